"""Sessions that survive (issue 12), the worker's part: a `suspend` event exports the session to the shared
tier and frees its slot, a tick for a suspended session is a demand to resume (503 `resuming`), the worker the
store places it on imports it before its first tick, periodic snapshots, and a resume from an older snapshot
answers 409 `rewound`; a migration pulled pod to pod over HTTP (the pool's transfer token), with the shared
tier's copy as the fallback when the holder dies mid-transfer. Real worker processes (fake runtime: its
state moves through the real export format) share one tier directory and the shared Redis; the store calls
play the operator's part.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import numpy as np
import pytest

from ardiff.kv.records import PoolId, SessionState
from tests.worker.conftest import TRANSFER_TOKEN, launch_fake_pod, suspend_and_wait
from tests.worker.test_http_contract import error_of, wait_for

POOL = PoolId("default", f"wk-cont-{uuid.uuid4().hex[:6]}")
TOKEN = "continuity-token"


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


def launch(launch_worker, redis_url, tier: Path, pod: str, **settings):
    """A pod of this pool on the shared tier, snapshotting every 2 chunks."""
    return launch_fake_pod(
        launch_worker, redis_url, POOL, pod, suspend_dir=str(tier), snapshot_every_chunks=2, **settings
    )


@pytest.fixture(scope="module")
def pod_a(launch_worker, redis_url, tier):
    worker = launch(launch_worker, redis_url, tier, "cont-a")
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def pod_b(launch_worker, redis_url, tier):
    # B pulls into memory it keeps between pulls (the pulls below: one that fails, then others).
    worker = launch(launch_worker, redis_url, tier, "cont-b", transfer_staging_bytes=16 << 20)
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


async def test_suspend_exports_to_the_tier_frees_the_slot_and_a_tick_demands_the_resume(
    pod_a, pod_b, store, on_a, tier
):
    session = await on_a(seed=4)
    twin = [frames_of(pod_a.tick(session, i, token=TOKEN)) for i in range(3)]
    pod = await store.get_pod(POOL, "cont-a")
    assert pod.exports
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert (record.tier, record.suspended_chunk) == ("shared", 3)
    assert record.bytes == (tier / record.location).stat().st_size > 0
    assert (await store.get_pod(POOL, "cont-a")).used == pod.used - 1  # a suspended session holds no slot
    listing = pod_a.client.get(f"{pod_a.url}/v1/sessions", headers=pod_a.headers(TRANSFER_TOKEN)).json()
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
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
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
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert (record.suspended_chunk, record.snapshot_chunk) == (3, 2)
    (tier / record.location).write_bytes((tier / record.location).read_bytes()[:-1])  # truncated
    await store.request_resume(POOL, session)
    assert (await place_avoiding(store, record.spec(), "cont-b")).placement.pod == "cont-a"
    error = error_of(pod_a.tick(session, 3, token=TOKEN), 409, "rewound")  # nothing lost but chunk 2
    assert error["expected_chunk_index"] == 2
    np.testing.assert_array_equal(frames_of(pod_a.tick(session, 2, token=TOKEN)), twin[2])
    assert chunk_index_of(pod_a.tick(session, 3, token=TOKEN)) == 3


def metric(worker, sample: str) -> float:
    """One sample's value from the worker's /metrics (0 when the series does not exist yet)."""
    for line in worker.client.get(f"{worker.url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pull(worker, session: str, token: str | None):
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    return worker.client.get(f"{worker.url}/internal/v1/sessions/{session}/export", headers=headers)


async def test_a_migration_is_pulled_pod_to_pod_and_a_wrong_token_harms_nothing(
    pod_a, pod_b, store, on_a, tier
):
    session = await on_a(seed=11)
    twin = await on_a(seed=11)  # the same seed, prompt and controls, never moved
    expected = [frames_of(pod_a.tick(twin, i, token=TOKEN)) for i in range(5)]
    for i in range(3):
        np.testing.assert_array_equal(frames_of(pod_a.tick(session, i, token=TOKEN)), expected[i])
    sent_before = metric(pod_a, 'ardiff_session_transfer_bytes_total{direction="out"}')
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    assert record.location.endswith("@cont-a.ardsess")  # names the pod that holds it for a pull
    assert record.resume_requested_ms > 0  # a migration is its own demand: placed at once
    assert record.bytes == (tier / record.location).stat().st_size  # the fallback copy is written first

    for token in (None, "not-the-pool-token", TOKEN):  # a session's token is not the pool's either
        error_of(pull(pod_a, session, token), 401, "unauthorized")
    error_of(pull(pod_a, "s-never-held", TRANSFER_TOKEN), 404, "unknown_session")

    # The client's next tick at A waits for the new pod and is pointed there (no 503, no Retry-After).
    waiting = asyncio.create_task(asyncio.to_thread(pod_a.tick, session, 3, token=TOKEN))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    placed = await place_avoiding(store, record.spec(), "cont-a")
    assert placed.placement.pod == "cont-b"
    assert error_of(await waiting, 421, "misdirected")["endpoint"] == pod_b.url

    async def pulled() -> bool:  # A sees the placement and offers it; B pulls it before any tick
        return metric(pod_b, 'ardiff_session_transfers_total{direction="in",result="ok"}') == 1

    await wait_for(pulled)
    note = json.loads((await store.get_session(POOL, session)).resumed_note)  # for the operator's Event
    assert note.pop("seconds") > 0
    assert note == {
        "source": "direct",
        "bytes": record.bytes,
        "from": "cont-a",
        "to": "cont-b",
        "direct_failed": False,
    }
    for i in (3, 4):  # the refused pulls harmed nothing
        np.testing.assert_array_equal(frames_of(pod_b.tick(session, i, token=TOKEN)), expected[i])
    assert f"pulled session {session} from pod cont-a: {record.bytes} bytes" in pod_b.log()
    assert "into the staging memory" in pod_b.log()
    assert "staging memory is still viewed" not in pod_b.log()
    sent = metric(pod_a, 'ardiff_session_transfer_bytes_total{direction="out"}') - sent_before
    assert sent == record.bytes == metric(pod_b, 'ardiff_session_transfer_bytes_total{direction="in"}')
    assert metric(pod_b, 'ardiff_session_transfers_total{direction="in",result="ok"}') == 1
    assert metric(pod_b, 'ardiff_session_resumes_total{source="direct"}') == 1
    assert metric(pod_b, 'ardiff_session_transfer_seconds_count{direction="in"}') == 1
    assert metric(pod_a, 'ardiff_session_transfer_seconds_sum{direction="out"}') > 0
    assert not (tier / record.location).exists()  # resumed: the fallback copy is of no use any more
    error_of(pull(pod_a, session, TRANSFER_TOKEN), 404, "unknown_session")  # released once pulled
    assert (await store.get_session(POOL, session)).chunk_index == 5


async def test_a_held_session_is_sent_once_with_its_length_declared(pod_a, store, on_a, tier):
    """The holder writes a held session's export before its answer starts, so the answer declares the length
    (the puller then provides its whole buffer at once): the bytes of the shared tier's copy, the same
    export."""
    session = await on_a(seed=3)
    for i in range(2):
        frames_of(pod_a.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    sent = pull(pod_a, session, TRANSFER_TOKEN)
    assert sent.status_code == 200
    assert sent.headers["content-length"] == str(len(sent.content)) == str(record.bytes)
    assert sent.content[:8] == (tier / record.location).read_bytes()[:8] == b"ARDSESS\x00"
    error_of(pull(pod_a, session, TRANSFER_TOKEN), 404, "unknown_session")  # sent once


async def test_a_holder_killed_mid_transfer_falls_back_to_the_shared_tier(
    launch_worker, redis_url, pod_a, pod_b, store, session_spec, tier
):
    pod_c = launch(launch_worker, redis_url, tier, "cont-c", test_faults=1, test_transfer_stall_seconds=60)
    session, twin = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    try:
        for other in ("cont-a", "cont-b"):  # C takes both
            await store.set_draining(POOL, other, draining=True)
        try:
            for name in (session, twin):
                assert (await store.place(POOL, session_spec(name, TOKEN, seed=5))).placement.pod == "cont-c"
        finally:
            for other in ("cont-a", "cont-b"):
                await store.set_draining(POOL, other, draining=False)
        expected = [frames_of(pod_c.tick(twin, i, token=TOKEN)) for i in range(4)]
        for i in range(3):
            np.testing.assert_array_equal(frames_of(pod_c.tick(session, i, token=TOKEN)), expected[i])
        record = await suspend_and_wait(store, POOL, session, reason="migrate")
        assert record.location.endswith("@cont-c.ardsess")
        await store.set_draining(POOL, "cont-c", draining=True)  # as the operator drains a pod it empties
        await store.set_draining(POOL, "cont-a", draining=True)
        try:
            assert (await place_avoiding(store, record.spec(), "cont-a")).placement.pod == "cont-b"
        finally:
            await store.set_draining(POOL, "cont-a", draining=False)

        async def stalled() -> bool:  # C offered it, sent the export's header and stalls: B is mid-import
            return metric(pod_c, 'ardiff_session_transfers_in_progress{direction="out"}') == 1

        await wait_for(stalled)
        assert metric(pod_b, 'ardiff_session_transfers_in_progress{direction="in"}') == 1
        pod_c.process.send_signal(signal.SIGKILL)
        pod_c.process.wait()
        response = pod_b.tick(session, 3, token=TOKEN)  # from the shared tier's copy: nothing lost, no rewind
        np.testing.assert_array_equal(frames_of(response), expected[3])
        assert chunk_index_of(response) == 3
        assert metric(pod_b, 'ardiff_session_transfers_total{direction="in",result="failed"}') >= 1
        note = json.loads((await store.get_session(POOL, session)).resumed_note)
        assert (note["source"], note["bytes"], note["from"], note["direct_failed"]) == (
            "suspend",
            record.bytes,
            "cont-c",
            True,
        )
        assert metric(pod_b, 'ardiff_session_resumes_total{source="suspend"}') >= 1
        assert f"direct transfer of session {session} from pod cont-c failed (export_corrupt" in pod_b.log()
        assert not (tier / record.location).exists()
    finally:
        pod_c.stop()
        await store.remove_pod(POOL, "cont-c")
        for name in (session, twin):
            await store.release(POOL, name, reason="test done")


async def test_a_target_killed_mid_transfer_loses_nothing(
    launch_worker, redis_url, pod_a, pod_b, store, session_spec, tier
):
    """The pod pulling a migrating session dies mid-pull: the session is `lost` with its export not imported,
    so it is placed again from the shared tier's copy and continues where it was (no rewind, no reset)."""
    holder = launch(launch_worker, redis_url, tier, "cont-h", test_faults=1, test_transfer_stall_seconds=3)
    target = launch(launch_worker, redis_url, tier, "cont-t")
    session, twin = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    others = ("cont-a", "cont-b", "cont-t")
    try:
        for other in others:
            await store.set_draining(POOL, other, draining=True)
        try:
            for name in (session, twin):
                assert (await store.place(POOL, session_spec(name, TOKEN, seed=8))).placement.pod == "cont-h"
        finally:
            for other in others:
                await store.set_draining(POOL, other, draining=False)
        expected = [frames_of(holder.tick(twin, i, token=TOKEN)) for i in range(3)]
        for i in range(2):
            frames_of(holder.tick(session, i, token=TOKEN))
        record = await suspend_and_wait(store, POOL, session, reason="migrate")
        for pod in ("cont-h", "cont-a", "cont-b"):
            await store.set_draining(POOL, pod, draining=True)
        assert (await store.place(POOL, record.spec())).placement.pod == "cont-t"

        async def stalled() -> bool:  # the target pulls, the holder sent the header and stalls mid-body
            return metric(holder, 'ardiff_session_transfers_in_progress{direction="out"}') == 1

        await wait_for(stalled)
        target.process.send_signal(signal.SIGKILL)
        target.process.wait()
        await store.remove_pod(POOL, "cont-t")  # the operator saw it die
        lost = await store.get_session(POOL, session)
        assert (lost.state, lost.resume_from) == (SessionState.LOST, record.location)
        await store.set_draining(POOL, "cont-b", draining=False)
        again = await store.place(POOL, lost.spec())
        assert (again.placement.pod, again.placement.resume_from) == ("cont-b", record.location)
        assert not again.placement.reset_required
        response = pod_b.tick(session, 2, token=TOKEN)  # from the tier's copy: the holder let go of its own
        np.testing.assert_array_equal(frames_of(response), expected[2])
        note = json.loads((await store.get_session(POOL, session)).resumed_note)
        assert (note["source"], note["direct_failed"]) == ("suspend", True)  # the holder had let go of it
    finally:
        for worker, pod in ((holder, "cont-h"), (target, "cont-t")):
            worker.stop()
            await store.remove_pod(POOL, pod)
        for pod in ("cont-a", "cont-b"):
            await store.set_draining(POOL, pod, draining=False)
        for name in (session, twin):
            await store.release(POOL, name, reason="test done")


async def test_a_draining_holder_finishes_the_pull_under_way_and_points_ticks_at_the_new_pod(
    launch_worker, redis_url, pod_a, pod_b, store, session_spec, tier
):
    """SIGTERM on the pod holding a migrated session (the operator deletes the pod it emptied): it answers the
    session's ticks with 421 naming the new pod, lets the pull under way finish, then exits 0."""
    pod_d = launch(launch_worker, redis_url, tier, "cont-d", test_faults=1, test_transfer_stall_seconds=2)
    session = f"s-{uuid.uuid4().hex[:8]}"
    try:
        for other in ("cont-a", "cont-b"):
            await store.set_draining(POOL, other, draining=True)
        try:
            assert (await store.place(POOL, session_spec(session, TOKEN, seed=3))).placement.pod == "cont-d"
        finally:
            for other in ("cont-a", "cont-b"):
                await store.set_draining(POOL, other, draining=False)
        frames_of(pod_d.tick(session, 0, token=TOKEN))
        record = await suspend_and_wait(store, POOL, session, reason="migrate")
        await store.set_draining(POOL, "cont-d", draining=True)
        await place_avoiding(store, record.spec(), "cont-a")
        pulled_before = metric(pod_b, 'ardiff_session_transfers_total{direction="in",result="ok"}')

        async def stalled() -> bool:  # B pulls, D stalls mid-body (2 s)
            return metric(pod_d, 'ardiff_session_transfers_in_progress{direction="out"}') == 1

        await wait_for(stalled)
        pod_d.signal(signal.SIGTERM)
        misdirected = error_of(pod_d.tick(session, 1, token=TOKEN), 421, "misdirected")
        assert misdirected["endpoint"] == pod_b.url
        assert pod_d.process.wait(timeout=30) == 0
        after = metric(pod_b, 'ardiff_session_transfers_total{direction="in",result="ok"}')
        assert after == pulled_before + 1  # the pull finished although its holder was going
        assert chunk_index_of(pod_b.tick(session, 1, token=TOKEN)) == 1
        assert json.loads((await store.get_session(POOL, session)).resumed_note)["source"] == "direct"
    finally:
        pod_d.stop()
        await store.remove_pod(POOL, "cont-d")
        await store.release(POOL, session, reason="test done")


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
