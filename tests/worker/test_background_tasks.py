"""Background tasks never die silently (issue 23 item 3): the pod's event consumer survives a Redis restart
that lands in the middle of its loop, and a long-lived task that fails anyway is restarted and counted.

A real worker process (fake runtime, a shared tier so suspends export) on a `redis-server` of this module's
own: the test restarts it (every key lost), which the shared server must never be."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.placement_worker import CONSUMER_GROUP
from ardiff.kv.records import PoolId, SessionState
from ardiff.worker.background import supervised
from ardiff.worker.metrics import WorkerMetrics
from tests.worker.conftest import TRANSFER_TOKEN, suspend_and_wait

POOL = PoolId("default", f"wk-tasks-{uuid.uuid4().hex[:6]}")
POD = "tasks-0"
TOKEN = "tasks-token"
TICK_SECONDS = 3.0  # the forward an event's handler waits behind


@pytest.fixture(scope="module")
def own_redis():
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def worker(launch_worker, own_redis, tmp_path_factory):
    process = launch_worker(
        runtime="fake",
        redis_url=own_redis.url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name=POD,
        fake_capacity=3,
        fake_tick_seconds=TICK_SECONDS,
        lease_seconds=10,
        heartbeat_seconds=0.5,
        suspend_dir=str(tmp_path_factory.mktemp("tier")),
        transfer_token=TRANSFER_TOKEN,  # the listing names sessions only to it
    )
    yield process
    process.stop()


async def wait_until(predicate, within: float, what: str):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} within {within} s")


async def place(store: PlacementStore, session_spec) -> str:
    name = f"s-{uuid.uuid4().hex[:8]}"
    placed = await store.place(POOL, session_spec(name, TOKEN))
    assert placed.placement is not None
    assert placed.placement.pod == POD
    return name


async def test_a_redis_restart_during_an_ack_does_not_end_the_event_consumer(worker, own_redis, session_spec):
    """The consumer reads a `close` event, its handler waits behind a forward, Redis goes away meanwhile, so
    the handler ends and the ack fails; Redis comes back empty. Then a suspend must still land. Before: the
    ack's error ended the consumer (and `/readyz` stayed 200), so the suspend was never handled."""
    store = PlacementStore.from_url(own_redis.url)
    try:
        busy, closed = await place(store, session_spec), await place(store, session_spec)
        ticking = threading.Thread(target=worker.tick, args=(busy, 0), kwargs={"token": TOKEN})
        ticking.start()

        async def in_flight() -> bool:
            listing = await asyncio.to_thread(
                worker.client.get, f"{worker.url}/v1/sessions", headers=worker.headers(TRANSFER_TOKEN)
            )
            return any(s["session_id"] == busy and s["in_flight"] for s in listing.json()["sessions"])

        await wait_until(in_flight, 5, "the tick to be in flight")
        assert await store.release(POOL, closed, reason="deleted") is SessionState.PLACED
        stream = PoolKeys(POOL).events(POD)

        async def delivered() -> bool:  # handed to the worker, not acked: its handler waits for the forward
            return (await store.client.xpending(stream, CONSUMER_GROUP))["pending"] == 1

        await wait_until(delivered, 5, "the close event to be delivered")
        await store.close()
        own_redis.stop()
        ticking.join(timeout=30)  # the forward ends, the handler with it, and its ack finds no Redis
        await asyncio.sleep(2.0)  # longer than the store's reconnect attempts
        own_redis.start()  # empty: the keys and the function library are gone
        own_redis.load_functions()  # what the operator's next pool round does
        store = PlacementStore.from_url(own_redis.url)

        async def re_registered() -> bool:  # the heartbeat re-creates the pod record Redis lost
            return await store.get_pod(POOL, POD) is not None

        await wait_until(re_registered, 10, "the heartbeat to re-create the pod record")
        assert worker.client.get(f"{worker.url}/readyz").status_code == 200
        fresh = await place(store, session_spec)
        assert worker.tick(fresh, 0, token=TOKEN).status_code == 200
        record = await suspend_and_wait(store, POOL, fresh, reason="evicted", within=20)
        assert record.location  # the consumer handled it: exported, reported
    finally:
        await store.close()


async def test_a_failing_background_task_is_restarted_and_counted() -> None:
    metrics = WorkerMetrics()
    runs: list[int] = []
    finished = asyncio.Event()

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise ConnectionError("redis went away")
        finished.set()
        await asyncio.Event().wait()  # then runs until cancelled

    task = supervised("events", flaky, metrics, restart_seconds=0.01)
    await asyncio.wait_for(finished.wait(), 5)
    assert runs == [0, 1, 2]
    text = metrics.render(None, admitted=0, ready=True, playback_ratio=1.0).decode()
    assert 'ardiff_background_task_restarts_total{task="events"} 2.0' in text
    task.cancel()
    await asyncio.sleep(0.05)
    assert task.cancelled()  # a cancel (the worker stopping) is not a failure: no restart
    assert len(runs) == 3
