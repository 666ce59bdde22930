"""The process kubelet behaves as a kubelet does, judged through the real API server and from inside its Pods.

Pods here run the operator image (slim Python) with small scripts; each test has its own namespace.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ardiff.devcluster.cluster import DevCluster, pod_pid
from ardiff.devcluster.images import WORKER_IMAGE, dev_site_packages
from ardiff.devcluster.kubeconfig import credentials_from_kubeconfig
from ardiff.devcluster.network import host_veth, short_pod_id
from ardiff.devcluster.waiting import condition_true, wait_until

pytestmark = pytest.mark.slow

IMAGE = "ghcr.io/ardiff/ardiff-operator:0.1.0"  # slim Python, user 10001
NON_ROOT = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
# A script every test Pod can run: HTTP on :8080 (GET /readyz follows /tmp/ready, GET /env, GET /file?path=),
# SIGTERM ignored with --ignore-sigterm.
HTTP_POD = """
import http.server, json, os, signal, sys, urllib.parse
if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
print("http pod up", flush=True)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/readyz":
            status, body = (200, b"ok") if not os.path.exists("/tmp/unready") else (503, b"no")
        elif url.path == "/env":
            status, body = 200, json.dumps(dict(os.environ)).encode()
        elif url.path == "/file":
            path = urllib.parse.parse_qs(url.query)["path"][0]
            try:
                status, body = 200, open(path, "rb").read()
            except OSError as exc:
                status, body = 404, str(exc).encode()
        else:
            status, body = 404, b""
        self.send_response(status); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", 8080), Handler).serve_forever()
"""


class Namespace:
    """The test's namespace, as the cluster's admin."""

    def __init__(self, cluster: DevCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.http = cluster.admin.client(timeout=15)

    def path(self, plural: str, name: str = "", core: bool = True) -> str:
        prefix = "/api/v1" if core else "/apis/apps/v1"
        return f"{prefix}/namespaces/{self.name}/{plural}" + (f"/{name}" if name else "")

    def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        reply = self.http.post(self.path(plural), json=body)
        assert reply.status_code == 201, reply.text
        return reply.json()

    def pod(self, name: str) -> dict[str, Any]:
        reply = self.http.get(self.path("pods", name))
        reply.raise_for_status()
        return reply.json()

    def run(
        self, name: str, *, script: str = HTTP_POD, args: list[str] | None = None, **spec: Any
    ) -> dict[str, Any]:
        """A Pod running `script` (python -c) in the operator image; its spec extended by `spec`."""
        container: dict[str, Any] = {
            "name": "main",
            "image": IMAGE,
            "command": ["python", "-c", script, *(args or [])],
        }
        if script == HTTP_POD:  # Ready once it serves (its SIGTERM handler is in place by then)
            container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1}
        container.update(spec.pop("container", {}))
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
            "spec": {
                "containers": [container, *spec.pop("sidecars", [])],
                "securityContext": NON_ROOT,
                "terminationGracePeriodSeconds": spec.pop("grace", 5),
                **spec,
            },
        }
        return self.create("pods", body)

    def wait_pod(self, name: str, predicate: Any, what: str, timeout: float = 60) -> dict[str, Any]:
        def matching() -> dict[str, Any] | None:
            pod = self.pod(name)
            return pod if predicate(pod) else None

        try:
            return wait_until(matching, timeout=timeout, what=f"pod {name} {what}")
        except AssertionError as exc:
            pod = self.pod(name)
            logs = self.http.get(self.path("pods", name) + "/log").text[-3000:]
            raise AssertionError(
                f"{exc}\nstatus: {json.dumps(pod.get('status'), indent=1)}\nlog: {logs}"
            ) from None

    def wait_ready(self, name: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait_pod(name, is_ready, "Ready", timeout)

    def get_from(self, name: str, path: str) -> httpx.Response:
        """GET the Pod's HTTP server at its own address (this machine routes the cluster's pod CIDRs)."""
        return httpx.get(f"http://{self.pod(name)['status']['podIP']}:8080{path}", timeout=5)

    def logs(self, name: str, **params: str) -> str:
        reply = self.http.get(self.path("pods", name) + "/log", params=params)
        assert reply.status_code == 200, reply.text
        return reply.text


def is_ready(pod: dict[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def container_status(pod: dict[str, Any], name: str = "main") -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s["name"] == name), {})


@pytest.fixture
def ns(dev_cluster: DevCluster, kube_namespace: str) -> Iterator[Namespace]:
    namespace = Namespace(dev_cluster, kube_namespace)
    yield namespace
    namespace.http.close()


def test_both_process_nodes_are_ready_renew_their_leases_and_advertise_capacity(
    dev_cluster: DevCluster,
) -> None:
    with dev_cluster.admin.client() as client:
        nodes = {n["metadata"]["name"]: n for n in client.get("/api/v1/nodes").json()["items"]}
        lease = lambda name: client.get(  # noqa: E731
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        ).json()
        first = lease("node-1")["spec"]["renewTime"]
        wait_until(
            lambda: lease("node-1")["spec"]["renewTime"] != first, timeout=30, what="the lease renewed"
        )
        owner = lease("node-1")["metadata"]["ownerReferences"][0]
    assert {"node-1", "node-2"} <= set(nodes)
    for name in ("node-1", "node-2"):
        node = nodes[name]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready == {
            "Ready": "True",
            "MemoryPressure": "False",
            "DiskPressure": "False",
            "PIDPressure": "False",
        }
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
        assert ipaddress.ip_address(node["status"]["addresses"][0]["address"]) in dev_cluster.network.underlay
        assert node["spec"]["podCIDR"]
    assert (owner["kind"], owner["name"]) == ("Node", "node-1")


def test_a_pod_has_its_own_address_hostname_env_and_cluster_dns(ns: Namespace) -> None:
    ns.create("configmaps", {"metadata": {"name": "settings"}, "data": {"colour": "green"}})
    ns.create("secrets", {"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}})
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "EXPANDED", "value": "$(GREETING) world"},
        {"name": "COLOUR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "colour"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MY_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {
            "name": "MEMORY",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
        },
    ]
    ns.run("envy", container={"env": env, "resources": {"limits": {"memory": "64Mi"}}})
    pod = ns.wait_ready("envy")
    seen = ns.get_from("envy", "/env").json()
    node = pod["spec"]["nodeName"]
    assert {
        k: seen[k] for k in ("GREETING", "EXPANDED", "COLOUR", "PASSWORD", "MY_POD", "MY_NODE", "MEMORY")
    } == {
        "GREETING": "hello",
        "EXPANDED": "hello world",
        "COLOUR": "green",
        "PASSWORD": "hunter2",
        "MY_POD": "envy",
        "MY_NODE": node,
        "MEMORY": "64",
    }
    assert seen["MY_IP"] == pod["status"]["podIP"]
    with ns.cluster.admin.client() as client:
        cidr = client.get(f"/api/v1/nodes/{node}").json()["spec"]["podCIDR"]
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(cidr)
    assert seen["HOSTNAME"] == "envy"
    assert seen["KUBERNETES_SERVICE_HOST"] == ns.cluster.network.api_service_ip
    assert ns.get_from("envy", "/file?path=/etc/hostname").text.strip() == "envy"
    assert "ndots:5" in ns.get_from("envy", "/file?path=/etc/resolv.conf").text


PROBE_NETWORK = """
import json, socket, ssl, time, urllib.request
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
context = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
request = urllib.request.Request("https://kubernetes.default.svc/api/v1/namespaces/" +
    open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read() + "/pods",
    headers={"Authorization": "Bearer " + token})
try:
    urllib.request.urlopen(request, context=context)
    listed = "allowed"
except urllib.error.HTTPError as exc:
    listed = exc.code
try:
    socket.create_connection(("192.0.2.1", 80), timeout=2)
    outside = "reached"
except OSError as exc:
    outside = exc.errno
for _ in range(40):  # until this node's kube-proxy has programmed the new Service, as any client retries
    try:
        web = urllib.request.urlopen("http://web:8080/readyz", timeout=5).read().decode()
        break
    except OSError as exc:
        web, _ = repr(exc), time.sleep(0.5)
print(json.dumps({"api": socket.gethostbyname("kubernetes.default.svc.cluster.local"), "listed": listed,
                  "web": web, "outside": outside}), flush=True)
"""


def test_pods_reach_services_by_dns_and_the_api_in_cluster_and_nothing_outside(ns: Namespace) -> None:
    ns.run("web", labels={"app": "web"})
    ns.wait_ready("web")
    service = {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]}}
    ns.create("services", service)
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{ns.name}/endpointslices"
    wait_until(
        lambda: [e for s in ns.http.get(slices).json()["items"] for e in s.get("endpoints") or []],
        timeout=30,
        what="the Service's EndpointSlice",
    )
    ns.run("client", script=PROBE_NETWORK, restartPolicy="Never")
    ns.wait_pod("client", lambda p: p["status"].get("phase") == "Succeeded", "Succeeded")
    result = json.loads(ns.logs("client").strip().splitlines()[-1])
    assert result == {
        "api": ns.cluster.network.api_service_ip,
        "listed": 403,  # the default service account: authenticated by its projected token, not authorized
        "web": "ok",
        "outside": 101,  # ENETUNREACH: nothing is routed beyond the cluster's own namespaces
    }


def test_volumes_mount_where_the_pod_says_and_secrets_follow_their_object(ns: Namespace) -> None:
    ns.create("secrets", {"metadata": {"name": "conf"}, "stringData": {"a.txt": "one", "b.txt": "two"}})
    ns.create("configmaps", {"metadata": {"name": "cfg"}, "data": {"x": "ex"}})
    ns.create(
        "persistentvolumeclaims",
        {
            "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    volumes = [
        {"name": "conf", "secret": {"secretName": "conf", "items": [{"key": "a.txt", "path": "sub/a"}]}},
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}},
        {
            "name": "info",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        },
    ]
    mounts = [
        {"name": "conf", "mountPath": "/etc/conf", "readOnly": True},
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "shared", "mountPath": "/shared"},
        {"name": "info", "mountPath": "/etc/info"},
    ]
    writer = "import time; open('/scratch/w', 'w').write('side'); open('/shared/p', 'w').write('pvc'); "
    writer += "time.sleep(3600)"
    sidecar = {"name": "writer", "image": IMAGE, "command": ["python", "-c", writer], "volumeMounts": mounts}
    ns.run(
        "vols",
        container={"volumeMounts": mounts},
        volumes=volumes,
        sidecars=[sidecar],
        securityContext={**NON_ROOT, "fsGroup": 10001},
    )
    ns.wait_ready("vols")
    read = lambda path: ns.get_from("vols", f"/file?path={path}")  # noqa: E731
    assert read("/etc/conf/sub/a").text == "one"
    assert read("/etc/conf/b.txt").status_code == 404  # items: only what is listed
    assert read("/etc/cfg/x").text == "ex"
    assert read("/etc/info/labels").text == 'app="vols"'
    wait_until(lambda: read("/scratch/w").text == "side", timeout=10, what="the sidecar's emptyDir write")
    assert read("/shared/p").text == "pvc"
    assert read("/var/run/secrets/kubernetes.io/serviceaccount/namespace").text == ns.name
    # The claim is a hostPath PersistentVolume of the provisioner, bound by the controller-manager.
    claim = ns.http.get(ns.path("persistentvolumeclaims", "shared")).json()
    with ns.cluster.admin.client() as client:
        volume = client.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}").json()
    assert claim["status"]["phase"] == "Bound"
    assert (Path(volume["spec"]["hostPath"]["path"]) / "p").read_text() == "pvc"
    # A changed Secret reaches the mounted file (the kubelet's periodic sync), without a restart.
    patch = {"data": {"a.txt": base64.b64encode(b"uno").decode()}}
    ns.http.patch(
        ns.path("secrets", "conf"), json=patch, headers={"Content-Type": "application/merge-patch+json"}
    ).raise_for_status()
    wait_until(
        lambda: read("/etc/conf/sub/a").text == "uno", timeout=30, what="the updated Secret in the volume"
    )
    assert container_status(ns.pod("vols"))["restartCount"] == 0


WRITE_ROOT = """
import errno, json, os
results = {}
for path in ("/etc/ardiff-probe", "/tmp/ardiff-probe"):
    try:
        open(path, "w").write("x")
        results[path] = "written"
    except OSError as exc:
        results[path] = errno.errorcode[exc.errno]
print(json.dumps({**results, "uid": os.getuid()}), flush=True)
"""


@pytest.mark.parametrize("read_only", [True, False])
def test_the_root_filesystem_is_the_containers_own_and_read_only_when_asked(
    ns: Namespace, read_only: bool
) -> None:
    name = f"root-{str(read_only).lower()}"
    context = {"readOnlyRootFilesystem": read_only, "allowPrivilegeEscalation": False, "runAsUser": 0}
    # root inside (runAsUser 0), so only the read-only mount can refuse the write
    ns.run(
        name,
        script=WRITE_ROOT,
        restartPolicy="Never",
        container={"securityContext": context},
        securityContext={},
    )
    ns.wait_pod(name, lambda p: p["status"].get("phase") == "Succeeded", "Succeeded")
    result = json.loads(ns.logs(name).strip())
    expected = "EROFS" if read_only else "written"
    assert result == {"/etc/ardiff-probe": expected, "/tmp/ardiff-probe": expected, "uid": 0}
    assert not Path("/etc/ardiff-probe").exists()  # a write that succeeded stayed in the container's layer


def test_a_volume_over_the_base_layers_path_does_not_hide_the_worker_images_packages(ns: Namespace) -> None:
    """The worker image's venv sees the dev venv's packages (torch, uvicorn, h11, ...) as its base layer, at
    that venv's host path. A volume the Pod mounts above that path (the chart's /tmp emptyDir, with a checkout
    under /tmp as CI's clean clones are) must not hide them, as a volume never hides an image's own layers."""
    base = dev_site_packages()
    ns.run(
        "layered",
        script="import h11, uvicorn; print('imported', h11.__name__, uvicorn.__name__)",
        restartPolicy="Never",
        container={
            "image": f"{WORKER_IMAGE}:0.1.0",
            "volumeMounts": [{"name": "over-base", "mountPath": str(base.parent)}],
        },
        volumes=[{"name": "over-base", "emptyDir": {}}],
    )
    pod = ns.wait_pod("layered", lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "done")
    assert pod["status"]["phase"] == "Succeeded", ns.logs("layered")
    assert ns.logs("layered").strip() == "imported h11 uvicorn"


def test_run_as_non_root_refuses_an_image_that_runs_as_root(ns: Namespace) -> None:
    body = {
        "metadata": {"name": "rooty"},
        "spec": {
            "securityContext": {"runAsNonRoot": True},
            "containers": [
                {"name": "main", "image": "docker.io/library/redis:7.2.5-alpine", "command": ["redis-server"]}
            ],
        },
    }
    ns.create("pods", body)
    pod = ns.wait_pod(
        "rooty", lambda p: container_status(p).get("state", {}).get("waiting", {}).get("message"), "refused"
    )
    waiting = container_status(pod)["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "runAsNonRoot and image will run as root" in waiting["message"]


def test_unknown_images_and_missing_secrets_are_reported_like_a_kubelet(ns: Namespace) -> None:
    ns.run("nopull", container={"image": "example.com/not-in-the-table:1"})
    ns.run(
        "nosecret",
        container={"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]},
    )
    reasons = {
        name: ns.wait_pod(
            name,
            lambda p: (
                "waiting" in container_status(p).get("state", {})
                and container_status(p)["state"]["waiting"].get("message")
            ),
            "waiting with a reason",
        )
        for name in ("nopull", "nosecret")
    }
    assert container_status(reasons["nopull"])["state"]["waiting"]["reason"] == "ErrImagePull"
    assert (
        "is not in the dev cluster's image table"
        in container_status(reasons["nopull"])["state"]["waiting"]["message"]
    )
    nosecret = container_status(reasons["nosecret"])["state"]["waiting"]
    assert (nosecret["reason"], nosecret["message"]) == (
        "CreateContainerConfigError",
        "secret 'absent' not found",
    )


def test_probes_drive_readiness_and_liveness_restarts(ns: Namespace) -> None:
    readiness = {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}
    liveness = {
        "exec": {"command": ["python", "-c", "import os, sys; sys.exit(os.path.exists('/tmp/dead'))"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    startup = {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 30}
    probes = {"readinessProbe": readiness, "livenessProbe": liveness, "startupProbe": startup}
    ns.run("probed", container=probes)
    pod = ns.wait_ready("probed")
    pid = pod_pid(pod)
    assert pid is not None
    # Not ready while /readyz answers 503; ready again when it answers 200 (the container keeps running).
    toggle = ["nsenter", f"--target={pid}", "--mount", "--root", "--", "sh", "-c"]
    subprocess.run([*toggle, "touch /tmp/unready"], check=True)
    ns.wait_pod("probed", lambda p: not is_ready(p), "not Ready")
    subprocess.run([*toggle, "rm /tmp/unready"], check=True)
    assert container_status(ns.wait_ready("probed"))["restartCount"] == 0
    # A failing liveness probe restarts it: the kubelet stops it, a new container (a fresh root) starts.
    subprocess.run([*toggle, "touch /tmp/dead"], check=True)
    restarted = ns.wait_pod(
        "probed",
        lambda p: container_status(p).get("restartCount") == 1 and is_ready(p),
        "restarted by its liveness probe and Ready",
        timeout=60,
    )
    assert "terminated" in container_status(restarted)["lastState"]
    assert pod_pid(restarted) != pid
    events = ns.http.get(ns.path("events")).json()["items"]
    assert any(e["reason"] == "Unhealthy" and "Liveness probe failed" in e["message"] for e in events)


def test_kill_9_is_reported_restarted_with_back_off_and_its_logs_kept(ns: Namespace) -> None:
    ns.run("victim")
    pod = ns.wait_ready("victim")
    pid = pod_pid(pod)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    restarted = ns.wait_pod(
        "victim", lambda p: container_status(p).get("restartCount") == 1 and is_ready(p), "restarted"
    )
    terminated = container_status(restarted)["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["signal"], terminated["reason"]) == (137, 9, "Error")
    assert terminated["containerID"] == f"process://{pid}"
    assert "http pod up" in ns.logs("victim", previous="true")
    assert "http pod up" in ns.logs("victim")
    refused = subprocess.run(
        [
            str(
                Path(os.environ.get("VIRTUAL_ENV", Path(__import__("sys").executable).parents[1]))
                / "bin"
                / "kubectl"
            ),
            "-n",
            ns.name,
            "exec",
            "victim",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0


@pytest.mark.parametrize(("policy", "code", "phase"), [("Never", 3, "Failed"), ("OnFailure", 0, "Succeeded")])
def test_restart_policy_decides_what_an_exit_means(ns: Namespace, policy: str, code: int, phase: str) -> None:
    name = f"exit-{policy.lower()}"
    ns.run(name, script=f"import sys; print('bye'); sys.exit({code})", restartPolicy=policy)
    pod = ns.wait_pod(name, lambda p: p["status"].get("phase") == phase, phase)
    terminated = container_status(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (code, "Completed" if code == 0 else "Error")
    assert container_status(pod)["restartCount"] == 0


def test_deletion_sends_sigterm_then_sigkill_after_the_grace_period(ns: Namespace) -> None:
    ns.run("stubborn", args=["--ignore-sigterm"], grace=2)
    pid = pod_pid(ns.wait_ready("stubborn"))
    started = time.monotonic()
    ns.http.delete(ns.path("pods", "stubborn")).raise_for_status()
    wait_until(
        lambda: ns.http.get(ns.path("pods", "stubborn")).status_code == 404, timeout=30, what="pod gone"
    )
    elapsed = time.monotonic() - started
    assert 1.5 < elapsed < 15, elapsed
    assert pid is not None
    assert not Path(f"/proc/{pid}").exists()


def test_a_deleted_pods_address_is_free_only_once_its_interface_is_gone(
    dev_cluster: DevCluster, ns: Namespace
) -> None:
    """The kernel frees a network namespace when its last reference goes, and then only asynchronously (in
    one CI run 108 s after its Pod was deleted): until then its eth0 answers for its address. Were the address
    given to the next Pod meanwhile, two would answer ARP for it on the node's bridge (that Pod's Redis
    connections timed out, its clients got RSTs from the dead one). So the kubelet removes the Pod's veth
    pair itself, at once; the test holds the old namespace open to stand for the kernel's delay."""
    ns.run("first", nodeName="node-1")
    first = ns.wait_ready("first")
    assert dev_cluster.network is not None
    short_id = short_pod_id(first["metadata"]["uid"])
    node_namespace = dev_cluster.network.node_namespace(1)
    veth = host_veth(short_id)

    def links() -> str:
        command = ["ip", "-n", node_namespace, "-o", "link", "show"]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    assert f" {veth}@" in links()
    holder = os.open(f"/run/netns/{dev_cluster.network.pod_namespace(short_id)}", os.O_RDONLY)
    try:
        ns.http.delete(ns.path("pods", "first"), params={"gracePeriodSeconds": "0"}).raise_for_status()
        wait_until(
            lambda: ns.http.get(ns.path("pods", "first")).status_code == 404, timeout=30, what="pod gone"
        )
        wait_until(lambda: f" {veth}@" not in links(), timeout=10, what=f"{veth} gone from {node_namespace}")
        held = subprocess.run(
            ["nsenter", f"--net=/proc/{os.getpid()}/fd/{holder}", "ip", "-o", "-4", "addr", "show"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f" {first['status']['podIP']}/" not in held  # the namespace lives on, without the address
        assert " lo " in held
    finally:
        os.close(holder)


def test_init_containers_run_first_in_order_and_a_failing_one_holds_the_pod(ns: Namespace) -> None:
    init = lambda name, code: {  # noqa: E731
        "name": name,
        "image": IMAGE,
        "command": ["python", "-c", f"open('/work/{name}', 'w'); import sys; sys.exit({code})"],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
    }
    volumes = [{"name": "work", "emptyDir": {}}]
    mounts = {"volumeMounts": [{"name": "work", "mountPath": "/work"}]}
    ns.run("inits", initContainers=[init("first", 0), init("second", 0)], volumes=volumes, container=mounts)
    ns.wait_ready("inits")
    assert ns.get_from("inits", "/file?path=/work/first").status_code == 200
    assert ns.get_from("inits", "/file?path=/work/second").status_code == 200
    ns.run("stuck", initContainers=[init("bad", 1)], volumes=volumes, container=mounts)
    pod = ns.wait_pod(
        "stuck",
        lambda p: ((p["status"].get("initContainerStatuses") or [{}])[0].get("restartCount") or 0) >= 1,
        "retrying its init container",
    )
    assert pod["status"]["phase"] == "Pending"
    assert container_status(pod).get("state", {}).get("waiting", {}).get("reason") in (
        "ContainerCreating",
        "PodInitializing",
    )


def test_a_kubelet_is_only_a_node_to_the_api_server(dev_cluster: DevCluster, ns: Namespace) -> None:
    """Its credential is `system:node:<name>`: the Node authorizer lets it read only what its Pods need and
    NodeRestriction keeps it off other nodes' objects."""
    ns.create("secrets", {"metadata": {"name": "unrelated"}, "stringData": {"k": "v"}})
    node = credentials_from_kubeconfig(dev_cluster.workdir / "nodes" / "node-1" / "kubeconfig")
    assert node.user == "system:node:node-1"
    with node.client() as client:
        assert client.get(ns.path("secrets", "unrelated")).status_code == 403
        other = client.patch(
            "/api/v1/nodes/node-2/status",
            content=json.dumps({"status": {"conditions": []}}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert other.status_code == 403
        assert client.get("/api/v1/nodes/node-1").status_code == 200
