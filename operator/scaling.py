"""How many worker pods a pool should have, and which ones may go: pure decisions, no I/O.

Scale up while sessions wait and no slot is free (counting slots still booting), never above `max`.
Scale down only pods that hold no session and have been empty for `scaleDownDelaySeconds`, never below `min`.
A pod that did not register within `startupTimeoutSeconds` (`stuck`) counts for nothing: it is replaced.
A slot counts as free only while the pod's compute (issue 25) also admits one more session at the pool's
default playout fps: a pod's free slots are min(KV slots free, sessions its compute headroom admits), and a
new pod brings min(KV slots, sessions its compute admits) of the largest registered pod.

A pod made from an older template (`stale`: the pool's spec changed since) takes no new session (the round
drains it); it is retired as soon as it holds none, and until then it counts against `max` (no surge: the
replicas are the GPU budget), never towards `min`. A live session is never cut short by a roll.

Migration (issue 12, `plan_migrations`): a pod whose worker exports (`exports`) need not wait for its sessions
to end. Its sessions are suspended with a demand to resume, so they are placed again elsewhere at once, and
the pod empties: during a roll that keeps the sessions' identity (model, pipeline, height, width, dtype), and
on a scale-down that is due (the least-loaded pod's sessions fit in the other pods' free slots, for
`scaleDownDelaySeconds`). A pod chosen for scale-down is then treated like a stale one (drained, retired once
empty).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

COMPUTE_SLACK = 1e-6  # as kv/lua/_lib.lua FPS_EPSILON, in sessions


@dataclass(frozen=True)
class PodSlots:
    """One worker pod as scaling sees it."""

    name: str
    registered: bool  # it has a live record in Redis (its capacity is known)
    capacity: int
    used: int
    empty_since: float | None  # monotonic seconds since the pod last held no session, None if it holds some
    stuck: bool = False  # never registered within the pool's startup timeout: replace it
    stale: bool = False  # made from an older template than the pool's current one (or chosen for scale-down)
    exports: bool = False  # its worker can export sessions (migration instead of waiting for them to end)
    same_identity: bool = True  # its sessions can be imported by a pod of the current template
    # Issue 25: sessions at the pool's default playout fps its compute admits in all, and still admits
    # (None: its compute is not limited)
    compute_capacity: int | None = None
    compute_free: int | None = None

    @property
    def free(self) -> int:
        """Sessions it can take now: free KV slots, bounded by its compute headroom."""
        slots = max(0, self.capacity - self.used)
        return slots if self.compute_free is None else min(slots, self.compute_free)

    @property
    def admits(self) -> int:
        """Sessions it holds when full: its KV slots, bounded by its compute."""
        return self.capacity if self.compute_capacity is None else min(self.capacity, self.compute_capacity)

    @property
    def retiring(self) -> bool:
        """Stale and holding no session: it goes now, and counts for nothing meanwhile."""
        return self.stale and self.used == 0


@dataclass(frozen=True)
class ScalePlan:
    create: int
    delete: tuple[str, ...]  # retire: drain (only if empty), then delete
    replace: tuple[str, ...] = ()  # stuck pods: delete (they hold nothing); `create` covers their successors


def compute_sessions(fps_budget: float, fps: float) -> int:
    """Sessions at `fps` that `fps_budget` frames/s admit (as placement compares them: a hair of slack)."""
    return max(0, math.floor(fps_budget / fps + COMPUTE_SLACK))


def counted(pods: Mapping[str, PodSlots]) -> dict[str, PodSlots]:
    """The pods that count for the pool's size and capacity: all but the stuck and the retiring ones."""
    return {name: pod for name, pod in pods.items() if not (pod.stuck or pod.retiring)}


def per_pod_capacity(pods: Mapping[str, PodSlots], session_capacity: int | None) -> int | None:
    """Sessions one more pod brings: the largest registered pod's (`admits`), else the spec's cap, else
    unknown."""
    known = [p.admits for p in pods.values() if p.registered and p.admits > 0]
    if known:
        return max(known)
    return session_capacity


def may_grow(pods: Mapping[str, PodSlots], max_replicas: int) -> bool:
    """True while the pool can still get more slots: below max, or pods at max still booting.

    `place` may evict only when this is False.
    """
    kept = counted(pods)
    return len(kept) < max_replicas or any(not p.registered for p in kept.values())


def plan_scaling(
    pods: Mapping[str, PodSlots],
    *,
    waiting: int,
    min_replicas: int,
    max_replicas: int,
    session_capacity: int | None,
    scale_down_delay: float,
    now: float,
) -> ScalePlan:
    """`waiting`: sessions that need a slot and did not get one in this reconcile."""
    replace = tuple(sorted(name for name, pod in pods.items() if pod.stuck))
    retire = tuple(sorted(name for name, pod in pods.items() if pod.retiring and not pod.stuck))
    pods = counted(pods)
    current = len(pods)  # against max: stale pods that still hold sessions included
    updated = [p for p in pods.values() if not p.stale]  # towards min
    booting = [p for p in updated if not p.registered]
    free = sum(p.free for p in pods.values() if p.registered)
    if len(updated) < min_replicas:
        create = max(0, min(min_replicas - len(updated), max_replicas - current))
        return ScalePlan(create=create, delete=retire, replace=replace)
    if waiting > 0:
        if free > 0 or current >= max_replicas:
            return ScalePlan(create=0, delete=retire, replace=replace)
        slots_per_pod = per_pod_capacity(pods, session_capacity)
        if slots_per_pod is None:
            # Capacity unknown until the first pod registers: grow one pod at a time.
            return ScalePlan(create=0 if booting else 1, delete=retire, replace=replace)
        uncovered = waiting - len(booting) * slots_per_pod
        wanted = math.ceil(uncovered / slots_per_pod) if uncovered > 0 else 0
        return ScalePlan(create=min(wanted, max_replicas - current), delete=retire, replace=replace)
    empty = sorted(
        (p for p in updated if p.registered and p.used == 0 and p.empty_since is not None),
        key=lambda p: (p.empty_since, p.name),
    )
    # Above max (the spec was lowered): empty pods go at once; otherwise only after the delay, down to min.
    immediate = [p.name for p in empty][: max(0, current - max_replicas)]
    due = [
        p.name for p in empty if p.name not in immediate and now - (p.empty_since or now) >= scale_down_delay
    ]
    keep_min = max(0, len(updated) - len(immediate) - min_replicas)
    return ScalePlan(create=0, delete=retire + tuple(immediate + due[:keep_min]), replace=replace)


@dataclass(frozen=True)
class MigrationPlan:
    roll: tuple[str, ...] = ()  # stale pods whose sessions move now
    scale_down: str | None = None  # the pod whose sessions move so that it can go (when the delay is over)


def plan_migrations(
    pods: Mapping[str, PodSlots], *, waiting: int, min_replicas: int, max_replicas: int
) -> MigrationPlan:
    """Which pods' sessions to migrate now (docs/contracts.md §5).

    Roll: a stale pod that exports, of the same identity, holding sessions, moves them all when they fit in
    the free slots of current pods (least-loaded stale pods first, each counted against the slots left); when
    no current pod has a free slot and none can come (the pool is at `max` and none is booting), the
    least-loaded one moves anyway: its sessions wait suspended, with their KV, for the pod that replaces it.
    Scale-down candidate: with no session waiting, no roll in progress and no empty current pod (an empty pod
    goes by the plain delay), more current pods than `min`: the least-loaded current pod that exports whose
    sessions fit in the other current pods' free slots. The caller migrates it once that has held for
    `scaleDownDelaySeconds`."""
    kept = counted(pods)
    updated = [p for p in kept.values() if not p.stale]
    free = sum(p.free for p in updated if p.registered)
    movable = sorted(
        (
            p
            for p in kept.values()
            if p.stale and p.exports and p.same_identity and p.registered and p.used > 0
        ),
        key=lambda p: (p.used, p.name),
    )
    roll: list[str] = []
    for pod in movable:
        if pod.used <= free:
            roll.append(pod.name)
            free -= pod.used
    booting = any(not p.registered for p in updated)
    if movable and not roll and free == 0 and len(kept) >= max_replicas and not booting:
        roll.append(movable[0].name)
    if roll or any(p.stale for p in kept.values()) or waiting > 0:
        return MigrationPlan(roll=tuple(roll))
    registered = [p for p in updated if p.registered]
    if len(updated) <= min_replicas or any(p.used == 0 for p in registered) or len(registered) < 2:
        return MigrationPlan()
    for pod in sorted(registered, key=lambda p: (p.used, p.name)):
        others = sum(p.free for p in registered if p.name != pod.name)
        if pod.exports and pod.used <= others:
            return MigrationPlan(scale_down=pod.name)
        break  # only the least-loaded pod is a candidate
    return MigrationPlan()
