"""Issue 25 under the real operator: a pod at its compute bound keeps the next session `Pending` with the
compute reason, and the operator adds a pod, which then takes it. Simulated worker pods (no process) report
the compute the worker's tick estimate would for the fake runtime (devcluster/simulated_pods.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import OPERATOR_COMMAND
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.worker.net import free_port
from tests.operator.conftest import SIMULATED_PLACEMENT, Cluster
from tests.operator.test_autoscaling import value, wait_metrics

pytestmark = pytest.mark.timeout(120)

# 12 frames per 0.25 s forward = 48 frames/s; x 0.9 = 43.2 frames/s: two sessions at 16 fps (32), not three
# (48), although the pod has four KV slots.
TICK_SECONDS = "0.25"
UTILISATION = 0.9
COMPUTE_FPS = 43.2


async def test_a_pod_at_its_compute_bound_keeps_the_next_session_waiting_and_the_pool_grows(
    cluster: Cluster, redis_url: str, store: PlacementStore, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    operator = cluster.operator(
        redis_url, tmp_path / "operator.log", command=(*OPERATOR_COMMAND, "--metrics", url)
    )
    operator.start()
    ns = cluster.namespace
    try:
        operator.wait_ready()
        cluster.create_pool(
            replicas={"min": 1, "max": 1},
            **SIMULATED_PLACEMENT,
            env=[
                {"name": "ARDIFF_RUNTIME", "value": "fake"},
                {"name": "ARDIFF_FAKE_CAPACITY", "value": "4"},
                {"name": "ARDIFF_FAKE_TICK_SECONDS", "value": TICK_SECONDS},
            ],
            computeUtilisation=UTILISATION,
            eviction={"minIdleSeconds": 3600},  # at max, nobody is evicted for the newcomer
        )
        (first_pod,) = cluster.wait_pods(1)
        for name in ("s1", "s2"):
            cluster.create_session(name)
        ready = {name: cluster.wait_phase(name, "Ready") for name in ("s1", "s2")}
        assert {s["pod"] for s in ready.values()} == {first_pod}
        assert ready["s1"]["playout"] == {"fps": 16, "bufferChunks": 2}  # the pool's default target
        pool = PoolId(ns, "pool")
        (record,) = await store.list_pods(pool)
        assert (record.capacity, record.compute_fps, record.demand_fps) == (4, COMPUTE_FPS, 32.0)
        status = wait_until(
            lambda: (s := cluster.pool_status()).get("computeCapacity") == 2 and s, what="compute capacity"
        )
        assert status["capacity"] == 4

        # Two KV slots free, no compute for a third session at 16 fps: it waits, saying why.
        cluster.create_session("s3")
        waiting = cluster.wait_phase("s3", "Pending", reason="WaitingForCompute")
        assert "spec.computeUtilisation (0.9)" in waiting["message"]
        assert waiting["playout"] == {"fps": 16, "bufferChunks": 2}
        samples = wait_metrics(
            url,
            ns,
            "one session waiting for compute",
            ardiff_pool_compute_waiting_sessions=1,
            ardiff_pool_pending_sessions=1,
        )
        assert value(samples, "ardiff_pool_compute_capacity_sessions") == 2
        assert value(samples, "ardiff_pool_compute_fps") == COMPUTE_FPS
        assert value(samples, "ardiff_pool_demand_fps") == 32.0
        assert value(samples, "ardiff_pool_free_slots") == 2  # KV slots: compute is what is missing

        # Room to grow: the operator adds a pod for it, and the new pod takes it.
        cluster.patch_pool_spec({"replicas": {"min": 1, "max": 2}})
        placed = cluster.wait_phase("s3", "Ready", timeout=30)
        assert placed["pod"] != first_pod
        assert len(cluster.pod_names()) == 2
        demand = {r.name: r.demand_fps for r in await store.list_pods(pool)}
        assert demand == {first_pod: 32.0, placed["pod"]: 16.0}
        assert await store.check_invariants(pool) == []
        wait_metrics(
            url,
            ns,
            "nobody waiting, two pods' compute",
            ardiff_pool_compute_waiting_sessions=0,
            ardiff_pool_compute_capacity_sessions=4,
            ardiff_pool_demand_fps=48.0,
        )
    finally:
        try:
            cluster.delete_all()
        finally:
            operator.stop()
            sys.stdout.write(f"\n----- operator log -----\n{operator.log()[-20000:]}\n")
