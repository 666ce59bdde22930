"""The process kubelet: the one part of the dev cluster that is not Kubernetes' own (no container runtime runs
here), doing what a kubelet does for the control plane.

`python -m ardiff.devcluster.kubelet CONFIG` (a `KubeletConfig` JSON), in the node's network namespace:
- authenticates as `system:node:<name>` with its own client certificate (the Node authorizer and
  NodeRestriction judge every call; it holds no other credential);
- registers its Node (labels, taints; capacity and allocatable as configured — they may advertise more than
  this machine has, as kwok's nodes do), patches its status (conditions, addresses, daemon endpoint, node
  info) and renews its Lease in `kube-node-lease` every `LEASE_RENEW_SECONDS`;
- waits for the controller-manager's `spec.podCIDR`, then makes the node's pod bridge;
- watches the Pods the scheduler binds to it and runs each under a `PodWorker` (`pod_worker`), one process per
  container in the Pod's own network namespace;
- serves the kubelet API (`kubelet_server`) on <node IP>:10250 for `kubectl logs`.

`simulated: true` makes a node for control-plane scale runs: its Pods get an address from the CIDR but no
namespace or process (`simulated_pods`).
On SIGTERM it stops every container (their grace periods, at most `SHUTDOWN_GRACE_SECONDS`) and removes their
namespaces; the Node then goes NotReady when its Lease runs out, as a stopped kubelet's does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import itertools
import json
import logging
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from ardiff.devcluster.binaries import KUBERNETES_VERSION
from ardiff.devcluster.containers import now_rfc3339
from ardiff.devcluster.images import ImageTable
from ardiff.devcluster.kubeconfig import credentials_from_kubeconfig
from ardiff.devcluster.kubelet_server import KUBELET_PORT, serve_kubelet_api
from ardiff.devcluster.network import ClusterNetwork, NetworkError, short_pod_id
from ardiff.devcluster.pod_worker import PodWorker, Sandbox

log = logging.getLogger("ardiff.kubelet")

LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10.0
STATUS_SECONDS = 60.0
SHUTDOWN_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class KubeletConfig:
    """Everything a kubelet process is told (written as JSON by the dev cluster)."""

    node_name: str
    node_number: int  # the node's host on the cluster network (0: simulated, no namespace)
    node_ip: str
    network_index: int
    kubeconfig: str  # its system:node credentials
    serving_cert: str
    serving_key: str
    ca: str
    state_dir: str
    images: str  # the image table's JSON file
    cluster_dns: str
    cluster_domain: str
    api_service_host: str
    python: str
    capacity: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    simulated: bool = False
    restart_backoff_seconds: float = 10.0
    max_restart_backoff_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.restart_backoff_seconds <= 0:
            raise ValueError(
                f"kubelet restart_backoff_seconds must be > 0, got {self.restart_backoff_seconds}"
            )
        for resource in ("cpu", "memory", "pods"):
            if resource not in self.capacity:
                raise ValueError(f"kubelet capacity must name {resource}, got {dict(self.capacity)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Self:
        data = json.loads(text)
        data["taints"] = tuple(data.get("taints") or ())
        return cls(**data)


class Kubelet:
    """See the module docstring; `run()` until `stop` is set."""

    def __init__(self, config: KubeletConfig, api: httpx.AsyncClient) -> None:
        self.config = config
        self.api = api
        self.images = ImageTable.from_json(Path(config.images).read_text())
        self.network = ClusterNetwork(config.network_index)
        self.state_dir = Path(config.state_dir)
        self.workers: dict[str, PodWorker] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.pod_cidr: ipaddress.IPv4Network | None = None
        self._used_ips: dict[str, str] = {}  # pod uid -> address
        self._ip_lock = threading.Lock()
        self._deleting: set[asyncio.Future[None]] = set()  # final deletes of finished Pods in flight
        self.probe_client = httpx.AsyncClient(verify=False, follow_redirects=False)

    # --- the Node ------------------------------------------------------------------------------------------

    def _node_labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.config.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.config.labels,
        }

    def _node_status(self) -> dict[str, Any]:
        heartbeat = now_rfc3339()

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": heartbeat,
                "lastTransitionTime": self._started,
            }

        return {
            "capacity": dict(self.config.capacity),
            "allocatable": dict(self.config.capacity),
            "conditions": [
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
                ),
                condition(
                    "PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"
                ),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.config.node_ip},
                {"type": "Hostname", "address": self.config.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "nodeInfo": {
                "machineID": self._machine_id,
                "systemUUID": self._machine_id,
                "bootID": self._boot_id,
                "kernelVersion": _read("/proc/sys/kernel/osrelease"),
                "osImage": "ardiff dev cluster (process kubelet)",
                "containerRuntimeVersion": "process://ardiff-devcluster",
                "kubeletVersion": KUBERNETES_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self) -> None:
        self._started = now_rfc3339()
        self._machine_id = secrets.token_hex(16)
        self._boot_id = secrets.token_hex(16)
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.config.node_name, "labels": self._node_labels()},
            "spec": {"taints": [dict(t) for t in self.config.taints]} if self.config.taints else {},
        }
        reply = await self.api.post("/api/v1/nodes", json=body)
        if reply.status_code not in (201, 409):
            raise RuntimeError(f"registering node {self.config.node_name}: {reply.status_code} {reply.text}")
        await self.patch_node_status()

    async def patch_node_status(self) -> None:
        reply = await self.api.patch(
            f"/api/v1/nodes/{self.config.node_name}/status",
            content=json.dumps({"status": self._node_status()}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        if reply.status_code >= 400:
            log.warning("node status: %s %s", reply.status_code, reply.text[:300])

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_SECONDS)
            with contextlib.suppress(httpx.HTTPError):
                await self.patch_node_status()

    async def _lease_loop(self) -> None:
        """Renew the Lease the node-lifecycle controller reads (created owned by the Node)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.config.node_name}"
        while True:
            with contextlib.suppress(httpx.HTTPError):
                await self._renew_lease(path)
            await asyncio.sleep(LEASE_RENEW_SECONDS)

    async def _renew_lease(self, path: str) -> None:
        renew = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {
            "holderIdentity": self.config.node_name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": renew,
        }
        reply = await self.api.get(path)
        if reply.status_code == 404:
            node = (await self.api.get(f"/api/v1/nodes/{self.config.node_name}")).json()
            owner = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node["metadata"]["name"],
                "uid": node["metadata"]["uid"],
            }
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.config.node_name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }
            await self.api.post("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", json=lease)
            return
        lease = reply.json()
        lease["spec"] = {**lease.get("spec", {}), **spec}
        await self.api.put(path, json=lease)

    async def wait_pod_cidr(self) -> None:
        """The controller-manager's node-IPAM controller gives the Node its `spec.podCIDR`."""
        while True:
            node = (await self.api.get(f"/api/v1/nodes/{self.config.node_name}")).json()
            cidr = (node.get("spec") or {}).get("podCIDR")
            if cidr:
                self.pod_cidr = ipaddress.IPv4Network(cidr)
                if not self.config.simulated:
                    await asyncio.to_thread(self.network.node_bridge, self.config.node_number, cidr)
                return
            await asyncio.sleep(0.2)

    # --- pods ----------------------------------------------------------------------------------------------

    async def _pod_events(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """ADDED for every Pod bound here, then the watch's events; relists when the watch ends."""
        selector = {"fieldSelector": f"spec.nodeName={self.config.node_name}"}
        while True:
            try:
                listing = (await self.api.get("/api/v1/pods", params=selector)).json()
                seen = {p["metadata"]["uid"] for p in listing["items"]}
                for uid in [u for u in self.workers if u not in seen]:
                    yield "DELETED", self.workers[uid].pod
                for pod in listing["items"]:
                    yield "ADDED", pod
                version = listing["metadata"]["resourceVersion"]
                params = {**selector, "watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
                async with self.api.stream(
                    "GET", "/api/v1/pods", params=params, timeout=httpx.Timeout(10, read=330)
                ) as stream:
                    async for line in stream.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            yield event["type"], event["object"]
                        elif event["type"] == "ERROR":
                            break
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                log.info("pod watch interrupted (%s); listing again", exc)
                await asyncio.sleep(0.5)

    async def _pod_loop(self) -> None:
        async for kind, pod in self._pod_events():
            self.observe(kind, pod)

    def observe(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.deleted = True
                worker.update(
                    {
                        **pod,
                        "metadata": {
                            **pod["metadata"],
                            "deletionTimestamp": now_rfc3339(),
                            "deletionGracePeriodSeconds": 0,
                        },
                    }
                )
            return
        if worker is not None:
            worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            if pod["metadata"].get("deletionTimestamp"):
                self._deleting.add(task := asyncio.ensure_future(self.delete_pod(pod)))
                task.add_done_callback(self._deleting.discard)
            return
        worker = PodWorker(
            self,
            pod,
            self.state_dir / "pods" / f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_{uid}",
        )
        if pod["metadata"].get("deletionTimestamp"):
            worker.terminating.set()
        self.workers[uid] = worker
        task = asyncio.create_task(
            worker.run(), name=f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}"
        )
        self.tasks[uid] = task
        task.add_done_callback(lambda t, uid=uid: self._forget(uid, t))

    def _forget(self, uid: str, task: asyncio.Task[None]) -> None:
        self.workers.pop(uid, None)
        self.tasks.pop(uid, None)
        with self._ip_lock:
            self._used_ips.pop(uid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("pod worker %s failed", uid, exc_info=task.exception())

    async def delete_pod(self, pod: Mapping[str, Any]) -> None:
        """The kubelet's final delete: grace 0, only this incarnation (uid precondition)."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        with contextlib.suppress(httpx.HTTPError):
            await self.api.request(
                "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", json=body
            )

    async def post_event(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool) -> None:
        meta = pod["metadata"]
        stamp = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.config.node_name},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self.config.node_name,
        }
        with contextlib.suppress(httpx.HTTPError):
            await self.api.post(f"/api/v1/namespaces/{meta['namespace']}/events", json=event)

    def allocate_ip(self, uid: str) -> str:
        """The next free address of the node's pod CIDR (the bridge holds the first). Sandboxes are made on
        threads, several at once: the lock keeps two Pods from one address."""
        assert self.pod_cidr is not None
        with self._ip_lock:
            if uid in self._used_ips:
                return self._used_ips[uid]
            used = set(self._used_ips.values())
            for host in itertools.islice(self.pod_cidr.hosts(), 1, None):
                if str(host) not in used:
                    self._used_ips[uid] = str(host)
                    return str(host)
        raise NetworkError(f"node {self.config.node_name}: no address left in {self.pod_cidr}")

    def make_sandbox(self, worker: PodWorker) -> Sandbox:
        """The Pod's network namespace (the node's for hostNetwork) and its /etc files (runs on a thread)."""
        etc = worker.directory / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        if worker.host_network:
            namespace, address = None, self.config.node_ip
        else:
            assert self.pod_cidr is not None
            address = self.allocate_ip(worker.uid)
            short_id = short_pod_id(worker.uid)
            self.network.remove_pod(short_id)  # what a crashed kubelet left for this Pod
            namespace = self.network.add_pod(
                self.config.node_number, short_id, address, str(self.pod_cidr)
            ).namespace
            for sysctl in (worker.pod["spec"].get("securityContext") or {}).get("sysctls") or []:
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        namespace,
                        "sysctl",
                        "-q",
                        "-w",
                        f"{sysctl['name']}={sysctl['value']}",
                    ],
                    check=True,
                )
        spec = worker.pod["spec"]
        hostname = spec.get("hostname") or worker.name
        fqdn = (
            f"{hostname}.{spec['subdomain']}.{worker.namespace}.svc.{self.config.cluster_domain}"
            if spec.get("subdomain")
            else ""
        )
        hosts = [
            "# Kubernetes-managed hosts file.",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            f"{address}\t{fqdn + chr(9) if fqdn else ''}{hostname}",
        ]
        hosts += [f"{a['ip']}\t{' '.join(a['hostnames'])}" for a in spec.get("hostAliases") or []]
        (etc / "hosts").write_text("\n".join(hosts) + "\n")
        (etc / "hostname").write_text(hostname + "\n")
        (etc / "resolv.conf").write_text(self._resolv_conf(worker))
        return Sandbox(namespace, address, etc)

    def _resolv_conf(self, worker: PodWorker) -> str:
        spec = worker.pod["spec"]
        policy = spec.get("dnsPolicy", "ClusterFirst")
        cluster = policy == "ClusterFirstWithHostNet" or (
            policy == "ClusterFirst" and not worker.host_network
        )
        lines: list[str] = []
        if cluster:
            domain = self.config.cluster_domain
            ns = worker.namespace
            lines = [
                f"search {ns}.svc.{domain} svc.{domain} {domain}",
                f"nameserver {self.config.cluster_dns}",
                "options ndots:5",
            ]
        elif policy == "Default":
            lines = [line for line in _read("/etc/resolv.conf").splitlines() if line.strip()]
        config = spec.get("dnsConfig") or {}
        lines += [f"nameserver {n}" for n in config.get("nameservers") or []]
        if config.get("searches"):
            lines.append("search " + " ".join(config["searches"]))
        if config.get("options"):
            lines.append(
                "options "
                + " ".join(
                    o["name"] + (f":{o['value']}" if o.get("value") else "") for o in config["options"]
                )
            )
        return "\n".join(lines) + "\n"

    def remove_sandbox(self, worker: PodWorker) -> None:
        if not worker.host_network and not self.config.simulated:
            self.network.remove_pod(short_pod_id(worker.uid))

    # --- running -------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        await self.wait_pod_cidr()
        server = None if self.config.simulated else await serve_kubelet_api(self)
        loops = [
            asyncio.create_task(loop) for loop in (self._lease_loop(), self._status_loop(), self._pod_loop())
        ]
        log.info("node %s ready (pod CIDR %s)", self.config.node_name, self.pod_cidr)
        await stop.wait()
        for loop in loops:
            loop.cancel()
        await self.shutdown()
        if server is not None:
            await server.cleanup()
        await self.probe_client.aclose()

    async def shutdown(self) -> None:
        """Stop every Pod's containers (each within its grace period, capped) and remove its namespace."""
        for worker in self.workers.values():
            worker.deleted = True  # nothing more is reported: the Pods stay as they are in the API
            grace = min(worker.grace_seconds(), SHUTDOWN_GRACE_SECONDS)
            worker.pod["metadata"]["deletionGracePeriodSeconds"] = grace
            worker.terminating.set()
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=SHUTDOWN_GRACE_SECONDS + 5)


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text().strip()
    return ""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the dev cluster's process kubelet")
    parser.add_argument("config", type=Path, help="a KubeletConfig JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = KubeletConfig.from_json(args.config.read_text())

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        credentials = credentials_from_kubeconfig(Path(config.kubeconfig))
        async with credentials.async_client(timeout=30) as api:
            await Kubelet(config, api).run(stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
