"""The rendered chart on the dev cluster: `helm template | kubectl apply`, then the operator Pod's own command
line brings a session to Ready.

helm itself cannot install into the emulated API (notes/k8s-test-harness.md), so the test does what
`helm install` and the cluster would: on a `DevCluster` started without CRDs (its API, Redis and pod runner;
no operator of its own), apply the chart's CRDs, then the rendered objects, with the real kubectl; start the
operator StatefulSet's first replica as a kubelet would (the dev cluster's own env and `$(VAR)` expansion,
pod-index label 0, the Redis URL resolved from the rendered Secret), as the dev cluster's `OperatorProcess`
with the rendered arguments as they are (its own `--liveness` included); only the API server address
(kubeconfig) and the Redis address (the dev cluster's redis-server, since nothing runs the bundled Redis
StatefulSet here) are overridden. Worker Pods run the real worker app over the fake runtime.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pod_runner import PodContext, build_env, container_command
from ardiff.devcluster.redis_server import free_port
from ardiff.devcluster.waiting import wait_until

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


@pytest.fixture
def dev_cluster(chart, tmp_path: Path) -> Iterator[DevCluster]:
    """The dev cluster without CRDs and without an operator, in the chart's namespace."""
    with DevCluster(tmp_path / "cluster", namespace=chart.namespace, install_crds=False) as cluster:
        yield cluster


def kubectl_apply(cluster: DevCluster, objects: list[dict[str, Any]]) -> list[str]:
    """`kubectl apply` (--validate=false: the emulated API serves no OpenAPI); returns its output lines."""
    result = cluster.kubectl(
        "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(objects), check=False
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


def test_rendered_chart_applies_and_its_operator_brings_a_session_to_ready(chart, dev_cluster):
    cluster = dev_cluster
    liveness_port = free_port()
    metrics_port = free_port()
    values = {
        "operator": {"livenessPort": liveness_port, "metricsPort": metrics_port},
        "defaultPool": FAKE_POOL,
    }
    rendered = chart.render(values, "--include-crds")
    crds = [obj for obj in rendered if obj["kind"] == "CustomResourceDefinition"]
    objects = [obj for obj in rendered if obj["kind"] != "CustomResourceDefinition"]

    # helm install: the CRDs first (as helm does from crds/), then the templates.
    kubectl_apply(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": chart.namespace}}])
    assert sorted(kubectl_apply(cluster, crds)) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']} created" for crd in crds
    )
    assert len(crds) == 4
    applied = kubectl_apply(cluster, objects)
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
        secret_data={redis_secret: secret_data(cluster.api_url, chart.namespace, redis_secret)},
        config_map_data={},
        overrides={
            "KUBECONFIG": str(cluster.kubeconfig),
            "ARDIFF_REDIS_URL": cluster.redis_url,
            "ARDIFF_WORKER_REDIS_URL": cluster.redis_url,
        },
    )
    assert container_env["ARDIFF_OPERATOR_PRIORITY"] == "0"
    argv = container_command(PodContext(pod, container, container_env, liveness_port))
    assert argv[-7:] == [
        "operator",
        "run",
        f"--namespace={chart.namespace}",
        f"--peering={chart.fullname}",
        "--priority=0",
        f"--liveness=http://0.0.0.0:{liveness_port}/healthz",
        f"--metrics=http://0.0.0.0:{metrics_port}/metrics",
    ]
    # The dev cluster stops it with the rest of its parts.
    operator = cluster.operator = OperatorProcess(
        argv,
        kubeconfig=cluster.kubeconfig,
        redis_url=cluster.redis_url,
        namespace=chart.namespace,
        log_path=cluster.logs_dir / "operator.log",
        env=container_env,
        liveness_port=liveness_port,  # the rendered --liveness, not one of the dev cluster's
    ).start()
    operator.wait_ready()
    session = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": "forest-walk", "namespace": chart.namespace},
        "spec": {"poolRef": FAKE_POOL["name"], "prompt": "A slow walk through a misty pine forest at dawn."},
    }
    assert kubectl_apply(cluster, [session]) == ["ardiffusionsession.ardiffusion.dev/forest-walk created"]
    url = f"{cluster.api_url}{SESSIONS.format(namespace=chart.namespace)}/forest-walk"

    def ready() -> dict[str, Any] | None:
        assert operator.running, operator.log()
        status = httpx.get(url, timeout=10).json().get("status") or {}
        return status if status.get("phase") == "Ready" else None

    status = wait_until(ready, timeout=120, what="session forest-walk Ready", poll=0.2)
    assert status["pod"].startswith("fake-pool-")
    assert status["endpoint"].startswith("http://127.0.0.1:")
    assert status["tokenSecretRef"]
    # The operator joined the chart's KopfPeering, with the priority of pod index 0.
    peering = httpx.get(
        f"{cluster.api_url}/apis/kopf.dev/v1/namespaces/{chart.namespace}/kopfpeerings/{chart.fullname}",
        timeout=10,
    ).json()
    assert [peer["priority"] for peer in peering["status"].values()] == [0]
    # Its metrics port serves the pool's autoscaling signals.
    ready_sessions = (
        "ardiff_pool_sessions",
        {"namespace": chart.namespace, "pool": "fake-pool", "phase": "Ready"},
    )

    def ready_metric() -> bool:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        return any((s.name, s.labels) == ready_sessions and s.value == 1 for s in samples)

    wait_until(ready_metric, what="the operator's metrics: one Ready session in its pool")
