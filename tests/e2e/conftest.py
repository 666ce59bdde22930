"""The end-to-end tier: the local cluster (`DevCluster`: emulated API, real Redis, the real operator, worker
Pods run as local `ardiff worker serve` processes), driven through the Python client and the real kubectl.

A module shares one cluster (workers are expensive: ~15 s to import vllm-omni, ~1 GB each); its tests create
their own sessions with `stack.session(...)`, which are deleted (and waited for) when the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from ardiff.client import KubeSessions, SessionClient
from ardiff.devcluster.cluster import OPERATOR_COMMAND, DevCluster, tiny_pool
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e"
# Short periods keep the tier within its budget; a dead worker is noticed within a few seconds.
OPERATOR_ENV = {
    "ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5",
    "ARDIFF_OPERATOR_MIRROR_SECONDS": "1",
    "ARDIFF_OPERATOR_CANCELLATION_POLLING_SECONDS": "0.5",
}
WORKER_LEASE_ENV = [
    {"name": "ARDIFF_LEASE_SECONDS", "value": "5"},
    {"name": "ARDIFF_HEARTBEAT_SECONDS", "value": "1"},
]


def build_pool(
    name: str, *, capacity: int, min_replicas: int, max_replicas: int, fake: bool
) -> dict[str, Any]:
    """A pool of the tiny model at 64x64 (or of the fake runtime) with short worker leases."""
    env = [*WORKER_LEASE_ENV]
    if fake:
        env += [
            {"name": "ARDIFF_RUNTIME", "value": "fake"},
            {"name": "ARDIFF_FAKE_CAPACITY", "value": str(capacity)},
            {"name": "ARDIFF_TEST_FAULTS", "value": "1"},
        ]
    return tiny_pool(
        name,
        capacity=capacity,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        scale_down_delay_seconds=3600,  # pods stay for the whole module
        env=env,
    )


@dataclass
class Stack:
    """A running dev cluster with one pool, and what the tests need to look at it."""

    cluster: DevCluster
    pool: str
    sessions: KubeSessions = field(init=False)
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sessions = self.cluster.sessions()

    @property
    def pool_id(self) -> PoolId:
        return PoolId(NAMESPACE, self.pool)

    # --- Kubernetes -------------------------------------------------------------------------------------

    def api(self, path: str) -> Any:
        response = httpx.get(f"{self.cluster.api_url}{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def pods(self) -> dict[str, dict[str, Any]]:
        """The pool's worker Pods that are not being deleted, by name."""
        items = self.api(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        return {
            p["metadata"]["name"]: p
            for p in items
            if p["metadata"].get("labels", {}).get("ardiffusion.dev/pool") == self.pool
            and not p["metadata"].get("deletionTimestamp")
        }

    def ready_pods(self) -> set[str]:
        return {
            name
            for name, pod in self.pods().items()
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
        }

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
            async with PlacementStore.from_url(self.cluster.redis_url) as store:
                return await use(store)

        return asyncio.run(run())

    def invariants(self) -> list[str]:
        return self.placement(lambda store: store.check_invariants(self.pool_id))

    def worker(self, pod: str) -> dict[str, Any]:
        """The worker's `GET /v1/sessions` (capacity, admitted sessions, KV blocks)."""
        info = self.cluster.runner.info(pod, NAMESPACE) if self.cluster.runner else None
        assert info is not None, f"no local process for pod {pod}"
        return httpx.get(f"http://127.0.0.1:{info.port}/v1/sessions", timeout=10).json()

    def diagnostics(self) -> str:
        logs = self.cluster.logs_dir
        parts = []
        for path in [logs / "operator.log", *sorted((logs / "pods").glob("*.log"))]:
            if path.exists():
                parts.append(f"----- {path.name}\n{path.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for every real worker of the run: the embedded tiny model is generated once."""
    return tmp_path_factory.mktemp("ardiff-model-cache")


@contextlib.contextmanager
def running_stack(workdir: Path, pool: dict[str, Any], pod_env: dict[str, str]) -> Iterator[Stack]:
    """A dev cluster with `pool` applied, stopped (every process) on exit."""
    cluster = DevCluster(
        workdir,
        operator_command=OPERATOR_COMMAND,
        namespace=NAMESPACE,
        operator_env=OPERATOR_ENV,
        pod_env=pod_env,
    )
    with cluster:
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pool))
        yield Stack(cluster, pool["metadata"]["name"])


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
