"""The operator under a placement store whose writes no replica acknowledges (`wait_replicas`, kv's
`NotReplicated`: applied on the master, possibly lost by a failover): it retries, reports nothing from such a
write, and goes on once a replica acknowledges. Real redis-server processes, the real operator, worker Pods on
the session's simulated node (they register through the worker's link, no process)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import SIMULATED_PLACEMENT, Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def master(cluster: Cluster) -> Iterator[RedisServer]:
    """The master; the worker Pods (their kubelet's namespace) reach it too."""
    with cluster.redis_server() as server:
        yield server


@pytest.fixture
async def store(master: RedisServer) -> AsyncIterator[PlacementStore]:
    async with PlacementStore.from_url(master.url) as placement_store:
        yield placement_store


@pytest.fixture
def waiting_operator(cluster: Cluster, master: RedisServer, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator, its every placement write waiting for one replica (100 ms); workers register without
    waiting (their own URL: the master as Pods reach it). On teardown the test's objects are deleted through
    it."""
    process = cluster.operator(
        f"{master.url}?wait_replicas=1&wait_timeout_ms=100",
        tmp_path / "operator.log",
        env={"ARDIFF_WORKER_REDIS_URL": cluster.kube.redis_url_for_pods(master.url)},
    ).start()
    process.wait_ready()
    yield process
    try:
        cluster.delete_all()
    finally:
        process.stop()
        print(f"\n----- operator log -----\n{process.log()[-20000:]}")


def replica_online(master: RedisServer) -> bool:
    info = master.info("replication")
    return info.get("connected_slaves") == "1" and "state=online" in info.get("slave0", "")


async def test_unreplicated_writes_are_retried_until_a_replica_acknowledges(
    cluster: Cluster,
    master: RedisServer,
    waiting_operator: OperatorProcess,
    store: PlacementStore,
) -> None:
    cluster.create_pool(**SIMULATED_PLACEMENT, replicas={"min": 1, "max": 1})
    cluster.create_session("s1")
    # No replica: every write of a round and the admission's `place` raise NotReplicated. Both are retried.
    wait_until(
        lambda: "the round is repeated" in (log := waiting_operator.log()) and "admission retried" in log,
        what="a repeated round and a retried admission in the operator's log",
    )
    assert waiting_operator.running
    # Nothing is reported from an unreplicated write: the session is not Ready (nor Failed).
    assert cluster.status("s1").get("phase") in (None, "Pending")

    with RedisServer(replica_of=master.port) as replica:
        wait_until(lambda: replica_online(master), what="the replica in sync")
        status = cluster.wait_phase("s1", "Ready", timeout=30)
        # The binding the status reports is the one on the master, and the replica has it too.
        binding = (await store.get_bindings(PoolId(cluster.namespace, "pool"), ["s1"]))["s1"]
        assert binding.state is SessionState.PLACED
        assert (binding.pod, binding.pod_epoch) == (status["pod"], status["podEpoch"])
        key = PoolKeys(PoolId(cluster.namespace, "pool")).session("s1")
        assert replica.cli("HGET", key, "pod").strip() == status["pod"]
        cluster.delete_all()  # while a replica acknowledges: the release is not retried forever

    log = waiting_operator.log()
    assert "reconcile failed" not in log  # NotReplicated is not the catch-all's unexpected error
    assert "Handler 'admit_session' failed with an exception" not in log
    assert waiting_operator.running
