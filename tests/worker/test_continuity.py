"""Sessions that survive (issue 12), the worker's part: a `suspend` event exports the session to the shared
tier and frees its slot, a tick for a suspended session is a demand to resume (503 `resuming`), the worker the
store places it on imports it before its first tick, periodic snapshots, and a resume from an older snapshot
answers 409 `rewound`. Two real worker processes (fake runtime: its state moves through the real export
format) share one tier directory and the shared Redis; the store calls play the operator's part.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

from ardiff.kv.records import PoolId, SessionState
from tests.worker.test_http_contract import error_of, wait_for

POOL = PoolId("default", f"wk-cont-{uuid.uuid4().hex[:6]}")
TOKEN = "continuity-token"


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


def launch(launch_worker, redis_url, tier: Path, pod: str, **settings):
    return launch_worker(
        runtime="fake",
        redis_url=redis_url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name=pod,
        fake_capacity=2,
        lease_seconds=5,
        heartbeat_seconds=0.5,
        suspend_dir=str(tier),
        snapshot_every_chunks=2,
        **settings,
    )


@pytest.fixture(scope="module")
def pod_a(launch_worker, redis_url, tier):
    worker = launch(launch_worker, redis_url, tier, "cont-a")
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def pod_b(launch_worker, redis_url, tier):
    worker = launch(launch_worker, redis_url, tier, "cont-b")
    yield worker
    worker.stop()


async def place_avoiding(store, spec, pod: str):
    """Place as the operator does, with `pod` drained for the moment: the other pod takes it."""
    await store.set_draining(POOL, pod, draining=True)
    try:
        return await store.place(POOL, spec)
    finally:
        await store.set_draining(POOL, pod, draining=False)


@pytest.fixture
async def on_a(pod_a, pod_b, store, session_spec):
    """Place fresh sessions on pod A (B is drained meanwhile); released after the test."""
    names: list[str] = []

    async def place(**spec) -> str:
        name = f"s-{uuid.uuid4().hex[:8]}"
        placed = await place_avoiding(store, session_spec(name, TOKEN, **spec), "cont-b")
        assert placed.placement is not None
        assert placed.placement.pod == "cont-a"
        names.append(name)
        return name

    yield place
    for name in names:
        await store.release(POOL, name, reason="test done")


def frames_of(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    shape = tuple(int(n) for n in response.headers["ardiff-frame-shape"].split(","))
    return np.frombuffer(response.content, dtype=np.uint8).reshape(shape)


def chunk_index_of(response) -> int:
    return json.loads(response.headers["ardiff-chunk-metadata"])["chunk_index"]


async def suspend(store, worker, session: str) -> dict:
    """What the operator does for a migration: ask the store to suspend; the worker exports and reports."""
    assert await store.suspend(POOL, session, reason="evicted")

    async def suspended():
        record = await store.get_session(POOL, session)
        return record if record.state is SessionState.SUSPENDED else None

    return await wait_for(suspended)


async def test_suspend_exports_to_the_tier_frees_the_slot_and_a_tick_demands_the_resume(
    pod_a, pod_b, store, on_a, tier
):
    session = await on_a(seed=4)
    twin = [frames_of(pod_a.tick(session, i, token=TOKEN)) for i in range(3)]
    pod = await store.get_pod(POOL, "cont-a")
    assert pod.exports
    record = await suspend(store, pod_a, session)
    assert (record.tier, record.suspended_chunk) == ("shared", 3)
    assert record.bytes == (tier / record.location).stat().st_size > 0
    assert (await store.get_pod(POOL, "cont-a")).used == pod.used - 1  # a suspended session holds no slot
    listing = pod_a.client.get(f"{pod_a.url}/v1/sessions").json()
    assert session not in {s["session_id"] for s in listing["sessions"]}  # released from the runner

    error = error_of(pod_a.tick(session, 3, token=TOKEN), 503, "resuming")
    assert "suspended" in error["message"]
    assert pod_a.tick(session, 3, token=TOKEN).headers["retry-after"] == "1"
    assert (await store.get_session(POOL, session)).resume_requested_ms > 0
    error_of(pod_a.tick(session, 3, token="not-the-token"), 401, "unauthorized")

    # The operator places it on B (A drained): B imports the export before its first tick.
    placed = await place_avoiding(store, record.spec(), "cont-a")
    assert placed.placement.pod == "cont-b"
    assert (await store.get_session(POOL, session)).resume_from == record.location
    misdirected = error_of(pod_a.tick(session, 3, token=TOKEN), 421, "misdirected")
    assert misdirected["endpoint"] == pod_b.url
    replay = pod_b.tick(session, 2, token=TOKEN, request_id=f"{session}-2")  # the book moved with it
    np.testing.assert_array_equal(frames_of(replay), twin[2])
    resumed = pod_b.tick(session, 3, token=TOKEN)
    assert chunk_index_of(resumed) == 3
    after = await store.get_session(POOL, session)
    assert (after.resume_from, after.chunk_index) == ("", 4)
    assert not (tier / record.location).exists()  # a resumed suspension's export is gone
    metrics = pod_b.client.get(f"{pod_b.url}/metrics").text
    assert 'ardiff_session_resumes_total{source="suspend"} 1.0' in metrics


async def test_an_export_that_cannot_be_read_needs_a_reset(pod_a, pod_b, store, on_a, tier):
    session = await on_a(seed=2)
    frames_of(pod_a.tick(session, 0, token=TOKEN))
    record = await suspend(store, pod_a, session)
    (tier / record.location).write_bytes(b"ARDSESS\x00 not really")
    await store.request_resume(POOL, session)
    placed = await place_avoiding(store, record.spec(), "cont-b")
    assert placed.placement.pod == "cont-a"
    error = error_of(pod_a.tick(session, 1, token=TOKEN), 409, "reset_required")
    assert "could not be resumed (export_corrupt)" in error["message"]
    assert (await store.get_session(POOL, session)).resume_from == ""
    assert chunk_index_of(pod_a.tick(session, 0, token=TOKEN, reset=True)) == 0


async def test_a_corrupt_suspension_falls_back_to_the_snapshot(pod_a, pod_b, store, on_a, tier):
    session = await on_a(seed=6)
    twin = [frames_of(pod_a.tick(session, i, token=TOKEN)) for i in range(3)]  # a snapshot at chunk 2
    record = await suspend(store, pod_a, session)
    assert (record.suspended_chunk, record.snapshot_chunk) == (3, 2)
    (tier / record.location).write_bytes((tier / record.location).read_bytes()[:-1])  # truncated
    await store.request_resume(POOL, session)
    assert (await place_avoiding(store, record.spec(), "cont-b")).placement.pod == "cont-a"
    error = error_of(pod_a.tick(session, 3, token=TOKEN), 409, "rewound")  # nothing lost but chunk 2
    assert error["expected_chunk_index"] == 2
    np.testing.assert_array_equal(frames_of(pod_a.tick(session, 2, token=TOKEN)), twin[2])
    assert chunk_index_of(pod_a.tick(session, 3, token=TOKEN)) == 3


async def test_a_lost_session_resumes_from_its_snapshot_and_is_told_it_rewound(pod_a, pod_b, store, on_a):
    session = await on_a(seed=9)
    twin = [frames_of(pod_a.tick(session, i, token=TOKEN)) for i in range(5)]  # snapshots at 2 and 4
    record = await store.get_session(POOL, session)
    assert record.snapshot_chunk == 4  # chunk 4 was made after the last snapshot: it is lost with the pod
    first_snapshot = record.snapshot_location
    pod_a.process.kill()  # pod A dies (the last test of the module: B is the only pod left)
    pod_a.process.wait()
    await store.remove_pod(POOL, "cont-a")  # the operator saw it die: its sessions are lost
    lost = await store.get_session(POOL, session)
    assert lost.state is SessionState.LOST
    placed = await store.place(POOL, lost.spec())
    assert placed.placement.pod == "cont-b"
    assert not placed.placement.reset_required  # it has a snapshot
    error = error_of(pod_b.tick(session, 5, token=TOKEN), 409, "rewound")
    assert error["expected_chunk_index"] == 4
    np.testing.assert_array_equal(frames_of(pod_b.tick(session, 4, token=TOKEN)), twin[4])
    assert chunk_index_of(pod_b.tick(session, 5, token=TOKEN)) == 5
    assert (await store.get_session(POOL, session)).snapshot_location != first_snapshot  # B snapshots on
