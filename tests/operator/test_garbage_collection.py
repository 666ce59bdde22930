"""What a pool owns goes with it by the controller-manager's garbage collector alone: deleted while no
operator runs, the pool's worker Pods, headless Service, workers' Redis Secret and busy-Pod budget are
removed through their ownerReferences (the real garbage collector), while its sessions and their token
Secrets, which the pool does not own, stay."""

from __future__ import annotations

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.operator.disruption import busy_pdb_name
from ardiff.operator.pods import pool_service_name, worker_redis_secret_name
from tests.operator.conftest import Cluster

pytestmark = pytest.mark.slow


def test_a_deleted_pools_pods_service_secret_and_budget_are_garbage_collected(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_pool()
    cluster.create_session("kept")
    cluster.wait_phase("kept", "Ready")
    owned = {
        ("services", pool_service_name("pool")),
        ("secrets", worker_redis_secret_name("pool")),
    }
    for plural, name in owned:
        assert cluster.get(plural, name, core=True) is not None, name
    budget = f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets/{busy_pdb_name('pool')}"
    wait_until(lambda: cluster.http.get(budget).status_code == 200, what="the pool's busy-Pod budget")
    assert cluster.pod_names()

    operator_process.stop()  # nothing of ours acts on the deletion: only the garbage collector
    cluster.delete("ardiffusionworkerpools", "pool")
    wait_until(
        lambda: (
            not cluster.pods()
            and all(cluster.get(plural, name, core=True) is None for plural, name in owned)
            and cluster.http.get(budget).status_code == 404
        ),
        timeout=60,
        what="the pool's Pods, Service, Secret and budget collected",
    )
    # Not the pool's: the session and its token Secret (owned by the session) are still there.
    assert cluster.get("ardiffusionsessions", "kept") is not None
    assert cluster.get("secrets", "kept-token", core=True) is not None
