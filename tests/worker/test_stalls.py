"""Timeouts everywhere (issue 23 item 6), against real worker processes (fake runtime): a Redis master that
stops answering (SIGSTOP) makes ticks retryable 503s within seconds, and a pod-to-pod pull from a holder that
stalls neither holds the pulling pod's forward lock nor outlives its deadline."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid

import numpy as np
import pytest

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.connection import SOCKET_TIMEOUT_SECONDS
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.worker.export_download import transfer_deadline_seconds
from tests.worker.conftest import launch_fake_pod, suspend_and_wait
from tests.worker.test_continuity import frames_of
from tests.worker.test_http_contract import error_of

TOKEN = "stalls-token"


@pytest.fixture(scope="module")
def own_redis():
    with RedisServer() as server:
        yield server


async def place_on(store, pool: PoolId, spec, pod: str, pods: tuple[str, ...]) -> None:
    """Place as the operator does, with every other pod of `pods` drained for the moment."""
    others = [other for other in pods if other != pod]
    for other in others:
        await store.set_draining(pool, other, draining=True)
    try:
        assert (await store.place(pool, spec)).placement.pod == pod
    finally:
        for other in others:
            await store.set_draining(pool, other, draining=False)


async def test_a_master_that_stops_answering_gives_retryable_503s_within_seconds(
    launch_worker, own_redis, session_spec
):
    """Before: a tick waited 20 s (redis-py's 5 s timeout, retried three times), and one whose touch met the
    stall answered 500 `internal_error`."""
    pool = PoolId("default", f"wk-stop-{uuid.uuid4().hex[:6]}")
    worker = launch_fake_pod(launch_worker, own_redis.url, pool, "stop-0", fake_tick_seconds=1.0)
    store = PlacementStore.from_url(own_redis.url)
    try:
        name = f"s-{uuid.uuid4().hex[:8]}"
        assert (await store.place(pool, session_spec(name, TOKEN))).placement.pod == "stop-0"
        frames_of(worker.tick(name, 0, token=TOKEN))

        answers: dict[str, object] = {}
        ticking = threading.Thread(
            target=lambda: answers.update(touched=worker.tick(name, 1, token=TOKEN)), daemon=True
        )
        ticking.start()
        await asyncio.sleep(0.5)  # in its forward: its touch will meet the stopped master
        own_redis.process.send_signal(signal.SIGSTOP)
        try:
            ticking.join(timeout=60)
            error = error_of(answers["touched"], 503, "not_ready")
            assert "retry" in error["message"]
            assert answers["touched"].headers["retry-after"] == "1"
            started = time.monotonic()
            error_of(worker.tick(name, 2, token=TOKEN), 503, "not_ready")  # the placement read meets it
            assert time.monotonic() - started < SOCKET_TIMEOUT_SECONDS + 2
        finally:
            own_redis.process.send_signal(signal.SIGCONT)
        frames_of(worker.tick(name, 1, token=TOKEN))  # the same request again: its chunk was kept
        frames_of(worker.tick(name, 2, token=TOKEN))
    finally:
        worker.stop()
        await store.close()


async def test_a_stalled_holder_neither_holds_the_pullers_forward_lock_nor_outlives_the_deadline(
    launch_worker, redis_url, store, session_spec, tmp_path
):
    """The holder of a migrating session sends the export's first 4 KiB and stops for 25 s. Meanwhile another
    session of the pulling pod ticks at once, and the pull gives up at its deadline: the session resumes from
    the shared tier's copy, bit-identically. Before: the pull held the pulling pod's forward lock until the
    stall ended, so every other tick there waited 25 s."""
    pool = PoolId("default", f"wk-stall-{uuid.uuid4().hex[:6]}")
    holder = launch_fake_pod(
        launch_worker,
        redis_url,
        pool,
        "stall-h",
        suspend_dir=str(tmp_path),
        test_faults=1,
        test_transfer_stall_seconds=25,
    )
    puller = launch_fake_pod(launch_worker, redis_url, pool, "stall-p", suspend_dir=str(tmp_path))
    pods = ("stall-h", "stall-p")
    try:
        session, twin, other = (f"s-{uuid.uuid4().hex[:8]}" for _ in range(3))
        for name in (session, twin):
            await place_on(store, pool, session_spec(name, TOKEN, seed=4), "stall-h", pods)
        await place_on(store, pool, session_spec(other, TOKEN, seed=5), "stall-p", pods)
        expected = [frames_of(holder.tick(twin, i, token=TOKEN)) for i in range(3)]
        for i in range(2):
            frames_of(holder.tick(session, i, token=TOKEN))
        frames_of(puller.tick(other, 0, token=TOKEN))
        record = await suspend_and_wait(store, pool, session, reason="migrate")
        await place_on(store, pool, record.spec(), "stall-p", pods)

        answers: dict[str, object] = {}

        def resume() -> None:
            started = time.monotonic()
            answers["resumed"] = puller.tick(session, 2, token=TOKEN)
            answers["seconds"] = time.monotonic() - started

        resuming = threading.Thread(target=resume, daemon=True)
        resuming.start()
        await asyncio.sleep(1.0)  # the pull is under way and stalled
        started = time.monotonic()
        frames_of(puller.tick(other, 1, token=TOKEN))
        assert time.monotonic() - started < 3.0
        resuming.join(timeout=60)
        np.testing.assert_array_equal(frames_of(answers["resumed"]), expected[2])
        assert answers["seconds"] < transfer_deadline_seconds(record.bytes) + 5 < 25
        assert "direct transfer of session" in puller.log()  # it gave up on the holder, logged
    finally:
        for worker, pod in ((holder, "stall-h"), (puller, "stall-p")):
            worker.stop()
            await store.remove_pod(pool, pod)
