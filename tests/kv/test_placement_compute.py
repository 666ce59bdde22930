"""Issue 25 in the placement store: admission by compute as well as KV slots (docs/contracts.md §2).

A pod's `demand_fps` (the playout_fps of the sessions holding its slots) changes with `used` in every script;
`place` takes a pod only if the session fits its `compute_fps`, and says why a session waits. Against the
shared real redis-server, one pool per test; every test ends with the store's invariants holding.
"""

from __future__ import annotations

import asyncio

import pytest

from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRegistration, PoolId, SessionSpec
from tests.kv.test_placement import spec

LEASE_MS = 60_000
FPS = 16.0


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


async def register(
    store: PlacementStore,
    pool: PoolId,
    pod: str,
    *,
    capacity: int = 4,
    compute_fps: float = 0.0,
    exports: bool = False,
    lease_ms: int = LEASE_MS,
) -> PodRegistration:
    return await store.register_pod(
        pool,
        pod,
        capacity=capacity,
        endpoint=f"http://{pod}.workers:8000",
        lease_ms=lease_ms,
        exports=exports,
        compute_fps=compute_fps,
        tick_ms=750.0,
    )


def playing(name: str, fps: float = FPS) -> SessionSpec:
    return spec(name, playout_fps=fps, playout_buffer_chunks=2)


async def demand(store: PlacementStore, pool: PoolId) -> dict[str, tuple[int, float]]:
    """Every pod's (used, demand_fps); the invariants hold."""
    assert await store.check_invariants(pool) == []
    return {pod.name: (pod.used, pod.demand_fps) for pod in await store.list_pods(pool)}


async def pod_of(store: PlacementStore, pool: PoolId, session: SessionSpec, **options: object) -> str | None:
    result = await store.place(pool, session, **options)  # type: ignore[arg-type]
    return result.placement.pod if result.placement else None


async def test_a_pod_takes_sessions_while_their_demand_fits_its_compute(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", compute_fps=40.0)
    assert [await pod_of(store, pool, playing(n)) for n in ("s1", "s2")] == ["w-a", "w-a"]
    assert await demand(store, pool) == {"w-a": (2, 32.0)}
    # 32 + 16 > 40: w-a has two free slots and is still open (32 < 40), but s3 does not fit.
    waiting = await store.place(pool, playing("s3"))
    assert (waiting.placement, waiting.pending_reason) == (None, "compute")
    assert await pod_of(store, pool, playing("small", fps=8.0)) == "w-a"  # 32 + 8 <= 40: an exact fit
    assert await demand(store, pool) == {"w-a": (3, 40.0)}
    # At its bound the pod leaves the open index: not even a session without a target goes there.
    no_target = await store.place(pool, spec("no-target"))
    assert (no_target.placement, no_target.pending_reason) == (None, "compute")
    await register(store, pool, "w-b")  # compute 0: admitted by KV slots only
    assert await pod_of(store, pool, playing("s3")) == "w-b"
    assert await demand(store, pool) == {"w-a": (3, 40.0), "w-b": (1, 16.0)}


async def test_without_a_free_slot_a_session_waits_for_capacity(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=1, compute_fps=100.0)
    await store.place(pool, playing("s1"))
    waiting = await store.place(pool, playing("s2"))
    assert (waiting.placement, waiting.pending_reason) == (None, "capacity")
    # A pod with a slot but no compute left makes it wait for compute; a dead or draining one does not.
    await register(store, pool, "w-dead", compute_fps=8.0, lease_ms=1)
    await register(store, pool, "w-drain", compute_fps=8.0)
    await store.set_draining(pool, "w-drain")
    await asyncio.sleep(0.01)
    assert (await store.place(pool, playing("s2"))).pending_reason == "capacity"
    await register(store, pool, "w-small", compute_fps=8.0)
    assert (await store.place(pool, playing("s2"))).pending_reason == "compute"
    await store.place(pool, playing("s1"))  # idempotent: placed
    assert (await store.place(pool, playing("s1"))).pending_reason == ""


async def test_place_skips_pods_that_do_not_fit_past_one_batch(store: PlacementStore, pool: PoolId) -> None:
    """40 open pods that do not fit come first in least-loaded order; the one that fits is taken."""
    for i in range(40):
        await register(store, pool, f"w-{i:02d}", compute_fps=20.0)
        assert await pod_of(store, pool, playing(f"small-{i:02d}", fps=10.0)) == f"w-{i:02d}"  # load 0.5
    await register(store, pool, "w-big", compute_fps=100.0)
    assert await pod_of(store, pool, playing("filler", fps=60.0)) == "w-big"  # load 0.6
    assert await pod_of(store, pool, playing("s1")) == "w-big"
    assert (await demand(store, pool))["w-big"] == (2, 76.0)


async def test_open_score_is_the_larger_of_slot_and_compute_load(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-compute", capacity=8, compute_fps=20.0)  # 1 of 8 slots, 16 of 20 fps: 0.8
    assert await pod_of(store, pool, playing("b")) == "w-compute"
    await register(store, pool, "w-slots", capacity=2, compute_fps=1000.0)  # 1 of 2 slots: 0.5
    assert await pod_of(store, pool, playing("a", fps=1.0)) == "w-slots"
    open_index = dict(await store.client.zrange(f"{pool.tag}:open", 0, -1, withscores=True))
    assert open_index == {b"w-slots": 0.5, b"w-compute": 0.8}
    assert await pod_of(store, pool, playing("c", fps=1.0)) == "w-slots"


async def test_demand_leaves_with_the_slot_on_release_and_eviction(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", compute_fps=48.0)
    for name, fps in (("s1", 16.0), ("s2", 12.5), ("s3", 8.0)):
        await store.place(pool, playing(name, fps))
    assert await demand(store, pool) == {"w-a": (3, 36.5)}
    await store.release(pool, "s2", reason="done")
    assert await demand(store, pool) == {"w-a": (2, 24.0)}
    await store.release(pool, "s2", reason="again")  # idempotent: nothing given back twice
    assert await demand(store, pool) == {"w-a": (2, 24.0)}
    assert await store.evict_lru(pool, min_idle_ms=0) == "s1"
    assert await demand(store, pool) == {"w-a": (1, 8.0)}
    await store.release(pool, "s3", reason="done")
    assert await demand(store, pool) == {"w-a": (0, 0.0)}


async def test_an_idle_session_counts_in_full_and_eviction_makes_room_only_if_the_session_fits(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=2, compute_fps=20.0)
    await store.place(pool, playing("idle-4", fps=4.0))
    await asyncio.sleep(0.005)  # LRU order: idle-4 first (ties go by name)
    await store.place(pool, playing("idle-12", fps=12.0))  # neither ever ticks: 16 of 20 fps still taken
    assert (await store.place(pool, playing("new"))).pending_reason == "capacity"
    # The first victim (idle-4, least recently placed) leaves 12 + 16 > 20: nobody is evicted.
    refused = await store.place(pool, playing("new"), may_evict=True)
    assert (refused.placement, refused.victim, refused.pending_reason) == (None, None, "compute")
    assert await demand(store, pool) == {"w-a": (2, 16.0)}
    await store.release(pool, "idle-12", reason="done")
    await store.place(pool, playing("idle-12b", fps=4.0))  # w-a: 4 + 4 of 20 fps, full by slots
    taken = await store.place(pool, playing("new"), may_evict=True)  # 4 + 16 <= 20 once idle-4 leaves
    assert (taken.placement and taken.placement.pod, taken.victim) == ("w-a", "idle-4")
    assert await demand(store, pool) == {"w-a": (2, 20.0)}


async def test_demand_goes_with_the_pod_when_it_is_lost_and_restarts_at_zero(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", compute_fps=40.0)
    await store.place(pool, playing("s1"))
    await store.place(pool, playing("s2"))
    await register(store, pool, "w-b", compute_fps=40.0)
    assert await pod_of(store, pool, playing("s3")) == "w-b"
    assert await store.remove_pod(pool, "w-b") == ("s3",)
    assert await demand(store, pool) == {"w-a": (2, 32.0)}
    await register(store, pool, "w-a", compute_fps=40.0)  # a restarted worker: its sessions are lost
    assert await demand(store, pool) == {"w-a": (0, 0.0)}
    assert await pod_of(store, pool, playing("s1")) == "w-a"  # placed again: charged again
    assert await demand(store, pool) == {"w-a": (1, 16.0)}


async def test_a_heartbeat_lowering_compute_closes_the_pod(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", compute_fps=64.0)
    await store.place(pool, playing("s1"))
    await store.place(pool, playing("s2"))
    assert await store.client.zscore(f"{pool.tag}:open", "w-a") == 0.5
    await store.heartbeat(
        pool,
        "w-a",
        epoch=reg.epoch,
        capacity=4,
        endpoint="http://w-a.workers:8000",
        lease_ms=LEASE_MS,
        compute_fps=30.0,  # measured slower: 32 fps of demand > 30
        tick_ms=800.0,
    )
    assert await store.client.zscore(f"{pool.tag}:open", "w-a") is None
    assert (await store.place(pool, playing("s3"))).pending_reason == "compute"
    assert await demand(store, pool) == {"w-a": (2, 32.0)}  # nobody is dropped: demand may exceed compute


async def test_demand_leaves_when_a_session_is_suspended_or_its_suspension_expires(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=2, compute_fps=64.0, exports=True)
    await store.place(pool, playing("s1"))
    await store.place(pool, playing("s2", fps=10.0))
    assert await store.suspend(pool, "s1", reason="migrate")
    assert await demand(store, pool) == {"w-a": (2, 26.0)}  # suspending: it keeps its slot and its demand
    held = await store.get_session(pool, "s1")
    assert held is not None
    await store.mark_suspended(
        pool,
        "s1",
        pod="w-a",
        epoch=held.pod_epoch,
        tier="shared",
        location="/tier/s1.ards",
        bytes=1,
        chunk_index=3,
    )
    assert await demand(store, pool) == {"w-a": (1, 10.0)}
    assert await store.suspend(pool, "s2", reason="migrate")
    await asyncio.sleep(0.01)
    assert await store.expire_suspending(pool, timeout_ms=1) == ("s2",)
    assert await demand(store, pool) == {"w-a": (0, 0.0)}
    assert await pod_of(store, pool, playing("s1")) == "w-a"  # resumed: charged again
    assert await demand(store, pool) == {"w-a": (1, 16.0)}


async def test_restore_charges_the_demand_of_the_binding_it_rebuilds(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", compute_fps=10.0)
    restored = await store.restore(
        pool, playing("s1"), pod="w-a", pod_epoch=reg.epoch, chunk_index=4, reset_required=False
    )
    assert restored is not None  # the binding existed: restored whatever the pod's compute
    assert await demand(store, pool) == {"w-a": (1, 16.0)}
