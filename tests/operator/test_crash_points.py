"""Crash points (issue 40 item 2; `ardiff/crash_points.py`): the setting as read at start-up, a process that
exits right after the chosen write took effect; every write the operator's code makes, read from its source,
declared as a point; and a seeded walk of the real operator through two scenarios that together reach every
point (a pool's life on simulated Pods; a shared-tier pool through a roll, Redis losing its data, a paused and
a killed worker), crashed once at each of a few points, restarted, and checked against the store's invariants
and the scenario's outcome."""

from __future__ import annotations

import ast
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import ardiff.kv
import ardiff.operator
from ardiff.crash_points import CRASH_AFTER_ENV, CRASH_EXIT_CODE, CRASH_POINTS_LOG_ENV, CrashPoints
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from ardiff.kv.scripts import READ_ONLY_SCRIPTS
from ardiff.operator import kube
from tests.operator.conftest import (
    FAKE_WORKER_ENV,
    SIMULATED_ENV,
    SIMULATED_PLACEMENT,
    Cluster,
    SharedTier,
    serving,
)

T = TypeVar("T")
# The walk's points in CI: a seeded sample of 3. The full walk (every point reached), recorded in
# docs/benchmarks.md: ARDIFF_CRASH_WALK_POINTS=all.
WALK_SEED = 40
WALK_POINTS_ENV = "ARDIFF_CRASH_WALK_POINTS"
CI_WALK_POINTS = 3


def walk_sample(points: list[str], setting: str | None) -> list[str]:
    """The points the walk crashes at: a seeded sample of `setting` of them (a count; `all`: every one; or
    points named, comma-separated, each as often as named: one point walked again and again)."""
    if setting == "all":
        return sorted(points)
    if setting is not None and not setting.isdigit():
        named = setting.split(",")
        if unknown := sorted(set(named) - set(points)):
            raise ValueError(f"{WALK_POINTS_ENV}: {unknown} not among the points reached {points}")
        return named
    count = CI_WALK_POINTS if setting is None else int(setting)
    return sorted(random.Random(WALK_SEED).sample(points, min(count, len(points))))


# --- every write point of the operator, read from its source ----------------------------------------------

OPERATOR_SOURCE = Path(ardiff.operator.__file__).parent
# The operator's side of the placement store (`PlacementStore` joins it with the workers' and the gateway's).
OPERATOR_STORE_SOURCES = (
    Path(ardiff.kv.__file__).parent / "placement_operator.py",
    Path(ardiff.kv.__file__).parent / "placement_shared.py",
)
# The Kubernetes client's writes (operator/kube.py) and the point each passes.
KUBE_WRITES = {"create": "create", "create_or_get": "create", "delete": "delete", "patch": "patch"}
# Every point the operator's code can pass: what the walk's scenarios must reach, each of them.
OPERATOR_WRITE_POINTS = {
    "kube:create pods",
    "kube:create poddisruptionbudgets",
    "kube:create secrets",
    "kube:create services",
    "kube:delete pods",
    "kube:patch ardiffusionsessions/status",
    "kube:patch ardiffusionworkerpools/status",
    "kube:patch poddisruptionbudgets",
    "kube:patch pods",
    "kube:patch secrets",
    "redis:ack_resumed_note",
    "redis:delete_pool",
    "redis:drain_pod",
    "redis:expire_suspending",
    "redis:mark_reset_required",
    "redis:place",
    "redis:read_bindings",
    "redis:release",
    "redis:remove_pods",
    "redis:restore",
    "redis:set_eviction",
    "redis:suspend",
    "redis:write_pool",
}


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def store_scripts() -> dict[str, set[str]]:
    """Each method of the operator's store: the library functions it runs, through the methods it calls."""
    runs: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for source in OPERATOR_STORE_SOURCES:
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for call in _calls(node):
                func = call.func
                if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
                    continue
                if func.value.id != "self":
                    continue
                if func.attr == "_run" and isinstance(first := call.args[0], ast.Constant):
                    runs.setdefault(node.name, set()).add(first.value)
                calls.setdefault(node.name, set()).add(func.attr)

    def closure(method: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = set(runs.get(method, ()))
        for called in calls.get(method, set()) - seen - {method}:
            found |= closure(called, seen | {method})
        return found

    return {method: closure(method) for method in {*runs, *calls}}


def operator_write_points() -> set[str]:
    """The points of every store method and Kubernetes write the operator's modules call (`ctx.store.<m>(`,
    `ctx.kube.<write>(<RESOURCE>, ...)`); the library's read-only functions are no points."""
    scripts = store_scripts()
    resources = {
        name: value.plural for name, value in vars(kube).items() if isinstance(value, kube.ApiResource)
    }
    points = set()
    for source in OPERATOR_SOURCE.glob("*.py"):
        for call in _calls(ast.parse(source.read_text())):
            func = call.func
            if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Attribute):
                continue
            if func.value.attr == "store":
                points |= {f"redis:{s}" for s in scripts.get(func.attr, ()) if s not in READ_ONLY_SCRIPTS}
            elif func.value.attr == "kube" and func.attr in (*KUBE_WRITES, "patch_status"):
                plural = resources[ast.unparse(call.args[0])]
                if func.attr == "patch_status":
                    points.add(f"kube:patch {plural}/status")
                else:
                    points.add(f"kube:{KUBE_WRITES[func.attr]} {plural}")
    return points


def test_every_write_the_operators_code_makes_is_a_point_the_walk_must_reach() -> None:
    """A new kind of write (a store function, a resource created, patched or deleted) is added here, and the
    walk's scenarios must then reach it."""
    assert operator_write_points() == OPERATOR_WRITE_POINTS


def test_the_walk_takes_a_seeded_sample_in_ci_and_every_point_when_told() -> None:
    points = [f"redis:p{i}" for i in range(10)]
    ci = walk_sample(points, None)
    assert len(ci) == CI_WALK_POINTS
    assert set(ci) <= set(points)
    assert ci == walk_sample(points, str(CI_WALK_POINTS))
    assert walk_sample(points, "all") == sorted(points)
    assert walk_sample(points, "50") == sorted(points)
    assert walk_sample(points, "redis:p3,redis:p1,redis:p3") == ["redis:p3", "redis:p1", "redis:p3"]
    with pytest.raises(ValueError, match="redis:nowhere"):
        walk_sample(points, "redis:p1,redis:nowhere")


def test_the_setting_is_read_from_the_environment_and_refuses_a_bad_count() -> None:
    assert not CrashPoints.from_environ({}).on
    parsed = CrashPoints.from_environ({CRASH_AFTER_ENV: "kube:create pods#2"})
    assert (parsed.point, parsed.remaining, parsed.on) == ("kube:create pods", 2, True)
    for bad in ("redis:place#0", "redis:place#two"):
        with pytest.raises(ValueError, match=CRASH_AFTER_ENV):
            CrashPoints.from_environ({CRASH_AFTER_ENV: bad})


def test_a_process_exits_right_after_the_nth_write_at_its_point_and_logs_each_point(tmp_path: Path) -> None:
    logged = tmp_path / "points"
    script = (
        "from ardiff import crash_points as c\n"
        "c.passed('a'); c.passed('b'); print('after the first b', flush=True)\n"
        "c.passed('b'); print('never', flush=True)\n"
    )
    env = {**os.environ, CRASH_AFTER_ENV: "b#2", CRASH_POINTS_LOG_ENV: str(logged)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == CRASH_EXIT_CODE, done.stderr
    assert done.stdout.splitlines() == ["after the first b"]
    assert logged.read_text().splitlines() == ["a", "b", "b"]


async def test_a_store_write_at_its_point_takes_effect_before_the_exit(
    redis_url: str, store: PlacementStore
) -> None:
    pool = PoolId("crash-points", f"p{time.monotonic_ns()}")
    script = (
        "import asyncio\n"
        "from ardiff.kv.placement import PlacementStore\n"
        "from ardiff.kv.records import PoolId\n"
        "async def main():\n"
        f"    async with PlacementStore.from_url({redis_url!r}, loads_library=True) as store:\n"
        f"        await store.register_pod(PoolId({pool.namespace!r}, {pool.name!r}), 'p1', capacity=2,\n"
        "            endpoint='http://p1:8000', lease_ms=60_000, address='10.0.0.1:80')\n"
        "    print('never', flush=True)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, CRASH_AFTER_ENV: "redis:register_pod"}
    argv = [sys.executable, "-c", script]
    done = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == CRASH_EXIT_CODE, done.stderr
    assert "never" not in done.stdout
    assert [pod.name for pod in await store.list_pods(pool)] == ["p1"]


# --- the walk ----------------------------------------------------------------------------------------------


class Restarter:
    """The operator process, started again without its crash setting whenever it exits at a crash point (what
    the StatefulSet's kubelet does to a crashed operator); any other exit fails the test."""

    def __init__(self, process: OperatorProcess) -> None:
        self.process = process
        self.crashes = 0

    def crash_at(self, point: str) -> None:
        self.process.stop()
        self.process.env = {**self.process.env, CRASH_AFTER_ENV: point}
        self.process.start().wait_ready()

    def check(self) -> None:
        running = self.process.process
        if running is None or running.poll() is None:
            return
        assert running.returncode == CRASH_EXIT_CODE, f"the operator exited {running.returncode}"
        self.crashes += 1
        self.process.process = None
        self.process.env = {k: v for k, v in self.process.env.items() if k != CRASH_AFTER_ENV}
        self.process.start().wait_ready()

    def wait(self, found: Callable[[], T | None], what: str, timeout: float = 90) -> T:
        def checked() -> T | None:
            self.check()
            return found()

        return wait_until(checked, timeout=timeout, what=what)


async def settled(operator: Restarter, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """`operator.wait` (90 s) for a check of the store."""
    deadline = time.monotonic() + 90
    while not await check():
        operator.check()
        assert time.monotonic() < deadline, f"timed out after 90 s waiting for {what}"
        await asyncio.sleep(0.2)


async def run_pool_scenario(cluster: Cluster, operator: Restarter, store: PlacementStore, pool: str) -> None:
    """A pool's life, whatever crash happens, checked as it goes: a pool and two sessions; one session's
    priority changed, the other deleted; the pool scaled to two Pods, then back to one (the empty Pod
    retired); two more sessions, the last of which evicts one (the Pod holds two); the sessions deleted, then
    the pool. At each step: the session where its status says on a
    current Pod incarnation, the slots used equal to the sessions, the store's invariants; at the end nothing
    of the pool left in the API server or the store."""
    pid = PoolId(cluster.namespace, pool)
    cluster.create_pool(
        pool, replicas={"min": 1, "max": 2}, scaleDownDelaySeconds=0, **SIMULATED_PLACEMENT, env=SIMULATED_ENV
    )
    for name in ("a", "b"):
        cluster.create_session(f"{pool}-{name}", pool=pool)
    for name in ("a", "b"):
        operator.wait(
            lambda n=name: _phase(cluster, f"{pool}-{n}") == "Ready" or None, f"{pool}-{name} Ready"
        )
    assert cluster.patch_spec("ardiffusionsessions", f"{pool}-b", {"priority": 7}).status_code == 200

    async def reprioritised() -> bool:
        binding = (await store.get_bindings(pid, [f"{pool}-b"])).get(f"{pool}-b")
        return binding is not None and binding.priority == 7

    await settled(operator, reprioritised, f"{pool}-b's new priority in the store")
    cluster.delete("ardiffusionsessions", f"{pool}-a")
    operator.wait(lambda: cluster.get("ardiffusionsessions", f"{pool}-a") is None, f"{pool}-a gone")
    cluster.patch_pool_spec({"replicas": {"min": 2, "max": 2}}, name=pool)
    operator.wait(lambda: _ready_pods(cluster, pool) == 2 or None, f"two Ready Pods in {pool}")
    await check_placed(cluster, operator, store, pool)
    cluster.patch_pool_spec({"replicas": {"min": 1, "max": 1}}, name=pool)
    operator.wait(lambda: len(cluster.pod_names(pool)) == 1 or None, f"{pool} back to one Pod")
    assert (await check_placed(cluster, operator, store, pool)) in cluster.pod_names(pool)
    # The one Pod's two slots: the third of b, c and d to be placed evicts an idle one (Evicted: the pool has
    # no tier to suspend it into); which, depends on the order the operator saw them in.
    for name in ("c", "d"):
        cluster.create_session(f"{pool}-{name}", pool=pool)
    phases: list[dict[str, str | None]] = []

    def evicted() -> bool:
        phases.append({n: _phase(cluster, f"{pool}-{n}") for n in "bcd"})
        return sorted(str(p) for p in phases[-1].values()) == ["Evicted", "Ready", "Ready"]

    try:
        operator.wait(lambda: evicted() or None, "two of b, c and d Ready, one evicted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: phases {phases[-1]}") from None
    assert await store.check_invariants(pid) == []
    for name in ("b", "c", "d"):
        cluster.delete("ardiffusionsessions", f"{pool}-{name}")
    await retire_pool(cluster, operator, store, pool)


async def check_placed(cluster: Cluster, operator: Restarter, store: PlacementStore, pool: str) -> str:
    """The survivor Ready on a live Pod with that Pod's epoch; one slot used; the store's invariants hold. Its
    Pod."""
    status = operator.wait(
        lambda: cluster.status(f"{pool}-b") if _phase(cluster, f"{pool}-b") == "Ready" else None,
        f"{pool}-b Ready",
    )
    assert status["pod"] in cluster.pod_names(pool)
    pid = PoolId(cluster.namespace, pool)
    records = {r.name: r for r in await store.list_pods(pid)}
    assert records[status["pod"]].epoch == status["podEpoch"]
    used: list[dict[str, int]] = []

    async def one_slot_used() -> bool:
        used.append({r.name: r.used for r in await store.list_pods(pid)})
        return sum(used[-1].values()) == 1

    # Eventually: a deletion the crashed operator did not see is released by the next one's sweep (at most
    # `sweep_seconds` after its first round), not at once.
    try:
        await settled(operator, one_slot_used, f"one slot used in {pool}")
    except AssertionError as exc:
        bindings = await store.get_bindings(pid, [f"{pool}-{n}" for n in "abcd"])
        raise AssertionError(f"{exc}: slots used {used[-1]}, records {bindings}") from None
    assert await store.check_invariants(pid) == []
    return status["pod"]


# The tier scenario's workers: the fake runtime exporting into the shared tier, with a lease long enough that
# a worker paused while its session suspends (PAUSE_SECONDS at most) keeps its Pod record; the operator gives
# an export SUSPEND_TIMEOUT_SECONDS (a roll's exports take milliseconds).
TIER_LEASE = {"name": "ARDIFF_LEASE_SECONDS", "value": "30"}
SUSPEND_TIMEOUT_SECONDS = 4
WALK_OPERATOR_ENV = {"ARDIFF_OPERATOR_SUSPEND_TIMEOUT_SECONDS": str(SUSPEND_TIMEOUT_SECONDS)}


async def run_tier_scenario(
    cluster: Cluster, operator: Restarter, store: PlacementStore, tier: SharedTier, pool: str
) -> None:
    """A pool whose workers export into a shared tier, through what moves or rebuilds a session: a roll (each
    session suspended to move, its export pulled by the new Pod, the worker's note acked); Redis losing the
    pool's data (the bindings restored from the sessions' status, the session ticking on); the pool at max and
    its worker paused while a newcomer makes a session suspend (the export never reported: expired, the
    session evicted); Redis losing the data while the worker is killed (placed again, reset required); then
    the sessions and the pool deleted, nothing of them left in the store."""
    pid = PoolId(cluster.namespace, pool)
    live, pinned, vip = f"{pool}-live", f"{pool}-pinned", f"{pool}-vip"
    env = [*(e for e in FAKE_WORKER_ENV if e["name"] != TIER_LEASE["name"]), TIER_LEASE, tier.env]
    cluster.create_pool(
        pool, replicas={"min": 1, "max": 2}, eviction={"minIdleSeconds": 1}, env=env, **tier.pool_spec
    )
    cluster.create_session(live, pool=pool)
    cluster.create_session(pinned, pool=pool, evictionPolicy="Never")
    first = {name: _wait_ready(cluster, operator, name) for name in (live, pinned)}
    _tick(cluster, live, 0)

    # A roll: both move to the new Pod, each through its export; the worker's note of the move is acked.
    cluster.patch_pool_spec({"kv": {"gpuMemoryFraction": 0.5}}, name=pool)
    old_pod = first[live]["pod"]
    for name in (live, pinned):
        _wait_ready(cluster, operator, name, lambda status: status.get("pod") != old_pod)
    operator.wait(lambda: old_pod not in cluster.pod_names(pool) or None, f"{old_pod} gone", timeout=90)

    async def acked() -> bool:
        records = await store.get_bindings(pid, [live, pinned])
        return len(records) == 2 and all(r.resumed_note == "" for r in records.values())

    await settled(operator, acked, "the moves' notes acked")
    _tick(cluster, live, 1)  # continues where it was: no reset

    # Redis loses the pool's data: the worker's heartbeat brings its Pod back, the operator the bindings.
    before = {name: cluster.status(name) for name in (live, pinned)}
    await forget_pool_data(store, pid)

    async def restored() -> bool:
        records = await store.get_bindings(pid, [live, pinned])
        return {n: (r.state, r.pod, r.pod_epoch) for n, r in records.items()} == {
            n: (SessionState.PLACED, s["pod"], s["podEpoch"]) for n, s in before.items()
        }

    await settled(operator, restored, "the bindings restored from the sessions' status")
    _tick(cluster, live, 2)

    # At max, the worker paused while a newcomer makes `live` suspend: no export comes, it expires.
    cluster.patch_pool_spec({"replicas": {"min": 1, "max": 1}}, name=pool)
    pod = before[live]["pod"]
    await asyncio.sleep(1.5)  # idle past the pool's minIdleSeconds: `live` may be the victim
    cluster.kill(pod, signal.SIGSTOP)
    try:
        cluster.create_session(vip, pool=pool, priority=5)
        operator.wait(lambda: _phase(cluster, live) == "Evicted" or None, f"{live} evicted", timeout=30)
    finally:
        cluster.kill(pod, signal.SIGCONT)
    _wait_ready(cluster, operator, vip)

    # Redis loses the data while the worker is killed: its new incarnation holds no KV of them.
    epoch = before[pinned]["podEpoch"]
    cluster.kill(pod, signal.SIGKILL)
    await forget_pool_data(store, pid)
    _wait_ready(
        cluster, operator, pinned, lambda status: status.get("resetRequired") and status["podEpoch"] != epoch
    )
    for name in (live, pinned, vip):
        cluster.delete("ardiffusionsessions", name)
    await retire_pool(cluster, operator, store, pool)


async def forget_pool_data(store: PlacementStore, pool: PoolId) -> None:
    """Every key of the pool deleted: what Redis losing its data does to one pool (the tests' Redis is
    shared)."""
    keys = [key async for key in store.client.scan_iter(match=PoolKeys(pool).pattern)]
    if keys:
        await store.client.delete(*keys)


async def retire_pool(cluster: Cluster, operator: Restarter, store: PlacementStore, pool: str) -> None:
    """The pool deleted once its sessions are: gone from the API server, its Pods and the store."""
    pid = PoolId(cluster.namespace, pool)
    operator.wait(
        lambda: not any(s["spec"]["poolRef"] == pool for s in cluster.items("ardiffusionsessions")) or None,
        f"{pool}'s sessions gone",
    )
    cluster.delete("ardiffusionworkerpools", pool)
    operator.wait(lambda: cluster.get("ardiffusionworkerpools", pool) is None, f"{pool} gone")
    operator.wait(lambda: not cluster.pods(pool) or None, f"{pool}'s Pods gone")

    async def forgotten() -> bool:
        return pid not in await store.list_pools() and not await store.list_pods(pid)

    await settled(operator, forgotten, f"{pool} gone from the store")


def _wait_ready(
    cluster: Cluster,
    operator: Restarter,
    name: str,
    also: Callable[[dict[str, Any]], object] = lambda _: True,
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        status = cluster.status(name)
        return status if status.get("phase") == "Ready" and also(status) else None

    return operator.wait(ready, f"{name} Ready")


def _tick(cluster: Cluster, name: str, chunk: int) -> None:
    answer = cluster.tick(name, chunk)
    assert answer.status_code == 200, answer.text


def _phase(cluster: Cluster, name: str) -> str | None:
    return (cluster.get("ardiffusionsessions", name) or {}).get("status", {}).get("phase")


def _ready_pods(cluster: Cluster, pool: str) -> int:
    return sum(
        condition_true(pod, "Ready")
        for pod in cluster.pods(pool)
        if not pod["metadata"].get("deletionTimestamp")
    )


@pytest.fixture
def walked_operator(
    cluster: Cluster, redis_url: str, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, Path]]:
    points = tmp_path / "points"
    env = {**WALK_OPERATOR_ENV, CRASH_POINTS_LOG_ENV: str(points)}
    process = cluster.operator(redis_url, tmp_path / "operator.log", env=env)
    with serving(cluster, process):
        yield process, points


@pytest.mark.slow
async def test_the_operator_crashed_at_a_seeded_sample_of_its_write_points_converges_with_its_invariants(
    cluster: Cluster, walked_operator: tuple[OperatorProcess, Path], store: PlacementStore
) -> None:
    """Each scenario once without a crash finds the points it reaches (together: every write point); then
    the operator crashes once at each chosen point, in a run of the scenario that reached it first."""
    process, logged = walked_operator
    operator = Restarter(process)
    tier = cluster.shared_tier()
    scenarios: dict[str, Callable[[str], Awaitable[None]]] = {
        "pool": lambda pool: run_pool_scenario(cluster, operator, store, pool),
        "tier": lambda pool: run_tier_scenario(cluster, operator, store, tier, pool),
    }
    reached_by: dict[str, str] = {}
    for kind, run in scenarios.items():
        seen = len(logged.read_text().splitlines()) if logged.exists() else 0
        await run(f"discover-{kind}")
        for point in logged.read_text().splitlines()[seen:]:
            reached_by.setdefault(point, kind)
    points = sorted(reached_by)
    assert set(points) == OPERATOR_WRITE_POINTS, (
        f"not reached: {sorted(OPERATOR_WRITE_POINTS - set(points))}; "
        f"not declared: {sorted(set(points) - OPERATOR_WRITE_POINTS)}"
    )
    chosen = walk_sample(points, os.environ.get(WALK_POINTS_ENV))
    print(
        f"crash points: {len(points)} reached; walked {chosen}; skipped {sorted(set(points) - set(chosen))}"
    )
    for index, point in enumerate(chosen):
        operator.crash_at(point)
        crashes = operator.crashes
        await scenarios[reached_by[point]](f"walk{index}-{reached_by[point]}")
        operator.wait(lambda c=crashes: operator.crashes > c or None, f"the crash at {point}", timeout=30)
