"""The pod runner's simulated mode (`PodRunner(simulated=True)`, devcluster/simulated_pods.py) under the real
operator: worker Pods without processes register through the worker's link, go Ready, and take sessions."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pod_runner import HOSTNAME_LABEL, PodRunner
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import SIMULATED_NODE, Cluster

pytestmark = pytest.mark.slow

CAPACITY = 3


async def test_sessions_go_ready_on_simulated_pods(
    cluster: Cluster, simulated_runner: PodRunner, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    cluster.create_pool(
        replicas={"min": 2, "max": 2},
        nodeSelector={HOSTNAME_LABEL: SIMULATED_NODE},
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
    # No process behind any of them; the session-wide runner did not take them.
    simulated = {info.name: info for info in simulated_runner.pods()}
    assert set(simulated) == pods
    assert all(info.pid is None and info.ready for info in simulated.values())
    assert not [p for p in cluster.runner.pods() if p.namespace == cluster.namespace]
    pool = wait_until(
        lambda: (s := cluster.pool_status()).get("sessions") == 5 and s, what="the pool's status"
    )
    assert pool["readyReplicas"] == 2
    assert pool["capacity"] == 2 * CAPACITY

    # Deleted: the Pod's simulated worker marks itself draining and the runner finalizes the Pod.
    gone = next(iter(pods))
    cluster.delete("pods", gone, core=True)
    cluster.wait_gone("pods", gone, core=True, timeout=10)
    assert gone not in {info.name for info in simulated_runner.pods()}


async def test_a_suspension_the_worker_never_reports_is_evicted_after_the_timeout(
    cluster: Cluster, simulated_runner: PodRunner, store: PlacementStore, redis_url: str, tmp_path: Path
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
            nodeSelector={HOSTNAME_LABEL: SIMULATED_NODE},
            env=[
                {"name": "ARDIFF_RUNTIME", "value": "fake"},
                {"name": "ARDIFF_FAKE_CAPACITY", "value": "1"},
                {"name": "ARDIFF_SUSPEND_DIR", "value": str(tmp_path / "tier")},
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
