"""The images the chart runs: what they install, and that they agree with the chart and the operator."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import yaml

from ardiff.devcluster.binaries import ENVOY_VERSION
from ardiff.devcluster.images import CONTEXT_FILES, DEV_HARNESS_DIRS, SOURCE_DIRS
from ardiff.operator.pods import WORKER_USER_ID

# Nothing of the GPU stack may reach the operator image.
GPU_STACK = re.compile(r"^(torch|torchvision|torchaudio|triton|vllm|vllm-omni|xformers|nvidia-.*|cuda-.*)$")


def _pyproject(chart) -> dict:
    return tomllib.loads((chart.path.parents[1] / "pyproject.toml").read_text())


def test_operator_install_pulls_no_torch_or_vllm(chart):
    root = chart.path.parents[1]
    dry_run = ["install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-", ".[operator]"]
    report = subprocess.run(
        [sys.executable, "-m", "pip", *dry_run],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {item["metadata"]["name"].lower() for item in json.loads(report.stdout)["install"]}
    assert {"ardiff", "kopf", "kubernetes", "redis", "httpx"} <= installed
    assert not {name for name in installed if GPU_STACK.match(name)}
    # The operator extra itself must stay light too, not only its resolution today.
    for requirement in _pyproject(chart)["project"]["optional-dependencies"]["operator"]:
        assert not GPU_STACK.match(re.split(r"[<>=!~\[; ]", requirement)[0].lower()), requirement


# Runs in a fresh interpreter: any import of the GPU stack on the operator's code path fails loudly.
_OPERATOR_IMPORTS_WITHOUT_GPU_STACK = """
import sys

class BlockGpuStack:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "vllm", "vllm_omni", "triton"}:
            raise ImportError(f"the operator image has no {name}")
        return None

sys.meta_path.insert(0, BlockGpuStack())
import ardiff.operator.handlers
from ardiff.cli import build_parser

build_parser().parse_args(["operator", "run", "--namespace", "worlds", "--peering", "p"])
print("ok")
"""


def test_operator_code_path_imports_nothing_of_the_gpu_stack(chart, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _OPERATOR_IMPORTS_WITHOUT_GPU_STACK],
        cwd=tmp_path,  # not the repository root: its operator/ folder would shadow the standard library
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def _instructions(path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _build_tag(path) -> str:
    [tag] = re.findall(r"docker build -f \S+ -t (\S+) \.", path.read_text())
    return tag


def test_operator_image_is_slim_python_with_the_operator_extra_only(chart):
    dockerfile = chart.path.parents[1] / "operator" / "Dockerfile"
    steps = _instructions(dockerfile)
    bases = [args for op, args in steps if op == "FROM"]
    assert all(base.split()[0].startswith("python:3.11-slim") for base in bases)
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "'.[operator]'" in runs
    assert "worker]" not in runs
    values = yaml.safe_load((chart.path / "values.yaml").read_text())
    [user] = [args for op, args in steps if op == "USER"]
    assert user == f"{values['operator']['podSecurityContext']['runAsUser']}:10001"
    image = values["operator"]["image"]["repository"]
    assert (
        _build_tag(dockerfile)
        == f"{image}:{yaml.safe_load((chart.path / 'Chart.yaml').read_text())['appVersion']}"
    )


def test_worker_image_is_the_pinned_vllm_omni_image_with_the_worker_extra(chart):
    dockerfile = chart.path.parents[1] / "worker" / "Dockerfile"
    steps = _instructions(dockerfile)
    pins = {
        name: version
        for name, version in (
            re.match(r"([\w-]+)==([\w.]+)", req).groups()
            for req in _pyproject(chart)["project"]["optional-dependencies"]["worker"]
            if "==" in req
        )
    }
    assert ("ARG", f"VLLM_OMNI_IMAGE=vllm/vllm-omni:v{pins['vllm-omni']}") in steps
    assert ("FROM", "${VLLM_OMNI_IMAGE}") in steps
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "'.[worker]'" in runs
    for package in ("torch", "vllm", "vllm-omni"):
        assert pins[package] in runs  # the build fails if the base image drifts from the pins
    # The operator runs worker pods as WORKER_USER_ID; that user owns HOME (the model cache).
    [user] = [args for op, args in steps if op == "USER"]
    assert user == f"{WORKER_USER_ID}:{WORKER_USER_ID}"
    values = yaml.safe_load((chart.path / "values.yaml").read_text())
    app_version = yaml.safe_load((chart.path / "Chart.yaml").read_text())["appVersion"]
    assert _build_tag(dockerfile) == f"{values['worker']['image']['repository']}:{app_version}"


def test_gateway_image_is_slim_python_with_the_gateway_extra_and_the_pinned_envoy(chart):
    dockerfile = chart.path.parents[1] / "ardiff" / "gateway" / "Dockerfile"
    steps = _instructions(dockerfile)
    bases = [args for op, args in steps if op == "FROM"]
    assert all(base.split()[0].startswith("python:3.11-slim") for base in bases)
    runs = " ".join(args for op, args in steps if op == "RUN")
    assert "'.[gateway]'" in runs
    assert "worker]" not in runs
    # Envoy at the version the dev cluster unpacks (ardiff/devcluster/binaries.py), on the PATH the chart's
    # `command: [envoy]` finds.
    assert ("ARG", f"ENVOY_VERSION={ENVOY_VERSION}") in steps
    assert any(op == "COPY" and args.endswith(" /usr/local/bin/envoy") for op, args in steps)
    values = yaml.safe_load((chart.path / "values.yaml").read_text())
    [user] = [args for op, args in steps if op == "USER"]
    assert user == f"{values['gateway']['podSecurityContext']['runAsUser']}:10001"
    app_version = yaml.safe_load((chart.path / "Chart.yaml").read_text())["appVersion"]
    assert _build_tag(dockerfile) == f"{values['gateway']['image']['repository']}:{app_version}"


def test_docker_context_holds_exactly_the_package_folders_but_the_harness(chart):
    root = chart.path.parents[1]
    package_dirs = set(_pyproject(chart)["tool"]["setuptools"]["package-dir"].values())
    rules = [line for line in (root / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    allowed = {line[1:].rstrip("/") for line in rules if line[0] == "!"}
    assert allowed == package_dirs | {"pyproject.toml", "README.md"}
    assert set(CONTEXT_FILES) | set(SOURCE_DIRS) == allowed  # the dev cluster's image builds agree
    # After the allowed folders: the dev harness is left out again (a later rule wins).
    left_out = [line.rstrip("/") for line in rules[rules.index("!worker/") + 1 :] if "*" not in line]
    assert left_out == list(DEV_HARNESS_DIRS)
    for name in ("operator", "worker", "ardiff/gateway"):
        steps = _instructions(root / name / "Dockerfile")
        # COPYs from the build context (not `--from=` another stage: the gateway's Envoy)
        copies = [args.split() for op, args in steps if op == "COPY" and not args.startswith("--from=")]
        sources = {part.rstrip("/") for parts in copies for part in parts[:-1]}
        assert sources == package_dirs | {"pyproject.toml", "README.md"}, name
