"""Deletion needs no running operator (operator/sweep.py): no finalizer of ours on sessions or pools, so
`kubectl delete namespace` of the operator's own namespace completes even when the operator went first; the
Redis state left behind is swept once an operator runs again."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from ardiff.devcluster.waiting import wait_until
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import Cluster

SWEEP_ENV = {"ARDIFF_OPERATOR_SWEEP_SECONDS": "1"}


async def eventually(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30) -> None:
    """Await `check()` until it is true, for up to `seconds`."""
    for _ in range(int(seconds / 0.2)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def test_namespace_deletion_completes_without_the_operator_and_its_redis_state_is_swept(
    cluster: Cluster, redis_url: str, store: PlacementStore, tmp_path: Path
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    operator = cluster.operator(redis_url, tmp_path / "operator.log", env=SWEEP_ENV).start()
    try:
        operator.wait_ready()
        cluster.create_pool()  # one pod, two slots (FAKE_WORKER_ENV)
        for name in ("kept", "dropped"):
            cluster.create_session(name)
            cluster.wait_phase(name, "Ready")
        for plural, name in (("ardiffusionworkerpools", "pool"), ("ardiffusionsessions", "kept")):
            item = cluster.get(plural, name)
            assert item is not None
            assert item["metadata"].get("finalizers", []) == [], (plural, item["metadata"].get("finalizers"))

        # A session deleted while no operator runs goes at once; its slot is freed by the next sweep.
        operator.stop(signal.SIGKILL)
        cluster.delete("ardiffusionsessions", "dropped")
        assert cluster.get("ardiffusionsessions", "dropped") is None
        assert (await store.get_session(pool, "dropped")).state is SessionState.PLACED  # type: ignore[union-attr]
        operator.start().wait_ready()

        async def dropped_released() -> bool:
            record = await store.get_session(pool, "dropped")
            return record is not None and record.state is SessionState.CLOSED

        await eventually(dropped_released, "the sweep to release the deleted session")
        assert (await store.get_session(pool, "kept")).state is SessionState.PLACED  # type: ignore[union-attr]
        assert [p.used for p in await store.list_pods(pool)] == [1]

        # The operator goes first (as a namespace deletion may order it), then the namespace: nothing waits.
        operator.stop(signal.SIGKILL)
        namespace = f"/api/v1/namespaces/{cluster.namespace}"
        cluster.http.delete(namespace).raise_for_status()
        wait_until(
            lambda: cluster.http.get(namespace).status_code == 404,
            timeout=60,
            what="the namespace to be deleted",
        )
        assert await store.list_pods(pool) != []  # what Redis holds outlived it: no operator ran

        # An operator for that namespace (started again, or any operator serving it) forgets the pool.
        operator.start().wait_ready()

        async def pool_forgotten() -> bool:
            return not [key async for key in store.client.scan_iter(match=PoolKeys(pool).pattern)]

        await eventually(pool_forgotten, "the sweep to forget the deleted pool's Redis state")
    finally:
        operator.stop()
        sys.stdout.write(f"\n----- operator log -----\n{operator.log()[-20000:]}\n")
