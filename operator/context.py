"""The operator's process-wide state, created by the startup handler and kept in kopf's memo.

Nothing here is the truth: Redis and the API server are. These are clients, per-pool locks, and caches that
a restarted operator rebuilds from them (level-triggered), at the cost of one extra read or write.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ardiff.kv.acl import PoolUsers
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.operator.config import OperatorConfig
from ardiff.operator.kube import KubeApi
from ardiff.operator.metrics import OperatorMetrics, PoolSample
from ardiff.operator.nodes import CordonedNodes

SessionKey = tuple[str, str]  # (namespace, session name)


@dataclass(frozen=True)
class TemplateRefusal:
    """The API refused (422 `Invalid`) a Pod made from a pool's template: no Pod of that template is created
    before `retry_at` (monotonic seconds); `delay` is the wait that led there (it doubles per refusal)."""

    template_hash: str
    message: str  # the API server's, e.g. `Pod "p" is invalid: spec.containers[0].env[0].name: ...`
    retry_at: float
    delay: float


@dataclass(frozen=True)
class PoolCa:
    """The CA bundle of a TLS pool's Secret (its `ca.crt`, "" without one) as last read, and when (monotonic
    seconds): the pool's record carries it (operator/pool_record.py)."""

    secret_name: str
    pem: str
    read_at: float


@dataclass
class OperatorContext:
    config: OperatorConfig
    store: PlacementStore
    kube: KubeApi
    # One reconcile or admission at a time per pool, so may_evict and scaling see a settled pool.
    locks: defaultdict[PoolId, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    # Wakes a pool's reconcile before its period ends (a slot was freed, a session is waiting, ...).
    kicks: defaultdict[PoolId, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    # Pods created but not yet seen by the pod index, with their creation time (monotonic seconds): the next
    # reconcile counts them, so it does not create them again.
    expected_pods: defaultdict[PoolId, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    # When each registered pod was last seen holding no session (monotonic seconds).
    empty_since: dict[tuple[PoolId, str], float] = field(default_factory=dict)
    # When each pod was first seen without a Redis record (monotonic seconds): its startup deadline runs from
    # there.
    unregistered_since: dict[tuple[PoolId, str], float] = field(default_factory=dict)
    # Per pool, why the last pod was replaced for not registering in time, until every pod has registered.
    startup_failures: dict[PoolId, str] = field(default_factory=dict)
    # The last status written per session, so a lagging watch does not make us write it twice.
    written_status: dict[SessionKey, dict[str, Any]] = field(default_factory=dict)
    mirrored_at: dict[SessionKey, float] = field(default_factory=dict)
    # SHA-256 of each session's token (read from its Secret once).
    token_hashes: dict[SessionKey, str] = field(default_factory=dict)
    # Why a session's state changed, when the status cannot tell (e.g. who evicted it): used once.
    notes: dict[SessionKey, str] = field(default_factory=dict)
    # Per pool, the API's last refusal of a Pod made from its current template, until a Pod is created.
    template_refusals: dict[PoolId, TemplateRefusal] = field(default_factory=dict)
    # Sessions being deleted (uids) whose slot was released while someone else's finalizer holds them: each of
    # their further events would release again; forgotten at their DELETED event.
    released_uids: set[str] = field(default_factory=set)
    # Per pool, why its workers have no usable Redis credentials (a Secret of its name it does not own, ACL
    # SETUSER forbidden, no administrator's user), as last reported by a Warning Event (once per reason).
    credential_problems: dict[PoolId, str] = field(default_factory=dict)
    # The pools' Redis users on every node (kv/acl.py); None with `--worker-redis-users administrator`.
    pool_users: PoolUsers | None = None
    # Issue 12: pods chosen for a scale-down by migration (drained; their sessions move; retired once empty),
    # and since when (monotonic seconds) each pool has had a pod that could be emptied that way.
    scale_down_pods: defaultdict[PoolId, set[str]] = field(default_factory=lambda: defaultdict(set))
    consolidation_since: dict[PoolId, float] = field(default_factory=dict)
    # With `follow_drains`: which nodes are cordoned (operator/nodes.py) and the worker Pods on them, by pool.
    cordoned_nodes: CordonedNodes | None = None
    cordoned_pods: defaultdict[PoolId, set[str]] = field(default_factory=lambda: defaultdict(set))
    # The minAvailable last written to each pool's busy-pod PodDisruptionBudget (operator/disruption.py).
    busy_budgets: dict[PoolId, int] = field(default_factory=dict)
    # Issue 14: how long the pool's last pod took from creation (or first sight) to registering, seconds;
    # mirrored into the pool's status.lastPodStartupSeconds.
    pod_startup_seconds: dict[PoolId, float] = field(default_factory=dict)
    # The Prometheus metrics (operator/metrics.py), each pool's last round's sample for them, and when each
    # session was admitted (monotonic seconds) until its first Ready status (the placement histogram).
    metrics: OperatorMetrics | None = None
    pool_samples: dict[PoolId, PoolSample] = field(default_factory=dict)
    admitted_at: dict[SessionKey, float] = field(default_factory=dict)
    # operator/sweep.py: the last SCAN of every session record, by pool, and when (monotonic seconds); one
    # per sweep period serves every pool's sweep.
    stored_sessions: dict[PoolId, set[str]] = field(default_factory=dict)
    stored_sessions_at: float = float("-inf")
    stored_sessions_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Issue 37: each TLS pool's CA as its record last carried it; and why the front door's Redis credentials
    # could not be kept, as last reported (once per reason; operator/gateway_credentials.py).
    pool_cas: dict[PoolId, PoolCa] = field(default_factory=dict)
    gateway_problem: str | None = None

    def kick(self, pool: PoolId) -> None:
        self.kicks[pool].set()

    def mirror_due(self, key: SessionKey) -> bool:
        return time.monotonic() - self.mirrored_at.get(key, 0.0) >= self.config.mirror_seconds

    def remember_status(self, key: SessionKey, status: dict[str, Any]) -> None:
        self.written_status[key] = {**self.written_status.get(key, {}), **status}
        self.mirrored_at[key] = time.monotonic()

    def forget_session(self, key: SessionKey) -> None:
        for cache in (self.written_status, self.mirrored_at, self.token_hashes, self.notes, self.admitted_at):
            cache.pop(key, None)

    def forget_pool(self, pool: PoolId) -> None:
        self.expected_pods.pop(pool, None)
        self.kicks.pop(pool, None)
        self.credential_problems.pop(pool, None)
        self.startup_failures.pop(pool, None)
        self.template_refusals.pop(pool, None)
        self.scale_down_pods.pop(pool, None)
        self.consolidation_since.pop(pool, None)
        self.busy_budgets.pop(pool, None)
        self.pod_startup_seconds.pop(pool, None)
        self.pool_samples.pop(pool, None)
        self.pool_cas.pop(pool, None)
        if self.metrics is not None:
            self.metrics.forget_pool(pool)
        self.forget_pods(pool)

    def forget_pods(self, pool: PoolId, *, keep: Collection[str] = ()) -> None:
        """Drop the pool's pod clocks (empty since, unregistered since), but those of the pods in `keep`."""
        for clock in (self.empty_since, self.unregistered_since):
            for key in [k for k in clock if k[0] == pool and k[1] not in keep]:
                del clock[key]
        if pool in self.scale_down_pods:
            self.scale_down_pods[pool] &= set(keep)

    async def close(self) -> None:
        await self.kube.close()
        await self.store.close()
        if self.pool_users is not None:
            await self.pool_users.close()
