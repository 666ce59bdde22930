"""The operator's Prometheus metrics: the signals an autoscaler needs, per pool (docs/contracts.md §5).

Served by `ardiff operator run --metrics http://0.0.0.0:9090/metrics` on their own port (prometheus_client's
HTTP server, a thread: a scrape never waits for the event loop). Each pool's round sets its gauges from what
it just observed; a deleted pool's series are removed. A kopf standby exports no pool series (it runs no
round): query them with `max by (namespace, pool)` or `sum` over the operator's replicas.

Gauges, labelled `namespace` and `pool` (and `phase` / `state` where named):
- `ardiff_pool_sessions{phase}`: sessions by `status.phase` (every phase, 0 included);
- `ardiff_pool_pending_sessions`: sessions waiting for a slot (`status.pending`), KEDA's signal;
- `ardiff_pool_free_slots`, `ardiff_pool_capacity_slots`: free and all slots on Ready, non-draining pods;
- `ardiff_pool_pods{state}`: worker pods `ready`, `starting` (not registered yet), `stale` (older template);
- `ardiff_pool_replicas`, `ardiff_pool_min_replicas`, `ardiff_pool_max_replicas`: pods, `spec.replicas`;
- `ardiff_pool_last_pod_startup_seconds`: `status.lastPodStartupSeconds` (a cold start's wait);
- issue 25, admission by compute: `ardiff_pool_compute_capacity_sessions` (sessions at the pool's default
  playout fps the Ready pods' compute admits, `status.computeCapacity`; 0 while no pod reports compute),
  `ardiff_pool_compute_fps` (frames/s the Ready pods may be asked for: their `compute_fps`),
  `ardiff_pool_demand_fps` (the playout fps of the sessions holding slots: their pods' `demand_fps`),
  `ardiff_pool_compute_waiting_sessions` (sessions pending because a pod had a slot but no compute).
Histograms: `ardiff_session_placement_seconds` (a session's admission to its first Ready status, cold starts
included), `ardiff_pool_reconcile_seconds` (one reconcile round). Counter:
`ardiff_pool_reconcile_failures_total{reason}`, the rounds that failed, by what failed (`store`: the placement
store unreachable, or a write it did not replicate; `api`: the Kubernetes API; `other`), the alerts' signal
that the operator cannot act (charts/ardiff/monitoring/).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from redis.exceptions import RedisError

from ardiff.errors import ArdiffError
from ardiff.kv.errors import NotReplicated
from ardiff.kv.records import PoolId
from ardiff.operator.kube import KubeApiError

PHASES = ("Pending", "Ready", "Lost", "Evicted", "Expired", "Failed", "Suspending", "Suspended")
POD_STATES = ("ready", "starting", "stale")
# Placement spans a warm slot (milliseconds) and a cold start of a GPU pod (minutes).
PLACEMENT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
FAILURE_REASONS = ("store", "api", "other")


def failure_reason(exc: BaseException) -> str:
    """What a failed round failed on (`FAILURE_REASONS`)."""
    if isinstance(exc, RedisError | NotReplicated):
        return "store"
    if isinstance(exc, KubeApiError | aiohttp.ClientError):
        return "api"
    return "other"


class MetricsAddressError(ArdiffError):
    code = "invalid_metrics_address"


def parse_metrics_address(url: str) -> tuple[str, int]:
    """`http://HOST:PORT[/metrics]` (or `HOST:PORT`) → (host, port). The server answers on every path."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise MetricsAddressError(f"operator metrics must be http://HOST:PORT/metrics, got {url!r}")
    return parts.hostname, port


@dataclass(frozen=True)
class PoolSample:
    """One round's observation of a pool, as the metrics need it."""

    phases: Mapping[str, int]
    pending: int
    free_slots: int
    capacity: int
    replicas: int
    ready: int
    starting: int
    stale: int
    min_replicas: int
    max_replicas: int
    last_pod_startup_seconds: float | None
    compute_capacity: int = 0
    compute_fps: float = 0.0
    demand_fps: float = 0.0
    waiting_for_compute: int = 0


@dataclass
class OperatorMetrics:
    """The operator's metrics in their own registry (one per process; tests make several)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        pool = ("namespace", "pool")
        r = self.registry
        self.sessions = Gauge("ardiff_pool_sessions", "Sessions by phase", [*pool, "phase"], registry=r)
        self.pending = Gauge("ardiff_pool_pending_sessions", "Sessions waiting for a slot", pool, registry=r)
        self.free_slots = Gauge(
            "ardiff_pool_free_slots", "Free slots on Ready, non-draining pods", pool, registry=r
        )
        self.capacity = Gauge(
            "ardiff_pool_capacity_slots", "Slots on Ready, non-draining pods", pool, registry=r
        )
        self.pods = Gauge("ardiff_pool_pods", "Worker pods by state", [*pool, "state"], registry=r)
        self.compute_capacity = Gauge(
            "ardiff_pool_compute_capacity_sessions",
            "Sessions at the pool's default playout fps the Ready pods' compute admits",
            pool,
            registry=r,
        )
        self.compute_fps = Gauge(
            "ardiff_pool_compute_fps", "Frames/s the Ready pods may be asked for", pool, registry=r
        )
        self.demand_fps = Gauge(
            "ardiff_pool_demand_fps", "Playout frames/s of the sessions holding slots", pool, registry=r
        )
        self.compute_waiting = Gauge(
            "ardiff_pool_compute_waiting_sessions",
            "Sessions waiting because a pod had a free slot but no compute for them",
            pool,
            registry=r,
        )
        self.replicas = Gauge("ardiff_pool_replicas", "Worker pods", pool, registry=r)
        self.min_replicas = Gauge("ardiff_pool_min_replicas", "spec.replicas.min", pool, registry=r)
        self.max_replicas = Gauge("ardiff_pool_max_replicas", "spec.replicas.max", pool, registry=r)
        self.startup = Gauge(
            "ardiff_pool_last_pod_startup_seconds",
            "How long the pool's last worker pod took from creation to registration",
            pool,
            registry=r,
        )
        self.placement = Histogram(
            "ardiff_session_placement_seconds",
            "From a session's admission to its first Ready status",
            pool,
            buckets=PLACEMENT_BUCKETS,
            registry=r,
        )
        self.rounds = Histogram(
            "ardiff_pool_reconcile_seconds",
            "One reconcile round of a pool",
            pool,
            buckets=ROUND_BUCKETS,
            registry=r,
        )
        self.failed_rounds = Counter(
            "ardiff_pool_reconcile_failures",
            "Reconcile rounds of a pool that failed, by what failed (store, api, other)",
            [*pool, "reason"],
            registry=r,
        )

    def serve(self, url: str) -> None:
        host, port = parse_metrics_address(url)
        start_http_server(port, addr=host, registry=self.registry)

    def observe_pool(self, pool: PoolId, sample: PoolSample) -> None:
        labels = (pool.namespace, pool.name)
        for phase in {*PHASES, *sample.phases}:
            self.sessions.labels(*labels, phase).set(sample.phases.get(phase, 0))
        self.pending.labels(*labels).set(sample.pending)
        self.free_slots.labels(*labels).set(sample.free_slots)
        self.capacity.labels(*labels).set(sample.capacity)
        self.compute_capacity.labels(*labels).set(sample.compute_capacity)
        self.compute_fps.labels(*labels).set(sample.compute_fps)
        self.demand_fps.labels(*labels).set(sample.demand_fps)
        self.compute_waiting.labels(*labels).set(sample.waiting_for_compute)
        for state, count in (("ready", sample.ready), ("starting", sample.starting), ("stale", sample.stale)):
            self.pods.labels(*labels, state).set(count)
        self.replicas.labels(*labels).set(sample.replicas)
        self.min_replicas.labels(*labels).set(sample.min_replicas)
        self.max_replicas.labels(*labels).set(sample.max_replicas)
        if sample.last_pod_startup_seconds is not None:
            self.startup.labels(*labels).set(sample.last_pod_startup_seconds)

    def observe_round(self, pool: PoolId, seconds: float) -> None:
        self.rounds.labels(pool.namespace, pool.name).observe(seconds)

    def observe_failed_round(self, pool: PoolId, exc: BaseException) -> None:
        self.failed_rounds.labels(pool.namespace, pool.name, failure_reason(exc)).inc()

    def observe_placement(self, pool: PoolId, seconds: float) -> None:
        self.placement.labels(pool.namespace, pool.name).observe(seconds)

    def forget_pool(self, pool: PoolId) -> None:
        """Remove every series of a deleted pool."""
        labels = (pool.namespace, pool.name)
        per_pool: Iterable[Gauge | Histogram] = (
            self.pending,
            self.free_slots,
            self.capacity,
            self.compute_capacity,
            self.compute_fps,
            self.demand_fps,
            self.compute_waiting,
            self.replicas,
            self.min_replicas,
            self.max_replicas,
            self.startup,
            self.placement,
            self.rounds,
        )
        for metric in per_pool:
            with contextlib.suppress(KeyError):
                metric.remove(*labels)
        for metric, values in (
            (self.sessions, PHASES),
            (self.pods, POD_STATES),
            (self.failed_rounds, FAILURE_REASONS),
        ):
            for value in values:
                with contextlib.suppress(KeyError):
                    metric.remove(*labels, value)
