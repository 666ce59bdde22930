"""The operator tier: the real operator process (`ardiff operator run`, started as the dev cluster starts it:
`ardiff.devcluster.operator_process.OperatorProcess`), the session's real cluster (its kubelets run the worker
Pods the operator creates), real Redis, and worker Pods running the real worker app over the fake runtime.

Every test gets its own namespace (`kube_namespace`) and its own operator watching only that namespace
(the default, namespaced mode). `Cluster` is a small synchronous client (the cluster's admin) with the waits
the tests need, a test's own Redis that Pods reach (`redis_server`) and a shared suspend tier on a real
volume (`shared_tier`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ardiff.devcluster.cluster import OPERATOR_COMMAND, SIMULATED_NODE, DevCluster, pod_pid
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import condition_true, wait_until

GROUP_PATH = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}"
MERGE = {"Content-Type": "application/merge-patch+json"}
# Short periods so that the tier stays within a few minutes.
OPERATOR_ENV = {
    "ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5",
    "ARDIFF_OPERATOR_MIRROR_SECONDS": "1",
    "ARDIFF_OPERATOR_CANCELLATION_POLLING_SECONDS": "0.5",
}
# A pool is finalized once its pods have terminated, which may take their grace period (30 s).
POOL_FINALIZE_SECONDS = 60
# A new worker Pod to Ready on the process kubelet: scheduling, its network namespace and overlay, the worker
# image's start (the fake runtime's imports), then the first startup probe that passes (period 5 s; the old
# pod runner's Pods were Ready within about a second). Measured from the Pod's creationTimestamp to its Ready
# condition's lastTransitionTime over 46 worker Pods of this tier (2 shared cores, load 1-7): 5 s for 25, 6 s
# for 20, 12 s for one whose first probe failed. A wait that includes a new Pod allows 45 s.
POD_READY_SECONDS = 45
# A suspend tier the workers of a pool share (issue 12): where its claim is mounted in their containers.
SHARED_TIER_MOUNT = "/var/lib/ardiff/tier"
# Worker Pods: the real worker app over the fake runtime, short leases so that a dead pod is noticed fast.
FAKE_WORKER_ENV = [
    {"name": "ARDIFF_RUNTIME", "value": "fake"},
    {"name": "ARDIFF_FAKE_CAPACITY", "value": "2"},
    {"name": "ARDIFF_LEASE_SECONDS", "value": "3"},
    {"name": "ARDIFF_HEARTBEAT_SECONDS", "value": "0.5"},
]


@dataclass(frozen=True)
class SharedTier:
    """A ReadWriteMany claim (the cluster's default StorageClass) for a pool's shared suspend tier: the pool
    spec fragment that mounts it (`volumes`, `volumeMounts`), the workers' env entry that names the mount
    (`ARDIFF_SUSPEND_DIR`), and its bound PersistentVolume's directory on this machine (`host_path`), where a
    test counts the tier's files."""

    pool_spec: dict[str, Any]
    env: dict[str, str]
    host_path: Path


@dataclass
class Cluster:
    """The test's namespace on the session's cluster, through HTTP as its admin."""

    kube: DevCluster
    namespace: str
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = self.kube.admin.client(timeout=10)

    # --- objects ---------------------------------------------------------------------------------------

    def _path(self, plural: str, name: str | None = None, core: bool = False) -> str:
        base = f"/api/v1/namespaces/{self.namespace}" if core else GROUP_PATH.format(ns=self.namespace)
        return f"{base}/{plural}" + (f"/{name}" if name else "")

    def create_pool(
        self, name: str = "pool", *, finalizers: Sequence[str] = (), **spec: Any
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionWorkerPool",
            "metadata": {"name": name, **({"finalizers": list(finalizers)} if finalizers else {})},
            "spec": {
                "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
                "image": "ghcr.io/ardiff/ardiff-worker:test",
                "env": FAKE_WORKER_ENV,
                "replicas": {"min": 1, "max": 1},
                "scaleDownDelaySeconds": 1,
                "eviction": {"minIdleSeconds": 0},
                **spec,
            },
        }
        response = self.http.post(self._path("ardiffusionworkerpools"), json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def create_session(
        self, name: str, pool: str = "pool", *, finalizers: Sequence[str] = (), **spec: Any
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionSession",
            "metadata": {"name": name, **({"finalizers": list(finalizers)} if finalizers else {})},
            "spec": {"poolRef": pool, "prompt": f"the world of {name}", **spec},
        }
        response = self.http.post(self._path("ardiffusionsessions"), json=body)
        assert response.status_code == 201, response.text
        return response.json()

    def get(self, plural: str, name: str, core: bool = False) -> dict[str, Any] | None:
        response = self.http.get(self._path(plural, name, core))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def patch_spec(self, plural: str, name: str, spec: dict[str, Any]) -> httpx.Response:
        """Merge-patch an object's spec (a list, like `env`, is replaced as a whole); the answer, whatever it
        is."""
        return self.http.patch(self._path(plural, name), json={"spec": spec}, headers=MERGE)

    def patch_pool_spec(self, spec: dict[str, Any], name: str = "pool") -> dict[str, Any]:
        """Merge-patch the pool's spec, which must be accepted."""
        response = self.patch_spec("ardiffusionworkerpools", name, spec)
        assert response.status_code == 200, response.text
        return response.json()

    def pool_condition(self, condition: str, name: str = "pool") -> dict[str, Any]:
        found = [c for c in self.pool_status(name).get("conditions") or [] if c["type"] == condition]
        return found[0] if found else {}

    def delete(self, plural: str, name: str, core: bool = False) -> None:
        response = self.http.delete(self._path(plural, name, core))
        assert response.status_code in (200, 202, 404), response.text

    def items(self, plural: str, core: bool = False) -> list[dict[str, Any]]:
        response = self.http.get(self._path(plural, core=core))
        response.raise_for_status()
        return response.json()["items"]

    def session(self, name: str) -> dict[str, Any]:
        found = self.get("ardiffusionsessions", name)
        assert found is not None, f"session {name} does not exist"
        return found

    def status(self, name: str) -> dict[str, Any]:
        return self.session(name).get("status") or {}

    def pool_status(self, name: str = "pool") -> dict[str, Any]:
        found = self.get("ardiffusionworkerpools", name)
        assert found is not None, f"pool {name} does not exist"
        return found.get("status") or {}

    def pods(self, pool: str = "pool") -> list[dict[str, Any]]:
        return [
            p
            for p in self.items("pods", core=True)
            if p["metadata"].get("labels", {}).get("ardiffusion.dev/pool") == pool
        ]

    def pod_names(self, pool: str = "pool") -> set[str]:
        return {p["metadata"]["name"] for p in self.pods(pool) if not p["metadata"].get("deletionTimestamp")}

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.items("events", core=True) if reason is None or e.get("reason") == reason]

    def shared_tier(self, claim: str = "shared-tier", timeout: float = 30) -> SharedTier:
        """A new ReadWriteMany claim in the test's namespace, once bound (see `SharedTier`)."""
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        response = self.http.post(self._path("persistentvolumeclaims", core=True), json=body)
        assert response.status_code == 201, response.text

        def bound() -> str | None:
            found = self.get("persistentvolumeclaims", claim, core=True) or {}
            phase = (found.get("status") or {}).get("phase")
            return found["spec"].get("volumeName") if phase == "Bound" else None

        volume_name = wait_until(bound, timeout=timeout, what=f"claim {claim} bound")
        volume = self.http.get(f"/api/v1/persistentvolumes/{volume_name}")
        volume.raise_for_status()
        return SharedTier(
            pool_spec={
                "volumes": [{"name": "shared-tier", "persistentVolumeClaim": {"claimName": claim}}],
                "volumeMounts": [{"name": "shared-tier", "mountPath": SHARED_TIER_MOUNT}],
            },
            env={"name": "ARDIFF_SUSPEND_DIR", "value": SHARED_TIER_MOUNT},
            host_path=Path(volume.json()["spec"]["hostPath"]["path"]),
        )

    def redis_server(self, **options: Any) -> RedisServer:
        """A redis-server of the test's own (not started yet) that the cluster's Pods reach too: it binds
        loopback and the root namespace's cluster address (`DevCluster.redis_url_for_pods`)."""
        assert self.kube.network is not None, "the dev cluster is not started"
        return RedisServer(bind=("127.0.0.1", self.kube.network.host_ip), **options)

    def kill(self, pod: str, sig: int) -> int:
        """Signal a worker Pod's container process (as `kill -9` on its node would); its pid."""
        found = self.get("pods", pod, core=True)
        pid = None if found is None else pod_pid(found)
        assert pid is not None, f"pod {pod} has no running container: {found and found.get('status')}"
        os.kill(pid, sig)
        return pid

    def pod_log(self, pod: str, previous: bool = False) -> str:
        """`kubectl logs`: the API server asks the Pod's kubelet."""
        reply = self.http.get(
            self._path("pods", pod, core=True) + "/log", params={"previous": str(previous).lower()}
        )
        reply.raise_for_status()
        return reply.text

    def token(self, session: str) -> str:
        secret = self.get("secrets", f"{session}-token", core=True)
        assert secret is not None, f"session {session} has no token secret"
        return base64.b64decode(secret["data"]["token"]).decode()

    def ticked_session(self, name: str) -> dict[str, Any]:
        """A pool (the defaults) with session `name`, Ready and ticked once (chunk 0); its Ready status."""
        self.create_pool()
        self.create_session(name)
        status = self.wait_phase(name, "Ready")
        assert self.tick(name, 0).status_code == 200
        return status

    def delete_all(self) -> None:
        """Delete the test's sessions and pools and wait until they are finalized (an operator must run)."""
        for plural in ("ardiffusionsessions", "ardiffusionworkerpools"):
            for item in self.items(plural):
                self.delete(plural, item["metadata"]["name"])
        wait_until(
            lambda: not self.items("ardiffusionsessions") and not self.items("ardiffusionworkerpools"),
            timeout=POOL_FINALIZE_SECONDS,
            what="the test's custom resources to be finalized",
        )

    # --- the operator ----------------------------------------------------------------------------------

    def operator(
        self,
        redis_url: str,
        log_path: Path,
        command: Sequence[str] = OPERATOR_COMMAND,
        env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> OperatorProcess:
        """`ardiff operator run` (standalone by default) for this namespace, with `env` over OPERATOR_ENV, as
        the cluster's admin unless `kubeconfig` names another identity; not started yet. Its worker Pods get
        `redis_url` at the address Pods reach."""
        worker_redis = {"ARDIFF_WORKER_REDIS_URL": self.kube.redis_url_for_pods(redis_url)}
        return OperatorProcess(
            command,
            kubeconfig=kubeconfig or self.kube.kubeconfig,
            redis_url=redis_url,
            namespace=self.namespace,
            log_path=log_path,
            env={**OPERATOR_ENV, **worker_redis, **(env or {})},
        )

    # --- waits -----------------------------------------------------------------------------------------

    def wait_phase(
        self, name: str, phase: str, timeout: float = POD_READY_SECONDS, **fields: Any
    ) -> dict[str, Any]:
        def matches() -> dict[str, Any] | None:
            status = self.status(name)
            ok = status.get("phase") == phase and all(status.get(k) == v for k, v in fields.items())
            return status if ok else None

        return wait_until(matches, timeout=timeout, what=f"session {name} {phase} {fields or ''}".strip())

    def wait_gone(self, plural: str, name: str, timeout: float = 30, core: bool = False) -> None:
        wait_until(
            lambda: self.get(plural, name, core) is None, timeout=timeout, what=f"{plural}/{name} gone"
        )

    def wait_pods(self, count: int, pool: str = "pool", timeout: float = POD_READY_SECONDS) -> set[str]:
        """Wait until the pool has exactly `count` Pods, all Ready (or none)."""

        def settled() -> set[str] | None:
            pods = [p for p in self.pods(pool) if not p["metadata"].get("deletionTimestamp")]
            ready = [p for p in pods if condition_true(p, "Ready")]
            names = {p["metadata"]["name"] for p in ready}
            return names if len(pods) == len(ready) == count and (names or count == 0) else None

        return (
            wait_until(settled, timeout=timeout, what=f"{count} ready pods in pool {pool}")
            if count
            else set()
        )

    def worker_session(self, session: str, endpoint: str) -> httpx.Response:
        """The worker's own view of the session (`GET /v1/sessions/{id}` with the session's token)."""
        return self.http.get(
            f"{endpoint}/v1/sessions/{session}", headers={"Authorization": f"Bearer {self.token(session)}"}
        )

    def tick(self, session: str, chunk_index: int, **body: Any) -> httpx.Response:
        status = self.status(session)
        payload = {"request_id": f"{session}-{chunk_index}", "chunk_index": chunk_index, **body}
        return self.http.post(
            f"{status['endpoint']}/v1/sessions/{session}/ticks",
            json=payload,
            headers={"Authorization": f"Bearer {self.token(session)}"},
            timeout=30,
        )


@pytest.fixture
def cluster(dev_cluster: DevCluster, kube_namespace: str) -> Iterator[Cluster]:
    client = Cluster(dev_cluster, kube_namespace)
    yield client
    client.http.close()


# A pool pins its Pods to the session's simulated node (registered in Redis, Ready, no process) with these.
# Their fake workers' capacity, as the Pods' env (the simulated node registers that many slots per Pod).
SIMULATED_ENV = [
    {"name": "ARDIFF_RUNTIME", "value": "fake"},
    {"name": "ARDIFF_FAKE_CAPACITY", "value": "2"},
]
SIMULATED_PLACEMENT = {
    "nodeSelector": {"kubernetes.io/hostname": SIMULATED_NODE},
    "tolerations": [{"key": "ardiff.dev/simulated", "operator": "Exists", "effect": "NoSchedule"}],
}


@contextlib.contextmanager
def serving(cluster: Cluster, process: OperatorProcess) -> Iterator[OperatorProcess]:
    """`process` started and serving; afterwards the cluster's test objects are deleted through it first
    (started again if the test stopped it: its finalizers run and its Redis keys go), then it stops. Its log
    is printed (shown when a test fails)."""
    process.start().wait_ready()
    try:
        yield process
    finally:
        if not process.running:
            process.start()
        try:
            cluster.delete_all()
        finally:
            process.stop()
            sys.stdout.write(f"\n----- operator log ({process.log_path}) -----\n{process.log()[-20000:]}\n")


@pytest.fixture
def operator_process(cluster: Cluster, redis_url: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator for the test's namespace, serving (`serving`)."""
    with serving(cluster, cluster.operator(redis_url, tmp_path / "operator.log")) as process:
        yield process


def peering_state(process: OperatorProcess) -> str:
    """What kopf last logged about peering: `active` (resumed), `paused`, or `` (nothing yet)."""
    state = ""
    for line in process.log().splitlines():
        if "Resuming operations" in line:
            state = "active"
        elif "Pausing operations" in line:
            state = "paused"
    return state


@dataclass
class Peering:
    """A namespaced KopfPeering (`ardiff`) of the test's namespace, made at once, and operators in it, each
    with its priority and the peering lifetime given."""

    cluster: Cluster
    redis_url: str
    logs: Path
    lifetime_seconds: int

    def __post_init__(self) -> None:
        body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "ardiff"}}
        assert self.cluster.http.post(self.path, json=body).status_code == 201

    @property
    def path(self) -> str:
        return f"/apis/kopf.dev/v1/namespaces/{self.cluster.namespace}/kopfpeerings"

    def operator(
        self, name: str, priority: int, kubeconfig: Path | None = None, env: Mapping[str, str] | None = None
    ) -> OperatorProcess:
        """An operator of the peering (not started), its log `<name>.log`."""
        command = ("ardiff", "operator", "run", "--peering", "ardiff", "--priority", str(priority))
        lifetime = {"ARDIFF_OPERATOR_PEERING_LIFETIME_SECONDS": str(self.lifetime_seconds)}
        return self.cluster.operator(
            self.redis_url,
            self.logs / f"{name}.log",
            command,
            env={**lifetime, **(env or {})},
            kubeconfig=kubeconfig,
        )

    def peers(self) -> dict[int, int]:
        """Each peer's priority and lifetime, as the peering's status lists them."""
        status = self.cluster.http.get(f"{self.path}/ardiff").json().get("status") or {}
        return {peer["priority"]: peer["lifetime"] for peer in status.values()}
