"""Facts about the installed environment that the rest of the suite relies on."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _has_cuda() -> bool:
    return shutil.which("nvidia-smi") is not None


def test_torchvision_family_matches_the_platform() -> None:
    present = [name for name in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(name)]
    if _has_cuda():
        # The GPU install keeps the vllm stack as PyPI ships it.
        assert "torchvision" in present
    else:
        # PyPI's builds cannot load beside the CPU torch; `make setup` removes them as its last step.
        assert present == []


def test_operator_import_name_does_not_shadow_stdlib() -> None:
    code = "import operator, ardiff.operator; print(operator.__file__); print(ardiff.operator.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    stdlib_operator, ours = out.stdout.split()
    assert Path(stdlib_operator).name == "operator.py"
    assert Path(ours) == ROOT / "operator" / "__init__.py"


def test_ardiff_cli_reports_usage_errors_without_traceback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ardiff.cli", "no-such-command"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "invalid choice" in out.stderr
    assert "Traceback" not in out.stderr
