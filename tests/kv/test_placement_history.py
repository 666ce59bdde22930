"""Issue 26 in the placement store: kept chunks (`history_keep_chunks`, `note_history`, rewind), forks
(`fork_from`, kept locations) and `place(prefer_pod=)` (docs/contracts.md §2). Against the shared real
redis-server, one pool per test."""

from __future__ import annotations

import asyncio

import pytest

from ardiff.kv.errors import InvalidPlacementArgument, PodFenced, SessionNotHere, UnknownSession
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import (
    KEPT_PREFIX,
    MAX_KEEP_CHUNKS,
    PoolId,
    SessionSpec,
    SessionState,
    kept_location,
    parse_kept_location,
)
from tests.kv.test_placement import register, spec
from tests.kv.test_placement_suspend import export, record, suspend_by_eviction
from tests.kv.test_placement_suspend import register as register_exporting


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


# ---- records -----------------------------------------------------------------------------------------------


def test_a_kept_location_names_pod_session_and_chunk_and_parses_back() -> None:
    location = kept_location("w-a", "walk", 12)
    assert location == "kept:w-a/walk/12"
    assert location.startswith(KEPT_PREFIX)
    assert parse_kept_location(location) == ("w-a", "walk", 12)


@pytest.mark.parametrize(
    "location",
    [
        "",
        "/tier/walk.ards",
        "kept:",
        "kept:w-a/walk",
        "kept:w-a/walk/0",
        "kept:w-a/walk/012",
        "kept:w-a/walk/-3",
        "kept:w-a/walk/3/4",
        "kept:W-A/walk/3",
        "kept:w-a/walk/٣",  # a non-ASCII digit
        "KEPT:w-a/walk/3",
    ],
)
def test_anything_else_is_not_a_kept_location(location: str) -> None:
    assert parse_kept_location(location) is None


@pytest.mark.parametrize(
    ("pod", "session", "chunk"), [("w-a", "walk", 0), ("W", "walk", 1), ("w-a", "a/b", 1), ("w-a", "s", True)]
)
def test_a_kept_location_refuses_bad_parts(pod: str, session: str, chunk: int) -> None:
    with pytest.raises(InvalidPlacementArgument):
        kept_location(pod, session, chunk)


def test_a_spec_validates_its_history_and_fork_fields() -> None:
    assert spec("s", history_keep_chunks=MAX_KEEP_CHUNKS).history_keep_chunks == MAX_KEEP_CHUNKS
    assert spec("s", fork_from="kept:w-a/p/3").fork_from == "kept:w-a/p/3"
    for bad in (-1, MAX_KEEP_CHUNKS + 1, True, 1.0, "4"):
        with pytest.raises(InvalidPlacementArgument, match="history_keep_chunks"):
            spec("s", history_keep_chunks=bad)
    for bad in ("/tier/p.ards", "kept:w-a/p/0", 3, None):
        with pytest.raises(InvalidPlacementArgument, match="fork_from"):
            spec("s", fork_from=bad)


# ---- history_keep_chunks and note_history ------------------------------------------------------------------


async def test_place_and_restore_write_the_history_fields_and_the_record_gives_them_back(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=2)
    placed = spec("keeper", history_keep_chunks=8)
    await store.place(pool, placed)
    held = await record(store, pool, "keeper")
    assert (held.history_keep_chunks, held.kept_chunks, held.fork_from) == (8, (), "")
    assert held.spec() == placed

    await store.client.delete(f"{pool.tag}:session:keeper")
    await store.client.hset(f"{pool.tag}:pod:w-a", "used", 0)  # the slot the lost record held
    restored = spec("keeper", history_keep_chunks=5)
    assert await store.restore(
        pool, restored, pod="w-a", pod_epoch=held.pod_epoch, chunk_index=4, reset_required=False
    )
    again = await record(store, pool, "keeper")
    assert (again.history_keep_chunks, again.kept_chunks, again.chunk_index) == (5, (), 4)
    binding = (await store.get_bindings(pool, ["keeper"]))["keeper"]
    assert (binding.history_keep_chunks, binding.kept_chunks) == (5, ())


async def test_note_history_sets_the_kept_chunks_and_bindings_carry_them(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("keeper", history_keep_chunks=3))
    await store.touch(pool, "keeper", pod="w-a", epoch=reg.epoch, chunk_index=5)
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[3, 4, 5])
    held = await record(store, pool, "keeper")
    assert (held.kept_chunks, held.chunk_index) == ((3, 4, 5), 5)
    assert await store.client.hget(f"{pool.tag}:session:keeper", "kept_chunks") == b"3,4,5"
    assert (await store.get_bindings(pool, ["keeper"]))["keeper"].kept_chunks == (3, 4, 5)
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[])
    assert (await record(store, pool, "keeper")).kept_chunks == ()


async def test_note_history_is_fenced_like_note_snapshot(store: PlacementStore, pool: PoolId) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    reg_b = await register(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("keeper", history_keep_chunks=3), prefer_pod="w-a")
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[1])
    with pytest.raises(SessionNotHere):
        await store.note_history(pool, "keeper", pod="w-b", epoch=reg_b.epoch, kept=[1, 2])
    with pytest.raises(UnknownSession):
        await store.note_history(pool, "nobody", pod="w-a", epoch=reg.epoch, kept=[1])
    newer = await register(store, pool, "w-a", capacity=1)  # a restarted worker: the session is lost
    assert newer.lost_sessions == ("keeper",)
    with pytest.raises(PodFenced):
        await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[1, 2])
    assert (await record(store, pool, "keeper")).kept_chunks == (1,)


@pytest.mark.parametrize(
    ("kept", "chunk_index", "match"),
    [
        ([2, 1], None, "ascending"),
        ([1, 1], None, "ascending"),
        ([0, 1], None, "kept chunk"),
        (list(range(1, MAX_KEEP_CHUNKS + 2)), None, "more than a session keeps"),
        ("1,2", None, "sequence"),
        ([1, 2, 5], 4, "keeps no later chunk"),
        ([1], 0, "chunk_index"),
    ],
)
async def test_note_history_refuses_bad_lists_before_redis(
    store: PlacementStore, pool: PoolId, kept: object, chunk_index: int | None, match: str
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("keeper"))
    with pytest.raises(InvalidPlacementArgument, match=match):
        await store.note_history(
            pool,
            "keeper",
            pod="w-a",
            epoch=reg.epoch,
            kept=kept,  # type: ignore[arg-type]
            chunk_index=chunk_index,
        )
    assert (await record(store, pool, "keeper")).kept_chunks == ()


async def test_a_rewind_sets_the_chunk_index_and_forgets_a_later_snapshot(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("keeper", history_keep_chunks=8))
    await store.note_snapshot(pool, "keeper", pod="w-a", epoch=reg.epoch, location="/tier/k-3", chunk_index=3)
    await store.touch(pool, "keeper", pod="w-a", epoch=reg.epoch, chunk_index=9)
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[6, 7, 8, 9])

    # Back to 7: the snapshot at 3 is an ancestor of the new history and stays.
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[6, 7], chunk_index=7)
    held = await record(store, pool, "keeper")
    assert (held.chunk_index, held.kept_chunks, held.snapshot_location, held.snapshot_chunk) == (
        7,
        (6, 7),
        "/tier/k-3",
        3,
    )
    # A snapshot after the target belongs to the abandoned world: forgotten (a pod loss cannot bring it back).
    await store.note_snapshot(pool, "keeper", pod="w-a", epoch=reg.epoch, location="/tier/k-9", chunk_index=9)
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[6], chunk_index=6)
    held = await record(store, pool, "keeper")
    assert (held.chunk_index, held.kept_chunks, held.snapshot_location) == (6, (6,), "")
    assert held.snapshot_chunk == 0
    assert await store.check_invariants(pool) == []


async def test_a_reset_a_suspension_and_a_new_placement_keep_no_chunks(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=1)
    await store.place(pool, spec("keeper", history_keep_chunks=4))
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[1, 2])
    await store.touch(pool, "keeper", pod="w-a", epoch=reg.epoch, chunk_index=1, reset_done=True)
    assert (await record(store, pool, "keeper")).kept_chunks == ()

    # Lost with its pod, placed again elsewhere: the chunks were in the old pod's memory.
    await store.note_history(pool, "keeper", pod="w-a", epoch=reg.epoch, kept=[1])
    assert await store.remove_pod(pool, "w-a") == ("keeper",)
    reg_b = await register_exporting(store, pool, "w-b", capacity=1)
    await store.place(pool, spec("keeper", history_keep_chunks=4))
    held = await record(store, pool, "keeper")
    assert (held.pod, held.kept_chunks, held.history_keep_chunks) == ("w-b", (), 4)

    # Suspended (exports carry no kept chunks).
    await store.note_history(pool, "keeper", pod="w-b", epoch=reg_b.epoch, kept=[1, 2, 3])
    assert await store.suspend(pool, "keeper", reason="migrate")
    await export(store, pool, "keeper", location="/tier/keeper.ards", chunk=3)
    held = await record(store, pool, "keeper")
    assert (held.state, held.kept_chunks) == (SessionState.SUSPENDED, ())


async def test_a_suspended_sessions_record_keeps_no_chunks_even_when_suspended_by_eviction(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await suspend_by_eviction(store, pool)
    # Still bound while suspending: its worker may report kept chunks until the export is written.
    await store.note_history(pool, "idle", pod="w-a", epoch=reg.epoch, kept=[4])
    await export(store, pool, "idle")
    assert (await record(store, pool, "idle")).kept_chunks == ()


# ---- forks -------------------------------------------------------------------------------------------------


async def test_a_fork_is_placed_to_import_the_kept_chunk_without_a_reset(
    store: PlacementStore, pool: PoolId
) -> None:
    reg = await register(store, pool, "w-a", capacity=2)
    await store.place(pool, spec("parent", history_keep_chunks=4))
    await store.touch(pool, "parent", pod="w-a", epoch=reg.epoch, chunk_index=12)
    await store.note_history(pool, "parent", pod="w-a", epoch=reg.epoch, kept=[10, 11, 12])

    fork_from = kept_location("w-a", "parent", 11)
    result = await store.place(pool, spec("child", fork_from=fork_from), prefer_pod="w-a")
    assert result.placement is not None
    assert (result.placement.pod, result.placement.resume_from, result.placement.reset_required) == (
        "w-a",
        fork_from,
        False,
    )
    child = await record(store, pool, "child")
    assert (child.chunk_index, child.resume_from, child.fork_from, child.reset_required) == (
        11,
        fork_from,
        fork_from,
        False,
    )
    # A fork location never becomes the record's export.
    assert (child.location, child.tier, child.kept_chunks) == ("", "", ())
    # The parent is untouched.
    parent = await record(store, pool, "parent")
    assert (parent.chunk_index, parent.kept_chunks, parent.state) == (12, (10, 11, 12), SessionState.PLACED)

    # Imported: resume_from clears, fork_from stays (what the session was forked from).
    await store.resumed(pool, "child", pod="w-a", epoch=reg.epoch)
    child = await record(store, pool, "child")
    assert (child.resume_from, child.fork_from, child.chunk_index) == ("", fork_from, 11)
    assert await store.check_invariants(pool) == []


async def test_a_fork_lost_before_its_import_comes_back_from_the_kept_chunk(
    store: PlacementStore, pool: PoolId
) -> None:
    await register(store, pool, "w-a", capacity=1)
    await register(store, pool, "w-b", capacity=1)
    fork_from = kept_location("w-a", "parent", 3)
    await store.place(pool, spec("child", fork_from=fork_from), prefer_pod="w-b")
    assert await store.remove_pod(pool, "w-b") == ("child",)
    back = await store.place(pool, spec("child", fork_from=fork_from))
    assert back.placement is not None
    assert (back.placement.pod, back.placement.resume_from) == ("w-a", fork_from)
    assert back.placement.reset_required is False
    assert (await record(store, pool, "child")).chunk_index == 3


async def test_fork_from_is_read_only_by_a_first_admission(store: PlacementStore, pool: PoolId) -> None:
    """An evicted fork starts a new world (reset_required) like any evicted session: the kept chunk it
    started from is history, not its state; a closed name admitted again is a new first admission."""
    reg = await register(store, pool, "w-a", capacity=1)
    fork_from = kept_location("w-a", "parent", 5)
    await store.place(pool, spec("child", fork_from=fork_from))
    await store.resumed(pool, "child", pod="w-a", epoch=reg.epoch)
    assert await store.evict_lru(pool, min_idle_ms=0) == "child"
    again = await store.place(pool, spec("child", fork_from=fork_from))
    assert again.placement is not None
    assert (again.placement.resume_from, again.placement.reset_required) == ("", True)
    assert (await record(store, pool, "child")).chunk_index == 0

    await store.release(pool, "child", reason="deleted")
    other = kept_location("w-a", "parent", 2)
    fresh = await store.place(pool, spec("child", fork_from=other))
    assert (fresh.placement.resume_from, fresh.placement.reset_required) == (other, False)  # type: ignore[union-attr]
    assert (await record(store, pool, "child")).chunk_index == 2


# ---- prefer_pod --------------------------------------------------------------------------------------------


async def placed_on(store: PlacementStore, pool: PoolId, session: SessionSpec, **options: object) -> str:
    result = await store.place(pool, session, **options)  # type: ignore[arg-type]
    assert result.placement is not None
    return result.placement.pod


async def test_prefer_pod_is_taken_when_it_fits(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-a", capacity=4)
    await register(store, pool, "w-b", capacity=4)
    await store.place(pool, spec("first"), prefer_pod="w-a")
    # least-loaded would choose the empty w-b; the preference wins while w-a takes the session.
    assert await placed_on(store, pool, spec("second"), prefer_pod="w-a") == "w-a"
    # pack would choose w-a; the preference for w-b wins.
    assert await placed_on(store, pool, spec("third"), prefer_pod="w-b", policy="pack") == "w-b"
    assert await store.check_invariants(pool) == []


async def test_prefer_pod_yields_to_every_rule(store: PlacementStore, pool: PoolId) -> None:
    await register(store, pool, "w-full", capacity=1)
    await register(store, pool, "w-drain", capacity=2)
    await register(store, pool, "w-ok", capacity=2)
    await register(store, pool, "w-dead", capacity=2, lease_ms=1)
    await asyncio.sleep(0.01)  # its 1 ms lease has expired (a fast run could place the next ones within it)
    await store.place(pool, spec("holder"), prefer_pod="w-full")
    await store.set_draining(pool, "w-drain")
    for prefer in ("w-full", "w-drain", "w-dead", "w-unknown"):
        assert await placed_on(store, pool, spec(f"s-{prefer}"), prefer_pod=prefer) == "w-ok", prefer
        await store.release(pool, f"s-{prefer}", reason="done")
    # Compute: a pod without headroom for the session's playout_fps is not taken either.
    await store.register_pod(
        pool, "w-slow", capacity=4, endpoint="http://w-slow:8000", lease_ms=60_000, compute_fps=10.0
    )
    await store.place(pool, spec("busy", playout_fps=8.0), prefer_pod="w-slow")
    assert await placed_on(store, pool, spec("fast", playout_fps=8.0), prefer_pod="w-slow") == "w-ok"
    # Never an eviction for it: with no other room the session waits (no victim on the preferred pod).
    assert await store.drain_pod(pool, "w-ok", only_if_empty=False)
    assert await store.drain_pod(pool, "w-slow", only_if_empty=False)
    pending = await store.place(pool, spec("late"), prefer_pod="w-full", may_evict=False)
    assert pending.placement is None
    assert await store.check_invariants(pool) == []


async def test_prefer_pod_must_be_a_name(store: PlacementStore, pool: PoolId) -> None:
    with pytest.raises(InvalidPlacementArgument, match="prefer_pod"):
        await store.place(pool, spec("s"), prefer_pod="Not A Pod")
