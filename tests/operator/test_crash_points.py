"""Crash points (issue 40 item 2; `ardiff/crash_points.py`): the setting as read at start-up, a process that
exits right after the chosen write took effect, and a seeded walk of the real operator crashed once at each of
a few of the points a create / delete / scale scenario passes, restarted, and checked against the store's
invariants and the scenario's outcome."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from ardiff.crash_points import CRASH_AFTER_ENV, CRASH_EXIT_CODE, CRASH_POINTS_LOG_ENV, CrashPoints
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from tests.operator.conftest import SIMULATED_ENV, SIMULATED_PLACEMENT, Cluster, serving

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


# Points every run of the scenario passes: the walk's discovery must find each (or the hooks moved).
EXPECTED_POINTS = {
    "kube:create pods",
    "kube:delete pods",
    "kube:patch ardiffusionsessions/status",
    "redis:place",
    "redis:set_eviction",
    "redis:release",
    "redis:delete_pool",
}


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


async def run_scenario(cluster: Cluster, operator: Restarter, store: PlacementStore, pool: str) -> None:
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
    for name in ("b", "c", "d"):
        operator.wait(
            lambda n=name: cluster.get("ardiffusionsessions", f"{pool}-{n}") is None, f"{pool}-{name} gone"
        )
    cluster.delete("ardiffusionworkerpools", pool)
    operator.wait(lambda: cluster.get("ardiffusionworkerpools", pool) is None, f"{pool} gone")
    operator.wait(lambda: not cluster.pods(pool) or None, f"{pool}'s Pods gone")

    async def forgotten() -> bool:
        return pid not in await store.list_pools() and not await store.list_pods(pid)

    await settled(operator, forgotten, f"{pool} gone from the store")


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
    process = cluster.operator(redis_url, tmp_path / "operator.log", env={CRASH_POINTS_LOG_ENV: str(points)})
    with serving(cluster, process):
        yield process, points


@pytest.mark.slow
async def test_the_operator_crashed_at_a_seeded_sample_of_its_write_points_converges_with_its_invariants(
    cluster: Cluster, walked_operator: tuple[OperatorProcess, Path], store: PlacementStore
) -> None:
    process, logged = walked_operator
    operator = Restarter(process)
    await run_scenario(cluster, operator, store, "discover")
    points = sorted(set(logged.read_text().splitlines()))
    assert set(points) >= EXPECTED_POINTS, points
    chosen = walk_sample(points, os.environ.get(WALK_POINTS_ENV))
    print(
        f"crash points: {len(points)} reached; walked {chosen}; skipped {sorted(set(points) - set(chosen))}"
    )
    for index, point in enumerate(chosen):
        operator.crash_at(point)
        crashes = operator.crashes
        await run_scenario(cluster, operator, store, f"walk{index}")
        operator.wait(lambda c=crashes: operator.crashes > c or None, f"the crash at {point}", timeout=30)
