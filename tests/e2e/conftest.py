"""The end-to-end tier: the session's real cluster, and per module a namespace with its own Redis and the real
operator (a process of this machine, as the dev cluster runs it) whose worker Pods the kubelets run from the
worker image (`ardiff worker serve` in its own network namespace), driven through the Python client and the
real kubectl.

A module shares one stack (workers are expensive: ~15 s to import vllm-omni, ~1 GB each); its tests create
their own sessions with `stack.session(...)`, which are deleted (and waited for) when the test ends. A
module's Redis is its own, so a test may restart it (every key lost) without touching another module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from ardiff.client import KubeSessions, SessionClient
from ardiff.devcluster.bench_target import BenchTarget
from ardiff.devcluster.cluster import OPERATOR_COMMAND, DevCluster, pod_pid
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pools import pool_pods, transfer_token, worker_sessions
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import condition_true
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.worker.net import free_port

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]


def restore_default_sigint() -> None:
    """A child's `preexec_fn`: SIGINT at its default, as in a terminal. A test runner started in the
    background of a non-interactive shell ignores SIGINT, and a child would inherit that and miss a Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Short periods keep the tier within its budget; a dead worker is noticed within a few seconds.
OPERATOR_ENV = {
    "ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5",
    "ARDIFF_OPERATOR_MIRROR_SECONDS": "1",
    "ARDIFF_OPERATOR_CANCELLATION_POLLING_SECONDS": "0.5",
}


@dataclass
class Stack:
    """A module's namespace on the session's cluster with one pool, its Redis and its operator, and what the
    tests need to look at them."""

    kube: DevCluster
    namespace: str
    redis: RedisServer
    operator: OperatorProcess
    pool: str
    metrics_url: str | None = None  # the operator's, when the stack was made with `metrics`
    sessions: KubeSessions = field(init=False)
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sessions = KubeSessions(self.namespace, kubeconfig=self.kube.kubeconfig)

    def bench_target(self) -> BenchTarget:
        """The stack as a benchmark's target (their smoke runs share the test session's cluster)."""
        return BenchTarget(
            self.kube, self.namespace, self.pool, self.redis, self.operator, self.sessions, self.metrics_url
        )

    @property
    def pool_id(self) -> PoolId:
        return PoolId(self.namespace, self.pool)

    @property
    def redis_url(self) -> str:
        return self.redis.url

    # --- Kubernetes -------------------------------------------------------------------------------------

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> Any:
        """kubectl in the stack's namespace (unless `args` name one)."""
        namespaced = any(a in ("-n", "--namespace", "-A", "--all-namespaces") for a in args)
        return self.kube.kubectl(
            *([] if namespaced else ["-n", self.namespace]), *args, stdin=stdin, check=check
        )

    def api(self, path: str) -> Any:
        with self.kube.admin.client(timeout=10) as client:
            response = client.get(path)
        response.raise_for_status()
        return response.json()

    def pods(self) -> dict[str, dict[str, Any]]:
        """The pool's worker Pods that are not being deleted, by name."""
        return pool_pods(self.kube.admin, self.namespace, self.pool)

    def ready_pods(self) -> set[str]:
        return {name for name, pod in self.pods().items() if condition_true(pod, "Ready")}

    def session(self, name: str, **spec: Any) -> str:
        """Create a session on the pool; it is deleted when the test ends."""
        self.sessions.create(name, pool=self.pool, prompt=spec.pop("prompt", f"the world of {name}"), **spec)
        self.created.append(name)
        return name

    def connect(self, name: str, timeout: float = 240) -> SessionClient:
        return self.sessions.connect(name, timeout=timeout)

    def phase(self, name: str) -> str | None:
        return self.sessions.status(name).get("phase")

    def delete_created(self) -> None:
        for name in self.created:
            self.sessions.delete(name)
        for name in self.created:
            self.sessions.delete(name, wait=True, timeout=60)
        self.created.clear()

    # --- Redis and workers ------------------------------------------------------------------------------

    def placement(self, use: Callable[[PlacementStore], Coroutine[Any, Any, T]]) -> T:
        """Run `use(store)` against the cluster's Redis (a fresh client: Redis may have restarted)."""

        async def run() -> T:
            async with PlacementStore.from_url(self.redis.url) as store:
                return await use(store)

        return asyncio.run(run())

    def invariants(self) -> list[str]:
        return self.placement(lambda store: store.check_invariants(self.pool_id))

    def worker(self, pod: str) -> dict[str, Any]:
        """The worker's `GET /v1/sessions` at the Pod's address, with the pool's transfer token (the sessions
        are named only to it)."""
        return worker_sessions(self.pods()[pod], transfer_token(self.kube.admin, self.namespace, self.pool))

    def restart_count(self, pod: str) -> int:
        return self.pods()[pod]["status"]["containerStatuses"][0]["restartCount"]

    def kill(self, pod: str, sig: int) -> int:
        """Signal a worker Pod's container process (`kill -9` on its node); its pid."""
        pid = pod_pid(self.pods()[pod])
        assert pid is not None, f"pod {pod} has no running container"
        os.kill(pid, sig)
        return pid

    def diagnostics(self) -> str:
        parts = [f"----- operator\n{self.operator.log()[-6000:]}"]
        for name in self.pods():
            with contextlib.suppress(httpx.HTTPError):
                with self.kube.admin.client(timeout=10) as client:
                    log = client.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}/log").text
                parts.append(f"----- pod {name}\n{log[-6000:]}")
        return "\n".join(parts)


@contextlib.contextmanager
def running_stack(
    kube: DevCluster,
    namespace: str,
    workdir: Path,
    pool: dict[str, Any],
    *,
    claims: Sequence[dict[str, Any]] = (),
    operator_env: dict[str, str] | None = None,
    metrics: bool = False,
) -> Iterator[Stack]:
    """`namespace` on the session's cluster with its own Redis, the operator (serving its metrics with
    `metrics`: `Stack.metrics_url`), `claims` and `pool` applied; on exit the pool and the namespace are
    deleted (its Pods stopped by their kubelets), the operator and Redis stopped."""
    network = kube.network
    assert network is not None
    assert kube.control_plane is not None
    kube.control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])
    with kube.admin.client() as client:
        for claim in claims:
            client.post(
                f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", json=claim
            ).raise_for_status()
    with RedisServer(bind=("127.0.0.1", network.host_ip)) as redis:
        metrics_url = f"http://127.0.0.1:{free_port()}/metrics" if metrics else None
        operator = OperatorProcess(
            (*OPERATOR_COMMAND, "--metrics", metrics_url) if metrics_url else OPERATOR_COMMAND,
            kubeconfig=kube.kubeconfig,
            redis_url=redis.url,
            namespace=namespace,
            log_path=workdir / "operator.log",
            env={
                **OPERATOR_ENV,
                "ARDIFF_WORKER_REDIS_URL": redis.url_at(network.host_ip),
                **(operator_env or {}),
            },
        ).start()
        try:
            operator.wait_ready()
            stack = Stack(kube, namespace, redis, operator, pool["metadata"]["name"], metrics_url)
            stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pool))
            yield stack
        finally:
            pools = f"/apis/ardiffusion.dev/v1alpha1/namespaces/{namespace}/ardiffusionworkerpools"
            with kube.admin.client() as client:
                client.delete(f"{pools}/{pool['metadata']['name']}")
            operator.stop()
            with kube.admin.client() as client:
                client.delete(f"/api/v1/namespaces/{namespace}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _delete_created_sessions(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test of a module with a `stack`: its sessions are deleted; its logs shown if it failed."""
    yield
    if "stack" not in request.fixturenames:
        return
    stack: Stack = request.getfixturevalue("stack")
    if request.node.stash.get(_FAILED, False):
        print(stack.diagnostics())
    stack.delete_created()
