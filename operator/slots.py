"""Slot accounting: what a pool's pods hold, as the pool round and admission both count it.

`sync_pods` makes Redis' pod records agree with the worker Pods (expired leases reaped, deleted pods and dead
incarnations forgotten, terminating, stale and cordoned pods drained); `live_pods` reads those records;
`pod_slots` turns Pods and records into the `PodSlots` that placement and scaling decide on (including when a
pod counts as stuck or stale). It writes Redis' pod records and the operator's pod clocks in the context,
nothing in the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from ardiff.kv.records import PodRecord, PoolId
from ardiff.operator.context import OperatorContext
from ardiff.operator.scaling import PodSlots, compute_sessions
from ardiff.operator.views import PodView, PoolView

# A created pod the index has not reported within this long is no longer counted (its creation was undone).
EXPECTED_POD_TTL_SECONDS = 60.0


def pod_slots(
    ctx: OperatorContext, pool: PoolView, pods: Iterable[PodView], live: Mapping[str, PodRecord]
) -> dict[str, PodSlots]:
    """The pool's pods as scaling sees them: existing (not terminating) and just created ones. A pod without a
    Redis record is `stuck` once it has been seen without one for `spec.startupTimeoutSeconds` (by this
    operator process: a restarted operator gives such pods a fresh deadline); one made from another template
    than the spec's is `stale`. A pod whose worker reports compute_fps counts the sessions at the pool's
    default playout fps its compute admits."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    now = time.monotonic()
    expected = ctx.expected_pods[pid]
    stale = {p.name for p in pods if not p.deleting and p.template_hash != pool.template_hash}
    stale |= ctx.scale_down_pods[pid]  # chosen for a scale-down by migration: it goes like a stale pod
    stale |= ctx.cordoned_pods[pid]  # on a cordoned node (operator/nodes.py): it goes like a stale pod too
    same_identity = {p.name for p in pods if p.identity_hash == pool.identity_hash}
    existing = {p.name for p in pods if not p.deleting}
    for name, created in list(expected.items()):
        if name in existing or now - created > EXPECTED_POD_TTL_SECONDS:
            del expected[name]
    current = existing | set(expected)
    ctx.forget_pods(pid, keep=current)  # the clocks of pods that are gone
    slots = {}
    for name in current:
        record = live.get(name)
        key = (pid, name)
        if record is not None and record.used == 0:
            ctx.empty_since.setdefault(key, now)
        else:
            ctx.empty_since.pop(key, None)
        stuck = False
        if record is None:
            since = ctx.unregistered_since.setdefault(key, expected.get(name, now))
            stuck = now - since >= pool.spec.startup_timeout_seconds
        elif (since := ctx.unregistered_since.pop(key, None)) is not None:
            # It registered: status.lastPodStartupSeconds. Rounded once here so that the status, the
            # metric and the waiting sessions' messages all state the same figure.
            ctx.pod_startup_seconds[pid] = round(now - since, 2)
        slots[name] = PodSlots(
            name=name,
            registered=record is not None,
            capacity=record.capacity if record and not record.draining else 0,
            used=record.used if record else 0,
            empty_since=ctx.empty_since.get(key),
            stuck=stuck,
            stale=name in stale,
            exports=bool(record and record.exports),
            same_identity=name in same_identity,
            **compute_slots(record, pool.spec.playout.fps),
        )
    return slots


def compute_slots(record: PodRecord | None, fps: float) -> dict[str, int | None]:
    """PodSlots' compute_capacity and compute_free of a pod (None: its compute is not limited)."""
    if record is None or record.compute_fps <= 0:
        return {"compute_capacity": None, "compute_free": None}
    return {
        "compute_capacity": compute_sessions(record.compute_fps, fps),
        "compute_free": compute_sessions(record.compute_fps - record.demand_fps, fps),
    }


async def live_pods(ctx: OperatorContext, pool: PoolId) -> dict[str, PodRecord]:
    return {p.name: p for p in await ctx.store.list_pods(pool)}


async def sync_pods(
    ctx: OperatorContext, pool: PoolId, pods: Sequence[PodView], template_hash: str
) -> dict[str, PodRecord]:
    """Make Redis agree with the Pods: reap expired leases, forget deleted pods and dead incarnations, drain
    terminating pods, stale ones (made from another template than `template_hash`) and those on a cordoned
    node: their sessions stay (or move, operator/nodes.py), new ones go to current pods."""
    if ctx.cordoned_nodes is not None:
        cordoned = await ctx.cordoned_nodes.among(p.node for p in pods)
        ctx.cordoned_pods[pool] = {p.name for p in pods if p.node in cordoned}
    await ctx.store.reap_expired(pool)
    live = await live_pods(ctx, pool)
    known = {p.name: p for p in pods}
    changed = False
    for name, record in live.items():
        pod = known.get(name)
        gone = pod is None and name not in ctx.expected_pods[pool]
        # A worker that died before its lease ran out: registered (epoch = registration time) before it died.
        died = pod is not None and pod.died_at_ms is not None and record.epoch < pod.died_at_ms
        if gone or died:
            await ctx.store.remove_pod(pool, name)  # its sessions become `lost`
            changed = True
        elif (
            pod is not None
            and not record.draining
            and (pod.deleting or pod.template_hash != template_hash or name in ctx.cordoned_pods[pool])
        ):
            await ctx.store.set_draining(pool, name, draining=True)
            changed = True
    return await live_pods(ctx, pool) if changed else live
