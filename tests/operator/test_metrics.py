"""operator/metrics.py without a cluster: the address, the samples a round sets, a deleted pool's series."""

from __future__ import annotations

import re

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import ConnectionError as RedisConnectionError

from ardiff.kv.errors import NotReplicated
from ardiff.kv.records import PoolId
from ardiff.operator.config import OperatorConfig
from ardiff.operator.kube import KubeApiError
from ardiff.operator.metrics import (
    MetricsAddressError,
    OperatorMetrics,
    PoolSample,
    failure_reason,
    parse_metrics_address,
)
from ardiff.operator.status import Reason, SessionObservation, build_session_status, derive_session_phase

POOL = PoolId("ns", "pool")


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_the_address_is_an_http_host_and_port() -> None:
    assert parse_metrics_address("http://0.0.0.0:9090/metrics") == ("0.0.0.0", 9090)
    assert parse_metrics_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    for bad in ("https://0.0.0.0:9090/metrics", "http://0.0.0.0/metrics", "http://:9090", "x:y"):
        with pytest.raises(MetricsAddressError, match="operator metrics must be http://HOST:PORT/metrics"):
            parse_metrics_address(bad)
    with pytest.raises(MetricsAddressError, match=re.escape("'http://0.0.0.0'")):
        OperatorConfig(
            redis_url="redis://r", worker_redis_url="redis://r", namespaces=("a",), metrics="http://0.0.0.0"
        )


def test_a_rounds_sample_and_a_deleted_pools_series() -> None:
    metrics = OperatorMetrics()
    sample = PoolSample(
        phases={"Ready": 3, "Pending": 2},
        pending=2,
        free_slots=1,
        capacity=4,
        replicas=3,
        ready=2,
        starting=1,
        stale=0,
        min_replicas=0,
        max_replicas=4,
        last_pod_startup_seconds=12.5,
    )
    metrics.observe_pool(POOL, sample)
    metrics.observe_round(POOL, 0.02)
    metrics.observe_placement(POOL, 7.0)
    got = samples(metrics)
    pool = (("namespace", "ns"), ("pool", "pool"))
    assert got[("ardiff_pool_sessions", (*pool[:1], ("phase", "Ready"), *pool[1:]))] == 3
    assert got[("ardiff_pool_sessions", (*pool[:1], ("phase", "Pending"), *pool[1:]))] == 2
    assert got[("ardiff_pool_sessions", (*pool[:1], ("phase", "Lost"), *pool[1:]))] == 0
    assert got[("ardiff_pool_pending_sessions", pool)] == 2
    assert got[("ardiff_pool_free_slots", pool)] == 1
    assert got[("ardiff_pool_capacity_slots", pool)] == 4
    assert got[("ardiff_pool_pods", (*pool, ("state", "starting")))] == 1
    assert got[("ardiff_pool_pods", (*pool, ("state", "ready")))] == 2
    assert got[("ardiff_pool_last_pod_startup_seconds", pool)] == 12.5
    assert got[("ardiff_session_placement_seconds_bucket", (("le", "5.0"), *pool))] == 0
    assert got[("ardiff_session_placement_seconds_bucket", (("le", "10.0"), *pool))] == 1
    assert got[("ardiff_pool_reconcile_seconds_sum", pool)] == 0.02
    other = PoolId("ns", "other")
    metrics.observe_pool(other, sample)
    metrics.forget_pool(POOL)
    left = {labels for _, labels in samples(metrics)}
    assert left
    assert all(("pool", "other") in labels for labels in left)


def test_failed_rounds_are_counted_by_what_failed_and_forgotten_with_the_pool() -> None:
    """The alerts' signal that the operator cannot act (charts/ardiff/monitoring/): a round that failed on the
    placement store (unreachable, or a write not replicated), on the Kubernetes API, or on anything else."""
    metrics = OperatorMetrics()
    failures = [
        RedisConnectionError("Connection refused"),
        NotReplicated("place", 0, 1, 100),
        KubeApiError(503, "PATCH", "/apis/x", "{}"),
        aiohttp.ServerDisconnectedError(),
        ValueError("a bug"),
    ]
    assert [failure_reason(exc) for exc in failures] == ["store", "store", "api", "api", "other"]
    for exc in failures:
        metrics.observe_failed_round(POOL, exc)
    pool = (("namespace", "ns"), ("pool", "pool"))
    got = samples(metrics)
    failed = {
        dict(labels)["reason"]: value
        for (name, labels), value in got.items()
        if name == "ardiff_pool_reconcile_failures_total"
    }
    assert failed == {"store": 2, "api": 2, "other": 1}
    assert ("ardiff_pool_reconcile_failures_total", (*pool, ("reason", "store"))) in got
    metrics.forget_pool(POOL)
    assert not [name for name, _ in samples(metrics) if name.startswith("ardiff_pool_reconcile_failures")]


def test_a_waiting_session_says_a_pod_is_starting_and_how_long_the_last_one_took() -> None:
    waiting = SessionObservation(record=None, pod=None, pod_ready=False, now_ms=0)
    assert derive_session_phase(waiting)[1] is Reason.WAITING_FOR_CAPACITY
    starting = SessionObservation(
        record=None, pod=None, pod_ready=False, now_ms=0, starting_pods=2, last_startup_seconds=14.25
    )
    status = build_session_status({}, starting, session="s", generation=1, now="2026-01-01T00:00:00Z")
    assert (status["phase"], status["reason"]) == ("Pending", "PodStarting")
    assert status["message"] == (
        "waiting for a slot: 2 worker pods are starting; pods of this pool took 14.2 s to start last time"
    )
    first = SessionObservation(record=None, pod=None, pod_ready=False, now_ms=0, starting_pods=1)
    status = build_session_status(status, first, session="s", generation=1, now="2026-01-01T00:00:00Z")
    assert (
        status["message"]
        == "waiting for a slot: 1 worker pod is starting; no pod of this pool has started yet"
    )
