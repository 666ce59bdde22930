"""Operator failover under load (issue 14 item 6): an active and a standby operator in a namespaced
KopfPeering, a peering lifetime of 2 s (kopf's default, 60 s, would keep the standby waiting a minute),
sessions arriving and ticking while the active operator is first frozen (both act for a moment when it wakes)
and then killed with SIGKILL. Nothing is placed twice, the pool never has more pods than `max`, and the
standby places a newly arrived session within a few seconds of the kill."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from ardiff.operator.config import OperatorConfigError, config_from_env
from tests.operator.conftest import Cluster, Peering, peering_state

LIFETIME_SECONDS = 2
MAX_PODS = 2


class Load(threading.Thread):
    """Ticks every Ready session in turn and samples the pool's pods, until stopped."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = Cluster(cluster.kube, cluster.namespace)  # its own HTTP client
        self.stop = threading.Event()
        self.ticks = 0
        self.most_pods = 0
        self.chunks: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            self.most_pods = max(self.most_pods, len(self.cluster.pod_names()))
            for item in self.cluster.items("ardiffusionsessions"):
                name, status = item["metadata"]["name"], item.get("status") or {}
                if status.get("phase") != "Ready" or self.stop.is_set():
                    continue
                chunk = 0 if status.get("resetRequired") else self.chunks.get(name, 0)
                try:
                    response = self.cluster.tick(name, chunk)
                except Exception:  # the session moved between the list and the tick
                    continue
                if response.status_code == 200:
                    self.chunks[name] = chunk + 1
                    self.ticks += 1
            time.sleep(0.05)
        self.cluster.http.close()


def test_standby_takes_over_under_load(cluster: Cluster, redis_url: str, tmp_path: Path) -> None:
    peering = Peering(cluster, redis_url, tmp_path, LIFETIME_SECONDS)
    active, standby = peering.operator("active", 10), peering.operator("standby", 0)
    load = Load(cluster)
    try:
        active.start()
        wait_until(lambda: peering_state(active) == "active", what="the active operator to resume")
        standby.start().wait_ready()
        wait_until(lambda: peering.peers() == {10: LIFETIME_SECONDS, 0: LIFETIME_SECONDS}, what="both peers")
        cluster.create_pool(replicas={"min": 1, "max": MAX_PODS})
        for name in ("a", "b", "c"):
            cluster.create_session(name)
        for name in ("a", "b", "c"):
            cluster.wait_phase(name, "Ready", timeout=40)
        load.start()

        # Frozen, the active misses its keepalives: the standby takes over; woken, the active acts at once
        # (it never paused) until the standby sees its keepalive and pauses: both act for a moment.
        active.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        cluster.create_session("d")
        wait_until(lambda: peering_state(standby) == "active", timeout=20, what="the standby to resume")
        cluster.wait_phase("d", "Ready", timeout=20)
        active.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        cluster.create_session("e")  # the pool is full at max: e evicts the least recently ticked session
        cluster.wait_phase("e", "Ready", timeout=20)
        # Waking, the active may clean its own expired record away, and the standby resume once more until the
        # next keepalive: wait until the standby has paused for good.
        wait_until(lambda: peering_state(standby) == "paused", timeout=20, what="the standby to pause")
        time.sleep(LIFETIME_SECONDS)
        assert peering_state(standby) == "paused"

        killed = time.monotonic()
        active.stop(signal.SIGKILL)
        cluster.create_session("f")
        wait_until(lambda: peering_state(standby) == "active", timeout=20, what="the standby to take over")
        resumed = time.monotonic() - killed
        cluster.wait_phase("f", "Ready", timeout=20)
        placed = time.monotonic() - killed
        ticks_before = load.ticks
        wait_until(lambda: load.ticks > ticks_before + 3, timeout=20, what="ticks after the takeover")
        load.stop.set()
        load.join(timeout=30)
        print(f"takeover after kill -9: standby resumed {resumed:.2f} s, new session Ready {placed:.2f} s")

        assert resumed <= LIFETIME_SECONDS + 3
        assert placed <= LIFETIME_SECONDS + 8
        assert load.most_pods <= MAX_PODS
        assert len(cluster.pod_names()) <= MAX_PODS

        def statuses() -> dict[str, dict[str, Any]]:
            return {
                item["metadata"]["name"]: item.get("status") or {}
                for item in cluster.items("ardiffusionsessions")
            }

        def ready_in(sessions: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
            return {name: status for name, status in sessions.items() if status.get("phase") == "Ready"}

        # f's admission evicts its victim in Redis at once; the victim's status says so in the standby's next
        # round (the admission kicks it), which may come after f's own Ready and the ticks above (CI, loaded).
        sessions = statuses()
        deadline = time.monotonic() + 15
        while len(ready_in(sessions)) != MAX_PODS * 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            sessions = statuses()
        ready = ready_in(sessions)
        phases = {name: (status.get("phase"), status.get("reason")) for name, status in sessions.items()}
        assert "f" in ready, phases  # placed by the standby (evicting the least recently ticked session)
        assert len(ready) == MAX_PODS * 2, phases  # every slot of the full pool holds one Ready session
        per_pod: dict[str, int] = {}
        for status in ready.values():
            per_pod[status["pod"]] = per_pod.get(status["pod"], 0) + 1
        assert max(per_pod.values()) <= 2  # the fake workers' capacity

        async def redis_view() -> tuple[list[str], dict[str, tuple[SessionState, str, int]]]:
            pool = PoolId(cluster.namespace, "pool")
            async with PlacementStore.from_url(redis_url) as store:
                records = await store.get_sessions(pool, sorted(sessions))
                return await store.check_invariants(pool), {
                    name: (r.state, r.pod, r.pod_epoch) for name, r in records.items()
                }

        violations, records = asyncio.run(redis_view())
        assert violations == []
        # One binding per session, the same in the session's status and in Redis: no double placement.
        for name, status in ready.items():
            assert records[name] == (SessionState.PLACED, status["pod"], status["podEpoch"]), name
        assert sorted(n for n, r in records.items() if r[0] is SessionState.PLACED) == sorted(ready)
    finally:
        load.stop.set()
        try:
            if not standby.running:
                standby.start()
            cluster.delete_all()
        finally:
            standby.stop()
            active.stop(signal.SIGKILL)


def test_peering_lifetime_setting() -> None:
    env = {"ARDIFF_REDIS_URL": "redis://r:6379/0"}
    assert config_from_env(env).peering_lifetime_seconds == 5  # not kopf's 60
    lifetime = {"ARDIFF_OPERATOR_PEERING_LIFETIME_SECONDS": "2"}
    assert config_from_env({**env, **lifetime}).peering_lifetime_seconds == 2
    with pytest.raises(OperatorConfigError, match="peering_lifetime_seconds must be positive"):
        config_from_env({**env, "ARDIFF_OPERATOR_PEERING_LIFETIME_SECONDS": "0"})
