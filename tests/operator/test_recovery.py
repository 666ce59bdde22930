"""Failures and contention through the real operator: pod loss, eviction at max, operator restarts, Redis
losing its data, and two operators with peering."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import Cluster

pytestmark = pytest.mark.slow


async def eventually_invariants_hold(store: PlacementStore, pool: PoolId) -> None:
    for _ in range(50):
        if await store.check_invariants(pool) == []:
            return
        await asyncio.sleep(0.1)
    assert await store.check_invariants(pool) == []


async def test_killed_pod_loses_its_sessions_which_come_back_with_reset_required(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    before = cluster.ticked_session("forest")

    cluster.kill(before["pod"], signal.SIGKILL)  # kill -9 the worker container's process

    # The kubelet restarts the container (restartPolicy Always); the restarted worker registers with a new
    # epoch; the session's KV is gone, so it is placed again and must reset before it ticks on.
    after = cluster.wait_phase("forest", "Ready", resetRequired=True)
    assert after["podEpoch"] > before["podEpoch"]
    assert after["reason"] == "ResetRequired"
    # The loss was reported (status and Event) before the repair.
    lost = wait_until(lambda: cluster.events("Lost"), what="a Lost event")
    assert lost[0]["involvedObject"]["name"] == "forest"
    replaced = wait_until(lambda: cluster.events("Replaced"), what="a Replaced event")
    assert replaced[0]["involvedObject"]["name"] == "forest"
    refused = cluster.tick("forest", 1)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "reset_required"
    assert cluster.tick("forest", 0, reset=True).status_code == 200
    cluster.wait_phase("forest", "Ready", resetRequired=False, reason="Placed")
    record = await store.get_session(pool, "forest")
    assert record is not None
    assert (record.state, record.pod_epoch) == (SessionState.PLACED, after["podEpoch"])
    await eventually_invariants_hold(store, pool)


async def test_eviction_when_full_at_max_picks_the_right_victim_without_thrashing(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    # One pod, two slots; a session is evictable once idle for 2 s (so a re-placed one is safe for 2 s).
    cluster.create_pool(replicas={"min": 1, "max": 1}, eviction={"minIdleSeconds": 2})
    cluster.create_session("lru")
    cluster.create_session("pinned", evictionPolicy="Never")
    cluster.wait_phase("lru", "Ready")
    cluster.wait_phase("pinned", "Ready")
    await asyncio.sleep(2.5)

    # Full at max: a newcomer evicts the least recently used evictable session, never the pinned one.
    cluster.create_session("vip", priority=5)
    cluster.wait_phase("vip", "Ready")
    evicted = cluster.wait_phase("lru", "Evicted", reason="Evicted")
    assert evicted["message"] == "evicted to make room for session vip"
    assert evicted["resetRequired"] is True
    event = wait_until(lambda: cluster.events("Evicted"), what="an Evicted event")[0]
    assert (event["involvedObject"]["name"], event["type"]) == ("lru", "Warning")
    assert "vip" in event["message"]

    # A lower-priority newcomer cannot evict the vip, nor the pinned session: it waits.
    cluster.create_session("late")
    cluster.wait_phase("late", "Pending", reason="WaitingForCapacity")
    await asyncio.sleep(2)  # several reconcile rounds: nobody takes a slot back (no thrashing)
    phases = {n: cluster.status(n)["phase"] for n in ("lru", "pinned", "vip", "late")}
    assert phases == {"lru": "Evicted", "pinned": "Ready", "vip": "Ready", "late": "Pending"}
    assert wait_until(lambda: cluster.pool_status().get("pending") == 2, what="2 pending in the pool status")

    # A slot frees up: the evicted session (older, same priority) gets it back, with a reset, and the
    # waiting newcomer cannot evict it straight away (it has not been idle for minIdleSeconds).
    cluster.delete("ardiffusionsessions", "vip")
    back = cluster.wait_phase("lru", "Ready", resetRequired=True)
    assert back["reason"] == "ResetRequired"
    assert cluster.status("late")["phase"] == "Pending"
    record = await store.get_session(pool, "late")
    assert record is None  # never admitted
    await eventually_invariants_hold(store, pool)


async def test_full_pool_pod_killed_its_active_sessions_take_the_slots_back_not_evicted_idle_ones(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    """Issue 12's defect, as a user met it: 2 pods x 2 slots at max, two sessions evicted earlier for being
    idle; `kill -9` of the worker holding the two active sessions. The active ones come back (Lost first, by
    priority then latest tick), the evicted ones keep waiting for a free slot."""
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(replicas={"min": 2, "max": 2}, eviction={"minIdleSeconds": 1})
    cluster.wait_pods(2)
    for name in ("s1", "s2", "s3", "s4"):
        cluster.create_session(name)
    pods = {name: cluster.wait_phase(name, "Ready")["pod"] for name in ("s1", "s2", "s3", "s4")}
    doomed = pods["s1"]
    idle = sorted(n for n, pod in pods.items() if pod == doomed)  # the two on the pod that will die
    busy = sorted(n for n, pod in pods.items() if pod != doomed)
    assert len(idle) == len(busy) == 2
    await asyncio.sleep(1.2)
    for name in busy:  # ticked: the idle pair is the least recently used
        assert cluster.tick(name, 0).status_code == 200

    # Two newcomers evict the idle pair; they land on the pod the idle pair was on.
    for name in ("active-a", "active-b"):
        cluster.create_session(name)
        assert cluster.wait_phase(name, "Ready")["pod"] == doomed
    for name in idle:
        cluster.wait_phase(name, "Evicted", reason="Evicted")
    for name in ("active-a", "active-b"):
        for chunk in range(2):
            assert cluster.tick(name, chunk).status_code == 200
    created = (await store.get_pod(pool, doomed)).epoch  # type: ignore[union-attr]

    cluster.kill(doomed, signal.SIGKILL)  # kill -9 the worker container's process

    # The restarted worker's two slots go back to the active sessions, with a reset; the idle ones wait.
    for name in ("active-a", "active-b"):
        back = cluster.wait_phase(name, "Ready", resetRequired=True)
        assert (back["pod"], back["podEpoch"] > created) == (doomed, True)
    await asyncio.sleep(1.5)  # more rounds (and past minIdleSeconds): nothing moves any more
    phases = {n: cluster.status(n)["phase"] for n in (*idle, *busy, "active-a", "active-b")}
    assert phases == {
        **dict.fromkeys(idle, "Evicted"),
        **dict.fromkeys((*busy, "active-a", "active-b"), "Ready"),
    }
    assert sorted(e["involvedObject"]["name"] for e in cluster.events("Evicted")) == idle  # once each
    assert sorted({e["involvedObject"]["name"] for e in cluster.events("Replaced")}) == [
        "active-a",
        "active-b",
    ]
    for name in ("active-a", "active-b"):
        assert cluster.tick(name, 0, reset=True).status_code == 200
    await eventually_invariants_hold(store, pool)


async def test_operator_restart_converges_without_duplicate_pods_or_leaked_slots(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(replicas={"min": 1, "max": 3})
    for name in ("a", "b", "c"):
        cluster.create_session(name)
    cluster.wait_phase("a", "Ready", timeout=30)
    operator_process.stop(signal.SIGKILL)  # a crash, mid-way: b and c may still be waiting for a pod

    # While it is down: one session leaves, two arrive.
    cluster.delete("ardiffusionsessions", "a")
    for name in ("d", "e"):
        cluster.create_session(name)
    operator_process.start()

    names = ["b", "c", "d", "e"]
    wait_until(
        lambda: all(cluster.status(n).get("phase") == "Ready" for n in names), timeout=45, what="all Ready"
    )
    cluster.wait_gone("ardiffusionsessions", "a")
    # 4 sessions at 2 slots per pod: exactly 2 pods are needed; a restarted operator must not add more.
    wait_until(lambda: len(cluster.pod_names()) == 2, timeout=20, what="2 pods")
    await asyncio.sleep(1.5)
    assert len(cluster.pods()) == 2
    records = await store.get_sessions(pool, ["a", *names])
    assert records["a"].state is SessionState.CLOSED
    assert {n: records[n].state for n in names} == dict.fromkeys(names, SessionState.PLACED)
    assert sum(p.used for p in await store.list_pods(pool)) == 4
    await eventually_invariants_hold(store, pool)


async def test_redis_losing_its_data_is_rebuilt_from_the_session_status(
    cluster: Cluster, tmp_path: Path
) -> None:
    with cluster.redis_server() as redis:
        operator = cluster.operator(redis.url, tmp_path / "operator.log").start()
        try:
            pool = PoolId(cluster.namespace, "pool")
            cluster.create_pool(replicas={"min": 2, "max": 2})
            for name in ("a", "b", "c"):
                cluster.create_session(name)
            before = {n: cluster.wait_phase(n, "Ready") for n in ("a", "b", "c")}

            redis.restart()  # no persistence: every key is gone

            async with PlacementStore.from_url(redis.url) as store:
                for _ in range(100):  # heartbeats re-create the pods, the operator restores the bindings
                    records = await store.get_sessions(pool, ["a", "b", "c"])
                    if len(records) == 3:
                        break
                    await asyncio.sleep(0.1)
                assert {n: (r.state, r.pod, r.pod_epoch) for n, r in records.items()} == {
                    n: (SessionState.PLACED, s["pod"], s["podEpoch"]) for n, s in before.items()
                }
                await eventually_invariants_hold(store, pool)
            for name, status in before.items():
                now = cluster.status(name)
                assert (now["phase"], now["pod"], now["podEpoch"]) == (
                    "Ready",
                    status["pod"],
                    status["podEpoch"],
                )
                assert now["resetRequired"] is False  # the workers still hold the KV: nothing was lost
            assert cluster.tick("a", 0).status_code == 200
        finally:
            try:
                cluster.delete_all()
            finally:
                operator.stop()


def test_two_operators_with_peering_only_one_acts(cluster: Cluster, redis_url: str, tmp_path: Path) -> None:
    """Ordered starts, so that every step waits on one fact. With mandatory peering kopf starts paused; the
    active operator (priority 10) resumes once it sees no peer above it. The standby (priority 0) starts only
    then: it sees the active at once and stays paused (kopf logs "Pausing operations" only for an operator
    that ran unpaused before a higher peer appeared, so the test never waits for that line). It must never
    resume nor run a handler until the active has left the peering."""
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "ardiff"}}
    response = cluster.http.post(
        f"/apis/kopf.dev/v1/namespaces/{cluster.namespace}/kopfpeerings", json=peering
    )
    assert response.status_code == 201, response.text

    def peer_priorities() -> list[int]:
        found = cluster.http.get(
            f"/apis/kopf.dev/v1/namespaces/{cluster.namespace}/kopfpeerings/ardiff"
        ).json()
        return sorted(peer["priority"] for peer in (found.get("status") or {}).values())

    def command(priority: int) -> tuple[str, ...]:
        return ("ardiff", "operator", "run", "--peering", "ardiff", "--priority", str(priority))

    active = cluster.operator(redis_url, tmp_path / "active.log", command(10))
    standby = cluster.operator(redis_url, tmp_path / "standby.log", command(0))
    try:
        active.start()
        wait_until(lambda: "Resuming operations" in active.log(), what="the active operator to resume")
        assert peer_priorities() == [10]
        standby.start().wait_ready()
        wait_until(lambda: peer_priorities() == [0, 10], what="both operators in the peering")
        cluster.create_pool(replicas={"min": 1, "max": 2})
        for name in ("a", "b", "c"):
            cluster.create_session(name)
        wait_until(
            lambda: all(cluster.status(n).get("phase") == "Ready" for n in "abc"), timeout=40, what="Ready"
        )
        assert len(cluster.pods()) == 2
        assert "Handler 'admit_session' succeeded" in active.log()
        assert "Handler '" not in standby.log()  # it ran no handler of any kind
        assert "Resuming operations" not in standby.log()

        assert active.stop() == 0  # on its way out it leaves the peering; the standby takes over
        wait_until(lambda: peer_priorities() == [0], what="the active operator to leave the peering")
        wait_until(lambda: "Resuming operations" in standby.log(), what="the standby to resume")
        cluster.create_session("d")
        cluster.wait_phase("d", "Ready", timeout=40)
        assert "Handler 'admit_session' succeeded" in standby.log()
        assert len(cluster.pods()) == 2
    finally:
        try:
            cluster.delete_all()
        finally:
            standby.stop()
            active.stop()
