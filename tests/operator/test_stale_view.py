"""The operator on a stale view of the cluster (issue 40: Sieve's "stale state", with a real server): the real
operator reaches the API only through a second kube-apiserver whose link to etcd is slow (its watches lag the
cluster) and then cut (it sees nothing new), with its own watch connections reset meanwhile, and across an
etcd crash; and a standby operator on that server while the active one is on the first. Whatever it saw
late, the operator makes no wrong deletion (no Pod, no placement of a session that still exists) and no
double placement (one slot per session, the store's invariants hold), and it converges to what the specs
say once its view catches up."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ardiff.devcluster.faults import FaultInjector, StaleApiServer
from ardiff.devcluster.link_proxy import LinkProxy
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import (
    SIMULATED_ENV,
    SIMULATED_PLACEMENT,
    Cluster,
    Peering,
    peering_state,
    serving,
)

pytestmark = pytest.mark.slow  # a second API server and a scenario on a lagging view (~1.5 min)

POOL = "stale"
# The stale server's link to etcd, each way: its watch cache lags the first server's by at least this.
ETCD_DELAY_MS = 300
# How long the stale server stays cut from etcd while the specs change (longer than a few of the operator's
# reconcile rounds, 0.5 s here, and than its watches' reconnect backoff).
CUT_SECONDS = 8
CONVERGE_SECONDS = 120
PEERING_LIFETIME_SECONDS = 2


@dataclass
class StaleOperator:
    """The operator, its way to the API (a link, whose cut resets its watches) and the stale server."""

    process: OperatorProcess
    link: LinkProxy
    stale: StaleApiServer
    faults: FaultInjector


@pytest.fixture
def stale_operator(cluster: Cluster, redis_url: str, tmp_path: Path) -> Iterator[StaleOperator]:
    assert cluster.kube.control_plane is not None
    control_plane = cluster.kube.control_plane
    faults = FaultInjector(tmp_path / "faults.jsonl")
    with faults.stale_api_server(control_plane, delay_ms=ETCD_DELAY_MS) as stale:
        link = LinkProxy("127.0.0.1", stale.address).start()
        try:
            # 127.0.0.1 is among the serving certificate's addresses: the operator verifies the server.
            admin = dataclasses.replace(cluster.kube.admin, server=f"https://{link.address}")
            kubeconfig = admin.write_kubeconfig(tmp_path / "stale.kubeconfig", cluster.namespace)
            process = cluster.operator(redis_url, tmp_path / "operator.log", kubeconfig=kubeconfig)
            with serving(cluster, process):
                yield StaleOperator(process, link, stale, faults)
        finally:
            link.stop()
    print("faults:", [(f.kind, f.target, round(f.ended - f.started, 1)) for f in faults.faults])


def _placement(cluster: Cluster, name: str) -> tuple[str, int]:
    status = cluster.wait_phase(name, "Ready", timeout=CONVERGE_SECONDS)
    return status["pod"], status["podEpoch"]


def _pod_uids(cluster: Cluster) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods(POOL)}


async def _check_store(store: PlacementStore, cluster: Cluster, sessions: dict[str, tuple[str, int]]) -> None:
    """Each session bound once, where its status says, with its pod's epoch; no other session in the store;
    slots used = sessions; the invariants hold."""
    pool = PoolId(cluster.namespace, POOL)
    records = {r.name: r for r in await store.list_pods(pool)}
    for name, (pod, epoch) in sessions.items():
        record = await store.get_session(pool, name, image=False)
        assert record is not None, name
        assert record.state is SessionState.PLACED, (name, record.state)
        assert (record.pod, record.pod_epoch) == (pod, epoch) == (pod, records[pod].epoch)
    assert sum(r.used for r in records.values()) == len(sessions)
    assert await store.check_invariants(pool) == []


async def _released(store: PlacementStore, cluster: Cluster, name: str) -> None:
    """Until the store holds `name` as closed (or no more)."""
    pool = PoolId(cluster.namespace, POOL)
    deadline = time.monotonic() + CONVERGE_SECONDS
    while (record := await store.get_session(pool, name, image=False)) is not None:
        if record.state is SessionState.CLOSED:
            return
        assert time.monotonic() < deadline, f"{name} still {record.state} in the store"
        await asyncio.sleep(0.2)


async def test_an_operator_on_a_lagging_then_cut_api_server_deletes_nothing_wrongly_and_places_once(
    cluster: Cluster, stale_operator: StaleOperator, store: PlacementStore
) -> None:
    faults = stale_operator.faults
    # Lagging: a session deleted and created again under its name (a new object) while the view is late.
    cluster.create_pool(POOL, replicas={"min": 2, "max": 2}, **SIMULATED_PLACEMENT, env=SIMULATED_ENV)
    for name in ("a", "b"):
        cluster.create_session(name, pool=POOL)
    first_a = _placement(cluster, "a")
    _placement(cluster, "b")
    uid = cluster.session("a")["metadata"]["uid"]
    cluster.delete("ardiffusionsessions", "a")
    cluster.wait_gone("ardiffusionsessions", "a", timeout=CONVERGE_SECONDS)
    cluster.create_session("a", pool=POOL)
    assert cluster.session("a")["metadata"]["uid"] != uid
    placed = {"a": _placement(cluster, "a"), "b": _placement(cluster, "b")}
    cluster.wait_pods(2, POOL, timeout=CONVERGE_SECONDS)
    pods = _pod_uids(cluster)
    await _check_store(store, cluster, placed)
    print("a placed first on", first_a, "then on", placed["a"])

    # Cut from etcd, its watches reset: the operator sees neither a new session nor a deletion.
    with faults.cut_from_etcd(stale_operator.stale):
        faults.cut(stale_operator.link, "the operator's API connections")
        cluster.create_session("c", pool=POOL)
        cluster.delete("ardiffusionsessions", "b")  # no finalizer: gone at once (operator/sweep.py)
        await asyncio.sleep(CUT_SECONDS)
        assert (cluster.status("c") or {}).get("phase") in (None, "Pending")
        assert _pod_uids(cluster) == pods
        await _check_store(store, cluster, placed)  # b's slot kept until seen gone, c not placed
    placed = {"a": placed["a"], "c": _placement(cluster, "c")}
    assert _placement(cluster, "a") == placed["a"]
    assert _pod_uids(cluster) == pods
    await _released(store, cluster, "b")
    await _check_store(store, cluster, placed)

    # etcd crashes and comes back: both API servers reconnect, the operator goes on.
    assert cluster.kube.control_plane is not None
    faults.restart_etcd(cluster.kube.control_plane)
    cluster.create_session("d", pool=POOL)
    placed["d"] = _placement(cluster, "d")
    assert {name: _placement(cluster, name) for name in ("a", "c")} == {k: placed[k] for k in ("a", "c")}
    assert _pod_uids(cluster) == pods
    await _check_store(store, cluster, placed)
    assert [f.kind for f in faults.faults] == ["cut", "partition", "restart"]


async def test_a_standby_cut_off_from_etcd_stays_paused_and_releases_nothing_the_active_placed(
    cluster: Cluster, redis_url: str, store: PlacementStore, tmp_path: Path
) -> None:
    """The active operator on the first API server, a standby on the stale one: cut from etcd, the standby
    stops seeing the active's keepalives. Were it to take over, its index would lack what the active placed
    meanwhile, and its sweep must not take that for a deleted session (operator/sweep.py confirms with a live
    listing; tests/operator/test_session_sweep.py). It stays paused, and nothing is released."""
    assert cluster.kube.control_plane is not None
    peering = Peering(cluster, redis_url, tmp_path, PEERING_LIFETIME_SECONDS)
    faults = FaultInjector(tmp_path / "faults.jsonl")
    with faults.stale_api_server(cluster.kube.control_plane, delay_ms=ETCD_DELAY_MS) as stale:
        kubeconfig = stale.credentials(cluster.kube.admin).write_kubeconfig(
            tmp_path / "stale.kubeconfig", cluster.namespace
        )
        active, standby = peering.operator("active", 10), peering.operator("standby", 0, kubeconfig)
        with serving(cluster, active):
            wait_until(lambda: peering_state(active) == "active", what="the active operator to resume")
            standby.start().wait_ready()
            try:
                cluster.create_pool(
                    POOL, replicas={"min": 2, "max": 2}, **SIMULATED_PLACEMENT, env=SIMULATED_ENV
                )
                cluster.create_session("a", pool=POOL)
                placed = {"a": _placement(cluster, "a")}
                wait_until(lambda: set(peering.peers()) == {10, 0}, what="both peers")
                assert peering_state(standby) == ""  # it starts paused
                with faults.cut_from_etcd(stale):
                    cluster.create_session("x", pool=POOL)
                    placed["x"] = _placement(cluster, "x")  # by the active: the standby never saw x
                    await asyncio.sleep(CUT_SECONDS)
                    # It sees no keepalive expire: kopf decides on peering events, and none come.
                    assert peering_state(standby) == ""
                    await _check_store(store, cluster, placed)
                await asyncio.sleep(2 * PEERING_LIFETIME_SECONDS)  # caught up, the standby pauses again
                assert {name: _placement(cluster, name) for name in placed} == placed
                await _check_store(store, cluster, placed)
            finally:
                standby.stop()
                sys.stdout.write(f"\n----- standby log -----\n{standby.log()[-20000:]}\n")
