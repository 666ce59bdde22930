"""A resume the store refuses at its end, in-process: the worker (fake runtime, a real `PodLink` on the shared
Redis, a shared tier in a temporary directory) imports a suspended session placed back on it, and the store
answers its `resumed` report that the session is no longer here (its pod's lease lapsed while it imported; a
local CI run met it under load) or that the pod was fenced. The tick is told to retry (503 `not_ready`), never
a 500; the import is released (or, fenced, the worker stops, as on any write the store fences)."""

from __future__ import annotations

import uuid

import pytest

from ardiff.kv import errors as placement
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from ardiff.worker.errors import NotReady
from tests.worker.conftest import started_in_process, suspend_and_wait

TOKEN = "resume-token"
AUTH = f"Bearer {TOKEN}"


def tick(chunk: int) -> dict:
    return {"request_id": f"r{chunk}", "chunk_index": chunk}


@pytest.fixture
async def service(redis_url, tmp_path):
    pool = PoolId("default", f"wk-resume-{uuid.uuid4().hex[:6]}")
    worker = await started_in_process(
        redis_url, pool, "resume-pod", fake_capacity=2, suspend_dir=str(tmp_path)
    )
    yield worker
    await worker.stop()


@pytest.mark.parametrize(
    ("refusal", "fenced"),
    [
        (placement.SessionNotHere("s", SessionState.LOST, "resume-pod"), False),
        (placement.PodFenced("resume-pod", 1, 2), True),
    ],
)
async def test_a_resume_the_store_refuses_is_retried_not_a_500_and_leaves_nothing_behind(
    service, session_spec, monkeypatch, refusal, fenced
):
    pool = service.placement.pool
    name = f"s-{uuid.uuid4().hex[:8]}"
    async with PlacementStore.from_url(service.settings.redis_url) as store:
        await store.place(pool, session_spec(name, TOKEN))
        for chunk in range(2):
            await service.tick(name, tick(chunk), authorization=AUTH)
        record = await suspend_and_wait(store, pool, name, reason="evicted")
        assert name not in service.runtime.resident_sessions()
        assert (await store.place(pool, record.spec())).placement.pod == "resume-pod"

        async def refused(session: str, *, note: str = "") -> None:
            raise refusal

        monkeypatch.setattr(service.placement, "resumed", refused)
        with pytest.raises(NotReady):
            await service.tick(name, tick(2), authorization=AUTH)
        assert service.sessions.stopped.is_set() is fenced  # fenced: the worker exits, holding nothing on
        if not fenced:  # not here: the import is released, the pod serves on
            assert name not in service.runtime.resident_sessions()
            assert name not in service.sessions.books
        await store.delete_pool(pool)
