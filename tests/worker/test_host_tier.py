"""The host tier (issue 12, docs/contracts.md §2): a suspended session's export kept in its pod's memory
within a byte budget. Resumed on the same pod from memory, pulled once by another pod, moved to the shared
tier when its pod drains, lost (reset) with a pod that dies; what does not fit goes to the shared tier. Real
worker processes (fake runtime: its state moves through the real export format) and the shared Redis; the
store calls play the operator's part. Every resumed session's frames equal an uninterrupted twin's."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import numpy as np
import pytest

from ardiff.kv.keys import PoolKeys
from ardiff.kv.records import PoolId, SessionState
from ardiff.worker.errors import ExportCorrupt
from ardiff.worker.host_tier import HostTier, HostTierFull, host_holder
from tests.worker.conftest import TRANSFER_TOKEN, launch_fake_pod, suspend_and_wait
from tests.worker.test_continuity import chunk_index_of, frames_of, metric, pull
from tests.worker.test_http_contract import error_of, wait_for

POOL = PoolId("default", f"wk-host-{uuid.uuid4().hex[:6]}")
TOKEN = "host-tier-token"
BUDGET = 64 << 20
PODS = ("host-a", "host-b")


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared-tier")


@pytest.fixture(scope="module")
def pod_a(launch_worker, redis_url):
    """Host memory only: no shared tier."""
    worker = launch_fake_pod(launch_worker, redis_url, POOL, "host-a", host_tier_bytes=BUDGET)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def pod_b(launch_worker, redis_url, tier):
    """A budget no export fits, and the shared tier."""
    worker = launch_fake_pod(
        launch_worker, redis_url, POOL, "host-b", host_tier_bytes=1, suspend_dir=str(tier)
    )
    yield worker
    worker.stop()


async def place_on(store, spec, pod: str, others=PODS):
    """Place as the operator does, with every other pod drained for the moment."""
    drained = [p for p in others if p != pod]
    for other in drained:
        await store.set_draining(POOL, other, draining=True)
    try:
        placed = await store.place(POOL, spec)
    finally:
        for other in drained:
            await store.set_draining(POOL, other, draining=False)
    assert placed.placement is not None
    assert placed.placement.pod == pod
    return placed


@pytest.fixture
async def sessions(pod_a, pod_b, store, session_spec):
    """`place(pod, seed)`: a fresh session and its uninterrupted twin on `pod`; released after the test."""
    names: list[str] = []

    async def place(pod: str, seed: int, others=PODS) -> tuple[str, str]:
        pair = (f"s-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}")
        for name in pair:
            await place_on(store, session_spec(name, TOKEN, seed=seed), pod, others)
            names.append(name)
        return pair

    yield place
    for name in names:
        await store.release(POOL, name, reason="test done")


async def test_an_evicted_session_waits_in_host_memory_and_resumes_on_its_pod_bit_identically(
    pod_a, store, sessions
):
    session, twin = await sessions("host-a", seed=3)
    expected = [frames_of(pod_a.tick(twin, i, token=TOKEN)) for i in range(5)]
    for i in range(3):
        np.testing.assert_array_equal(frames_of(pod_a.tick(session, i, token=TOKEN)), expected[i])
    used = (await store.get_pod(POOL, "host-a")).used
    assert (await store.get_pod(POOL, "host-a")).exports  # a host tier alone is a tier

    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert (record.tier, record.suspended_chunk, record.pod) == ("host", 3, "")
    assert host_holder(record.location) == "host-a"
    assert record.bytes > 0
    assert (await store.get_pod(POOL, "host-a")).used == used - 1  # no slot while it waits in memory
    error_of(pod_a.tick(session, 3, token=TOKEN), 503, "resuming")

    await place_on(store, record.spec(), "host-a")
    for i in (3, 4):
        response = pod_a.tick(session, i, token=TOKEN)
        np.testing.assert_array_equal(frames_of(response), expected[i])
        assert chunk_index_of(response) == i
    note = json.loads((await store.get_session(POOL, session)).resumed_note)
    assert (note["source"], note["from"], note["to"], note["direct_failed"]) == (
        "host",
        "host-a",
        "host-a",
        False,
    )
    assert metric(pod_a, 'ardiff_session_resumes_total{source="host"}') >= 1
    # Resumed: the copy is gone (a pull for it finds nothing).
    error_of(pull(pod_a, session, TRANSFER_TOKEN), 404, "unknown_session")


async def test_another_pod_pulls_a_host_tier_export_once(pod_a, pod_b, store, sessions):
    session, twin = await sessions("host-a", seed=8)
    expected = [frames_of(pod_a.tick(twin, i, token=TOKEN)) for i in range(4)]
    for i in range(2):
        frames_of(pod_a.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert record.tier == "host"
    error_of(pull(pod_a, session, "not-the-token"), 401, "unauthorized")  # harms nothing
    copy = pull(pod_a, session, TRANSFER_TOKEN)  # a pull does not consume it; its length is declared
    assert copy.headers["content-length"] == str(len(copy.content)) == str(record.bytes)

    await place_on(store, record.spec(), "host-b")
    for i in (2, 3):
        np.testing.assert_array_equal(frames_of(pod_b.tick(session, i, token=TOKEN)), expected[i])
    note = json.loads((await store.get_session(POOL, session)).resumed_note)
    assert (note["source"], note["from"], note["to"], note["bytes"]) == (
        "direct",
        "host-a",
        "host-b",
        record.bytes,
    )
    error_of(pull(pod_a, session, TRANSFER_TOKEN), 404, "unknown_session")  # sent once, then forgotten


async def test_a_refusal_on_the_pulling_pod_loses_no_copy(launch_worker, redis_url, pod_a, store, sessions):
    """The session is placed on a pod that cannot import its export (another frame size: another identity).
    That pod gives it back (suspended again, at the same copy; 503 `resuming`) and the holder keeps its copy,
    so the session resumes on a pod that can, bit-identically. Before: the pull took the holder's only copy,
    the refusal counted as a failed transfer, and the session needed a reset."""
    pod_g = launch_fake_pod(launch_worker, redis_url, POOL, "host-g", host_tier_bytes=BUDGET, height=32)
    pods = (*PODS, "host-g")
    try:
        session, twin = await sessions("host-a", seed=6, others=pods)
        expected = [frames_of(pod_a.tick(twin, i, token=TOKEN)) for i in range(4)]
        for i in range(2):
            frames_of(pod_a.tick(session, i, token=TOKEN))
        record = await suspend_and_wait(store, POOL, session, reason="evicted")
        assert host_holder(record.location) == "host-a"

        await place_on(store, record.spec(), "host-g", pods)
        error = error_of(pod_g.tick(session, 2, token=TOKEN), 503, "resuming")
        assert "cannot import" in error["message"]
        back = await store.get_session(POOL, session)
        assert (back.state, back.location, back.tier, back.reset_required) == (
            SessionState.SUSPENDED,
            record.location,
            "host",
            False,
        )
        assert (await store.get_pod(POOL, "host-g")).used == 0  # its slot given back too

        await place_on(store, back.spec(), "host-a", pods)
        for i in (2, 3):
            np.testing.assert_array_equal(frames_of(pod_a.tick(session, i, token=TOKEN)), expected[i])
    finally:
        pod_g.stop()
        await store.remove_pod(POOL, "host-g")


async def test_the_holder_keeps_its_copy_until_the_puller_resumed(pod_a, pod_b, store, sessions):
    """A pull that never reaches an import (the puller went away mid-body) leaves the copy where it was: the
    next pull gets it again. Once a pod reported it resumed, the copy is gone."""
    session, twin = await sessions("host-a", seed=9)
    expected = [frames_of(pod_a.tick(twin, i, token=TOKEN)) for i in range(3)]
    for i in range(2):
        frames_of(pod_a.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert pull(pod_a, session, TRANSFER_TOKEN).status_code == 200  # pulled, imported by nobody
    assert pull(pod_a, session, TRANSFER_TOKEN).status_code == 200  # still there
    await place_on(store, record.spec(), "host-b")
    np.testing.assert_array_equal(frames_of(pod_b.tick(session, 2, token=TOKEN)), expected[2])
    error_of(pull(pod_a, session, TRANSFER_TOKEN), 404, "unknown_session")  # resumed elsewhere: dropped


async def test_an_export_that_does_not_fit_the_budget_goes_to_the_shared_tier(pod_b, store, sessions, tier):
    session, twin = await sessions("host-b", seed=5)
    expected = [frames_of(pod_b.tick(twin, i, token=TOKEN)) for i in range(3)]
    for i in range(2):
        frames_of(pod_b.tick(session, i, token=TOKEN))
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert record.tier == "shared"
    assert (tier / record.location).stat().st_size == record.bytes
    await place_on(store, record.spec(), "host-b")
    np.testing.assert_array_equal(frames_of(pod_b.tick(session, 2, token=TOKEN)), expected[2])


async def test_a_draining_pod_moves_its_host_tier_to_the_shared_tier(
    launch_worker, redis_url, pod_a, pod_b, store, sessions, tier
):
    pod_c = launch_fake_pod(
        launch_worker, redis_url, POOL, "host-c", host_tier_bytes=BUDGET, suspend_dir=str(tier)
    )
    pods = (*PODS, "host-c")
    try:
        session, twin = await sessions("host-c", seed=11, others=pods)
        expected = [frames_of(pod_c.tick(twin, i, token=TOKEN)) for i in range(4)]
        for i in range(3):
            frames_of(pod_c.tick(session, i, token=TOKEN))
        record = await suspend_and_wait(store, POOL, session, reason="evicted")
        assert (record.tier, host_holder(record.location)) == ("host", "host-c")
        await store.release(POOL, twin, reason="done")  # the pod empties, as one the operator scales down

        pod_c.signal(signal.SIGTERM)
        assert pod_c.process.wait(timeout=60) == 0
        moved = await store.get_session(POOL, session)
        assert (moved.state, moved.tier, moved.suspended_chunk) == (SessionState.SUSPENDED, "shared", 3)
        assert (tier / moved.location).stat().st_size == record.bytes
        assert "from the host tier to" in pod_c.log()

        await place_on(store, moved.spec(), "host-b")
        response = pod_b.tick(session, 3, token=TOKEN)
        np.testing.assert_array_equal(frames_of(response), expected[3])
        assert not (tier / moved.location).exists()  # resumed: the shared copy is removed too
    finally:
        pod_c.stop()
        await store.remove_pod(POOL, "host-c")


async def test_a_draining_pod_without_a_shared_tier_waits_for_its_migrations_to_be_pulled(
    launch_worker, redis_url, pod_a, pod_b, store, sessions
):
    """No shared volume: a migration (roll, scale-down) leaves the export in the going pod's memory, and the
    pod, SIGTERMed, stays until the pod the session was placed on has pulled it, then exits 0."""
    pod_e = launch_fake_pod(launch_worker, redis_url, POOL, "host-e", host_tier_bytes=BUDGET)
    pods = (*PODS, "host-e")
    try:
        session, twin = await sessions("host-e", seed=13, others=pods)
        expected = [frames_of(pod_e.tick(twin, i, token=TOKEN)) for i in range(3)]
        for i in range(2):
            frames_of(pod_e.tick(session, i, token=TOKEN))
        await store.release(POOL, twin, reason="done")
        record = await suspend_and_wait(store, POOL, session, reason="migrate")
        assert (record.tier, host_holder(record.location)) == ("host", "host-e")
        assert record.resume_requested_ms > 0  # a migration is placed again at once

        pod_e.signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert pod_e.process.poll() is None  # waiting for the pull
        await store.set_draining(POOL, "host-a", draining=True)
        try:
            assert (await store.place(POOL, record.spec())).placement.pod == "host-b"
        finally:
            await store.set_draining(POOL, "host-a", draining=False)
        response = pod_b.tick(session, 2, token=TOKEN)
        np.testing.assert_array_equal(frames_of(response), expected[2])
        assert pod_e.process.wait(timeout=30) == 0
        note = json.loads((await store.get_session(POOL, session)).resumed_note)
        assert (note["source"], note["from"]) == ("direct", "host-e")
    finally:
        pod_e.stop()
        await store.remove_pod(POOL, "host-e")


async def test_a_host_tier_export_whose_pod_died_needs_a_reset(
    launch_worker, redis_url, pod_a, store, sessions
):
    pod_d = launch_fake_pod(launch_worker, redis_url, POOL, "host-d", host_tier_bytes=BUDGET)
    pods = (*PODS, "host-d")
    try:
        session, _ = await sessions("host-d", seed=2, others=pods)
        for i in range(2):
            frames_of(pod_d.tick(session, i, token=TOKEN))
        record = await suspend_and_wait(store, POOL, session, reason="evicted")
        assert host_holder(record.location) == "host-d"
        pod_d.process.send_signal(signal.SIGKILL)
        pod_d.process.wait()
        await store.remove_pod(POOL, "host-d")  # the operator saw the Pod go

        await place_on(store, record.spec(), "host-a")
        error = error_of(pod_a.tick(session, 2, token=TOKEN), 409, "reset_required")
        assert "could not be resumed (export_corrupt)" in error["message"]
        assert chunk_index_of(pod_a.tick(session, 0, token=TOKEN, reset=True)) == 0
    finally:
        pod_d.stop()


async def test_the_sweep_drops_copies_of_deleted_sessions_but_not_of_unknown_ones(
    launch_worker, redis_url, store, sessions
):
    """A session deleted while its export waits in a pod's memory has nobody to resume it: the pod's tier
    sweep drops the copy once the store says `closed`; a session without a record keeps its copy (Redis may
    have lost its data, and the operator rebuilds suspended records from their statuses)."""
    pod_f = launch_fake_pod(
        launch_worker, redis_url, POOL, "host-f", host_tier_bytes=BUDGET, tier_sweep_seconds=0.2
    )
    pods = (*PODS, "host-f")
    try:
        deleted, unknown = await sessions("host-f", seed=4, others=pods)
        for name in (deleted, unknown):
            frames_of(pod_f.tick(name, 0, token=TOKEN))
            await suspend_and_wait(store, POOL, name, reason="evicted")
        await store.release(POOL, deleted, reason="deleted")
        await store.client.delete(PoolKeys(POOL).session(unknown))  # as when Redis loses its data

        async def swept() -> bool:
            return "removed 1 host-tier exports nothing points at" in pod_f.log()

        await wait_for(swept)
        error_of(pull(pod_f, deleted, TRANSFER_TOKEN), 404, "unknown_session")
        assert pull(pod_f, unknown, TRANSFER_TOKEN).status_code == 200  # still there (sent, once)
    finally:
        pod_f.stop()
        await store.remove_pod(POOL, "host-f")


# ---- the tier itself --------------------------------------------------------------------------------------


def test_the_budget_counts_every_copy_and_a_copy_stays_until_removed() -> None:
    tier = HostTier(10, "p")
    first, size = tier.write("s1", lambda out: out.write(b"abcdef") or 6)
    assert (host_holder(first), size, tier.used_bytes) == ("p", 6, 6)
    with pytest.raises(HostTierFull):
        tier.write("s2", lambda out: out.write(b"12345") or 5)
    assert tier.used_bytes == 6  # nothing kept of the refused one
    replaced, _ = tier.write("s1", lambda out: out.write(b"0123456789") or 10)  # replaces its own copy
    assert tier.used_bytes == 10
    with pytest.raises(ExportCorrupt):
        tier.get(first)  # the replaced location is gone
    assert tier.get(replaced).reader().read(100) == b"0123456789"
    copy = tier.copy_of("s1")
    assert copy is not None
    assert (copy.size, copy.location, tier.copy_of("s1")) == (10, replaced, copy)  # a read keeps it
    tier.remove(replaced)
    assert (tier.copy_of("s1"), tier.used_bytes) == (None, 0)
    assert host_holder("ns/pool/s1/suspend-1.ardsess") is None
