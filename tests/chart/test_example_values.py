"""charts/ardiff/examples/: the worked values files render with real helm into objects a cluster accepts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from ardiff.devcluster.cluster import DevCluster
from ardiff.kv.pod_plan import plan_for_pool
from ardiff.kv.presets import get_preset
from ardiff.operator.pods import build_worker_pod
from ardiff.operator.specs import WorkerPoolSpec
from ardiff.worker.settings import build_settings
from tests.conftest import Admission

from .test_chart import CUSTOM_KINDS, KUBERNETES_VERSIONS, one
from .test_crds import OUR_KINDS

H200 = "values-lingbot-h200.yaml"


def render_example(chart, file: str, *args: str) -> list[dict[str, Any]]:
    result = chart.helm(
        "template",
        chart.release,
        chart.path,
        "--namespace",
        chart.namespace,
        "--values",
        chart.path / "examples" / file,
        *args,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def h200(chart) -> list[dict[str, Any]]:
    return render_example(chart, H200)


def test_every_example_lints_strict(chart):
    files = sorted(path.name for path in (chart.path / "examples").glob("*.yaml"))
    assert H200 in files
    for file in files:
        result = chart.helm(
            "lint",
            "--strict",
            chart.path,
            "--namespace",
            chart.namespace,
            "--values",
            chart.path / "examples" / file,
        )
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_h200_objects_pass_kubernetes_validate_strict(chart, kubernetes_version):
    rendered = render_example(chart, H200, "--kube-version", kubernetes_version)  # as helm renders for it
    builtin = [obj for obj in rendered if obj["kind"] not in CUSTOM_KINDS]
    assert len(builtin) >= 7
    for obj in builtin:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


def _admitted_pool(admission: Admission, h200) -> dict[str, Any]:
    """The default pool as the real apiserver would store it (server-side dry-run): pruned, defaulted,
    CEL-checked against the CRDs it serves (crds/, identical to the chart's: tests/chart/test_crds.py); the
    peering passes too."""
    for obj in h200:
        if obj["kind"] in OUR_KINDS:
            admitted = admission.create(obj)
            assert admitted.admitted, (obj["kind"], admitted.body)
            assert admitted.pruned == [], obj["kind"]  # nothing the file says is silently dropped
    return admission.create(one(h200, "ARDiffusionWorkerPool")).obj


@pytest.fixture(scope="module")
def nvidia_runtime_class(dev_cluster: DevCluster) -> Iterator[str]:
    """The RuntimeClass the H200 example names, as the NVIDIA GPU Operator installs it (the RuntimeClass
    admission plugin refuses a Pod naming one that does not exist); removed afterwards if made here."""
    runtime_class = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}}
    url = "/apis/node.k8s.io/v1/runtimeclasses"
    with dev_cluster.admin.client() as client:
        created = client.post(url, json={**runtime_class, "handler": "nvidia"})
        assert created.status_code in (201, 409), created.text
        yield "nvidia"
        if created.status_code == 201:
            client.delete(f"{url}/nvidia")


def test_h200_pool_is_lingbot_world_480x832_bf16_on_one_h200_from_a_claim(admission, h200):
    pool = _admitted_pool(admission, h200)
    spec = pool["spec"]
    assert spec["model"] == {
        "path": "/weights/lingbot-world-base-cam",  # the chart's default model.name is dropped, not merged
        "pipeline": "LingBotWorldCausalDMDPipeline",
        "height": 480,
        "width": 832,
        "dtype": "bfloat16",
    }
    assert (
        spec["resources"]["requests"]["nvidia.com/gpu"] == spec["resources"]["limits"]["nvidia.com/gpu"] == 1
    )
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}
    assert claims == {"weights": "lingbot-world-weights", "sessions": "lingbot-world-sessions"}
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert spec["model"]["path"].startswith(mounts["weights"] + "/")
    assert spec["shmSize"] == "16Gi"
    assert spec["imagePullSecrets"] == [{"name": "ghcr-pull"}]  # the chart-wide value
    # Issue 25: admitted by compute as well as KV memory, at LingBot's 16 frames/s.
    assert (spec["playout"], spec["computeUtilisation"]) == ({"fps": 16, "bufferChunks": 2}, 0.9)


def test_h200_renders_are_repeatable_and_hold_no_password(chart, h200):
    """The Redis password is the user's Secret: a GitOps sync renders the same objects every time."""
    again = render_example(chart, H200)
    assert again == h200
    secrets = {obj["metadata"]["name"]: obj for obj in h200 if obj["kind"] == "Secret"}
    assert set(secrets) == {"rel-ardiff-redis", "rel-ardiff-gateway-redis"}
    assert set(secrets["rel-ardiff-redis"]["stringData"]) == {"redis.conf"}
    # The gateway's Redis Secret is rendered empty: the operator writes its user's password into it.
    assert not secrets["rel-ardiff-gateway-redis"].get("data")
    assert not secrets["rel-ardiff-gateway-redis"].get("stringData")


def test_h200_capacity_is_the_planners_and_the_comment_cites_it(chart, admission, h200):
    spec = _admitted_pool(admission, h200)["spec"]
    plan = plan_for_pool(
        get_preset("lingbot-world-480x832"),
        device_memory_bytes=141 << 30,
        gpu_memory_fraction=spec["kv"]["gpuMemoryFraction"],
    )
    assert plan.sessions == spec["kv"]["sessionCapacity"] == 2
    assert plan.binding_limit == "pipeline_session_capacity"
    text = (chart.path / "examples" / H200).read_text()
    assert "ardiff kv plan --preset lingbot-world-480x832 --gpu-memory-gib 141" in text
    assert re.search(r"-> 2 sessions per pod \(binding limit: pipeline_session_capacity\)", text)


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_h200_worker_pod_passes_kubernetes_validate_and_pod_admission(
    admission, h200, nvidia_runtime_class, kubernetes_version
):
    pool = _admitted_pool(admission, h200)
    spec = WorkerPoolSpec.from_resource(pool["spec"])
    pod = build_worker_pod(
        pool["metadata"]["namespace"], pool["metadata"]["name"], spec, pod_name="lingbot-world-ab12c"
    )
    kubernetes_validate.validate(pod, kubernetes_version, strict=True)
    admitted = admission.create(pod)  # the whole admission chain, ServiceAccount and RuntimeClass included
    assert admitted.admitted, admitted.body
    assert admitted.warnings == ()
    assert admitted.obj["spec"]["runtimeClassName"] == nvidia_runtime_class
    podspec = pod["spec"]
    assert podspec["runtimeClassName"] == "nvidia"
    [worker] = podspec["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "ARDIFF_MODEL", "value": "/weights/lingbot-world-base-cam"} in worker["env"]
    assert {"name": "ARDIFF_SESSION_CAPACITY", "value": "2"} in worker["env"]
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in worker["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in podspec["volumes"]
    # Sessions survive eviction and moves: the shared tier on the RWX claim, the host tier within the limit.
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert {"name": "sessions", "mountPath": "/sessions"} in worker["volumeMounts"]
    assert env["ARDIFF_SUSPEND_DIR"] == "/sessions"
    host_tier = int(env["ARDIFF_HOST_TIER_BYTES"])
    settings = build_settings(environ={k: v for k, v in env.items() if v is not None})
    assert (settings.suspend_dir, settings.host_tier_bytes) == ("/sessions", host_tier)
    limit = parse_quantity(worker["resources"]["limits"]["memory"])
    assert host_tier >= 2 * 26e9  # two 480x832 bf16 exports
    assert limit - host_tier >= 160 << 30  # the weights' load and the runtime keep what they had
