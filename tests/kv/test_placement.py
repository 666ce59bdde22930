"""The placement store against the shared real redis-server: each test owns a pool (`unique_pool`)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
from collections import Counter

import pytest

from ardiff.kv.connection import MAX_BLOCK_MS
from ardiff.kv.errors import (
    CapacityBelowUsed,
    InvalidPlacementArgument,
    PodFenced,
    SessionNotHere,
    UnknownPod,
    UnknownSession,
)
from ardiff.kv.keys import PoolKeys, pool_of_key
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRecord, PodRegistration, PoolId, SessionBinding, SessionSpec, SessionState

TOKEN = hashlib.sha256(b"token").hexdigest()
LEASE_MS = 60_000


def spec(name: str, **fields: object) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, **fields)  # type: ignore[arg-type]


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


async def register(
    store: PlacementStore, pool: PoolId, pod: str, capacity: int, lease_ms: int = LEASE_MS
) -> PodRegistration:
    return await store.register_pod(
        pool, pod, capacity=capacity, endpoint=f"http://{pod}.workers:8000", lease_ms=lease_ms
    )


async def heartbeat(
    store: PlacementStore, pool: PoolId, pod: str, epoch: int, capacity: int
) -> PodRegistration:
    return await store.heartbeat(
        pool, pod, epoch=epoch, capacity=capacity, endpoint=f"http://{pod}.workers:8000", lease_ms=LEASE_MS
    )


async def placed_pods(store: PlacementStore, pool: PoolId, names: list[str]) -> dict[str, str]:
    records = await store.get_sessions(pool, names)
    return {name: record.pod for name, record in records.items() if record.state is SessionState.PLACED}


async def test_a_record_gives_back_the_spec_it_was_placed_with(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1)
    placed = spec(
        "s1",
        seed=3,
        prompt="a forest",
        image=b"\x89PNG",
        max_chunks=9,
        priority=5,
        eviction_policy="Never",
        playout_fps=12.5,
        playout_buffer_chunks=3,
    )
    await store.place(pool, placed)
    record = await store.get_session(pool, "s1")
    assert record is not None
    assert record.spec() == placed


async def test_a_workers_read_leaves_the_image_out_and_the_image_is_there_only_while_the_session_is_bound(
    store: PlacementStore, pool: PoolId
) -> None:
    """Issue 41: a tick reads the record but its image; the image is read once per session, and a release in
    between (which drops the image) reads as None, not as "no image" (the worker would render the seed's)."""
    await register(store, pool, "w-a", capacity=2)
    placed = spec("s1", seed=3, prompt="a forest", image=b"\x89PNG" * 100)
    await store.place(pool, placed)
    whole, but_image = await store.get_session(pool, "s1"), await store.get_session(pool, "s1", image=False)
    assert whole is not None
    assert but_image == dataclasses.replace(whole, image=b"")
    assert await store.get_session_image(pool, "s1") == placed.image
    await store.place(pool, spec("s2", seed=4))
    assert await store.get_session_image(pool, "s2") == b""  # no image: empty, not None
    await store.release(pool, "s1", reason="deleted")
    assert await store.get_session_image(pool, "s1") is None
    assert await store.get_session_image(pool, "never-placed") is None


async def test_a_pod_record_carries_the_compute_its_worker_reports(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await store.register_pod(
        pool, "w-a", capacity=2, endpoint="http://w-a:8000", lease_ms=LEASE_MS, compute_fps=43.2, tick_ms=250
    )
    pod = await store.get_pod(pool, "w-a")
    assert pod is not None
    assert (pod.compute_fps, pod.tick_ms, pod.demand_fps) == (43.2, 250.0, 0.0)
    await store.heartbeat(
        pool,
        "w-a",
        epoch=reg.epoch,
        capacity=2,
        endpoint="http://w-a:8000",
        lease_ms=LEASE_MS,
        compute_fps=40.0,
        tick_ms=270.5,
    )
    pod = await store.get_pod(pool, "w-a")
    assert pod is not None
    assert (pod.compute_fps, pod.tick_ms) == (40.0, 270.5)


async def test_place_is_idempotent(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=2)
    first = await store.place(pool, spec("s1", prompt="a forest", seed=7))
    again = await store.place(pool, spec("s1", prompt="a forest", seed=7))

    assert first.placement is not None
    assert not first.already_placed
    assert first.placement.pod == "w-a"
    assert first.placement.endpoint == "http://w-a.workers:8000"
    assert first.placement.pod_epoch == reg.epoch
    assert not first.placement.reset_required
    assert again.already_placed
    assert again.placement == first.placement
    pods = await store.list_pods(pool)
    assert [(p.name, p.used, p.capacity) for p in pods] == [("w-a", 1, 2)]
    record = await store.get_session(pool, "s1")
    assert record is not None
    assert (record.state, record.pod, record.pod_epoch, record.pool) == (
        "placed",
        "w-a",
        reg.epoch,
        pool.name,
    )
    assert (record.prompt, record.seed, record.token_sha256, record.chunk_index) == ("a forest", 7, TOKEN, 0)
    assert await store.check_invariants(pool) == []


async def test_least_loaded_spreads_and_pack_fills(store: PlacementStore, pool: PoolId) -> None:
    for pod in ("w-a", "w-b", "w-c"):
        await register(store, pool, pod, capacity=3)
    for i in range(3):
        await store.place(pool, spec(f"spread-{i}"))
    spread = await placed_pods(store, pool, [f"spread-{i}" for i in range(3)])
    assert sorted(spread.values()) == ["w-a", "w-b", "w-c"]

    for i in range(3):
        await store.place(pool, spec(f"pack-{i}"), policy="pack")
    pods = {p.name: p.used for p in await store.list_pods(pool)}
    # pack fills the fullest pod that still has room: one pod reaches capacity, then the next fills
    assert sorted(pods.values()) == [1, 2, 3]
    assert await store.check_invariants(pool) == []


async def test_pending_when_full_and_no_eviction_allowed(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    result = await store.place(pool, spec("s2"), may_evict=False)
    assert result.placement is None
    assert result.victim is None
    assert await store.get_session(pool, "s2") is None
    assert await store.check_invariants(pool) == []


async def test_draining_and_expired_pods_get_no_sessions(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-drain", capacity=4)
    await register(store, pool, "w-dead", capacity=4, lease_ms=1)
    await store.set_draining(pool, "w-drain", draining=True)
    await asyncio.sleep(0.01)
    assert (await store.place(pool, spec("s1"))).placement is None

    await store.set_draining(pool, "w-drain", draining=False)
    result = await store.place(pool, spec("s1"))
    assert result.placement is not None
    assert result.placement.pod == "w-drain"
    with pytest.raises(UnknownPod):
        await store.set_draining(pool, "w-never", draining=True)
    assert await store.check_invariants(pool) == []


async def test_touch_updates_tick_and_refuses_other_pods(store: PlacementStore, pool: PoolId) -> None:
    reg_a = await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("s1"))
    before = await store.get_session(pool, "s1")
    assert before is not None
    assert before.pod == "w-a"

    await asyncio.sleep(0.005)
    tick_ms = await store.touch(pool, "s1", pod="w-a", epoch=reg_a.epoch, chunk_index=3)
    after = await store.get_session(pool, "s1")
    assert after is not None
    assert after.chunk_index == 3
    assert after.last_tick_ms == tick_ms > before.last_tick_ms

    reg_b = (await store.list_pods(pool))[1]
    with pytest.raises(SessionNotHere) as not_here:
        await store.touch(pool, "s1", pod="w-b", epoch=reg_b.epoch, chunk_index=3)
    assert not_here.value.state is SessionState.PLACED
    assert (not_here.value.pod, not_here.value.endpoint) == ("w-a", "http://w-a.workers:8000")
    assert not_here.value.code == "session_not_here"
    with pytest.raises(UnknownSession):
        await store.touch(pool, "nobody", pod="w-a", epoch=reg_a.epoch, chunk_index=0)
    with pytest.raises(PodFenced):
        await store.touch(pool, "s1", pod="w-a", epoch=reg_a.epoch - 1, chunk_index=4)
    assert (await store.get_session(pool, "s1")).chunk_index == 3  # type: ignore[union-attr]


async def test_a_changed_priority_or_eviction_policy_moves_a_placed_session_in_the_lru_index(
    store: PlacementStore, pool: PoolId
) -> None:
    """Issue 40 item 4: `set_eviction` writes the record and moves the LRU entry, so eviction follows it."""
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("held"))
    assert await store.set_eviction(pool, "held", priority=0, eviction_policy="LRU") is False  # as placed
    assert await store.set_eviction(pool, "held", priority=900, eviction_policy="LRU") is True
    assert await store.evict_lru(pool, min_idle_ms=0, max_priority=500) is None  # outranks a 500 now
    assert await store.check_invariants(pool) == []
    await store.set_eviction(pool, "held", priority=0, eviction_policy="Never")
    assert await store.evict_lru(pool, min_idle_ms=0, max_priority=500) is None  # never a victim
    assert await store.check_invariants(pool) == []
    await store.set_eviction(pool, "held", priority=0, eviction_policy="LRU")
    record = await store.get_session(pool, "held", image=False)
    assert record is not None
    assert (record.priority, record.eviction_policy) == (0, "LRU")
    assert await store.check_invariants(pool) == []
    assert await store.evict_lru(pool, min_idle_ms=0, max_priority=500) == "held"
    # Not placed any more: the record follows, the index has no entry to move.
    assert await store.set_eviction(pool, "held", priority=7, eviction_policy="Never") is True
    bindings = await store.get_bindings(pool, ["held"])
    assert (bindings["held"].state, bindings["held"].priority, bindings["held"].eviction_policy) == (
        SessionState.EVICTED,
        7,
        "Never",
    )
    assert await store.check_invariants(pool) == []
    with pytest.raises(UnknownSession):
        await store.set_eviction(pool, "nobody", priority=0, eviction_policy="LRU")
    with pytest.raises(InvalidPlacementArgument, match="eviction_policy"):
        await store.set_eviction(pool, "held", priority=0, eviction_policy="Sometimes")  # type: ignore[arg-type]


async def test_mark_reset_required_then_reset_tick_clears_it(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    await store.touch(pool, "s1", pod="w-a", epoch=reg.epoch, chunk_index=5)
    await store.mark_reset_required(pool, "s1", pod="w-a", epoch=reg.epoch)
    record = await store.get_session(pool, "s1")
    assert record is not None
    assert record.reset_required
    assert record.chunk_index == 0

    await store.touch(pool, "s1", pod="w-a", epoch=reg.epoch, chunk_index=1, reset_done=True)
    record = await store.get_session(pool, "s1")
    assert record is not None
    assert not record.reset_required
    assert record.chunk_index == 1


async def test_release_frees_the_slot_and_notifies_the_pod(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    assert await store.release(pool, "s1", reason="deleted") is SessionState.PLACED
    assert await store.release(pool, "s1", reason="deleted") is SessionState.CLOSED
    assert await store.release(pool, "never-placed", reason="deleted") is None

    record = await store.get_session(pool, "s1")
    assert record is not None
    assert record.state is SessionState.CLOSED
    assert record.pod == "w-a"
    ttl_ms = await store.client.pttl(f"{pool.tag}:session:s1")
    assert 0 < ttl_ms <= store.closed_ttl_ms
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session, e.reason, e.epoch) for e in events] == [("close", "s1", "deleted", reg.epoch)]
    assert [p.used for p in await store.list_pods(pool)] == [0]

    # A closed session placed again is a fresh first admission.
    again = await store.place(pool, spec("s1"))
    assert again.placement is not None
    assert not again.placement.reset_required
    assert not again.already_placed
    assert await store.client.pttl(f"{pool.tag}:session:s1") == -1
    assert await store.check_invariants(pool) == []


async def test_events_survive_a_consumer_restart(store: PlacementStore, pool: PoolId, redis_url: str) -> None:
    await register(store, pool, "w-a", capacity=3)
    for name in ("s1", "s2", "s3"):
        await store.place(pool, spec(name))
        await store.release(pool, name, reason="bye")

    first = await store.read_events(pool, "w-a", count=2)
    assert [e.session for e in first] == ["s1", "s2"]
    await store.ack_events(pool, "w-a", [first[0].id])

    # The worker dies before acknowledging s2; its successor (a new client, same pod name) gets s2 again,
    # then the never-delivered s3.
    async with PlacementStore.from_url(redis_url) as restarted:
        redelivered = await restarted.read_events(pool, "w-a")
        assert [e.session for e in redelivered] == ["s2"]
        assert await restarted.ack_events(pool, "w-a", [e.id for e in redelivered]) == 1
        fresh = await restarted.read_events(pool, "w-a")
        assert [e.session for e in fresh] == ["s3"]
        assert await restarted.ack_events(pool, "w-a", [e.id for e in fresh]) == 1
        assert await restarted.read_events(pool, "w-a", block_ms=10) == []


async def test_read_events_heals_a_missing_group(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1)
    await store.client.xgroup_destroy(f"{pool.tag}:events:w-a", "worker")
    assert await store.read_events(pool, "w-a") == []
    await store.place(pool, spec("s1"))
    await store.release(pool, "s1", reason="bye")
    assert [e.session for e in await store.read_events(pool, "w-a")] == ["s1"]


async def test_blocking_read_wakes_on_a_new_event(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    reader = asyncio.create_task(store.read_events(pool, "w-a", block_ms=MAX_BLOCK_MS))
    await asyncio.sleep(0.05)
    await store.release(pool, "s1", reason="bye")
    events = await asyncio.wait_for(reader, timeout=5)
    assert [e.session for e in events] == ["s1"]


# ---- eviction ---------------------------------------------------------------------------------------------


async def tick(store: PlacementStore, pool: PoolId, session: str) -> int:
    """Touch `session` where it is placed, one millisecond after the previous tick (distinct LRU stamps)."""
    await asyncio.sleep(0.002)
    record = await store.get_session(pool, session)
    assert record is not None
    return await store.touch(
        pool, session, pod=record.pod, epoch=record.pod_epoch, chunk_index=record.chunk_index + 1
    )


async def test_evict_lru_takes_lowest_priority_then_least_recently_ticked(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=6)
    for name, priority, policy in [
        ("old-high", 5, "LRU"),
        ("low-1", 1, "LRU"),
        ("low-2", 1, "LRU"),
        ("zero", 0, "LRU"),
        ("pinned", 0, "Never"),
    ]:
        await store.place(pool, spec(name, priority=priority, eviction_policy=policy))
    for name in ("old-high", "low-2", "low-1", "zero"):  # old-high ticked longest ago, zero most recently
        await tick(store, pool, name)

    order = [await store.evict_lru(pool, min_idle_ms=0, reason="test") for _ in range(5)]
    assert order == ["zero", "low-2", "low-1", "old-high", None]  # never `pinned`
    records = await store.get_sessions(pool, ["zero", "low-2", "low-1", "old-high", "pinned"])
    assert {n: r.state for n, r in records.items()} == {
        "zero": "evicted",
        "low-2": "evicted",
        "low-1": "evicted",
        "old-high": "evicted",
        "pinned": "placed",
    }
    assert records["zero"].pod == "w-a"  # an evicted record keeps its pod: the worker answers 410
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session, e.reason) for e in events] == [
        ("evict", name, "test") for name in ("zero", "low-2", "low-1", "old-high")
    ]
    assert [p.used for p in await store.list_pods(pool)] == [1]
    assert await store.check_invariants(pool) == []


async def test_evict_lru_respects_max_priority_and_min_idle(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("high", priority=9))
    await store.place(pool, spec("fresh", priority=0))
    assert await store.evict_lru(pool, min_idle_ms=0, max_priority=8) == "fresh"
    assert await store.evict_lru(pool, min_idle_ms=0, max_priority=8) is None
    await tick(store, pool, "high")
    assert await store.evict_lru(pool, min_idle_ms=60_000) is None  # ticked just now: not idle
    assert (await store.get_session(pool, "high")).state is SessionState.PLACED  # type: ignore[union-attr]


async def test_place_evicts_for_a_first_admission_only(store: PlacementStore, pool: PoolId) -> None:
    """Victim choice through `place`: priority bound, min idle, `Never`, re-placements never evict."""
    await register(store, pool, "w-a", capacity=3)
    await store.place(pool, spec("low", priority=1))
    await store.place(pool, spec("high", priority=8))
    await store.place(pool, spec("pinned", priority=0, eviction_policy="Never"))
    await asyncio.sleep(0.06)  # all three are idle for >= 50 ms now

    # A newcomer of priority 5 may evict `low` (1 <= 5) but never `high` (8 > 5) nor `pinned`.
    first = await store.place(pool, spec("new-1", priority=5), may_evict=True, min_idle_ms=50)
    assert first.victim == "low"
    assert first.placement is not None
    assert first.placement.pod == "w-a"
    assert not first.placement.reset_required
    # new-1 was just placed: not idle, so it is no victim either (no thrashing between newcomers).
    second = await store.place(pool, spec("new-2", priority=5), may_evict=True, min_idle_ms=50)
    assert second.placement is None
    assert second.victim is None
    # Without may_evict nothing is evicted even though `low`-like victims would qualify.
    assert (await store.place(pool, spec("new-3", priority=9), may_evict=False)).placement is None

    # The evicted session comes back only into a free slot, never by evicting.
    assert (await store.place(pool, spec("low", priority=1), may_evict=True)).placement is None
    assert (await store.get_session(pool, "low")).state is SessionState.EVICTED  # type: ignore[union-attr]
    await store.release(pool, "new-1", reason="deleted")
    back = await store.place(pool, spec("low", priority=1), may_evict=True)
    assert back.placement is not None
    assert back.placement.reset_required
    assert back.victim is None
    record = await store.get_session(pool, "low")
    assert record is not None
    assert (record.state, record.reset_required, record.chunk_index) == ("placed", True, 0)

    # A priority-9 newcomer may evict `high` too, but the lowest priority goes first.
    await asyncio.sleep(0.06)
    third = await store.place(pool, spec("new-4", priority=9), may_evict=True, min_idle_ms=50)
    assert third.victim == "low"  # lowest priority first, even though `high` ticked longer ago
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session) for e in events] == [("evict", "low"), ("close", "new-1"), ("evict", "low")]
    assert await store.check_invariants(pool) == []


async def test_a_lost_session_may_evict_an_idle_one(store: PlacementStore, pool: PoolId) -> None:
    """A session whose pod died did not lose its slot to the policy: it takes an idle session's slot like a
    newcomer (same bounds), while its victim, now `evicted`, may not evict in turn."""
    await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("active", priority=3))
    await store.place(pool, spec("idle", priority=3))
    placed = await placed_pods(store, pool, ["active", "idle"])
    await asyncio.sleep(0.06)
    assert await store.remove_pod(pool, placed["active"]) == ("active",)

    back = await store.place(pool, spec("active", priority=3), may_evict=True, min_idle_ms=50)
    assert back.victim == "idle"
    assert back.placement is not None
    assert (back.placement.pod, back.placement.reset_required) == (placed["idle"], True)
    assert (await store.get_session(pool, "idle")).state is SessionState.EVICTED  # type: ignore[union-attr]
    # The victim does not evict back, even once the session it lost to is idle.
    await asyncio.sleep(0.06)
    again = await store.place(pool, spec("idle", priority=3), may_evict=True, min_idle_ms=50)
    assert again.placement is None
    # Without may_evict (the pool may still grow) a lost session waits for a free slot, like a newcomer.
    await register(store, pool, "w-c", capacity=1)
    await store.place(pool, spec("other", priority=3))
    assert await store.remove_pod(pool, "w-c") == ("other",)
    assert (await store.place(pool, spec("other", priority=3), may_evict=False)).placement is None
    assert await store.check_invariants(pool) == []


async def test_victims_on_draining_or_dead_pods_are_skipped(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("on-a"))
    await store.place(pool, spec("on-b"))
    placed = await placed_pods(store, pool, ["on-a", "on-b"])
    assert sorted(placed.values()) == ["w-a", "w-b"]
    await store.set_draining(pool, placed["on-a"], draining=True)
    result = await store.place(pool, spec("new"), may_evict=True)
    assert result.victim == "on-b"  # on-a is older, but its pod takes no new session
    assert result.placement is not None
    assert result.placement.pod == placed["on-b"]


# ---- pods: leases, fencing, draining, removal -------------------------------------------------------------


async def test_reap_expired_returns_exactly_the_dead_pods_sessions(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-dying", capacity=2, lease_ms=150)
    await register(store, pool, "w-alive", capacity=2)
    names = [f"s{i}" for i in range(4)]
    for name in names:
        await store.place(pool, spec(name))
    where = await placed_pods(store, pool, names)
    assert sorted(where.values()) == ["w-alive", "w-alive", "w-dying", "w-dying"]

    assert await store.reap_expired(pool) == {}
    await asyncio.sleep(0.2)
    reaped = await store.reap_expired(pool)
    assert {pod: sorted(sessions) for pod, sessions in reaped.items()} == {
        "w-dying": sorted(n for n, p in where.items() if p == "w-dying")
    }
    records = await store.get_sessions(pool, names)
    assert {n: r.state for n, r in records.items()} == {
        n: ("lost" if p == "w-dying" else "placed") for n, p in where.items()
    }
    assert [p.name for p in await store.list_pods(pool)] == ["w-alive"]
    assert await store.client.exists(f"{pool.tag}:events:w-dying") == 0
    assert await store.reap_expired(pool) == {}
    assert await store.check_invariants(pool) == []


async def test_a_heartbeat_after_the_lease_was_reaped_is_fenced_not_recreated(
    store: PlacementStore, pool: PoolId
) -> None:
    """A pod cut off from Redis past its lease (issue 40): the operator reaps it and its sessions go
    elsewhere. Its heartbeat on reconnecting used to re-create the record with the same epoch (as after a
    Redis data loss), so the pod counted its stale books as placed here again. Fenced now; a restart registers
    a new epoch and leaves the reaped index; a deleted pod's removal leaves no entry behind."""
    reaped = await register(store, pool, "w-cut", capacity=1, lease_ms=150)
    await store.place(pool, spec("s1"))
    await asyncio.sleep(0.2)
    assert set(await store.reap_expired(pool)) == {"w-cut"}
    assert await store.client.zrange(f"{pool.tag}:reaped", 0, -1) == [b"w-cut"]
    with pytest.raises(PodFenced, match="lease lapsed") as fenced:
        await heartbeat(store, pool, "w-cut", reaped.epoch, capacity=1)
    assert fenced.value.current_epoch == 0
    assert await store.get_pod(pool, "w-cut") is None
    restarted = await register(store, pool, "w-cut", capacity=1)
    assert restarted.epoch > reaped.epoch
    assert await store.client.zrange(f"{pool.tag}:reaped", 0, -1) == []
    renewed = await heartbeat(store, pool, "w-cut", restarted.epoch, capacity=1)
    assert renewed == PodRegistration(epoch=restarted.epoch)
    # Redis losing its data loses the index too: a heartbeat then re-creates the record, as before.
    await store.client.delete(f"{pool.tag}:pod:w-cut", f"{pool.tag}:pods")
    recreated = await heartbeat(store, pool, "w-cut", restarted.epoch, capacity=1)
    assert (recreated.epoch, recreated.recreated) == (restarted.epoch, True)


async def test_a_restarted_worker_fences_its_previous_incarnation(
    store: PlacementStore, pool: PoolId
) -> None:
    old = await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.place(pool, spec("s2"))
    new = await register(store, pool, "w-a", capacity=2)
    assert new.epoch > old.epoch
    assert sorted(new.lost_sessions) == ["s1", "s2"]
    assert {r.state for r in (await store.get_sessions(pool, ["s1", "s2"])).values()} == {"lost"}
    pod = await store.get_pod(pool, "w-a")
    assert pod is not None
    assert (pod.epoch, pod.used) == (new.epoch, 0)

    with pytest.raises(PodFenced) as fenced:
        await store.heartbeat(
            pool, "w-a", epoch=old.epoch, capacity=2, endpoint="http://w-a.workers:8000", lease_ms=LEASE_MS
        )
    assert fenced.value.current_epoch == new.epoch
    with pytest.raises(PodFenced):
        await store.touch(pool, "s1", pod="w-a", epoch=old.epoch, chunk_index=1)
    with pytest.raises(PodFenced):
        await store.mark_reset_required(pool, "s1", pod="w-a", epoch=old.epoch)
    renewed = await store.heartbeat(
        pool, "w-a", epoch=new.epoch, capacity=2, endpoint="http://w-a.workers:8000", lease_ms=LEASE_MS
    )
    assert renewed == PodRegistration(epoch=new.epoch)

    # The new incarnation does not hold the lost sessions until they are placed again (with a reset).
    with pytest.raises(SessionNotHere) as not_here:
        await store.touch(pool, "s1", pod="w-a", epoch=new.epoch, chunk_index=1)
    assert not_here.value.state is SessionState.LOST
    again = await store.place(pool, spec("s1"), may_evict=True)
    assert again.placement is not None
    assert (again.placement.pod_epoch, again.placement.reset_required) == (new.epoch, True)
    assert await store.check_invariants(pool) == []


async def test_epochs_increase_even_within_one_millisecond(store: PlacementStore, pool: PoolId) -> None:
    epochs = [(await register(store, pool, "w-a", capacity=1)).epoch for _ in range(20)]
    assert epochs == sorted(set(epochs))


async def test_heartbeat_cannot_shrink_capacity_below_placed_sessions(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.place(pool, spec("s2"))
    with pytest.raises(CapacityBelowUsed):
        await store.heartbeat(
            pool, "w-a", epoch=reg.epoch, capacity=1, endpoint="http://w-a.workers:8000", lease_ms=LEASE_MS
        )
    assert [(p.capacity, p.used) for p in await store.list_pods(pool)] == [(2, 2)]


async def test_drain_pod_only_when_empty(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    assert await store.drain_pod(pool, "w-a", only_if_empty=True) is False
    assert (await store.get_pod(pool, "w-a")).draining is False  # type: ignore[union-attr]
    await store.release(pool, "s1", reason="deleted")
    assert await store.drain_pod(pool, "w-a", only_if_empty=True) is True
    assert (await store.get_pod(pool, "w-a")).draining is True  # type: ignore[union-attr]
    assert (await store.place(pool, spec("s2"))).placement is None
    with pytest.raises(UnknownPod):
        await store.drain_pod(pool, "w-gone")
    assert await store.check_invariants(pool) == []


async def test_get_bindings_reads_where_sessions_are_without_their_prompt_or_image(
    store: PlacementStore, pool: PoolId
) -> None:
    a = await register(store, pool, "w-a", capacity=2)
    ticking = spec(
        "ticking", prompt="a forest", image=b"\x89PNG" * 1000, playout_fps=12.5, playout_buffer_chunks=3
    )
    await store.place(pool, ticking)
    await store.place(pool, spec("reset", prompt="a desert"))
    await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("lost", prompt="the sea"))  # w-a is full: on w-b
    tick_ms = await store.touch(pool, "ticking", pod="w-a", epoch=a.epoch, chunk_index=4)
    await store.mark_reset_required(pool, "reset", pod="w-a", epoch=a.epoch)
    assert await store.remove_pod(pool, "w-b") == ("lost",)

    bindings = await store.get_bindings(pool, ["ticking", "reset", "lost", "never-placed"])

    assert set(bindings) == {"ticking", "reset", "lost"}  # no record, no binding
    assert bindings["ticking"] == SessionBinding(
        name="ticking",
        state=SessionState.PLACED,
        pod="w-a",
        pod_epoch=a.epoch,
        reset_required=False,
        chunk_index=4,
        last_tick_ms=tick_ms,
        playout_fps=12.5,
        playout_buffer_chunks=3,
    )
    assert (bindings["reset"].state, bindings["reset"].reset_required) == (SessionState.PLACED, True)
    assert bindings["lost"].state is SessionState.LOST
    # The same values a whole record has, field by field.
    full = await store.get_sessions(pool, ["ticking", "reset", "lost"])
    for name, binding in bindings.items():
        assert {f: getattr(full[name], f) for f in SessionBinding.FIELDS} == {
            f: getattr(binding, f) for f in SessionBinding.FIELDS
        }
    assert await store.get_bindings(pool, []) == {}


def test_a_binding_reads_its_values_by_position_from_a_reply_or_json() -> None:
    """Scripts answer a binding's (and a pod record's) values in `FIELDS` order and it is built by position:
    the dataclass' fields after `name` are FIELDS, every value reads from bytes (a reply) and str (JSON), an
    empty one is the default, and a state nobody wrote is an error, not a guess."""
    for record in (SessionBinding, PodRecord):
        assert tuple(f.name for f in dataclasses.fields(record))[1:] == record.FIELDS
    given = {"state": "suspended", "pod": "w-a", "pod_epoch": "7", "reset_required": "1", "chunk_index": "12"}
    given |= {"tier": "local", "bytes": "4096", "playout_fps": "12.5", "kept_chunks": "4,8"}
    expected = SessionBinding(
        name="s",
        state=SessionState.SUSPENDED,
        pod="w-a",
        pod_epoch=7,
        reset_required=True,
        chunk_index=12,
        last_tick_ms=0,
        tier="local",
        bytes=4096,
        playout_fps=12.5,
        kept_chunks=(4, 8),
    )
    texts = [given.get(f, "") for f in SessionBinding.FIELDS]
    assert SessionBinding.from_values("s", texts) == expected
    assert SessionBinding.from_values("s", [v.encode() or None for v in texts]) == expected
    assert SessionBinding.from_values("s", [None] * len(SessionBinding.FIELDS)) is None  # no record
    with pytest.raises(ValueError, match="'floating'"):
        SessionBinding.from_values("s", [b"floating", *[None] * (len(SessionBinding.FIELDS) - 1)])


async def test_ping_and_server_time(store: PlacementStore, pool: PoolId) -> None:
    await store.ping()
    before = await store.server_time_ms()
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    ticked = await store.touch(
        pool, "s1", pod="w-a", epoch=(await store.get_pod(pool, "w-a")).epoch, chunk_index=1
    )  # type: ignore[union-attr]
    assert before <= ticked <= await store.server_time_ms()  # the clock the scripts stamp ticks with


async def test_remove_pod_loses_its_sessions(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.place(pool, spec("s2"))
    assert sorted(await store.remove_pod(pool, "w-a")) == ["s1", "s2"]
    assert await store.remove_pod(pool, "w-a") == ()
    assert await store.list_pods(pool) == []
    assert {r.state for r in (await store.get_sessions(pool, ["s1", "s2"])).values()} == {"lost"}
    assert await store.check_invariants(pool) == []


async def test_delete_pool_removes_every_key(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.release(pool, "s1", reason="bye")
    assert await store.delete_pool(pool) > 0
    assert [key async for key in store.client.scan_iter(match=f"{pool.tag}*")] == []


async def test_check_invariants_reports_corruption(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.client.hset(f"{pool.tag}:pod:w-a", "used", 3)
    await store.client.hset(f"{pool.tag}:session:s1", "pod_epoch", 1)
    violations = await store.check_invariants(pool)
    assert "pod w-a used=3 but 1 sessions are placed on it" in violations
    assert "pod w-a used=3 exceeds capacity=2" in violations
    assert any(v.startswith("session s1 has pod_epoch 1") for v in violations)


# ---- concurrency ------------------------------------------------------------------------------------------

PLACERS = 32
TOTAL_OPERATIONS = 5_000


async def test_concurrent_placers_never_over_admit(redis_url: str, pool: PoolId) -> None:
    """32 placers on 4 clients, 5,000 place/release/touch operations in all, against 8 pods (36 slots)."""
    stores = [PlacementStore.from_url(redis_url) for _ in range(4)]
    capacities = {f"w-{i}": 3 + i % 4 for i in range(8)}
    try:
        for pod, capacity in capacities.items():
            await register(stores[0], pool, pod, capacity)
        names = [f"s{i}" for i in range(120)]
        done: Counter[str] = Counter()
        over_admitted: list[str] = []
        running = True

        async def placer(index: int) -> None:
            store = stores[index % len(stores)]
            rng = random.Random(index)
            for _ in range(TOTAL_OPERATIONS // PLACERS + (index < TOTAL_OPERATIONS % PLACERS)):
                name, roll = rng.choice(names), rng.random()
                if roll < 0.5:
                    result = await store.place(
                        pool, spec(name, priority=rng.randint(0, 3)), may_evict=rng.random() < 0.3
                    )
                    done["placed" if result.placement else "pending"] += 1
                    done["evictions"] += result.victim is not None
                elif roll < 0.75:
                    done[f"release-{await store.release(pool, name, reason='test')}"] += 1
                else:
                    record = await store.get_session(pool, name)
                    if record is None or record.state is not SessionState.PLACED:
                        done["touch-skipped"] += 1
                        continue
                    try:
                        await store.touch(pool, name, pod=record.pod, epoch=record.pod_epoch, chunk_index=1)
                        done["touched"] += 1
                    except (SessionNotHere, UnknownSession):  # released or evicted since the read
                        done["touch-refused"] += 1

        async def watch_capacity() -> None:
            while running:
                over_admitted.extend(
                    f"{p.name}: {p.used}/{p.capacity}"
                    for p in await stores[0].list_pods(pool)
                    if p.used > p.capacity
                )
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch_capacity())
        await asyncio.gather(*(placer(i) for i in range(PLACERS)))
        running = False
        await watcher

        operations = sum(v for k, v in done.items() if k != "evictions")
        assert operations == TOTAL_OPERATIONS
        assert over_admitted == []
        assert done["placed"] > 100
        assert done["evictions"] > 10
        assert done["release-placed"] > 100
        assert done["touched"] > 100
        assert await stores[0].check_invariants(pool) == []
        pods = await stores[0].list_pods(pool)
        records = await stores[0].get_sessions(pool, names)
        placed = [r for r in records.values() if r.state is SessionState.PLACED]
        assert sum(p.used for p in pods) == len(placed)
        assert all(p.used <= capacities[p.name] for p in pods)
    finally:
        for store in stores:
            await store.close()


async def test_competing_evictors_all_make_progress(redis_url: str, pool: PoolId) -> None:
    """Every concurrent evictor wants the same least recently ticked sessions; each call still completes."""
    stores = [PlacementStore.from_url(redis_url) for _ in range(4)]
    try:
        for i in range(4):
            await register(stores[0], pool, f"w-{i}", capacity=100)
        for i in range(400):
            await stores[0].place(pool, spec(f"old-{i:03d}"))

        async def evictor(index: int) -> list[str]:
            store, evicted = stores[index % len(stores)], []
            for round_ in range(10):
                if round_ % 2:
                    victim = await store.evict_lru(pool, min_idle_ms=0)
                    assert victim is not None
                else:
                    placed = await store.place(
                        pool, spec(f"new-{index}-{round_}", priority=1), may_evict=True
                    )
                    assert placed.placement is not None  # into a slot an evict_lru freed, or by evicting
                    victim = placed.victim
                evicted += [victim] if victim else []
            return evicted

        evicted = [
            name for names in await asyncio.gather(*(evictor(i) for i in range(PLACERS))) for name in names
        ]
        assert len(evicted) >= 5 * PLACERS  # at least every evict_lru call
        assert len(evicted) == len(set(evicted))  # no session was evicted twice
        assert all(
            name.startswith("old-") for name in evicted
        )  # priority 0 goes before the priority-1 newcomers
        records = await stores[0].get_sessions(pool, evicted)
        assert {r.state for r in records.values()} == {SessionState.EVICTED}
        assert await stores[0].check_invariants(pool) == []
    finally:
        for store in stores:
            await store.close()


# ---- bad arguments ----------------------------------------------------------------------------------------


async def pool_state(store: PlacementStore, pool: PoolId) -> dict[bytes, object]:
    """Every key of the pool with its full content (hashes, sets, sorted sets, streams)."""
    state: dict[bytes, object] = {}
    async for key in store.client.scan_iter(match=f"{pool.tag}*"):
        kind = (await store.client.type(key)).decode()
        readers = {
            "hash": store.client.hgetall,
            "set": store.client.smembers,
            "zset": lambda k: store.client.zrange(k, 0, -1, withscores=True),
            "stream": store.client.xrange,
        }
        state[key] = (kind, await readers[kind](key))
    return state


def _call(method: str, **kwargs: object) -> tuple[str, dict[str, object]]:
    return method, kwargs


BAD_CALLS = [
    _call("register_pod", pod="Bad_Name", capacity=1, endpoint="http://w:8000", lease_ms=1000),
    _call("register_pod", pod="w-a", capacity=-1, endpoint="http://w:8000", lease_ms=1000),
    _call("register_pod", pod="w-a", capacity=True, endpoint="http://w:8000", lease_ms=1000),
    _call("register_pod", pod="w-a", capacity=1, endpoint="", lease_ms=1000),
    _call("register_pod", pod="w-a", capacity=1, endpoint="ftp://w:21", lease_ms=1000),
    _call("register_pod", pod="w-a", capacity=1, endpoint="http://w:8000", lease_ms=0),
    _call("register_pod", pod="w-a", capacity=1, endpoint="http://w:8000", lease_ms=9, compute_fps=-1.0),
    _call(
        "register_pod", pod="w-a", capacity=1, endpoint="http://w:8000", lease_ms=9, compute_fps=float("nan")
    ),
    _call("register_pod", pod="w-a", capacity=1, endpoint="http://w:8000", lease_ms=9, tick_ms="5"),
    _call("heartbeat", pod="w-a", epoch=0, capacity=1, endpoint="http://w:8000", lease_ms=1000),
    _call("touch", session="s1", pod="w-a", epoch=1, chunk_index=-1),
    _call("touch", session="S1", pod="w-a", epoch=1, chunk_index=0),
    _call("touch", session="s1", pod="w-a", epoch=-3, chunk_index=0),
    _call("mark_reset_required", session="s1", pod="", epoch=1),
    _call("read_events", pod="w-a", count=0),
    _call("read_events", pod="w-a", block_ms=-1),
    _call("ack_events", pod="w-a", ids=[""]),
    _call("set_draining", pod="w_a"),
    _call("place", spec="s1"),
    _call("place", spec=spec("s1"), policy="random"),
    _call("place", spec=spec("s1"), min_idle_ms=-5),
    _call("restore", spec=spec("s1"), pod="w-a", pod_epoch=0, chunk_index=0, reset_required=False),
    _call("restore", spec=spec("s1"), pod="w-a", pod_epoch=5, chunk_index=-1, reset_required=False),
    _call("release", session="s1", reason=""),
    _call("release", session="-s1", reason="bye"),
    _call("evict_lru", min_idle_ms=0, max_priority=1001),
    _call("evict_lru", min_idle_ms=-1),
    _call("drain_pod", pod="x" * 64),
    _call("remove_pod", pod="W-A"),
    _call("get_sessions", names=["ok", "not ok"]),
    _call("get_bindings", names=["Not-ok"]),
]


@pytest.mark.parametrize(
    ("method", "kwargs"), BAD_CALLS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(BAD_CALLS)]
)
async def test_bad_arguments_raise_and_change_nothing(
    store: PlacementStore, pool: PoolId, method: str, kwargs: dict[str, object]
) -> None:
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    before = await pool_state(store, pool)
    with pytest.raises(InvalidPlacementArgument) as raised:
        await getattr(store, method)(pool, **kwargs)
    assert raised.value.code == "invalid_argument"
    assert str(raised.value).startswith("placement ")
    assert await pool_state(store, pool) == before


async def test_a_pool_must_be_a_pool_id(store: PlacementStore) -> None:
    with pytest.raises(InvalidPlacementArgument, match="pool must be a PoolId"):
        await store.list_pods("default/p")  # type: ignore[arg-type]
    with pytest.raises(InvalidPlacementArgument, match="namespace must be a DNS-1123 label"):
        PoolId("Default", "p")


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "s1", "token_sha256": "abc"},
        {"name": "s1", "token_sha256": TOKEN, "priority": 1001},
        {"name": "s1", "token_sha256": TOKEN, "seed": -1},
        {"name": "s1", "token_sha256": TOKEN, "image": b"x" * (4 * 1024 * 1024 + 1)},
        {"name": "s1", "token_sha256": TOKEN, "eviction_policy": "Sometimes"},
        {"name": "s1", "token_sha256": TOKEN, "playout_fps": -1.0},
        {"name": "s1", "token_sha256": TOKEN, "playout_fps": 120.5},
        {"name": "s1", "token_sha256": TOKEN, "playout_fps": float("inf")},
        {"name": "s1", "token_sha256": TOKEN, "playout_buffer_chunks": 17},
        {"name": "s1", "token_sha256": TOKEN, "playout_buffer_chunks": 1.5},
    ],
)
def test_bad_session_specs_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(InvalidPlacementArgument):
        SessionSpec(**fields)  # type: ignore[arg-type]


async def test_place_recovers_from_a_stale_hint(store: PlacementStore, pool: PoolId, redis_url: str) -> None:
    """The pod the previous reply predicted is gone by the next call: the script asks for the right keys."""
    await register(store, pool, "w-a", capacity=2)
    await register(store, pool, "w-b", capacity=2)
    first = await store.place(pool, spec("s1"))
    assert first.placement is not None
    predicted = "w-b" if first.placement.pod == "w-a" else "w-a"
    async with PlacementStore.from_url(redis_url) as other_operator:
        await other_operator.set_draining(pool, predicted, draining=True)
    second = await store.place(pool, spec("s2"))
    assert second.placement is not None
    assert second.placement.pod == first.placement.pod
    assert await store.check_invariants(pool) == []


async def test_streams_are_trimmed_and_trimmed_pending_entries_are_dropped(
    redis_url: str, pool: PoolId
) -> None:
    async with PlacementStore.from_url(redis_url, stream_maxlen=10) as store:
        await register(store, pool, "w-a", capacity=1)
        for i in range(5):
            await store.place(pool, spec(f"early-{i}"))
            await store.release(pool, f"early-{i}", reason="bye")
        delivered = await store.read_events(pool, "w-a")  # pending, never acknowledged
        assert [e.session for e in delivered] == [f"early-{i}" for i in range(5)]
        for i in range(300):
            await store.place(pool, spec(f"late-{i}"))
            await store.release(pool, f"late-{i}", reason="bye")
        stream = f"{pool.tag}:events:w-a"
        # MAXLEN ~ trims whole stream nodes (100 entries each): the stream stays near its bound.
        assert await store.client.xlen(stream) <= 10 + 100
        # The early entries were trimmed while pending: they are dropped (acknowledged), the survivors follow.
        fresh = await store.read_events(pool, "w-a", count=1000)
        assert not any(e.session.startswith("early-") for e in fresh)
        assert fresh[-1].session == "late-299"
        assert len(fresh) == await store.client.xlen(stream)
        assert (await store.client.xpending(stream, "worker"))["pending"] == len(fresh)


async def test_the_store_lists_its_pools_and_their_session_names(store: PlacementStore, pool: PoolId) -> None:
    """What the operator's sweeps compare with the API (operator/sweep.py): every pool with a key, and every
    session record of a pool, closed ones included."""
    other = PoolId("other-ns", pool.name)
    await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.place(pool, spec("s2"))
    await register(store, other, "w-b", capacity=1)
    await store.place(other, spec("elsewhere"))
    await store.release(pool, "s2", reason="deleted")
    names = await store.list_session_names()
    assert (names[pool], names[other]) == ({"s1", "s2"}, {"elsewhere"})
    assert {pool, other} <= await store.list_pools()
    await store.delete_pool(other)
    assert other not in await store.list_pools()
    assert pool in await store.list_pools()


def test_pool_of_key_reads_back_the_pool_of_every_key_and_nothing_else() -> None:
    pool = PoolId("ns-1", "pool-a")
    keys = PoolKeys(pool)
    for key in (keys.pod("p"), keys.session("s"), keys.events("p"), keys.pods, keys.lru, keys.suspending):
        assert pool_of_key(key) == pool, key
    foreign_keys = ("{ardiff:ns-1/pool-a}", "{ardiff:ns-1}:pods", "{other:ns/p}:pods", "{ardiff:NS/p}:x", "x")
    for foreign in foreign_keys:
        assert pool_of_key(foreign) is None, foreign
