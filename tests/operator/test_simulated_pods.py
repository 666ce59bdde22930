"""The session's simulated node (`SIMULATED_NODE`: its kubelet runs no process, see
devcluster/simulated_pods.py) under the real operator: worker Pods scheduled there (`SIMULATED_PLACEMENT`)
register through the worker's link without a process, go Ready, and take sessions."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import pod_pid
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import SIMULATED_NODE, SIMULATED_PLACEMENT, Cluster

pytestmark = pytest.mark.slow

CAPACITY = 3


def container_ids(cluster: Cluster) -> dict[str, str]:
    """{pod: its container's ID} for the pool's Pods, as their kubelet reports it."""
    ids = {}
    for pod in cluster.pods():
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        ids[pod["metadata"]["name"]] = statuses[0].get("containerID", "")
    return ids


async def test_sessions_go_ready_on_simulated_pods(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    cluster.create_pool(
        replicas={"min": 2, "max": 2},
        **SIMULATED_PLACEMENT,
        env=[
            {"name": "ARDIFF_RUNTIME", "value": "fake"},
            {"name": "ARDIFF_FAKE_CAPACITY", "value": str(CAPACITY)},
        ],
    )
    pods = cluster.wait_pods(2)
    names = [f"s{i}" for i in range(5)]
    for name in names:
        cluster.create_session(name)
    statuses = {name: cluster.wait_phase(name, "Ready") for name in names}

    # Placed by the operator onto the two simulated pods, within their capacity.
    per_pod = Counter(status["pod"] for status in statuses.values())
    assert set(per_pod) <= pods
    assert sum(per_pod.values()) == 5
    assert max(per_pod.values()) <= CAPACITY
    # Registered through the worker's link: the fake runtime's capacity, the Pod's name, its epoch.
    records = {r.name: r for r in await store.list_pods(PoolId(cluster.namespace, "pool"))}
    assert set(records) == pods
    assert {r.capacity for r in records.values()} == {CAPACITY}
    assert {name: r.used for name, r in records.items() if r.used} == dict(per_pod)
    for status in statuses.values():
        assert status["podEpoch"] == records[status["pod"]].epoch
    # No process behind any of them: the simulated node's kubelet reports each container as a simulated
    # one (its ID names the pod and its epoch), not a process; no process node took any.
    found = {p["metadata"]["name"]: p for p in cluster.pods()}
    assert set(found) == pods
    assert {name: p["spec"]["nodeName"] for name, p in found.items()} == dict.fromkeys(pods, SIMULATED_NODE)
    assert container_ids(cluster) == {name: f"simulated://{name}/{records[name].epoch}" for name in pods}
    assert all(pod_pid(p) is None for p in found.values())
    pool = wait_until(
        lambda: (s := cluster.pool_status()).get("sessions") == 5 and s, what="the pool's status"
    )
    assert pool["readyReplicas"] == 2
    assert pool["capacity"] == 2 * CAPACITY

    # Deleted: the Pod's simulated worker marks itself draining and its kubelet finalizes the Pod (the final
    # delete with grace 0); the operator forgets its record.
    gone = next(iter(pods))
    cluster.delete("pods", gone, core=True)
    cluster.wait_gone("pods", gone, core=True, timeout=10)
    pool_id = PoolId(cluster.namespace, "pool")
    for _ in range(100):
        if gone not in {r.name for r in await store.list_pods(pool_id)}:
            break
        await asyncio.sleep(0.1)
    assert gone not in {r.name for r in await store.list_pods(pool_id)}


async def test_a_suspension_the_worker_never_reports_is_evicted_after_the_timeout(
    cluster: Cluster, store: PlacementStore, redis_url: str, tmp_path: Path
) -> None:
    """A simulated pod registers exports=1 (a shared tier in its env) but never consumes its events: the
    session suspended to make room stays `Suspending`, blocking every eviction of the pool, until the
    operator's timeout evicts it (reset required) and the newcomer takes the slot."""
    pool = PoolId(cluster.namespace, "pool")
    operator = cluster.operator(
        redis_url, tmp_path / "operator.log", env={"ARDIFF_OPERATOR_SUSPEND_TIMEOUT_SECONDS": "3"}
    ).start()
    try:
        operator.wait_ready()
        cluster.create_pool(
            replicas={"min": 1, "max": 1},
            eviction={"minIdleSeconds": 1},
            **SIMULATED_PLACEMENT,
            # A tier in its env, never written: a simulated pod has no process (nor volumes) to export with.
            env=[
                {"name": "ARDIFF_RUNTIME", "value": "fake"},
                {"name": "ARDIFF_FAKE_CAPACITY", "value": "1"},
                {"name": "ARDIFF_SUSPEND_DIR", "value": "/var/lib/ardiff/tier"},
            ],
        )
        cluster.create_session("old")
        cluster.wait_phase("old", "Ready")
        assert [p.exports for p in await store.list_pods(pool)] == [True]

        cluster.create_session("vip", priority=5)
        cluster.wait_phase("old", "Suspending", timeout=20)
        assert cluster.status("vip").get("phase") == "Pending"
        evicted = cluster.wait_phase("old", "Evicted", timeout=20, resetRequired=True)
        assert "did not report the export within 3 s" in evicted["message"]
        cluster.wait_phase("vip", "Ready")
        record = await store.get_session(pool, "old")
        assert record is not None
        assert (record.state, record.reset_required) == (SessionState.EVICTED, True)
        assert await store.check_invariants(pool) == []
        cluster.delete_all()
    finally:
        operator.stop()
        sys.stdout.write(f"\n----- operator log -----\n{operator.log()[-20000:]}\n")
