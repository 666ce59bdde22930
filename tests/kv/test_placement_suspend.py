"""Issue 12 in the placement store: two-phase eviction (suspending → suspended), resume on demand, migration,
snapshots after pod loss (docs/contracts.md §2). Against the shared real redis-server, one pool per test."""

from __future__ import annotations

import asyncio

import pytest

from ardiff.kv.errors import InvalidPlacementArgument, PodFenced, SessionNotHere
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PlaceObservation, PodRegistration, PoolId, SessionRecord, SessionState
from tests.kv.test_placement import pool_state, spec

LEASE_MS = 60_000
IDLE_MS = 50


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


async def register(
    store: PlacementStore, pool: PoolId, pod: str, capacity: int, *, exports: bool = True
) -> PodRegistration:
    return await store.register_pod(
        pool,
        pod,
        capacity=capacity,
        endpoint=f"http://{pod}.workers:8000",
        lease_ms=LEASE_MS,
        exports=exports,
    )


async def record(store: PlacementStore, pool: PoolId, name: str) -> SessionRecord:
    found = await store.get_session(pool, name)
    assert found is not None
    return found


async def used(store: PlacementStore, pool: PoolId) -> dict[str, int]:
    return {pod.name: pod.used for pod in await store.list_pods(pool)}


async def suspend_by_eviction(store: PlacementStore, pool: PoolId) -> PodRegistration:
    """w-a (exports, 1 slot) holds `idle`; `new` asks for a slot and makes `idle` suspending."""
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("idle"))
    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    result = await store.place(pool, spec("new"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (result.placement, result.victim, result.suspending) == (None, "idle", True)
    return reg


async def export(
    store: PlacementStore, pool: PoolId, name: str, location: str = "/tier/idle.ards", chunk: int = 7
) -> None:
    """What the worker does once the export is written."""
    held = await record(store, pool, name)
    await store.mark_suspended(
        pool,
        name,
        pod=held.pod,
        epoch=held.pod_epoch,
        tier="shared",
        location=location,
        bytes=4096,
        chunk_index=chunk,
    )


# ---- pods --------------------------------------------------------------------------------------------------


async def test_pods_say_whether_they_export_and_a_recreating_heartbeat_keeps_it(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1, exports=False)
    assert {p.name: p.exports for p in await store.list_pods(pool)} == {"w-a": True, "w-b": False}
    await store.client.delete(f"{pool.tag}:pod:w-a")  # Redis lost the record
    again = await store.heartbeat(
        pool,
        "w-a",
        epoch=reg.epoch,
        capacity=1,
        endpoint="http://w-a.workers:8000",
        lease_ms=LEASE_MS,
        exports=True,
    )
    assert again.recreated
    assert (await store.get_pod(pool, "w-a")).exports  # type: ignore[union-attr]
    assert await store.check_invariants(pool) == []


# ---- eviction suspends -------------------------------------------------------------------------------------


async def test_eviction_on_an_exporting_pod_suspends_and_keeps_the_slot(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await suspend_by_eviction(store, pool)

    victim = await record(store, pool, "idle")
    assert (victim.state, victim.pod, victim.pod_epoch) == (SessionState.SUSPENDING, "w-a", reg.epoch)
    assert await store.get_session(pool, "new") is None  # not placed this time
    assert await used(store, pool) == {"w-a": 1}  # the victim keeps its slot while the export is written
    assert await store.client.zscore(f"{pool.tag}:lru", "w-a/idle") is None
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session, e.reason, e.epoch) for e in events] == [
        ("suspend", "idle", "evicted", reg.epoch)
    ]
    # Until then the newcomer waits (it may not evict the suspending session again, nor anything else).
    assert (await store.place(pool, spec("new"), may_evict=True)).placement is None
    assert await store.check_invariants(pool) == []

    await export(store, pool, "idle")
    gone = await record(store, pool, "idle")
    assert (gone.state, gone.pod, gone.pod_epoch) == (SessionState.SUSPENDED, "", 0)
    assert (gone.tier, gone.location, gone.bytes, gone.suspended_chunk) == (
        "shared",
        "/tier/idle.ards",
        4096,
        7,
    )
    assert gone.resume_requested_ms == 0  # evicted for idleness: it waits for a tick
    assert await used(store, pool) == {"w-a": 0}
    placed = await store.place(pool, spec("new"), may_evict=True)
    assert placed.placement is not None
    assert placed.placement.pod == "w-a"
    assert await store.check_invariants(pool) == []


async def test_a_victim_on_a_pod_that_cannot_export_is_evicted_as_before(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=1, exports=False)
    await store.place(pool, spec("idle"))
    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    result = await store.place(pool, spec("new"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (result.victim, result.suspending) == ("idle", False)
    assert result.placement is not None
    assert (await record(store, pool, "idle")).state is SessionState.EVICTED
    assert [e.kind for e in await store.read_events(pool, "w-a")] == ["evict"]
    assert await store.check_invariants(pool) == []


async def test_while_a_session_is_suspending_nobody_is_evicted(store: PlacementStore, pool: PoolId) -> None:
    """One freed slot per suspension: a second newcomer does not suspend (or evict) another idle session."""
    await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1, exports=False)
    await store.place(pool, spec("idle-1"))
    await store.place(pool, spec("idle-2"))
    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    on_a = "idle-1" if (await record(store, pool, "idle-1")).pod == "w-a" else "idle-2"
    await store.set_draining(pool, "w-b", draining=True)  # the only victim is on w-a
    first = await store.place(pool, spec("new-1"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (first.victim, first.suspending) == (on_a, True)
    await store.set_draining(pool, "w-b", draining=False)

    second = await store.place(pool, spec("new-2"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (second.placement, second.victim) == (None, None)
    assert {(await record(store, pool, n)).state for n in ("idle-1", "idle-2")} == {"placed", "suspending"}
    # Once the export is written, eviction is allowed again.
    await export(store, pool, on_a)
    assert (await store.place(pool, spec("new-1"), may_evict=True)).placement is not None
    third = await store.place(pool, spec("new-2"), may_evict=True, min_idle_ms=IDLE_MS)
    assert third.placement is not None
    assert third.victim is not None
    assert await store.check_invariants(pool) == []


async def test_a_failed_export_evicts_with_reset_required(store: PlacementStore, pool: PoolId) -> None:
    reg = await suspend_by_eviction(store, pool)
    await store.mark_suspended(
        pool, "idle", pod="w-a", epoch=reg.epoch, tier="shared", location="", bytes=0, chunk_index=3
    )
    failed = await record(store, pool, "idle")
    assert (failed.state, failed.reset_required, failed.location) == (SessionState.EVICTED, True, "")
    assert await used(store, pool) == {"w-a": 0}
    assert await store.check_invariants(pool) == []


async def test_a_suspension_its_worker_never_reports_ends_as_an_eviction(
    store: PlacementStore, pool: PoolId
) -> None:
    """A silent worker must not block the pool's evictions forever: past the timeout the suspending session is
    evicted (reset required), its slot freed, its pod told; the export it reports late is refused."""
    reg = await suspend_by_eviction(store, pool)
    delivered = await store.read_events(pool, "w-a")
    assert [e.kind for e in delivered] == ["suspend"]
    await store.ack_events(pool, "w-a", [e.id for e in delivered])
    assert await store.expire_suspending(pool, timeout_ms=60_000) == ()  # not overdue yet
    assert (await record(store, pool, "idle")).state is SessionState.SUSPENDING

    await asyncio.sleep(0.05)
    assert await store.expire_suspending(pool, timeout_ms=20) == ("idle",)
    expired = await record(store, pool, "idle")
    assert (expired.state, expired.reset_required, expired.chunk_index) == (SessionState.EVICTED, True, 0)
    assert await used(store, pool) == {"w-a": 0}
    assert await store.client.zcard(f"{pool.tag}:suspending") == 0
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session, e.reason, e.epoch) for e in events] == [
        ("evict", "idle", "suspend-timeout", reg.epoch)
    ]
    assert await store.check_invariants(pool) == []
    with pytest.raises(SessionNotHere):
        await export(store, pool, "idle")
    # Eviction works again: the newcomer takes the freed slot.
    assert (await store.place(pool, spec("new"), may_evict=True)).placement is not None
    assert await store.expire_suspending(pool, timeout_ms=20) == ()
    assert await store.check_invariants(pool) == []


async def test_a_host_tier_export_moves_to_the_shared_tier_while_the_record_points_at_it(
    store: PlacementStore, pool: PoolId
) -> None:
    """A draining pod copies its host tier to the shared tier: the record follows only while it still
    points at the host copy (suspended, or placed again and not imported yet)."""
    reg = await suspend_by_eviction(store, pool)
    host_copy = "host:w-a/idle/1"
    await store.mark_suspended(
        pool, "idle", pod="w-a", epoch=reg.epoch, tier="host", location=host_copy, bytes=9, chunk_index=4
    )
    assert (await record(store, pool, "idle")).tier == "host"
    moved = await store.relocate_export(
        pool, "idle", from_location="host:w-a/idle/1", to_location="ns/p/idle/s.ardsess", tier="shared"
    )
    assert moved
    held = await record(store, pool, "idle")
    assert (held.state, held.tier, held.location, held.suspended_chunk) == (
        SessionState.SUSPENDED,
        "shared",
        "ns/p/idle/s.ardsess",
        4,
    )
    assert not await store.relocate_export(
        pool, "idle", from_location="host:w-a/idle/1", to_location="ns/p/idle/t.ardsess", tier="shared"
    )  # it no longer points at the host copy
    # Placed again before importing: resume_from follows.
    await store.request_resume(pool, "idle")
    await store.release(pool, "new", reason="deleted")
    back = await store.place(pool, spec("idle"), may_evict=True)
    assert back.placement is not None
    assert await store.relocate_export(
        pool, "idle", from_location="ns/p/idle/s.ardsess", to_location="ns/p/idle/u.ardsess", tier="shared"
    )
    assert (await record(store, pool, "idle")).resume_from == "ns/p/idle/u.ardsess"
    await store.release(pool, "idle", reason="deleted")
    assert not await store.relocate_export(
        pool, "idle", from_location="ns/p/idle/u.ardsess", to_location="ns/p/idle/v.ardsess", tier="shared"
    )
    with pytest.raises(InvalidPlacementArgument, match="tier"):
        await store.relocate_export(pool, "idle", from_location="a", to_location="b", tier="disk")
    assert await store.check_invariants(pool) == []


async def test_mark_suspended_only_from_the_pod_that_holds_it(store: PlacementStore, pool: PoolId) -> None:
    reg = await suspend_by_eviction(store, pool)
    report = {"tier": "shared", "location": "/tier/x", "bytes": 1, "chunk_index": 1}
    reg_b = await register(store, pool, "w-b", capacity=1)
    with pytest.raises(SessionNotHere):
        await store.mark_suspended(pool, "idle", pod="w-b", epoch=reg_b.epoch, **report)  # type: ignore[arg-type]
    with pytest.raises(PodFenced):
        await store.mark_suspended(pool, "idle", pod="w-a", epoch=reg.epoch - 1, **report)  # type: ignore[arg-type]
    with pytest.raises(InvalidPlacementArgument):
        await store.mark_suspended(pool, "idle", pod="w-a", epoch=reg.epoch, **{**report, "tier": "disk"})  # type: ignore[arg-type]
    await store.mark_suspended(pool, "idle", pod="w-a", epoch=reg.epoch, **report)  # type: ignore[arg-type]
    before = await pool_state(store, pool)
    # A repeated report (its reply was lost) is a no-op; another location is not.
    await store.mark_suspended(pool, "idle", pod="w-a", epoch=reg.epoch, **report)  # type: ignore[arg-type]
    assert await pool_state(store, pool) == before
    with pytest.raises(SessionNotHere) as refused:
        await store.mark_suspended(
            pool, "idle", pod="w-a", epoch=reg.epoch, **{**report, "location": "/tier/y"}
        )  # type: ignore[arg-type]
    assert refused.value.state is SessionState.SUSPENDED


async def test_a_worker_may_suspend_a_placed_session_itself(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("s1"))
    await store.mark_suspended(
        pool, "s1", pod="w-a", epoch=reg.epoch, tier="shared", location="/tier/s1", bytes=9, chunk_index=2
    )
    assert (await record(store, pool, "s1")).state is SessionState.SUSPENDED
    assert await used(store, pool) == {"w-a": 0}
    assert await store.check_invariants(pool) == []


# ---- resume on demand --------------------------------------------------------------------------------------


async def test_a_tick_is_a_demand_and_the_suspended_session_resumes_from_its_export(
    store: PlacementStore, pool: PoolId
) -> None:
    await suspend_by_eviction(store, pool)
    await export(store, pool, "idle", location="/tier/idle-1", chunk=7)
    assert (await store.place(pool, spec("new"))).placement is not None

    assert await store.request_resume(pool, "idle") is SessionState.SUSPENDED
    demand = (await record(store, pool, "idle")).resume_requested_ms
    assert demand > 0
    await asyncio.sleep(0.005)
    assert await store.request_resume(pool, "idle") is SessionState.SUSPENDED
    assert (await record(store, pool, "idle")).resume_requested_ms == demand  # idempotent: the first demand
    assert await store.request_resume(pool, "new") is SessionState.PLACED
    assert (await record(store, pool, "new")).resume_requested_ms == 0
    assert await store.request_resume(pool, "nobody") is None

    # A suspended session may take an idle session's slot like a newcomer (here on a pod that cannot export).
    await register(store, pool, "w-b", capacity=1, exports=False)
    await store.place(pool, spec("other"))
    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    await store.set_draining(pool, "w-a", draining=True)
    back = await store.place(pool, spec("idle"), may_evict=True, min_idle_ms=IDLE_MS)
    assert back.victim == "other"
    assert back.placement is not None
    assert (back.placement.pod, back.placement.reset_required, back.placement.resume_from) == (
        "w-b",
        False,
        "/tier/idle-1",
    )
    resumed = await record(store, pool, "idle")
    assert (resumed.state, resumed.chunk_index, resumed.resume_from, resumed.resume_requested_ms) == (
        SessionState.PLACED,
        7,
        "/tier/idle-1",
        0,
    )
    # An idempotent place repeats resume_from while the worker has not imported it yet.
    assert (await store.place(pool, spec("idle"))).placement.resume_from == "/tier/idle-1"  # type: ignore[union-attr]
    note = '{"source": "direct", "bytes": 4174639, "seconds": 0.034, "from": "w-a"}'
    await store.resumed(pool, "idle", pod="w-b", epoch=back.placement.pod_epoch, note=note)
    after = await record(store, pool, "idle")
    assert (after.resume_from, after.resumed_note) == ("", note)
    assert (await store.get_bindings(pool, ["idle"]))["idle"].resumed_note == note  # what the operator reads
    with pytest.raises(SessionNotHere):
        await store.resumed(pool, "idle", pod="w-a", epoch=back.placement.pod_epoch)
    # The operator reports it once (an Event), then acks it; an older note never clears a newer one.
    assert not await store.ack_resumed_note(pool, "idle", '{"source": "older"}')
    assert await store.ack_resumed_note(pool, "idle", note)
    assert (await record(store, pool, "idle")).resumed_note == ""
    assert not await store.ack_resumed_note(pool, "idle", note)
    assert not await store.ack_resumed_note(pool, "never-existed", note)
    assert await store.check_invariants(pool) == []


async def test_a_suspended_session_is_placed_into_a_suspending_slot_only_once_it_is_free(
    store: PlacementStore, pool: PoolId
) -> None:
    """A suspending session is not placed again (it still holds its slot): place answers pending."""
    await suspend_by_eviction(store, pool)
    assert await store.request_resume(pool, "idle") is SessionState.SUSPENDING  # a tick while suspending
    assert (await store.place(pool, spec("idle"), may_evict=True)).placement is None
    await export(store, pool, "idle")
    # The demand made while suspending survives the export: the operator places it at once.
    assert (await record(store, pool, "idle")).resume_requested_ms > 0
    assert await store.check_invariants(pool) == []


# ---- migration ---------------------------------------------------------------------------------------------


async def test_suspend_for_migration_sets_the_demand(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=2)
    await register(store, pool, "w-b", capacity=2, exports=False)
    await store.set_draining(pool, "w-b", draining=True)
    await store.place(pool, spec("s1"))
    await store.place(pool, spec("s2"))
    await store.set_draining(pool, "w-b", draining=False)
    await store.place(pool, spec("on-b"))

    assert await store.suspend(pool, "s1", reason="migrate")
    assert await store.suspend(pool, "s1", reason="migrate")  # already suspending: still True, nothing new
    assert await store.suspend(pool, "s2", reason="drain")
    assert not await store.suspend(pool, "on-b", reason="migrate")  # its pod cannot export
    assert not await store.suspend(pool, "nobody", reason="migrate")
    events = await store.read_events(pool, "w-a")
    assert [(e.kind, e.session, e.reason, e.epoch) for e in events] == [
        ("suspend", "s1", "migrate", reg.epoch),
        ("suspend", "s2", "drain", reg.epoch),
    ]
    assert await used(store, pool) == {"w-a": 2, "w-b": 1}
    await export(store, pool, "s1")
    await export(store, pool, "s2")
    assert (await record(store, pool, "s1")).resume_requested_ms > 0  # migrate: placed again at once
    assert (await record(store, pool, "s2")).resume_requested_ms == 0
    assert not await store.suspend(pool, "s1", reason="migrate")  # suspended: nothing to do
    assert await store.check_invariants(pool) == []


async def test_release_of_a_suspending_session_frees_its_slot(store: PlacementStore, pool: PoolId) -> None:
    await suspend_by_eviction(store, pool)
    await store.ack_events(pool, "w-a", [e.id for e in await store.read_events(pool, "w-a")])
    assert await store.release(pool, "idle", reason="deleted") is SessionState.SUSPENDING
    assert await used(store, pool) == {"w-a": 0}
    with pytest.raises(SessionNotHere):
        await export(store, pool, "idle")
    assert [(e.kind, e.session) for e in await store.read_events(pool, "w-a")] == [("close", "idle")]
    assert await store.check_invariants(pool) == []


# ---- pod loss: snapshots -----------------------------------------------------------------------------------


async def test_a_lost_session_resumes_from_its_snapshot_without_reset(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("snap"))
    await store.note_snapshot(
        pool, "snap", pod="w-a", epoch=reg.epoch, location="/tier/snap-4", chunk_index=4
    )
    with pytest.raises(SessionNotHere):
        await store.note_snapshot(pool, "snap", pod="w-b", epoch=reg.epoch, location="/tier/x", chunk_index=5)
    await store.touch(pool, "snap", pod="w-a", epoch=reg.epoch, chunk_index=6)
    assert await store.remove_pod(pool, "w-a") == ("snap",)

    await register(store, pool, "w-b", capacity=1)
    back = await store.place(pool, spec("snap"))
    assert back.placement is not None
    assert (back.placement.reset_required, back.placement.resume_from) == (False, "/tier/snap-4")
    held = await record(store, pool, "snap")
    assert (held.chunk_index, held.reset_required) == (4, False)

    # Lost again before it imported the snapshot: it still comes back from it.
    assert await store.remove_pod(pool, "w-b") == ("snap",)
    reg_c = await register(store, pool, "w-c", capacity=1)
    again = await store.place(pool, spec("snap"))
    assert (again.placement.reset_required, again.placement.resume_from) == (False, "/tier/snap-4")  # type: ignore[union-attr]
    # A reset starts a new world: the snapshot is forgotten, a later loss means reset_required.
    await store.touch(pool, "snap", pod="w-c", epoch=reg_c.epoch, chunk_index=1, reset_done=True)
    assert (await record(store, pool, "snap")).snapshot_location == ""
    assert await store.remove_pod(pool, "w-c") == ("snap",)
    await register(store, pool, "w-d", capacity=1)
    fresh = await store.place(pool, spec("snap"))
    assert (fresh.placement.reset_required, fresh.placement.resume_from) == (True, "")  # type: ignore[union-attr]
    assert await store.check_invariants(pool) == []


async def test_a_lost_session_without_a_snapshot_still_needs_a_reset(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("plain"))
    await store.remove_pod(pool, "w-a")
    await register(store, pool, "w-b", capacity=1)
    back = await store.place(pool, spec("plain"))
    assert (back.placement.reset_required, back.placement.resume_from) == (True, "")  # type: ignore[union-attr]


async def test_a_pod_lost_while_suspending_loses_the_session_and_unblocks_eviction(
    store: PlacementStore, pool: PoolId
) -> None:
    await suspend_by_eviction(store, pool)
    assert await store.remove_pod(pool, "w-a") == ("idle",)
    assert (await record(store, pool, "idle")).state is SessionState.LOST
    assert await store.client.zcard(f"{pool.tag}:suspending") == 0
    await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("other"))
    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    # Eviction works again (the lost session takes other's slot: suspending it).
    result = await store.place(pool, spec("idle"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (result.victim, result.suspending) == ("other", True)
    assert await store.check_invariants(pool) == []


async def test_a_readmitted_name_forgets_the_previous_sessions_exports(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("s1"))
    await store.note_snapshot(pool, "s1", pod="w-a", epoch=reg.epoch, location="/tier/old", chunk_index=3)
    await store.release(pool, "s1", reason="deleted")
    await store.place(pool, spec("s1"))
    fresh = await record(store, pool, "s1")
    assert (fresh.snapshot_location, fresh.location, fresh.resume_from) == ("", "", "")


async def test_bindings_carry_the_continuity_fields(store: PlacementStore, pool: PoolId) -> None:
    await suspend_by_eviction(store, pool)
    await export(store, pool, "idle", location="/tier/b", chunk=5)
    await store.request_resume(pool, "idle")
    binding = (await store.get_bindings(pool, ["idle"]))["idle"]
    assert (binding.state, binding.tier, binding.location, binding.bytes, binding.suspended_chunk) == (
        SessionState.SUSPENDED,
        "shared",
        "/tier/b",
        4096,
        5,
    )
    assert binding.resume_requested_ms > 0
    assert binding.resume_from == ""


async def test_the_invariant_check_knows_the_new_states(store: PlacementStore, pool: PoolId) -> None:
    await suspend_by_eviction(store, pool)
    assert await store.check_invariants(pool) == []
    await store.client.zrem(f"{pool.tag}:suspending", "idle")
    assert "session idle is suspending but the suspending index disagrees" in await store.check_invariants(
        pool
    )
    await store.client.zadd(f"{pool.tag}:suspending", {"idle": 1})
    await export(store, pool, "idle")
    await store.client.hset(f"{pool.tag}:session:idle", "pod", "w-a")
    assert "suspended session idle still names pod w-a" in await store.check_invariants(pool)


async def test_the_tick_in_flight_when_a_suspension_begins_still_touches_and_snapshots(store, pool):
    """A migration may suspend a session mid-tick: that tick finishes on its pod (touch, snapshot) before the
    worker writes the export; only a newer tick is refused (the worker answers 503 resuming)."""
    reg = await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("busy"))
    assert await store.suspend(pool, "busy", reason="migrate")
    assert (await record(store, pool, "busy")).state is SessionState.SUSPENDING
    await store.touch(pool, "busy", pod="w-a", epoch=reg.epoch, chunk_index=5, reset_done=False)
    await store.note_snapshot(
        pool, "busy", pod="w-a", epoch=reg.epoch, location="/tier/s.ards", chunk_index=5
    )
    held = await record(store, pool, "busy")
    assert (held.state, held.chunk_index, held.snapshot_chunk) == (SessionState.SUSPENDING, 5, 5)
    await export(store, pool, "busy", location="/tier/busy.ards", chunk=5)
    assert (await record(store, pool, "busy")).state is SessionState.SUSPENDED
    with pytest.raises(SessionNotHere):  # once suspended, the pod holds it no more
        await store.touch(pool, "busy", pod="w-a", epoch=reg.epoch, chunk_index=6, reset_done=False)


async def test_a_suspended_record_redis_lost_is_restored_from_the_status_and_resumes(
    store: PlacementStore, pool: PoolId
) -> None:
    """What the operator does for a Suspended session without a record (Redis lost its data): the status's
    tier, location, bytes and chunk give the record back, with no pod and no slot."""
    await suspend_by_eviction(store, pool)
    await export(store, pool, "idle", location="/tier/idle-9", chunk=5)
    assert (await store.place(pool, spec("new"))).placement is not None
    before = await record(store, pool, "idle")
    await store.client.delete(f"{pool.tag}:session:idle")
    idle = spec("idle", prompt="a forest", seed=3)

    assert await store.restore_suspended(
        pool, idle, tier="shared", location="/tier/idle-9", size=4096, chunk_index=5
    )
    restored = await record(store, pool, "idle")
    assert (restored.state, restored.pod, restored.pod_epoch, restored.reset_required) == (
        SessionState.SUSPENDED,
        "",
        0,
        False,
    )
    exported = ("tier", "location", "bytes", "suspended_chunk", "chunk_index")
    assert [getattr(restored, f) for f in exported] == [getattr(before, f) for f in exported]
    assert (restored.prompt, restored.seed, restored.token_sha256) == ("a forest", 3, before.token_sha256)
    assert await used(store, pool) == {"w-a": 1}  # no slot: `new` holds the only one
    assert not await store.restore_suspended(
        pool, idle, tier="shared", location="/tier/other", size=1, chunk_index=0
    )  # a record exists: nothing changes
    assert (await record(store, pool, "idle")).location == "/tier/idle-9"
    with pytest.raises(InvalidPlacementArgument, match="location"):
        await store.restore_suspended(pool, spec("x"), tier="shared", location="", size=1, chunk_index=0)
    with pytest.raises(InvalidPlacementArgument, match="tier"):
        await store.restore_suspended(pool, spec("x"), tier="disk", location="/tier/x", size=1, chunk_index=0)

    # A demand resumes it from the export like any suspended session.
    await store.release(pool, "new", reason="deleted")
    assert await store.request_resume(pool, "idle") is SessionState.SUSPENDED
    back = await store.place(pool, idle, may_evict=True, min_idle_ms=IDLE_MS)
    assert back.placement is not None
    assert (back.placement.reset_required, back.placement.resume_from) == (False, "/tier/idle-9")
    assert (await record(store, pool, "idle")).chunk_index == 5
    assert await store.check_invariants(pool) == []


async def test_place_answers_with_what_a_status_needs_read_in_the_same_script(
    store: PlacementStore, pool: PoolId
) -> None:
    """Issue 27: `place` returns the session's binding, the record of the pod it holds a slot on and the
    server time, as `get_bindings`, `get_pod` and `TIME` read them after it: admission reads nothing more."""

    async def check(observed: PlaceObservation, name: str, *, pod: str | None) -> None:
        assert observed.binding == (await store.get_bindings(pool, [name])).get(name)
        assert observed.pod == (await store.get_pod(pool, pod) if pod else None)
        assert 0 <= await store.server_time_ms() - observed.now_ms < 5_000

    await register(store, pool, "w-a", capacity=1)
    placed = await store.place(pool, spec("idle"))
    await check(placed.observed, "idle", pod="w-a")
    assert placed.observed.binding is not None
    assert placed.observed.binding.state is SessionState.PLACED
    assert placed.observed.pod is not None
    assert placed.observed.pod.used == 1
    again = await store.place(pool, spec("idle"))  # idempotent: the same binding, read again
    assert again.already_placed
    await check(again.observed, "idle", pod="w-a")

    waiting = await store.place(pool, spec("new"))  # no record, no pod
    assert waiting.placement is None
    assert (waiting.observed.binding, waiting.observed.pod) == (None, None)
    await check(waiting.observed, "new", pod=None)

    await asyncio.sleep(IDLE_MS / 1000 + 0.01)
    suspending = await store.place(pool, spec("new"), may_evict=True, min_idle_ms=IDLE_MS)
    assert (suspending.placement, suspending.victim, suspending.suspending) == (None, "idle", True)
    await check(suspending.observed, "new", pod=None)
    # The victim still holds its slot while it exports: its pod's record comes with it.
    victim = await store.place(pool, spec("idle"))
    assert victim.placement is None
    assert victim.observed.binding is not None
    assert victim.observed.binding.state is SessionState.SUSPENDING
    await check(victim.observed, "idle", pod="w-a")
    await export(store, pool, "idle")
    assert (await store.place(pool, spec("new"))).observed.pod == await store.get_pod(pool, "w-a")
    assert await store.check_invariants(pool) == []
