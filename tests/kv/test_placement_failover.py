"""Redis Sentinel failover with real processes (3 Sentinels, a master, a replica): kill -9 the master under a
stream of placements, and what waiting for a replica (`wait_replicas`) buys.

Sentinels here declare a master down after 500 ms; each test starts its own group.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time

import pytest

from ardiff.devcluster.redis_failover import run_failover
from ardiff.devcluster.redis_server import SentinelGroup
from ardiff.kv.connection import split_url_options
from ardiff.kv.errors import (
    FunctionsNotLoaded,
    InvalidPlacementArgument,
    InvalidRedisUrl,
    NotReplicated,
    UnknownSession,
)
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState

POOL = PoolId("failover", "wait")
TOKEN = hashlib.sha256(b"token").hexdigest()


def spec(name: str) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, prompt=f"prompt of {name}")


@pytest.mark.parametrize("wait_replicas", [0, 1])
async def test_kill_9_of_the_master_under_load(wait_replicas: int) -> None:
    run = await run_failover(wait_replicas, before_s=1.0, after_s=0.5)
    print(run)
    assert run.violations == []  # no session on two pods, no slot leaked, every index agrees
    assert run.acked_placements > 20
    assert run.acked_evictions > 0  # the pool filled up: placements evicted while the master died
    assert run.acked_releases > 0
    assert run.touches > 0
    assert run.unavailable_calls > 0  # the clients did meet the dead master
    assert 0.5 <= run.window_s < 10  # no failover before down-after-milliseconds; one well within 10 s
    # A lost placement is never silent: the worker's touch answers UnknownSession (404; the operator restores
    # it from the session's status). With WAIT nothing acknowledged is lost at all.
    lost_placements = sorted(e.rsplit(" ", 1)[1] for e in run.lost if e.startswith("placement"))
    assert lost_placements == sorted(run.lost_reported)
    if wait_replicas:
        assert run.lost == []


async def test_wait_reports_the_writes_a_failover_loses() -> None:
    """The replica falls behind (stopped, its link cut) while both stores write: without WAIT the writes are
    acknowledged and the failover loses them; with WAIT each one raises NotReplicated instead."""
    with SentinelGroup(down_after_ms=500, failover_timeout_ms=2000) as group:
        plain = PlacementStore.from_url(group.url + "?wait_replicas=0")
        waiting = PlacementStore.from_url(group.url)  # Sentinel: waits for a replica by default
        assert (plain.wait_replicas, waiting.wait_replicas) == (0, 1)
        try:
            epoch = (
                await waiting.register_pod(
                    POOL, "w-0", capacity=10, endpoint="http://w-0:8000", lease_ms=60_000
                )
            ).epoch
            assert (await waiting.place(POOL, spec("before"))).placement is not None
            assert (await waiting.place(POOL, spec("released"))).placement is not None

            group.replica.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            group.master.cli("CLIENT", "KILL", "TYPE", "replica")
            acked = [(await plain.place(POOL, spec(f"plain-{i}"))).placement for i in range(3)]
            assert all(p is not None and p.pod == "w-0" for p in acked)
            assert await plain.release(POOL, "released", reason="closed") is SessionState.PLACED
            for i in range(3):
                with pytest.raises(NotReplicated) as refused:
                    await waiting.place(POOL, spec(f"waiting-{i}"))
                assert (refused.value.operation, refused.value.acked, refused.value.wanted) == ("place", 0, 1)
            # A touch never waits: a lost one costs a stale last_tick_ms that the next tick rewrites.
            assert await waiting.touch(POOL, "before", pod="w-0", epoch=epoch, chunk_index=3) > 0

            old_master = group.master.port
            group.master.kill()
            group.replica.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            deadline = time.monotonic() + 20
            while group.master_port() == old_master:
                assert time.monotonic() < deadline, "the Sentinels did not fail over"
                await asyncio.sleep(0.05)
            assert group.master_port() == group.replica.port

            # The acknowledged placements and release are gone; the placement loss surfaces as UnknownSession.
            records = await plain.get_sessions(POOL, ["before", "released", "plain-0", "plain-1", "plain-2"])
            assert {name: r.state for name, r in records.items()} == {
                "before": SessionState.PLACED,
                "released": SessionState.PLACED,  # the release was acknowledged, then undone
            }
            with pytest.raises(UnknownSession):
                await plain.touch(POOL, "plain-0", pod="w-0", epoch=epoch, chunk_index=1)
            assert await plain.check_invariants(POOL) == []
            # The promoted replica has no replica of its own: WAIT cannot be met, every write says so.
            with pytest.raises(NotReplicated):
                await waiting.place(POOL, spec("after"))
            assert (await plain.place(POOL, spec("after"))).already_placed  # applied all the same
        finally:
            await plain.close()
            await waiting.close()


async def test_wait_survives_flushed_functions() -> None:
    """Issue 42 item 4: the master lost the library (FUNCTION FLUSH, replicated: the replica too): a worker's
    store answers `FunctionsNotLoaded` (retryable), the operator's loads it on the master (the replica gets it
    by replication) and its write still waits for the replica."""
    with SentinelGroup() as group:
        async with (
            PlacementStore.from_url(group.url) as store,
            PlacementStore.from_url(group.url, loads_library=True) as operator,
        ):
            await store.register_pod(POOL, "w-0", capacity=2, endpoint="http://w-0:8000", lease_ms=60_000)
            group.master.cli("FUNCTION", "FLUSH")
            with pytest.raises(FunctionsNotLoaded):
                await store.touch(POOL, "s", pod="w-0", epoch=1, chunk_index=1)
            assert (await operator.place(POOL, spec("s"))).placement is not None
            assert group.replica.cli("EXISTS", f"{POOL.tag}:session:s").strip() == "1"
            library = operator.library.name
            assert library in group.replica.cli("FUNCTION", "LIST", "LIBRARYNAME", library)
            assert (await store.place(POOL, spec("s"))).already_placed


def test_store_options_in_the_url() -> None:
    assert split_url_options("redis://h:1/0?wait_replicas=2&wait_timeout_ms=30&ssl_cert_reqs=none") == (
        "redis://h:1/0?ssl_cert_reqs=none",
        {"wait_replicas": 2, "wait_timeout_ms": 30},
    )
    assert split_url_options("redis+sentinel://s:1/svc") == ("redis+sentinel://s:1/svc", {})
    assert PlacementStore.from_url("redis://h:1/0").wait_replicas == 0
    assert PlacementStore.from_url("redis+sentinel://s:1/svc/0").wait_replicas == 1
    store = PlacementStore.from_url("redis+sentinel://s:1/svc/0?wait_replicas=0&wait_timeout_ms=7")
    assert (store.wait_replicas, store.wait_timeout_ms) == (0, 7)
    with pytest.raises(InvalidRedisUrl, match="wait_replicas must be an integer"):
        PlacementStore.from_url("redis://:secret@h:1/0?wait_replicas=one")
    with pytest.raises(InvalidPlacementArgument, match="not supported on a Redis Cluster"):
        PlacementStore.from_url("redis+cluster://h:1/?wait_replicas=1")
