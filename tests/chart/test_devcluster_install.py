"""The rendered chart on the dev cluster: `helm template | kubectl apply`, then the operator Pod's own command
line brings a session to Ready.

helm itself cannot install into the emulated API (notes/k8s-test-harness.md), so the test does what
`helm install` and the cluster would: apply the chart's CRDs, then the rendered objects, with the real
kubectl; start the operator StatefulSet's first replica as a kubelet would (the dev cluster's own env and
`$(VAR)` expansion, pod-index label 0, the Redis URL resolved from the rendered Secret); only the API server
address (kubeconfig) and the Redis address (the test's redis-server, since nothing runs the bundled Redis
StatefulSet here) are overridden. Worker Pods run the real worker app over the fake runtime.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.kubectl import run_kubectl
from ardiff.devcluster.pod_runner import PodContext, PodRunner, build_env, container_command
from ardiff.devcluster.redis_server import free_port

pytestmark = pytest.mark.slow

SESSIONS = "/apis/ardiffusion.dev/v1alpha1/namespaces/{namespace}/ardiffusionsessions"
# The default pool of the chart, made to run the worker app over the fake runtime (no model, no torch).
FAKE_POOL = {
    "enabled": True,
    "name": "fake-pool",
    "spec": {
        "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
        "env": [
            {"name": "ARDIFF_RUNTIME", "value": "fake"},
            {"name": "ARDIFF_FAKE_CAPACITY", "value": "2"},
        ],
        "replicas": {"min": 1, "max": 1},
    },
}


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


@pytest.fixture
def dev_cluster(tmp_path: Path) -> Iterator[tuple[KubeAPIThread, Path]]:
    """The emulated API (no CRDs yet) and a pod runner for worker Pods; yields the API and its kubeconfig."""
    kubeconfig = tmp_path / "kubeconfig"
    with KubeAPIThread(kubeconfig=kubeconfig) as api, PodRunner(api.url, logs_dir=tmp_path / "pods"):
        yield api, kubeconfig


def kubectl_apply(kubeconfig: Path, objects: list[dict[str, Any]]) -> list[str]:
    """`kubectl apply` (--validate=false: the emulated API serves no OpenAPI); returns its output lines."""
    manifest = yaml.safe_dump_all(objects)
    result = run_kubectl(
        ["apply", "--validate=false", "-f", "-"], kubeconfig=kubeconfig, stdin=manifest, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def operator_pod(statefulset: dict[str, Any]) -> dict[str, Any]:
    """The first replica as the StatefulSet controller creates it (name `<set>-0`, pod-index label 0)."""
    template = statefulset["spec"]["template"]
    labels = {**template["metadata"]["labels"], "apps.kubernetes.io/pod-index": "0"}
    name = f"{statefulset['metadata']['name']}-0"
    return {
        "metadata": {"name": name, "namespace": statefulset["metadata"]["namespace"], "labels": labels},
        "spec": template["spec"],
    }


def secret_data(api: str, namespace: str, name: str) -> dict[str, str]:
    secret = httpx.get(f"{api}/api/v1/namespaces/{namespace}/secrets/{name}", timeout=10).json()
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def test_rendered_chart_applies_and_its_operator_brings_a_session_to_ready(
    chart, dev_cluster, redis_url, tmp_path
):
    api, kubeconfig = dev_cluster
    liveness_port = free_port()
    values = {"operator": {"livenessPort": liveness_port}, "defaultPool": FAKE_POOL}
    rendered = chart.render(values, "--include-crds")
    crds = [obj for obj in rendered if obj["kind"] == "CustomResourceDefinition"]
    objects = [obj for obj in rendered if obj["kind"] != "CustomResourceDefinition"]

    # helm install: the CRDs first (as helm does from crds/), then the templates.
    kubectl_apply(
        kubeconfig, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": chart.namespace}}]
    )
    assert sorted(kubectl_apply(kubeconfig, crds)) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']} created" for crd in crds
    )
    assert len(crds) == 4
    applied = kubectl_apply(kubeconfig, objects)
    assert len(applied) == len(objects)
    assert all(line.endswith(" created") for line in applied), applied
    for expected in (
        f"statefulset.apps/{chart.fullname}-operator created",
        f"role.rbac.authorization.k8s.io/{chart.fullname}-operator created",
        f"kopfpeering.kopf.dev/{chart.fullname} created",
        "ardiffusionworkerpool.ardiffusion.dev/fake-pool created",
    ):
        assert expected in applied

    # The operator Pod's process, as a kubelet would start it.
    operator_set = f"{chart.fullname}-operator"
    [statefulset] = [
        o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == operator_set
    ]
    pod = operator_pod(statefulset)
    [container] = pod["spec"]["containers"]
    redis_secret = f"{chart.fullname}-redis"
    container_env = build_env(
        pod,
        container,
        base=dict(os.environ),
        secret_data={redis_secret: secret_data(api.url, chart.namespace, redis_secret)},
        config_map_data={},
        overrides={
            "KUBECONFIG": str(kubeconfig),
            "ARDIFF_REDIS_URL": redis_url,
            "ARDIFF_WORKER_REDIS_URL": redis_url,
        },
    )
    assert container_env["ARDIFF_OPERATOR_PRIORITY"] == "0"
    argv = container_command(PodContext(pod, container, container_env, liveness_port))
    assert argv[-6:] == [
        "operator",
        "run",
        f"--namespace={chart.namespace}",
        f"--peering={chart.fullname}",
        "--priority=0",
        f"--liveness=http://0.0.0.0:{liveness_port}/healthz",
    ]
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as log:
        operator = subprocess.Popen(
            argv, env=container_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        healthz = f"http://127.0.0.1:{liveness_port}/healthz"

        def healthy() -> bool:
            assert operator.poll() is None, log_path.read_text()
            try:
                return httpx.get(healthz, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=60, what="the operator's liveness endpoint")
        session = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionSession",
            "metadata": {"name": "forest-walk", "namespace": chart.namespace},
            "spec": {
                "poolRef": FAKE_POOL["name"],
                "prompt": "A slow walk through a misty pine forest at dawn.",
            },
        }
        assert kubectl_apply(kubeconfig, [session]) == [
            "ardiffusionsession.ardiffusion.dev/forest-walk created"
        ]
        url = f"{api.url}{SESSIONS.format(namespace=chart.namespace)}/forest-walk"

        def ready() -> dict[str, Any] | None:
            assert operator.poll() is None, log_path.read_text()
            status = httpx.get(url, timeout=10).json().get("status") or {}
            return status if status.get("phase") == "Ready" else None

        status = wait_until(ready, timeout=120, what="session forest-walk Ready")
        assert status["pod"].startswith("fake-pool-")
        assert status["endpoint"].startswith("http://127.0.0.1:")
        assert status["tokenSecretRef"]
        # The operator joined the chart's KopfPeering, with the priority of pod index 0.
        peering = httpx.get(
            f"{api.url}/apis/kopf.dev/v1/namespaces/{chart.namespace}/kopfpeerings/{chart.fullname}",
            timeout=10,
        ).json()
        assert [peer["priority"] for peer in peering["status"].values()] == [0]
    finally:
        operator.terminate()
        operator.wait(timeout=30)
