"""Issue 14 items 1-2 on the dev cluster: a `min: 0` pool scales from zero and back, and the operator's
Prometheus metrics say so (values, not just names), after a scripted scenario with fake-runtime workers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ardiff.devcluster.cluster import OPERATOR_COMMAND
from ardiff.devcluster.prometheus import Prometheus
from ardiff.devcluster.waiting import wait_until
from ardiff.worker.net import free_port
from tests.operator.conftest import Cluster

pytestmark = pytest.mark.timeout(120)

SCALE_DOWN_DELAY = 2


def scrape(url: str, namespace: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's samples of this namespace's pool: (name, sorted labels but namespace/pool) → value."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.pop("namespace", None) != namespace or labels.pop("pool", None) != "pool":
                continue
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_metrics(url: str, namespace: str, what: str, **expected: float) -> dict:
    """Wait until each `name` or `name__label_value` sample has its expected value."""

    def matches() -> dict | None:
        samples = scrape(url, namespace)
        for key, want in expected.items():
            name, _, label = key.partition("__")
            labels = dict([label.split("_", 1)]) if label else {}
            if value(samples, name, **labels) != want:
                return None
        return samples

    return wait_until(matches, timeout=30, what=what)


def test_a_pool_scales_from_zero_and_back_and_its_metrics_say_so(
    cluster: Cluster, redis_url: str, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    operator = cluster.operator(
        redis_url, tmp_path / "operator.log", command=(*OPERATOR_COMMAND, "--metrics", url)
    )
    operator.start()
    ns = cluster.namespace
    try:
        operator.wait_ready()
        # Two slots per pod, one pod at most; nobody is evicted for a newcomer (a third session waits).
        cluster.create_pool(
            replicas={"min": 0, "max": 1},
            scaleDownDelaySeconds=SCALE_DOWN_DELAY,
            eviction={"minIdleSeconds": 3600},
        )
        wait_metrics(url, ns, "an empty pool", ardiff_pool_replicas=0, ardiff_pool_pods__state_ready=0)
        assert cluster.pod_names() == set()

        # The first session of an empty pool: Pending while a pod starts, then Ready with no client action.
        cluster.create_session("first")
        starting = cluster.wait_phase("first", "Pending", reason="PodStarting")
        assert starting["message"] == (
            "waiting for a slot: 1 worker pod is starting; no pod of this pool has started yet"
        )
        cluster.wait_phase("first", "Ready")
        startup = wait_until(
            lambda: cluster.pool_status().get("lastPodStartupSeconds"), what="the pool's startup time"
        )
        assert 0 < startup < 30
        cluster.create_session("second")
        cluster.wait_phase("second", "Ready")
        cluster.create_session("third")  # no free slot, at max, nobody evictable: it waits
        cluster.wait_phase("third", "Pending", reason="WaitingForCapacity")

        samples = wait_metrics(
            url,
            ns,
            "two Ready sessions and one pending",
            ardiff_pool_sessions__phase_Ready=2,
            ardiff_pool_sessions__phase_Pending=1,
            ardiff_pool_pending_sessions=1,
        )
        assert value(samples, "ardiff_pool_sessions", phase="Lost") == 0
        assert value(samples, "ardiff_pool_free_slots") == 0
        assert value(samples, "ardiff_pool_capacity_slots") == 2
        assert value(samples, "ardiff_pool_pods", state="ready") == 1
        assert value(samples, "ardiff_pool_pods", state="starting") == 0
        assert value(samples, "ardiff_pool_replicas") == 1
        assert value(samples, "ardiff_pool_min_replicas") == 0
        assert value(samples, "ardiff_pool_max_replicas") == 1
        assert value(samples, "ardiff_pool_last_pod_startup_seconds") == startup
        # Placement: two sessions reached Ready, the first after a cold start (its pod's startup at least).
        assert value(samples, "ardiff_session_placement_seconds_count") == 2
        placed = value(samples, "ardiff_session_placement_seconds_sum")
        assert placed is not None
        assert placed >= startup
        assert (value(samples, "ardiff_session_placement_seconds_bucket", le="1.0") or 0) >= 1  # the warm one
        assert (value(samples, "ardiff_pool_reconcile_seconds_count") or 0) > 3

        # Sessions end: the third takes a freed slot, then none is left and the pod goes after the delay.
        cluster.delete("ardiffusionsessions", "first")
        cluster.wait_phase("third", "Ready")
        samples = wait_metrics(
            url, ns, "two Ready again", ardiff_pool_pending_sessions=0, ardiff_pool_free_slots=0
        )
        assert value(samples, "ardiff_session_placement_seconds_count") == 3
        for name in ("second", "third"):
            cluster.delete("ardiffusionsessions", name)
        wait_until(lambda: not cluster.items("ardiffusionsessions"), what="sessions finalized")
        empty_at = time.monotonic()
        wait_until(lambda: not cluster.pod_names(), timeout=30, what="the empty pod to go")
        waited = time.monotonic() - empty_at
        assert waited >= SCALE_DOWN_DELAY - 0.5, waited  # not before scaleDownDelaySeconds
        samples = wait_metrics(
            url,
            ns,
            "a pool at zero",
            ardiff_pool_replicas=0,
            ardiff_pool_pods__state_ready=0,
            ardiff_pool_capacity_slots=0,
            ardiff_pool_sessions__phase_Ready=0,
        )
        assert value(samples, "ardiff_pool_free_slots") == 0

        # From zero again: the waiting session now says how long the last cold start took.
        cluster.create_session("again")
        starting = cluster.wait_phase("again", "Pending", reason="PodStarting")
        assert starting["message"] == (
            f"waiting for a slot: 1 worker pod is starting; pods of this pool took {startup:.1f} s to start "
            "last time"
        )
        cluster.wait_phase("again", "Ready")

        cluster.delete_all()  # a deleted pool's series go
        wait_until(lambda: not scrape(url, ns), what="the deleted pool's series to go")
    finally:
        try:
            cluster.delete_all()
        finally:
            operator.stop()
            sys.stdout.write(f"\n----- operator log -----\n{operator.log()[-20000:]}\n")


def test_a_pools_rounds_that_fail_on_the_store_are_counted_and_a_real_prometheus_alerts_on_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The alerts' signal (charts/ardiff/monitoring/: ArdiffPlacementStoreUnreachable): an operator whose
    placement store does not answer (nothing listens at its address) counts each failed round of the pool
    under `reason="store"`, and none under another reason; a real Prometheus scraping it with the chart's
    rules holds that alert (pending: its `for` is minutes) and no other, and the dashboard's panel of failed
    rounds shows the pool."""
    url = f"http://127.0.0.1:{free_port()}/metrics"
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    operator = cluster.operator(
        unreachable, tmp_path / "operator.log", command=(*OPERATOR_COMMAND, "--metrics", url)
    )
    operator.start()
    try:
        cluster.create_pool(replicas={"min": 0, "max": 1})

        def failed_on_the_store() -> dict | None:
            try:
                samples = scrape(url, cluster.namespace)
            except httpx.HTTPError:  # the metrics server is not up yet
                return None
            counted = value(samples, "ardiff_pool_reconcile_failures_total", reason="store") or 0
            return samples if counted >= 2 else None

        with Prometheus([url]) as prometheus:
            samples = wait_until(failed_on_the_store, timeout=60, what="two rounds failed on the store")
            assert value(samples, "ardiff_pool_reconcile_failures_total", reason="api") is None
            assert value(samples, "ardiff_pool_reconcile_failures_total", reason="other") is None

            def alerted() -> list[dict] | None:
                mine = [a for a in prometheus.alerts() if a["labels"].get("namespace") == cluster.namespace]
                return mine or None

            (alert,) = wait_until(alerted, timeout=60, what="the store alert")
            assert alert["labels"] == {
                "alertname": "ArdiffPlacementStoreUnreachable",
                "namespace": cluster.namespace,
                "pool": "pool",
                "severity": "critical",
            }
            assert alert["state"] == "pending"
            panel = (
                "sum by (pool, reason) (increase(ardiff_pool_reconcile_failures_total"
                f'{{namespace=~"{cluster.namespace}", pool=~"pool"}}[5m]))'
            )
            (series,) = prometheus.query(panel)
            assert series["metric"] == {"pool": "pool", "reason": "store"}
            assert float(series["value"][1]) > 0
        assert operator.running
    finally:
        operator.stop()
