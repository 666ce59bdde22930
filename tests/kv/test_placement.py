"""The placement store against the shared real redis-server: each test owns a pool (`unique_pool`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest

from ardiff.kv.errors import PodFenced, SessionNotHere, UnknownPod, UnknownSession
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRegistration, PoolId, SessionSpec, SessionState

TOKEN = hashlib.sha256(b"token").hexdigest()
LEASE_MS = 60_000


def spec(name: str, **fields: object) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, **fields)  # type: ignore[arg-type]


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[PlacementStore]:
    async with PlacementStore.from_url(redis_url) as placement_store:
        yield placement_store


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


async def register(
    store: PlacementStore, pool: PoolId, pod: str, capacity: int, lease_ms: int = LEASE_MS
) -> PodRegistration:
    return await store.register_pod(
        pool, pod, capacity=capacity, endpoint=f"http://{pod}.workers:8000", lease_ms=lease_ms
    )


async def placed_pods(store: PlacementStore, pool: PoolId, names: list[str]) -> dict[str, str]:
    records = await store.get_sessions(pool, names)
    return {name: record.pod for name, record in records.items() if record.state is SessionState.PLACED}


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
    reader = asyncio.create_task(store.read_events(pool, "w-a", block_ms=5_000))
    await asyncio.sleep(0.05)
    await store.release(pool, "s1", reason="bye")
    events = await asyncio.wait_for(reader, timeout=5)
    assert [e.session for e in events] == ["s1"]
