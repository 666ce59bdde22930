"""Admission when the runtime is full, in-process: the worker never lets the runner evict silently.

The service runs with the fake runtime and a real `PodLink` on the shared Redis; its event consumer (and its
heartbeat) are stopped, so a released session's `close` event stays unread and only the admission path can
notice the release.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.worker.errors import AtCapacity, ChunkOutOfOrder, SessionClosed
from tests.worker.conftest import started_in_process

TOKEN = "admission-token"
AUTH = f"Bearer {TOKEN}"


def tick(chunk: int) -> dict:
    return {"request_id": f"r{chunk}", "chunk_index": chunk}


@pytest.fixture
async def service(redis_url):
    pool = PoolId("default", f"wk-admit-{uuid.uuid4().hex[:6]}")
    worker = await started_in_process(redis_url, pool, "admit-pod", fake_capacity=1)
    for task in worker._tasks:  # no event consumer; no heartbeat overwriting the pod record in the test
        if task.get_name() in ("events", "heartbeat"):
            task.cancel()
    yield worker
    await worker.stop()


async def test_full_worker_releases_a_session_the_store_moved_away_before_admitting(service, session_spec):
    pool = service.placement.pool
    async with PlacementStore.from_url(service.settings.redis_url) as store:
        await store.place(pool, session_spec("first", TOKEN))
        await service.tick("first", tick(0), authorization=AUTH)
        await store.release(pool, "first", reason="deleted")  # its `close` event is never read
        assert (await store.place(pool, session_spec("second", TOKEN))).placement.pod == "admit-pod"
        response = await service.tick("second", tick(0), authorization=AUTH)
        assert response.chunk.frames.shape == (9, 64, 64, 3)
        assert service.runtime.resident_sessions() == ("second",)
        assert service.metrics.evictions.labels("stale")._value.get() == 1
        with pytest.raises(SessionClosed):
            await service.tick("first", tick(1), authorization=AUTH)
        await store.delete_pool(pool)


async def test_a_tick_whose_session_is_deleted_while_it_is_prepared_never_runs(
    service, session_spec, monkeypatch
):
    """Issue 41 checks the chunk order once: a DELETE between that check and the forward (while the tick's
    pictures are decoded) leaves a closed book that admission replaces with a fresh one; the tick is checked
    again against it (a book changed under it) and refused, never run as chunk 1 of a fresh session."""
    pool = service.placement.pool
    async with PlacementStore.from_url(service.settings.redis_url) as store:
        await store.place(pool, session_spec("gone", TOKEN))
        await service.tick("gone", tick(0), authorization=AUTH)
        entered, proceed = threading.Event(), threading.Event()
        decode = service.family.decode_tick

        def held(parsed):
            entered.set()
            proceed.wait(10)
            return decode(parsed)

        monkeypatch.setattr(service.family, "decode_tick", held)
        ticking = asyncio.create_task(service.tick("gone", tick(1), authorization=AUTH))
        assert await asyncio.to_thread(entered.wait, 10)
        await service.close("gone", AUTH)
        proceed.set()
        with pytest.raises(ChunkOutOfOrder):
            await ticking
        assert "gone" not in service.runtime.resident_sessions()
        await store.delete_pool(pool)


async def test_full_worker_refuses_a_session_it_cannot_make_room_for(service, session_spec):
    pool = service.placement.pool
    async with PlacementStore.from_url(service.settings.redis_url) as store:
        await store.place(pool, session_spec("holder", TOKEN))
        await service.tick("holder", tick(0), authorization=AUTH)
        # Redis and the worker disagree (the pod's record says 2 slots): the worker still admits only 1.
        await store.heartbeat(
            pool,
            "admit-pod",
            epoch=service.placement.epoch,
            capacity=2,
            endpoint=service.placement.endpoint,
            lease_ms=5000,
        )
        assert (await store.place(pool, session_spec("newcomer", TOKEN))).placement.pod == "admit-pod"
        with pytest.raises(AtCapacity):
            await service.tick("newcomer", tick(0), authorization=AUTH)
        assert service.runtime.resident_sessions() == ("holder",)
        await service.tick("holder", tick(1), authorization=AUTH)
        await store.delete_pool(pool)
