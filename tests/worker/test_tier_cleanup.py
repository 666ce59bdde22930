"""Nothing left behind in the shared tier (issue 23 item 11): each path that writes an export, counted in
files afterwards. Real worker processes (fake runtime, a snapshot every chunk) on one tier directory and a
`redis-server` of this module's own (one test pauses its writes, `CLIENT PAUSE`)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.connection import SOCKET_TIMEOUT_SECONDS
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.placement_worker import CONSUMER_GROUP
from ardiff.kv.records import PoolId, SessionState
from tests.worker.conftest import launch_fake_pod, suspend_and_wait
from tests.worker.test_continuity import frames_of
from tests.worker.test_http_contract import wait_for

POOL = PoolId("default", f"wk-clean-{uuid.uuid4().hex[:6]}")
TOKEN = "cleanup-token"
PODS = ("clean-a", "clean-b")


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


@pytest.fixture(scope="module")
def own_redis():
    with RedisServer() as server:
        yield server


@pytest.fixture
async def store(own_redis):
    placement = PlacementStore.from_url(own_redis.url)
    yield placement
    await placement.close()


def files_of(tier: Path, session: str) -> list[str]:
    """The session's files in the tier, by kind (`snapshot`, `suspend`), sorted."""
    directory = tier / POOL.namespace / POOL.name / session
    return sorted(path.name.split("-", 1)[0] for path in directory.glob("*")) if directory.is_dir() else []


def launch_cleanup_pod(launch_worker, redis_url, tier: Path, pod: str):
    """A pod of the pool on the tier: a snapshot every chunk, 1 s forwards (a tick to act during), a sweep
    every 0.3 s."""
    return launch_fake_pod(
        launch_worker,
        redis_url,
        POOL,
        pod,
        suspend_dir=str(tier),
        snapshot_every_chunks=1,
        fake_tick_seconds=1.0,
        tier_sweep_seconds=0.3,
    )


@pytest.fixture(scope="module")
def pods(launch_worker, own_redis, tier):
    workers = {pod: launch_cleanup_pod(launch_worker, own_redis.url, tier, pod) for pod in PODS}
    yield workers
    for worker in workers.values():
        worker.stop()


async def place_on(store, spec, pod: str, pods: tuple[str, ...] = PODS) -> None:
    """Place as the operator does, with every other pod of `pods` drained for the moment."""
    others = [other for other in pods if other != pod]
    for other in others:
        await store.set_draining(POOL, other, draining=True)
    try:
        assert (await store.place(POOL, spec)).placement.pod == pod
    finally:
        for other in others:
            await store.set_draining(POOL, other, draining=False)


@pytest.fixture
async def session(pods, store, session_spec):
    name = f"s-{uuid.uuid4().hex[:8]}"
    await place_on(store, session_spec(name, TOKEN), "clean-a")
    yield name
    await store.release(POOL, name, reason="test done")


async def test_a_snapshot_whose_note_failed_is_removed(
    launch_worker, own_redis, pods, store, session_spec, tier
):
    """The record vanishes during a tick (Redis lost it): the chunk stands, the snapshot is written, its note
    finds no record. Before: that snapshot stayed, pointed at by nothing. (A pod of its own: a session whose
    record is gone keeps its slot there.)"""
    worker = launch_cleanup_pod(launch_worker, own_redis.url, tier, "clean-c")
    try:
        name = f"s-{uuid.uuid4().hex[:8]}"
        await place_on(store, session_spec(name, TOKEN), "clean-c", (*PODS, "clean-c"))
        frames_of(worker.tick(name, 0, token=TOKEN))
        assert files_of(tier, name) == ["snapshot"]
        ticking = threading.Thread(target=worker.tick, args=(name, 1), kwargs={"token": TOKEN})
        ticking.start()
        await asyncio.sleep(0.4)  # in its forward
        await store.client.delete(PoolKeys(POOL).session(name))
        ticking.join(timeout=30)
        assert "snapshot of session" in worker.log()  # the note failed
        assert files_of(tier, name) == ["snapshot"]  # the previous one, which the next note replaces
    finally:
        worker.stop()
        await store.remove_pod(POOL, "clean-c")


async def test_a_resumed_or_migrated_session_keeps_one_snapshot(pods, store, session, tier):
    """A's snapshots, an eviction, a resume on B (B's snapshots), a migration back to A: after each, one
    snapshot. Before: the pod a session resumed on never knew its previous pod's snapshot, which stayed until
    the session was closed (one more per move)."""
    a, b = pods["clean-a"], pods["clean-b"]
    for i in range(2):
        frames_of(a.tick(session, i, token=TOKEN))
    assert files_of(tier, session) == ["snapshot"]
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert files_of(tier, session) == ["snapshot", "suspend"]
    await place_on(store, record.spec(), "clean-b")
    frames_of(b.tick(session, 2, token=TOKEN))
    assert files_of(tier, session) == ["snapshot"]  # the export imported and removed, A's snapshot replaced
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    await place_on(store, record.spec(), "clean-a")
    frames_of(a.tick(session, 3, token=TOKEN))
    assert files_of(tier, session) == ["snapshot"]
    assert (tier / (await store.get_session(POOL, session)).snapshot_location).is_file()


async def test_a_retried_suspend_leaves_one_export(pods, store, session, tier):
    """Redis stops taking writes while the suspend is reported (`CLIENT PAUSE ... WRITE`, longer than the
    socket timeout): the report fails and the event is handled again once Redis answers. Before: the retry
    wrote a second export and the first stayed behind."""
    worker = pods["clean-a"]
    frames_of(worker.tick(session, 0, token=TOKEN))
    ticking = threading.Thread(target=worker.tick, args=(session, 1), kwargs={"token": TOKEN})
    ticking.start()
    await asyncio.sleep(0.3)  # in its forward: the suspend waits for it
    assert await store.suspend(POOL, session, reason="evicted")
    stream = PoolKeys(POOL).events("clean-a")

    async def delivered() -> bool:
        return (await store.client.xpending(stream, CONSUMER_GROUP))["pending"] == 1

    await wait_for(delivered)
    # Long enough for the tick's touch to time out and then the suspend's report too (both writes).
    pause_ms = int((2 * SOCKET_TIMEOUT_SECONDS + 2.5) * 1000)
    await store.client.execute_command("CLIENT", "PAUSE", str(pause_ms), "WRITE")
    ticking.join(timeout=30)
    await asyncio.sleep(pause_ms / 1000)

    async def suspended() -> bool:
        record = await store.get_session(POOL, session)
        return record.state is SessionState.SUSPENDED

    await wait_for(suspended, within=20)
    assert "handling suspend of session" in worker.log()  # the first report did fail
    record = await store.get_session(POOL, session)
    assert files_of(tier, session) == ["snapshot", "suspend"]
    assert (tier / record.location).is_file()


async def test_a_directory_with_an_odd_name_never_breaks_the_sweep(pods, store, session_spec, tier):
    """Names no session can have (`lost+found`, upper case, a dot) beside a deleted session's files: the sweep
    removes the deleted session's files and leaves the rest. Before: one odd name failed every sweep."""
    worker = pods["clean-a"]
    name = f"s-{uuid.uuid4().hex[:8]}"
    await place_on(store, session_spec(name, TOKEN), "clean-a")
    frames_of(worker.tick(name, 0, token=TOKEN))
    await suspend_and_wait(store, POOL, name, reason="evicted")
    odd = [tier / POOL.namespace / POOL.name / odd for odd in ("lost+found", "Upper", ".hidden")]
    for directory in odd:
        directory.mkdir(parents=True)
        (directory / "keep").write_text("not ours")
    assert files_of(tier, name) == ["snapshot", "suspend"]
    await store.release(POOL, name, reason="deleted")
    deadline = time.monotonic() + 10
    while files_of(tier, name) and time.monotonic() < deadline:  # noqa: ASYNC110 (the tier's files)
        await asyncio.sleep(0.1)
    assert files_of(tier, name) == []
    assert all((directory / "keep").is_file() for directory in odd)
