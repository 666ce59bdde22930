"""`PoolState`: what the operator keeps of one pool between its rounds, owned by the pool's round.

Nothing here is the truth (Redis and the API server are): a restarted operator starts from empty states and
rebuilds them, level-triggered. The round (operator/reconcile.py) is the one writer of the pod clocks
(`observe`); admission and release take `lock` and read `slots`, writing nothing of the round's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ardiff.kv.records import PodRecord
from ardiff.operator.metrics import PoolSample
from ardiff.operator.scaling import PodSlots, compute_sessions
from ardiff.operator.views import PodView, PoolView

# A created pod the index has not reported within this long is no longer counted (its creation was undone).
EXPECTED_POD_TTL_SECONDS = 60.0


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
class PoolState:
    """One pool's books between rounds; monotonic seconds throughout."""

    # One round, admission or release at a time, so may_evict and scaling see a settled pool.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Wakes the pool's round before its period ends (a slot was freed, a session is waiting, ...).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Pods created but not yet seen by the pod index, with their creation time: the next round counts them,
    # so it does not create them again.
    expected_pods: dict[str, float] = field(default_factory=dict)
    # When each registered pod was last seen holding no session.
    empty_since: dict[str, float] = field(default_factory=dict)
    # When each pod was first seen without a Redis record: its startup deadline runs from there.
    unregistered_since: dict[str, float] = field(default_factory=dict)
    # How long the pool's last pod took from creation (or first sight) to registering (issue 14), seconds;
    # mirrored into the pool's status.lastPodStartupSeconds.
    last_startup_seconds: float | None = None
    # Why the last pod was replaced for not registering in time, until every pod has registered.
    startup_failure: str | None = None
    # The API's last refusal of a Pod made from the pool's current template, until a Pod is created.
    template_refusal: TemplateRefusal | None = None
    # Why the pool's workers have no usable Redis credentials, as last reported by a Warning Event (once per
    # reason).
    credential_problem: str | None = None
    # Issue 12: pods chosen for a scale-down by migration (drained; their sessions move; retired once empty),
    # and since when the pool has had a pod that could be emptied that way.
    scale_down_pods: set[str] = field(default_factory=set)
    consolidation_since: float | None = None
    # With `follow_drains`: the pool's worker Pods on cordoned nodes (operator/nodes.py).
    cordoned_pods: set[str] = field(default_factory=set)
    # The minAvailable last written to the pool's busy-pod PodDisruptionBudget (operator/disruption.py).
    busy_budget: int | None = None
    # The last round's sample for the Prometheus metrics (operator/metrics.py).
    sample: PoolSample | None = None
    # Issue 37: a TLS pool's CA as its record last carried it.
    ca: PoolCa | None = None

    def kick(self) -> None:
        self.wake.set()

    def slots(
        self, pool: PoolView, pods: Iterable[PodView], live: Mapping[str, PodRecord]
    ) -> dict[str, PodSlots]:
        """The pool's pods as scaling sees them, from the clocks as the last round left them (nothing
        written): existing (not terminating) and just created ones. A pod without a Redis record is `stuck`
        once it has been seen without one for `spec.startupTimeoutSeconds` (by this operator process: a
        restarted operator gives such pods a fresh deadline); one made from another template than the spec's
        is `stale`. A pod whose worker reports compute_fps counts the sessions at the pool's default playout
        fps its compute admits."""
        return self._slots(pool, list(pods), live, time.monotonic())

    def observe(
        self, pool: PoolView, pods: Iterable[PodView], live: Mapping[str, PodRecord]
    ) -> dict[str, PodSlots]:
        """The round's `slots`: first the clocks move on (created pods the index now shows, pods gone, pods
        that became empty or registered), then the slots are read from them."""
        pods = list(pods)
        now = time.monotonic()
        existing = {p.name for p in pods if not p.deleting}
        for name, created in list(self.expected_pods.items()):
            if name in existing or now - created > EXPECTED_POD_TTL_SECONDS:
                del self.expected_pods[name]
        current = existing | set(self.expected_pods)
        self.forget_pods(keep=current)
        for name in current:
            record = live.get(name)
            if record is not None and record.used == 0:
                self.empty_since.setdefault(name, now)
            else:
                self.empty_since.pop(name, None)
            if record is None:
                self.unregistered_since.setdefault(name, self.expected_pods.get(name, now))
            elif (since := self.unregistered_since.pop(name, None)) is not None:
                # It registered: status.lastPodStartupSeconds. Rounded once here so that the status, the
                # metric and the waiting sessions' messages all state the same figure.
                self.last_startup_seconds = round(now - since, 2)
        return self._slots(pool, pods, live, now)

    def _slots(
        self, pool: PoolView, pods: list[PodView], live: Mapping[str, PodRecord], now: float
    ) -> dict[str, PodSlots]:
        assert pool.spec is not None
        stale = {p.name for p in pods if not p.deleting and p.template_hash != pool.template_hash}
        stale |= self.scale_down_pods  # chosen for a scale-down by migration: it goes like a stale pod
        stale |= self.cordoned_pods  # on a cordoned node (operator/nodes.py): it goes like a stale pod too
        same_identity = {p.name for p in pods if p.identity_hash == pool.identity_hash}
        existing = {p.name for p in pods if not p.deleting}
        expected = {n: t for n, t in self.expected_pods.items() if now - t <= EXPECTED_POD_TTL_SECONDS}
        slots = {}
        for name in existing | set(expected):
            record = live.get(name)
            since = None if record is not None else self.unregistered_since.get(name, expected.get(name, now))
            slots[name] = PodSlots(
                name=name,
                registered=record is not None,
                capacity=record.capacity if record and not record.draining else 0,
                used=record.used if record else 0,
                empty_since=self.empty_since.get(name, now)
                if record is not None and record.used == 0
                else None,
                stuck=since is not None and now - since >= pool.spec.startup_timeout_seconds,
                stale=name in stale,
                exports=bool(record and record.exports),
                same_identity=name in same_identity,
                **compute_slots(record, pool.spec.playout.fps),
            )
        return slots

    def forget_pods(self, *, keep: Collection[str] = ()) -> None:
        """Drop the pod clocks (empty since, unregistered since), but those of the pods in `keep`."""
        for clock in (self.empty_since, self.unregistered_since):
            for name in [n for n in clock if n not in keep]:
                del clock[name]
        self.scale_down_pods &= set(keep)


def compute_slots(record: PodRecord | None, fps: float) -> dict[str, int | None]:
    """PodSlots' compute_capacity and compute_free of a pod (None: its compute is not limited)."""
    if record is None or record.compute_fps <= 0:
        return {"compute_capacity": None, "compute_free": None}
    return {
        "compute_capacity": compute_sessions(record.compute_fps, 0.0, fps),
        "compute_free": compute_sessions(record.compute_fps, record.demand_fps, fps),
    }
