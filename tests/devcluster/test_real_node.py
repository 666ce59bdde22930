"""The session's real node (issue 39): the kubelet built from the control plane's Go module, containerd and
runc run Pods from the node images (`ardiff.dev/busybox`); the API server reaches them for `logs` and `exec`.

Each test has its own namespace; its Pods tolerate the real node's taint and select it."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import httpx
import pytest
import yaml
from redis import Redis as SyncRedis

from ardiff.devcluster.cluster import CHECKOUT, REAL_NODE, REAL_TAINT, DevCluster
from ardiff.devcluster.image_builds import build_image
from ardiff.devcluster.images import GATEWAY_IMAGE, OPERATOR_IMAGE
from ardiff.devcluster.node_images import ensure_node_images
from ardiff.devcluster.real_node import _cgroup_dirs
from ardiff.devcluster.waiting import condition_true, wait_until
from tests.chart.conftest import Chart

pytestmark = pytest.mark.slow

ON_REAL_NODE = {
    "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
    "tolerations": [{**REAL_TAINT, "operator": "Equal"}],
}
RESTRICTED = {
    "runAsUser": 1000,
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _pod(name: str, command: str, image: str = "", **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            **ON_REAL_NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": image or ensure_node_images().busybox,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    **container,
                }
            ],
        },
    }


def _create(cluster: DevCluster, namespace: str, pod: dict[str, Any]) -> None:
    with cluster.admin.client() as client:
        client.post(f"/api/v1/namespaces/{namespace}/pods", json=pod).raise_for_status()


def _get(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    with cluster.admin.client() as client:
        return client.get(f"/api/v1/namespaces/{namespace}/pods/{name}").json()


def test_the_real_node_reports_the_kubelets_version_containerd_this_machines_cpus_and_fake_gpus(
    dev_cluster: DevCluster,
) -> None:
    with dev_cluster.admin.client() as client:
        node = client.get(f"/api/v1/nodes/{REAL_NODE}").json()
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6.")
    assert node["status"]["capacity"]["cpu"] == str(os.cpu_count())
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert condition_true(node, "Ready")
    assert REAL_TAINT in [{k: t[k] for k in ("key", "value", "effect")} for t in node["spec"]["taints"]]
    # Its Pods' cgroups are its own tree, in every hierarchy, apart from the host's and the other nodes'.
    assert all(directory.is_dir() for directory in _cgroup_dirs(dev_cluster.real_nodes[REAL_NODE].config))


def test_a_restricted_pod_runs_under_runc_with_its_probe_logs_exec_and_pod_network(
    dev_cluster: DevCluster, kube_namespace: str
) -> None:
    serve = "mkdir /tmp/w && echo served-by-runc > /tmp/w/index.html && echo up && httpd -f -p 8080 -h /tmp/w"
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    _create(dev_cluster, kube_namespace, _pod("web", serve, readinessProbe=probe, securityContext=RESTRICTED))

    def ready() -> dict[str, Any] | None:
        pod = _get(dev_cluster, kube_namespace, "web")
        return pod if condition_true(pod, "Ready") else None

    pod = wait_until(ready, timeout=60, what="the Pod Ready by its HTTP probe")
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["imageID"].startswith("sha256:") or "@sha256:" in status["imageID"]
    assert dev_cluster.kubectl("-n", kube_namespace, "logs", "web").stdout.splitlines() == ["up"]
    exec_ = ["-n", kube_namespace, "exec", "web", "--"]
    assert dev_cluster.kubectl(*exec_, "id", "-u").stdout.strip() == "1000"
    proc_status = dict(
        line.split(":\t", 1)
        for line in dev_cluster.kubectl(*exec_, "cat", "/proc/self/status").stdout.splitlines()
    )
    assert proc_status["Seccomp"].strip() == "2"  # a filter: runc loaded RuntimeDefault's profile
    assert int(proc_status["CapEff"], 16) == 0
    assert proc_status["NoNewPrivs"].strip() == "1"
    # The Pod's address is on the node's CNI bridge, routed from this machine's namespace.
    response = httpx.get(f"http://{pod['status']['podIP']}:8080/", timeout=10)
    assert response.text == "served-by-runc\n"


def test_a_container_over_its_memory_limit_is_oom_killed_by_the_kernel(
    dev_cluster: DevCluster, kube_namespace: str
) -> None:
    limits = {"limits": {"memory": "16Mi", "cpu": "100m"}}
    # dd allocates and fills a 64 MiB buffer: four times the limit.
    _create(
        dev_cluster,
        kube_namespace,
        _pod("hog", "dd if=/dev/zero of=/dev/null bs=64M count=4", resources=limits),
    )

    def terminated() -> dict[str, Any] | None:
        statuses = _get(dev_cluster, kube_namespace, "hog")["status"].get("containerStatuses") or []
        return statuses[0]["state"].get("terminated") if statuses else None

    state = wait_until(terminated, timeout=60, what="the container terminated")
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)


def test_node_images_are_built_once_and_named_as_the_pods_ask() -> None:
    images = ensure_node_images()
    built = images.archive.stat().st_mtime_ns
    assert ensure_node_images() == images
    assert images.archive.stat().st_mtime_ns == built
    listing = subprocess.run(
        ["tar", "-xOf", str(images.archive), "./index.json"], capture_output=True, check=True
    )
    index = json.loads(listing.stdout)
    names = {m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]}
    assert names == {images.busybox, images.pause, images.redis}
    chart = yaml.safe_load((CHECKOUT / "charts/ardiff/values.yaml").read_text())["redis"]["bundled"]["image"]
    assert images.redis == f"{chart['repository']}:{chart['tag']}"


def _finished(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = _get(cluster, namespace, name)
    return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None


# The dev harness is in no image (issue 41 item 6): neither its packages nor its commands.
NO_HARNESS = (
    ' && python -c "import importlib.util as u;'
    " print([m for m in ('ardiff.devcluster', 'ardiff.tiny_world') if u.find_spec(m)])\""
    " && { ardiff --help | grep -cE '^ +(up|down|demo|train-tiny-world)( |$)' || true; }"
)


@pytest.mark.parametrize(
    ("dockerfile", "image", "values", "command", "expected"),
    [
        (
            "operator/Dockerfile",
            OPERATOR_IMAGE,
            "operator",
            "id -u && ardiff operator run --help > /dev/null && echo operator-ok" + NO_HARNESS,
            ["10001", "operator-ok", "[]", "0"],
        ),
        (
            "ardiff/gateway/Dockerfile",
            GATEWAY_IMAGE,
            "gateway",
            "id -u && envoy --version | grep -o '1\\.40\\.0' | head -1"
            " && ardiff gateway picker --help > /dev/null && echo gateway-ok" + NO_HARNESS,
            ["10001", "1.40.0", "gateway-ok", "[]", "0"],
        ),
    ],
    ids=["operator", "gateway"],
)
def test_an_image_built_from_its_dockerfile_runs_on_the_real_node_under_the_charts_security_settings(
    dev_cluster: DevCluster,
    kube_namespace: str,
    dockerfile: str,
    image: str,
    values: str,
    command: str,
    expected: list[str],
) -> None:
    """buildah builds the Dockerfile as written (the gateway's once imported the checkout's `operator/` in
    place of the standard library's); the image runs as its own user with the chart's read-only root, and
    holds nothing of the dev harness."""
    chart = yaml.safe_load((CHECKOUT / "charts/ardiff/values.yaml").read_text())[values]
    built = build_image(CHECKOUT, dockerfile, f"{image}:0.1.0")
    dev_cluster.real_nodes[REAL_NODE].import_archive(built.archive)
    pod = _pod("image", command, image=built.name, securityContext=chart["securityContext"])
    pod["spec"]["securityContext"] = chart["podSecurityContext"]
    _create(dev_cluster, kube_namespace, pod)
    done = wait_until(
        lambda: _finished(dev_cluster, kube_namespace, "image"), timeout=120, what="the Pod done"
    )
    logs = dev_cluster.kubectl("-n", kube_namespace, "logs", "image").stdout
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs.split() == expected


def test_the_charts_bundled_redis_runs_on_the_real_node_from_its_image_under_its_own_settings(
    dev_cluster: DevCluster, kube_namespace: str
) -> None:
    """The chart's Redis objects as `helm template` renders them (its config in a Secret, a read-only root,
    user 999, every capability dropped, the readiness probe's redis-cli) run unchanged under runc from the
    stand-in of the chart's image, and answer the operator's user through their Service."""
    chart = Chart(namespace=kube_namespace)
    rendered = chart.render({"redis": {"bundled": ON_REAL_NODE}})
    redis = [
        doc
        for doc in rendered
        if doc["metadata"]["name"] == f"{chart.fullname}-redis"
        and doc["kind"] in ("Secret", "Service", "StatefulSet")
    ]
    assert sorted(doc["kind"] for doc in redis) == ["Secret", "Service", "StatefulSet"]
    dev_cluster.kubectl("-n", kube_namespace, "apply", "-f", "-", stdin=yaml.safe_dump_all(redis))
    name = f"{chart.fullname}-redis-0"

    def ready() -> dict[str, Any] | None:
        pod = _get(dev_cluster, kube_namespace, name)
        return pod if pod.get("kind") == "Pod" and condition_true(pod, "Ready") else None  # 404: not made yet

    pod = wait_until(ready, timeout=90, what="the Redis Pod Ready by its redis-cli probe")
    assert pod["spec"]["nodeName"] == REAL_NODE
    (status,) = pod["status"]["containerStatuses"]
    assert status["image"].removeprefix("docker.io/library/") == "redis:7.2.5-alpine"
    assert status["containerID"].startswith("containerd://")
    exec_ = ["-n", kube_namespace, "exec", name, "--"]
    assert dev_cluster.kubectl(*exec_, "id", "-u").stdout.strip() == "999"
    written = dev_cluster.kubectl(*exec_, "sh", "-c", "touch /etc/x 2>&1 || echo read-only")
    assert written.stdout.strip().endswith("read-only")
    (secret,) = (doc for doc in redis if doc["kind"] == "Secret")
    with dev_cluster.admin.client() as client:
        service = client.get(f"/api/v1/namespaces/{kube_namespace}/services/{chart.fullname}-redis").json()
    client = SyncRedis(
        host=service["spec"]["clusterIP"],
        port=6379,
        username="ardiff-operator",
        password=secret["stringData"]["password"],
        socket_timeout=10,
    )
    with client:
        assert client.ping()
        assert client.acl_whoami() == "ardiff-operator"


def _node_ready(cluster: DevCluster) -> bool:
    with cluster.admin.client() as client:
        return condition_true(client.get(f"/api/v1/nodes/{REAL_NODE}").json(), "Ready")


def test_a_node_whose_kubelet_stops_goes_not_ready_and_the_taint_manager_evicts_its_pods(
    dev_cluster: DevCluster, kube_namespace: str
) -> None:
    """Issue 39 item 5's first fault: the real node-lifecycle controller marks the node NotReady once its
    kubelet stops renewing (the default 50 s grace), taints it, and evicts a Pod after its 1 s toleration; the
    kubelet started again makes the node Ready."""
    pod = _pod("victim", "sleep 3600")
    pod["spec"]["tolerations"] += [
        {
            "key": f"node.kubernetes.io/{taint}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 1,
        }
        for taint in ("not-ready", "unreachable")
    ]
    _create(dev_cluster, kube_namespace, pod)
    wait_until(
        lambda: _get(dev_cluster, kube_namespace, "victim")["status"].get("phase") == "Running",
        timeout=60,
        what="the Pod Running",
    )
    real = dev_cluster.real_nodes[REAL_NODE]
    real.stop_kubelet()
    try:
        wait_until(lambda: not _node_ready(dev_cluster), timeout=120, what="the node NotReady")
        evicted = wait_until(
            lambda: _get(dev_cluster, kube_namespace, "victim")["metadata"].get("deletionTimestamp"),
            timeout=60,
            what="the taint manager's eviction",
        )
        assert evicted
        with dev_cluster.admin.client() as client:
            taints = client.get(f"/api/v1/nodes/{REAL_NODE}").json()["spec"]["taints"]
        assert {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"} & {t["key"] for t in taints}
    finally:
        real.start_kubelet()
        wait_until(lambda: _node_ready(dev_cluster), timeout=120, what="the node Ready again")
    # The restarted kubelet finishes the eviction: the Pod's container is stopped and the object removed.
    with dev_cluster.admin.client() as client:
        wait_until(
            lambda: client.get(f"/api/v1/namespaces/{kube_namespace}/pods/victim").status_code == 404,
            timeout=60,
            what="the evicted Pod gone",
        )
