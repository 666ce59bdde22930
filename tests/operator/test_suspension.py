"""Issue 12 through the real operator and fake-runtime workers that export into a shared tier (a
ReadWriteMany PersistentVolumeClaim every worker Pod of the pool mounts: `Cluster.shared_tier`) or their host
memory: eviction at max suspends the victim (it keeps its slot
until exported), its status shows where the export lies, and a demand (what a tick does) brings it back
without a reset; a roll and a due scale-down move live sessions pod to pod instead of waiting for them to
end."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionRecord, SessionState
from tests.operator.conftest import FAKE_WORKER_ENV, Cluster, SharedTier

pytestmark = pytest.mark.slow


@pytest.fixture
def tier(cluster: Cluster) -> SharedTier:
    """The shared tier: a claim in the test's namespace (deleted with it), bound before the pool mounts it."""
    return cluster.shared_tier()


def suspend_for_capacity(
    cluster: Cluster, env: list[dict[str, str]], session: str, **pool_spec: Any
) -> dict[str, Any]:
    """One pod at max with two slots: `session` (ticked once, so it has state to export) and a `pinned` one
    (Never evicted); after a second of idleness `vip` (priority 5) makes `session` suspend. Its status.
    `pool_spec`: more of the pool's spec (a shared tier's volume)."""
    cluster.create_pool(replicas={"min": 1, "max": 1}, eviction={"minIdleSeconds": 1}, env=env, **pool_spec)
    cluster.create_session(session)
    cluster.wait_phase(session, "Ready")
    assert cluster.tick(session, 0).status_code == 200  # a session that never ticked has nothing to export
    cluster.create_session("pinned", evictionPolicy="Never")
    cluster.wait_phase("pinned", "Ready")
    time.sleep(1.5)
    cluster.create_session("vip", priority=5)
    return cluster.wait_phase(session, "Suspended", reason="SuspendedForCapacity")


async def test_eviction_at_max_suspends_and_a_demand_resumes_without_reset(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore, tier: SharedTier
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    suspended = suspend_for_capacity(cluster, [*FAKE_WORKER_ENV, tier.env], "old", **tier.pool_spec)
    assert all(p.exports for p in await store.list_pods(pool))
    assert (suspended["tier"], suspended["resetRequired"]) == ("shared", False)
    assert suspended["bytes"] > 0
    assert suspended["message"] == "suspended to make room for session vip"
    assert suspended.get("pod") is None
    cluster.wait_phase("vip", "Ready")
    event = wait_until(lambda: cluster.events("Suspended"), what="a Suspended event")[0]
    assert (event["involvedObject"]["name"], event["type"]) == ("old", "Normal")
    assert "bytes" in event["message"]
    assert await store.check_invariants(pool) == []

    # A tick for it is a demand (the worker calls request_resume); with no idle victim (vip is not idle for
    # long, pinned is Never) it waits; once vip goes it resumes from its export, without a reset.
    assert await store.request_resume(pool, "old") is SessionState.SUSPENDED
    cluster.wait_phase("old", "Suspended", reason="ResumeRequested")
    cluster.delete("ardiffusionsessions", "vip")
    back = cluster.wait_phase("old", "Ready", resetRequired=False)
    assert back.get("tier") is None
    record = await store.get_session(pool, "old")
    assert record is not None
    assert (record.resume_from, record.chunk_index) == (suspended_location := record.location, 1)
    assert suspended_location
    wait_until(lambda: cluster.events("Resumed"), what="a Resumed event")
    # Its next tick (chunk 1) imports the export and continues: no reset.
    assert cluster.tick("old", 1).status_code == 200
    record = await store.get_session(pool, "old")
    assert record is not None
    assert (record.resume_from, record.chunk_index) == ("", 2)
    assert await store.check_invariants(pool) == []


async def test_a_same_identity_roll_migrates_a_live_session_instead_of_waiting(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore, tier: SharedTier
) -> None:
    """The spec changes something that keeps the sessions' identity (the KV budget): the old pod's session
    moves to the new pod at a tick boundary (no reset), pulled pod to pod with the pool's transfer token (an
    Event says how many bytes in how long), and the old pod goes while the session lives on."""
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(replicas={"min": 1, "max": 2}, env=[*FAKE_WORKER_ENV, tier.env], **tier.pool_spec)
    cluster.create_session("live")
    before = cluster.wait_phase("live", "Ready")
    assert cluster.tick("live", 0).status_code == 200
    old_pod = before["pod"]

    cluster.patch_pool_spec({"kv": {"gpuMemoryFraction": 0.5}})
    moved = cluster.wait_phase("live", "Ready", timeout=60, resetRequired=False)
    wait_until(lambda: cluster.status("live").get("pod") not in (None, old_pod), timeout=60, what="a new pod")
    wait_until(lambda: old_pod not in cluster.pod_names(), timeout=60, what=f"{old_pod} deleted")
    assert moved["phase"] == "Ready"
    [event] = wait_until(lambda: cluster.events("Transferred"), what="a Transferred event")
    new_pod = cluster.status("live")["pod"]
    assert (event["involvedObject"]["name"], event["type"]) == ("live", "Normal")
    pattern = rf"\d+ bytes pulled from pod {old_pod} by pod {new_pod} in \d+\.\d{{3}} s \(\d+ MB/s\)"
    assert re.fullmatch(pattern, event["message"]), event["message"]
    record = await store.get_session(pool, "live")
    assert record is not None
    assert record.resumed_note == ""  # reported once: the operator acked the worker's note
    answer = cluster.tick("live", 1)
    assert answer.status_code == 200, answer.text  # continues where it was: chunk 1, no reset
    record = await store.get_session(pool, "live")
    assert record is not None
    assert (record.state, record.resume_from, record.chunk_index) == (SessionState.PLACED, "", 2)
    assert await store.check_invariants(pool) == []


async def test_a_due_scale_down_moves_the_emptier_pods_sessions_instead_of_waiting(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore, tier: SharedTier
) -> None:
    """Two pods of two slots hold three sessions; one ends, leaving one on each: after the scale-down delay
    the operator drains one pod, its session moves to the other at a tick boundary (pulled pod to pod, no
    reset), and the emptied pod goes."""
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(
        replicas={"min": 1, "max": 2},
        scaleDownDelaySeconds=1,
        env=[*FAKE_WORKER_ENV, tier.env],
        **tier.pool_spec,
    )
    for name in ("s1", "s2", "s3"):
        cluster.create_session(name)
    statuses = {name: cluster.wait_phase(name, "Ready", timeout=60) for name in ("s1", "s2", "s3")}
    for name in statuses:
        assert cluster.tick(name, 0).status_code == 200
    by_pod: dict[str, list[str]] = {}
    for name, status in statuses.items():
        by_pod.setdefault(status["pod"], []).append(name)
    assert sorted(len(names) for names in by_pod.values()) == [1, 2]
    full = next(pod for pod, names in by_pod.items() if len(names) == 2)
    cluster.delete("ardiffusionsessions", by_pod[full][0])  # one pod of each: one can go

    def consolidated() -> bool:
        live = {name: cluster.status(name) for name in statuses if name != by_pod[full][0]}
        return len(cluster.pod_names()) == 1 and all(
            s.get("phase") == "Ready" and s.get("pod") in cluster.pod_names() for s in live.values()
        )

    wait_until(consolidated, timeout=90, what="the pool consolidated on one pod")
    [event] = wait_until(lambda: cluster.events("Transferred"), what="a Transferred event")
    moved = event["involvedObject"]["name"]
    assert "bytes pulled from pod" in event["message"]
    answer = cluster.tick(moved, 1)
    assert answer.status_code == 200, answer.text  # continues at chunk 1: no reset
    assert cluster.status(moved).get("resetRequired") is not True
    assert await store.check_invariants(pool) == []


async def test_an_eviction_into_the_host_tier_resumes_without_reset(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    """A pool whose workers keep evicted sessions in their own memory (no shared volume): the status says
    `tier: host`, and a demand brings the session back on that pod from memory."""
    pool = PoolId(cluster.namespace, "pool")
    env = [*FAKE_WORKER_ENV, {"name": "ARDIFF_HOST_TIER_BYTES", "value": str(64 << 20)}]
    suspended = suspend_for_capacity(cluster, env, "old")
    assert (suspended["tier"], suspended["resetRequired"], suspended["suspendedChunk"]) == ("host", False, 1)
    assert suspended["exportLocation"].startswith("host:")
    cluster.wait_phase("vip", "Ready")
    cluster.delete("ardiffusionsessions", "vip")
    assert await store.request_resume(pool, "old") is SessionState.SUSPENDED  # what its next tick does
    cluster.wait_phase("old", "Ready", resetRequired=False)
    answer = cluster.tick("old", 1)
    assert answer.status_code == 200, answer.text  # continues at chunk 1 from the host tier
    [event] = wait_until(lambda: cluster.events("Transferred"), what="a Transferred event")
    assert "read from its own host memory" in event["message"]
    assert await store.check_invariants(pool) == []


async def test_a_suspended_session_whose_record_redis_lost_resumes_from_its_export(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore, tier: SharedTier
) -> None:
    """The status says where the export lies (`exportLocation`): with the record gone (as when Redis loses its
    data), the operator rebuilds it as suspended, and a demand resumes it from the export without a reset."""
    pool = PoolId(cluster.namespace, "pool")
    suspended = suspend_for_capacity(cluster, [*FAKE_WORKER_ENV, tier.env], "old", **tier.pool_spec)
    before = await store.get_session(pool, "old")
    assert before is not None
    assert suspended["exportLocation"] == before.location != ""
    # Relative to the tier: the file is in the claim's volume.
    assert await asyncio.to_thread((tier.host_path / before.location).is_file)

    await store.client.delete(PoolKeys(pool).session("old"))

    async def restored() -> SessionRecord | None:
        record = await store.get_session(pool, "old")
        return record if record is not None and record.state is SessionState.SUSPENDED else None

    for _ in range(100):
        if (record := await restored()) is not None:
            break
        await asyncio.sleep(0.1)
    assert record is not None, "the operator did not restore the suspended record"
    assert (record.location, record.suspended_chunk, record.chunk_index, record.pod) == (
        before.location,
        before.suspended_chunk,
        1,
        "",
    )
    assert cluster.status("old")["phase"] == "Suspended"

    cluster.delete("ardiffusionsessions", "vip")
    assert await store.request_resume(pool, "old") is SessionState.SUSPENDED  # what its next tick does
    cluster.wait_phase("old", "Ready", resetRequired=False)
    assert cluster.tick("old", 1).status_code == 200  # continues at chunk 1 from the export
    assert await store.check_invariants(pool) == []


async def test_a_suspended_session_deleted_leaves_no_files_in_the_tier(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore, tier: SharedTier
) -> None:
    """A suspended session has no pod to remove its export when it is deleted: the workers' tier sweep does,
    for sessions the store has closed, never for one it has no record of (Redis may have lost it)."""
    pool = PoolId(cluster.namespace, "pool")
    env = [*FAKE_WORKER_ENV, tier.env, {"name": "ARDIFF_TIER_SWEEP_SECONDS", "value": "0.5"}]
    suspend_for_capacity(cluster, env, "gone", **tier.pool_spec)
    pool_dir = tier.host_path / cluster.namespace / "pool"  # the claim's volume on this machine
    stranger = pool_dir / "stranger"
    await asyncio.to_thread(stranger.mkdir, parents=True)
    await asyncio.to_thread((stranger / "suspend-1-abc.ardsess").write_bytes, b"no record")
    assert await asyncio.to_thread(lambda: sorted(p.name for p in pool_dir.iterdir())) == ["gone", "stranger"]

    cluster.delete("ardiffusionsessions", "gone")
    for _ in range(100):
        names = await asyncio.to_thread(lambda: sorted(p.name for p in pool_dir.iterdir()))
        if "gone" not in names:
            break
        await asyncio.sleep(0.1)
    assert names == ["stranger"]
    assert (await store.get_session(pool, "gone")).state is SessionState.CLOSED  # type: ignore[union-attr]
