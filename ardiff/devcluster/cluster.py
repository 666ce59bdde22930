"""The whole local stack as one object: a real control plane, process kubelets, add-ons, Redis and (given a
command) the operator.

    with DevCluster(Path(".ardiff-dev"), operator_command=OPERATOR_COMMAND) as cluster:
        cluster.kubectl("apply", "-f", "examples/")

`start()` claims a network slot (`network`), starts the control plane (`controlplane`: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), the kubelets (`kubelet`, one process per node in its namespace; two
process nodes by default, plus `simulated_nodes`), applies kube-proxy and CoreDNS (`addons`) and the local
volume provisioner's StorageClass, installs the CRDs (unless `install_crds=False`: `helm install` does it),
starts `redis-server` on the root namespace's cluster address (Pods reach it there) and the operator, as a
process of this machine outside the cluster with the admin kubeconfig, or `operator_in_cluster()`'s
ServiceAccount token (the chart tests run it as the chart's Pod instead). Logs go to `<workdir>/logs/`
(`kubelet-<node>.log`, the control plane's, the Pods' under `nodes/<node>/pods/`). `stop()` tears down in
reverse order and removes every namespace the slot made. `ardiff up`/`down` run it in a background process
(`ardiff.devcluster.daemon`); `ardiff demo` and the tests run it in theirs.
This is a development harness; production runs on a real cluster through the Helm chart.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import yaml

from ardiff.devcluster import addons
from ardiff.devcluster.binaries import ensure_kubernetes
from ardiff.devcluster.controlplane import CLUSTER_DOMAIN, ComponentProcess, ControlPlane
from ardiff.devcluster.images import build_image_table
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.kubectl import run_kubectl
from ardiff.devcluster.kubelet import KubeletConfig
from ardiff.devcluster.network import ClusterNetwork, SlotLock, claimed_network, ip
from ardiff.devcluster.node_images import ensure_node_images
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pki import KeyPair
from ardiff.devcluster.provisioner import storage_class
from ardiff.devcluster.real_node import (
    KUBELET_API_ADMIN_BINDING,
    RealNode,
    RealNodeConfig,
    extended_resources_patch,
)
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import condition_true, wait_until

if TYPE_CHECKING:
    from ardiff.client import KubeSessions

CHECKOUT = Path(__file__).resolve().parents[2]
CHART_RELEASE = "ardiff"
# What a run keeps under its workdir besides its logs.
STATE_DIRS = ("control-plane", "nodes", "volumes", "helm")
CRD_DIR = CHECKOUT / "crds"
# The real operator, as `ardiff up` and the demo run it.
OPERATOR_COMMAND = ("ardiff", "operator", "run", "--standalone")
# Interactive periods: statuses (and `kubectl get`'s Chunk column) follow ticks within about a second.
INTERACTIVE_OPERATOR_ENV = {"ARDIFF_OPERATOR_RECONCILE_SECONDS": "1", "ARDIFF_OPERATOR_MIRROR_SECONDS": "1"}
# Benchmark periods: a reconcile round every half second, so rounds add little to what is timed.
BENCHMARK_OPERATOR_ENV = {"ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5", "ARDIFF_OPERATOR_MIRROR_SECONDS": "1"}
PROCESS_NODE_LABEL = "ardiff.dev/process-node"
# The chart's front door (the gateway Service's NodePort) on a chart-installed dev cluster.
FRONT_DOOR_NODE_PORT = 30080
# A process node's capacity: more than this machine has, as kwok's nodes advertise (the scheduler places by
# it; the kubelet enforces no limit).
PROCESS_NODE_CAPACITY = {
    "cpu": "32",
    "memory": "128Gi",
    "pods": "110",
    "ephemeral-storage": "200Gi",
    "nvidia.com/gpu": "8",
}
SIMULATED_NODE_CAPACITY = {"cpu": "4000", "memory": "16000Gi", "pods": "1000", "ephemeral-storage": "20000Gi"}


def load_manifests(directory: Path = CRD_DIR) -> list[dict[str, Any]]:
    """Every document of the YAML files in `directory` (the CRDs by default)."""
    documents: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def crds_established(crds: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the API server lists ardiff's CRDs and has Established every one (serves its resources)."""
    ours = [c for c in crds if c["spec"]["group"] == "ardiffusion.dev"]
    return bool(ours) and all(condition_true(dict(c), "Established") for c in ours)


@dataclass(frozen=True)
class NodeSpec:
    """A node of the dev cluster: a process node (its own namespace, Pods as processes) or a simulated one."""

    name: str
    simulated: bool = False
    real: bool = False  # the real kubelet, containerd and runc (`real_node`)
    capacity: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()


SIMULATED_NODE = "simulated-node"
SIMULATED_TAINT = {"key": "ardiff.dev/simulated", "value": "true", "effect": "NoSchedule"}


REAL_NODE = "real-node"
REAL_TAINT = {"key": "ardiff.dev/real-node", "value": "true", "effect": "NoSchedule"}


def default_nodes(*, simulated: bool = False, real: bool = False) -> list[NodeSpec]:
    """Two process nodes; with `simulated`, also `SIMULATED_NODE`, tainted so that only Pods which tolerate
    `ardiff.dev/simulated` (and select it) land there; with `real`, also `REAL_NODE` (the real kubelet,
    `real_node`), tainted `ardiff.dev/real-node` while the process nodes still run the images it cannot."""
    nodes = [NodeSpec(f"node-{n}") for n in (1, 2)]
    if simulated:
        nodes.append(NodeSpec(SIMULATED_NODE, simulated=True, taints=(SIMULATED_TAINT,)))
    if real:
        nodes.append(NodeSpec(REAL_NODE, real=True, taints=(REAL_TAINT,)))
    return nodes


@dataclass
class DevCluster:
    """Control plane + kubelets + add-ons + Redis (+ operator); see the module docstring."""

    workdir: Path
    operator_command: Sequence[str] | None = None
    namespace: str = "default"
    install_crds: bool = True  # False: the caller installs them (as `helm install` does from the chart)
    nodes: Sequence[NodeSpec] = field(default_factory=default_nodes)
    worker_image: bool = True  # False: no worker venv (operator-only runs on simulated pods)
    operator_env: Mapping[str, str] = field(default_factory=dict)
    # True: the operator and its Redis are the chart's (`helm install` of charts/ardiff into `namespace`, its
    # StatefulSets' Pods on the nodes), as `ardiff up` and the demo run them (`operator_command` unused).
    chart: bool = False
    restart_backoff_seconds: float = 1.0
    # Given: used as they are, and left running (the tests' session claims the network and starts Redis
    # before the cluster, so that Redis binds the root namespace's cluster address).
    network: ClusterNetwork | None = None
    redis: RedisServer | None = None
    control_plane: ControlPlane | None = None
    operator: OperatorProcess | None = None
    kubelets: dict[str, ComponentProcess] = field(default_factory=dict)
    real_nodes: dict[str, RealNode] = field(default_factory=dict)
    provisioner: ComponentProcess | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _lock: SlotLock | None = None
    _owns_redis: bool = True

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def admin(self) -> Credentials:
        assert self.control_plane is not None, "the dev cluster is not started"
        assert self.control_plane.admin is not None, "the control plane is not started"
        return self.control_plane.admin

    @property
    def redis_url(self) -> str:
        """The placement store as this machine reaches it (with `chart`: the bundled Redis' Service)."""
        if self.chart:
            return self._chart_redis_url()
        assert self.redis is not None, "the dev cluster is not started"
        return self.redis.url

    @property
    def cluster_redis_url(self) -> str:
        """Redis as Pods reach it (the root namespace's address on the cluster network)."""
        assert self.redis is not None, "the dev cluster is not started"
        assert self.network is not None, "the dev cluster is not started"
        return self.redis.url_at(self.network.host_ip)

    def redis_url_for_pods(self, url: str) -> str:
        """A loopback Redis URL of this machine as the cluster's Pods reach it (the server must bind the root
        namespace's cluster address, as the session's and this cluster's own do)."""
        assert self.network is not None, "the dev cluster is not started"
        return url.replace("@127.0.0.1:", f"@{self.network.host_ip}:").replace(
            "//127.0.0.1:", f"//{self.network.host_ip}:"
        )

    def start(self) -> Self:
        """Start every part; on a failure the parts already started are stopped again."""
        self.workdir = self.workdir.resolve()  # kubeconfigs and flags name files by absolute path
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A cluster always starts empty: etcd's data, the nodes' Pods and the volumes of an earlier run (one
        # that crashed, say) would bring back objects bound to nodes and Pods that no longer exist.
        for previous in STATE_DIRS:
            shutil.rmtree(self.workdir / previous, ignore_errors=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self._owns_redis = self.redis is None
        try:
            if self.network is None:
                self.network, self._lock = self._stack.enter_context(claimed_network())
            binaries = ensure_kubernetes()
            images = build_image_table(CHECKOUT, binaries, worker=self.worker_image)
            images_file = self.workdir / "images.json"
            images_file.write_text(images.to_json())
            self.control_plane = ControlPlane(self.workdir / "control-plane", self.network, binaries).start()
            self.admin.write_kubeconfig(self.kubeconfig, self.namespace)
            for number, node in enumerate(self.nodes, start=1):
                self._start_kubelet(number, node, images_file)
            self._route_nodes()
            self.control_plane.apply(
                [
                    *addons.kube_proxy(self.network, self.control_plane.server),
                    *addons.coredns(self.network),
                    storage_class(),
                ]
            )
            self.provisioner = ComponentProcess(
                "provisioner",
                [
                    sys.executable,
                    "-m",
                    "ardiff.devcluster.provisioner",
                    str(self.kubeconfig),
                    str(self.workdir / "volumes"),
                ],
                self.network.control_plane_namespace,
                self.logs_dir / "provisioner.log",
            ).start()
            if self.install_crds:
                self.control_plane.apply(load_manifests())
                self.wait_crds()
            if self.namespace != "default":
                self.control_plane.apply(
                    [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}]
                )
            self.wait_dns()
            if self.chart:
                self.install_chart()
                return self
            if self.redis is None:
                self.redis = RedisServer(bind=("127.0.0.1", self.network.host_ip)).start()
            if self.operator_command is not None:
                self.operator = OperatorProcess(
                    self.operator_command,
                    kubeconfig=self.kubeconfig,
                    redis_url=self.redis.url,
                    namespace=self.namespace,
                    log_path=self.logs_dir / "operator.log",
                    env={"ARDIFF_WORKER_REDIS_URL": self.cluster_redis_url, **self.operator_env},
                ).start()
                self.operator.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def front_door_url(self) -> str:
        """The chart's front door as a client outside the cluster reaches it (issue 37): its NodePort on the
        first node's address (the real kube-proxy serves it on every node's)."""
        assert self.network is not None, "the dev cluster is not started"
        return f"http://{self.network.node_ip(1)}:{FRONT_DOOR_NODE_PORT}"

    def install_chart(self, timeout_seconds: int = 600) -> None:
        """`helm install ardiff charts/ardiff` into `namespace`, with the operator's periods from
        `operator_env` and the front door on a NodePort (`front_door_url`, every session's `status.url`);
        returns once its Pods are Ready (`--wait`)."""
        values = {
            "operator": {"extraEnv": [{"name": k, "value": v} for k, v in self.operator_env.items()]},
            "gateway": {
                "service": {"type": "NodePort", "nodePort": FRONT_DOOR_NODE_PORT},
                "publicURL": self.front_door_url,
            },
        }
        values_file = self.workdir / "chart-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("helm")),
                "upgrade",
                "--install",
                CHART_RELEASE,
                str(CHECKOUT / "charts" / "ardiff"),
                "--namespace",
                self.namespace,
                "--create-namespace",
                "--values",
                str(values_file),
                "--wait",
                "--timeout",
                f"{timeout_seconds}s",
            ],
            env={
                **os.environ,
                "KUBECONFIG": str(self.kubeconfig),
                "HELM_CONFIG_HOME": str(self.workdir / "helm"),
                "HELM_CACHE_HOME": str(self.workdir / "helm"),
                "HELM_DATA_HOME": str(self.workdir / "helm"),
            },
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"helm install of the chart failed: {done.stderr.strip()}")

    def _chart_redis_url(self) -> str:
        """The bundled Redis through its Service's ClusterIP (this machine routes the Service range)."""
        with self.admin.client() as client:
            secret = client.get(f"/api/v1/namespaces/{self.namespace}/secrets/{CHART_RELEASE}-redis").json()
            service = client.get(f"/api/v1/namespaces/{self.namespace}/services/{CHART_RELEASE}-redis").json()
        url = base64.b64decode(secret["data"]["url"]).decode()
        host = url.split("@", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        return url.replace(f"@{host}:", f"@{service['spec']['clusterIP']}:")

    def _start_kubelet(self, number: int, node: NodeSpec, images_file: Path) -> None:
        assert self.network is not None
        assert self.control_plane is not None
        if node.simulated:
            node_ip = str(self.network.underlay[200 + number])
            namespace = self.network.control_plane_namespace
        else:
            namespace = self.network.add_node(number)
            node_ip = self.network.node_ip(number)
        credentials = self.control_plane.node_credentials(node.name)
        serving = self.control_plane.kubelet_serving(node.name, node_ip)
        state = self.workdir / "nodes" / node.name
        if node.real:
            self._start_real_node(node, namespace, node_ip, state, credentials, serving)
            return
        config = KubeletConfig(
            node_name=node.name,
            node_number=0 if node.simulated else number,
            node_ip=node_ip,
            network_index=self.network.index,
            kubeconfig=str(credentials.write_kubeconfig(state / "kubeconfig")),
            serving_cert=str(serving.cert),
            serving_key=str(serving.key),
            ca=str(self.control_plane.ca.cert_path if self.control_plane.ca else ""),
            state_dir=str(state),
            images=str(images_file),
            cluster_dns=self.network.dns_ip,
            cluster_domain=CLUSTER_DOMAIN,
            api_service_host=self.network.api_service_ip,
            python=sys.executable,
            capacity={
                **(SIMULATED_NODE_CAPACITY if node.simulated else PROCESS_NODE_CAPACITY),
                **node.capacity,
            },
            labels={**({} if node.simulated else {PROCESS_NODE_LABEL: "true"}), **node.labels},
            taints=tuple(node.taints),
            simulated=node.simulated,
            restart_backoff_seconds=self.restart_backoff_seconds,
        )
        config_file = state / "kubelet.json"
        config_file.write_text(config.to_json())
        process = ComponentProcess(
            f"kubelet {node.name}",
            [sys.executable, "-m", "ardiff.devcluster.kubelet", str(config_file)],
            namespace,
            self.logs_dir / f"kubelet-{node.name}.log",
        ).start()
        self.kubelets[node.name] = process

    def _start_real_node(
        self,
        node: NodeSpec,
        namespace: str,
        node_ip: str,
        state: Path,
        credentials: Credentials,
        serving: KeyPair,
    ) -> None:
        assert self.network is not None
        assert self.control_plane is not None
        assert self.control_plane.ca is not None
        config = RealNodeConfig(
            name=node.name,
            network_index=self.network.index,
            namespace=namespace,
            node_ip=node_ip,
            kubeconfig=credentials.write_kubeconfig(state / "kubeconfig"),
            serving_cert=serving.cert,
            serving_key=serving.key,
            client_ca=self.control_plane.ca.cert_path,
            state_dir=state,
            cluster_dns=self.network.dns_ip,
            cluster_domain=CLUSTER_DOMAIN,
            labels=dict(node.labels),
            taints=tuple(node.taints),
        )
        self.control_plane.apply([KUBELET_API_ADMIN_BINDING])
        real = RealNode(config, ensure_kubernetes().kubelet, ensure_node_images(), self.logs_dir)
        self.real_nodes[node.name] = real.start()

    def _advertise_extended_resources(self, node: NodeSpec) -> None:
        with self.admin.client() as client:
            response = client.patch(
                f"/api/v1/nodes/{node.name}/status",
                json=extended_resources_patch(node.capacity),
                headers={"Content-Type": "application/json-patch+json"},
            )
            response.raise_for_status()

    def _route_nodes(self, timeout: float = 60) -> None:
        """Once every node has its pod CIDR: routes to each from the root namespace and from the other nodes
        (what a cloud's route controller does), and to the Service range through node 1's kube-proxy."""
        assert self.network is not None
        assert self.control_plane is not None
        network = self.network

        def cidrs() -> dict[str, tuple[str, str]] | None:
            for process in self.kubelets.values():
                process.check_running()
            with self.admin.client() as client:
                items = client.get("/api/v1/nodes").json()["items"]
            found = {
                n["metadata"]["name"]: (n["spec"].get("podCIDR", ""), n["status"]["addresses"][0]["address"])
                for n in items
                if n.get("spec", {}).get("podCIDR") and n.get("status", {}).get("addresses")
            }
            return found if len(found) == len(self.nodes) else None

        found = wait_until(cidrs, timeout=timeout, what="every node to register with a pod CIDR")
        for node in self.nodes:
            if node.real:
                self.real_nodes[node.name].write_network(found[node.name][0])
                self._advertise_extended_resources(node)
        process_nodes = [(n, number) for number, n in enumerate(self.nodes, start=1) if not n.simulated]
        for node, _ in process_nodes:
            cidr, node_ip = found[node.name]
            others = [network.node_namespace(m) for other, m in process_nodes if other is not node]
            network.route_node_cidr(
                cidr, node_ip, from_namespaces=[None, network.control_plane_namespace, *others]
            )
        if process_nodes:
            ip("route", "replace", str(network.service_cidr), "via", network.node_ip(process_nodes[0][1]))
        self.wait_nodes_ready(timeout)

    def wait_nodes_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            with self.admin.client() as client:
                items = client.get("/api/v1/nodes").json()["items"]
            return len(items) >= len(self.nodes) and all(condition_true(n, "Ready") for n in items)

        wait_until(ready, timeout=timeout, what="every node Ready")

    def wait_crds(self, timeout: float = 30) -> None:
        def established() -> bool:
            with self.admin.client() as client:
                items = client.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").json()["items"]
            return crds_established(items)

        wait_until(established, timeout=timeout, what="the CRDs Established")

    def wait_dns(self, timeout: float = 90) -> None:
        """Until kube-proxy runs on every process node and CoreDNS is Ready (Pods resolve Service names)."""
        if not any(not n.simulated for n in self.nodes):
            return

        def ready() -> bool:
            with self.admin.client() as client:
                daemonset = client.get("/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy").json()
                deployment = client.get("/apis/apps/v1/namespaces/kube-system/deployments/coredns").json()
            proxies = daemonset.get("status", {})
            return (
                proxies.get("numberReady", 0) >= 1
                and proxies.get("numberReady") == proxies.get("desiredNumberScheduled")
                and deployment.get("status", {}).get("readyReplicas", 0) >= 1
            )

        wait_until(ready, timeout=timeout, what="kube-proxy and CoreDNS ready", poll=0.3)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster, in its namespace unless `args` name one."""
        namespaced = any(a in ("-n", "--namespace", "-A", "--all-namespaces") for a in args)
        prefix = [] if namespaced else ["-n", self.namespace]
        return run_kubectl([*prefix, *args], kubeconfig=self.kubeconfig, stdin=stdin, check=check)

    def stop(self) -> None:
        """Operator first (it must not see Pods vanish), then the kubelets, the control plane, Redis and the
        network (which kills whatever still runs in its namespaces)."""
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        for process in self.kubelets.values():
            process.stop()
        self.kubelets.clear()
        for real in self.real_nodes.values():
            real.stop()
        self.real_nodes.clear()
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        if self.redis is not None and self._owns_redis:
            self.redis.stop()
            self.redis = None
        if self._lock is not None:
            self._stack.close()
            self.network = None
            self._lock = None

    def processes(self) -> list[int]:
        """The pids of every process the cluster runs itself: control plane, kubelets, provisioner, Redis (if
        its own) and operator (the Pods' run in the slot's namespaces, which `stop` and a reclaim empty)."""
        components = [
            *(self.control_plane.components if self.control_plane is not None else []),
            *self.kubelets.values(),
            *(
                c
                for real in self.real_nodes.values()
                for c in (real.containerd, real.kubelet)
                if c is not None
            ),
            *([self.provisioner] if self.provisioner is not None else []),
        ]
        pids = [c.process.pid for c in components if c.process is not None]
        if self.redis is not None and self._owns_redis and self.redis.process is not None:
            pids.append(self.redis.process.pid)
        if self.operator is not None and self.operator.pid is not None:
            pids.append(self.operator.pid)
        return sorted(pids)

    def sessions(self) -> KubeSessions:
        """The Python client's Kubernetes part, for this cluster's namespace."""
        from ardiff.client import KubeSessions

        return KubeSessions(self.namespace, kubeconfig=self.kubeconfig)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pod_pid(pod: Mapping[str, Any], container: str | None = None) -> int | None:
    """The pid of a Pod's container process (the kubelet's containerID is `process://<pid>`)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if container in (None, status["name"]) and "running" in status.get("state", {}):
            container_id = status.get("containerID", "")
            if container_id.startswith("process://"):
                return int(container_id.removeprefix("process://"))
    return None


def in_cidr(address: str, cidr: str) -> bool:
    return ipaddress.ip_address(address) in ipaddress.ip_network(cidr)


__all__ = ["OPERATOR_COMMAND", "DevCluster", "NodeSpec", "load_manifests", "pod_pid", "time"]
