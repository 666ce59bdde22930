"""One pool's round, level-triggered: Redis + Pods + session CRs in, placements, statuses and Pods out.

Each round re-derives everything from what it reads (batched: one Redis read for all of a pool's sessions),
so a missed event or an operator restart converges on the next round. Writes happen only on change. The
round decides; its collaborators act: `slots` (what the pods hold), `status_writer` (every status write),
`worker_pods` (creating, replacing and retiring Pods) and `worker_credentials` (the workers' Secret and
Redis user).

Order of a round; 1-3 under the pool's lock (admissions and releases take it too):
1. pods: reap expired leases, forget pods that no longer exist, keep terminating pods from new placements;
2. sessions: expire idle ones, restore bindings Redis lost, place waiting / lost / evicted ones; then the
   pool's record (operator/pool_record.py), unless a lost binding still waits for its pod;
3. statuses: re-read if 2 changed anything, derive, patch what changed (events on phase transitions);
4. scaling: create pods for waiting sessions, drain and delete empty ones;
5. the pool's status.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import kopf

from ardiff.kv.acl import AclForbidden
from ardiff.kv.errors import UnknownPod
from ardiff.kv.records import PodRecord, PoolId, SessionBinding, SessionSpec, SessionState
from ardiff.operator.admission import AdmissionFailure, check_family, placement_spec
from ardiff.operator.context import OperatorContext
from ardiff.operator.disruption import pool_selector, sync_busy_pods
from ardiff.operator.forks import SessionFinder, fork_request
from ardiff.operator.kube import PODS
from ardiff.operator.metrics import PoolSample
from ardiff.operator.pool_record import write_pool_record
from ardiff.operator.pool_state import PoolState
from ardiff.operator.scaling import PodSlots, compute_sessions, may_grow, plan_migrations, plan_scaling
from ardiff.operator.slots import live_pods, sync_pods
from ardiff.operator.spec_changes import apply_eviction_specs
from ardiff.operator.status import Phase, PoolObservation, Reason, build_pool_status, status_patch
from ardiff.operator.status_writer import now_rfc3339, previous_status, write_failed, write_session_statuses
from ardiff.operator.views import PodView, PoolView, SessionView, epoch_ms
from ardiff.operator.worker_credentials import ensure_worker_redis_secret
from ardiff.operator.worker_pods import (
    create_worker_pod,
    replace_stuck_pod,
    retire_worker_pod,
    template_refusal,
)


def needs_reconcile(session: SessionView) -> bool:
    """Sessions a pool round looks after: admitted (their create handler wrote a status; until then it is
    theirs, and kopf re-runs it after a restart), not being deleted, valid, and not finished."""
    if not session.status or session.deleting or session.spec is None:
        return False
    if session.phase == Phase.EXPIRED:
        return False
    # A session that arrived before its pool is admitted once the pool exists.
    return session.phase != Phase.FAILED or session.status.get("reason") == Reason.UNKNOWN_POOL


@dataclass
class RoundResult:
    waiting: int = 0  # sessions that need a slot and did not get one
    changed: bool = False  # a placement, restore or failure happened: bindings must be read again
    # Sessions whose status this round must not rewrite: failed now, or bound to a pod that must re-register
    # before their binding can be restored.
    settled: set[str] = field(default_factory=set)
    # Issue 25: waiting sessions `place` left pending for compute (a pod had a slot but no compute for them),
    # and those not tried after such an answer.
    waiting_for_compute: set[str] = field(default_factory=set)
    # Some binding Redis lost waits for its pod to register again: the store lacks some of the pool's data.
    restoring: bool = False


def placement_order(session: SessionView, record: SessionBinding | None) -> tuple[int, int, int, str, str]:
    """Waiting sessions' order (docs/contracts.md §2): `lost` ones first (their pod died while they were in
    use), by priority then most recent activity (last tick, latest first); then suspended ones a tick asked
    for (their users are ticking), by priority then the demand's time; then the others (new, evicted) by
    priority then creation time. A session without a record (Redis lost its data) ranks by its status: lost
    when it says `Lost`, or a pod it is bound to (it was in use; first, it may be restored there with its KV,
    which a slot an evicted or new session took first would prevent)."""
    assert session.spec is not None
    if record is not None:
        lost = record.state is SessionState.LOST
    else:
        lost = session.phase == Phase.LOST or bool(session.status.get("pod"))
    if record is not None and record.state is SessionState.SUSPENDED:
        return (1, -session.spec.priority, record.resume_requested_ms, session.created, session.name)
    if not lost:
        return (2, -session.spec.priority, 0, session.created, session.name)
    if record is not None:
        last_tick_ms = record.last_tick_ms
    else:
        last_tick = session.status.get("lastTickTime")
        last_tick_ms = epoch_ms(last_tick) if last_tick else 0
    return (0, -session.spec.priority, -last_tick_ms, session.created, session.name)


async def rebind_from_status(
    ctx: OperatorContext,
    pool_view: PoolView,
    session: SessionView,
    live: Mapping[str, PodRecord],
    slots: Mapping[str, PodSlots],
    logger: kopf.Logger,
) -> Literal["new", "lost", "wait", "restored", "suspended"]:
    """A session without a Redis record: never placed (`new`), or Redis lost its data. Then its binding is
    rebuilt from the CR's status (`restored`) if its pod re-registered with the same epoch, waited for
    (`wait`) while that pod still exists, or given up (`lost`: the KV is gone, it is placed again). A
    Suspended session's record comes back from the status's export fields (`suspended`: no slot; its export
    outlives Redis' data in the shared tier)."""
    pool = PoolId(pool_view.namespace, pool_view.name)
    if session.phase == Phase.SUSPENDED and (location := session.status.get("exportLocation")):
        restored_suspended = await ctx.store.restore_suspended(
            pool,
            await placement_spec(ctx, session, pool_view),
            tier=session.status.get("tier") or "",
            location=location,
            size=int(session.status.get("bytes") or 0),
            chunk_index=int(session.status.get("suspendedChunk") or 0),
        )
        if restored_suspended:
            logger.info(f"restored suspended session {session.name} (export {location}) from its status")
        return "suspended"
    bound_pod, bound_epoch = session.status.get("pod"), session.status.get("podEpoch")
    if not (bound_pod and bound_epoch):
        # Evicted, Lost, or Suspended with no export to restore from: it had a world it cannot continue.
        return "lost" if session.phase in (Phase.LOST, Phase.EVICTED, Phase.SUSPENDED) else "new"
    pod = live.get(bound_pod)
    if pod is None and bound_pod in slots:
        return "wait"  # its heartbeat re-creates the pod's record soon
    if pod is None or pod.epoch != bound_epoch:
        return "lost"
    spec = await placement_spec(ctx, session, pool_view)
    restored = await ctx.store.restore(
        pool,
        spec,
        pod=bound_pod,
        pod_epoch=int(bound_epoch),
        chunk_index=int(session.status.get("chunkIndex") or 0),
        reset_required=bool(session.status.get("resetRequired")),
    )
    if restored is None:
        return "lost"  # the pod has no free slot for it any more
    logger.info(f"restored session {session.name} on {bound_pod} (epoch {bound_epoch}) from its status")
    return "restored"


def waits_for_a_slot(record: SessionBinding | None) -> bool:
    """Whether a round places the session: no record (new, or Redis lost it), `lost`, `evicted`, or
    `suspended` with a demand (a tick asked for it; never eagerly)."""
    if record is None:
        return True
    state = record.state
    if state is SessionState.PLACED:  # most of them: decided without an enum comparison
        return False
    if state is SessionState.SUSPENDED:
        return record.resume_requested_ms > 0
    return state is SessionState.LOST or state is SessionState.EVICTED


async def place_sessions(
    ctx: OperatorContext,
    pool: PoolView,
    sessions: Sequence[SessionView],
    records: Mapping[str, SessionBinding],
    live: Mapping[str, PodRecord],
    slots: Mapping[str, PodSlots],
    find_session: SessionFinder,
    logger: kopf.Logger,
) -> RoundResult:
    """Restore bindings Redis lost; place sessions that wait for a slot, in `placement_order` (first
    admissions, lost sessions and suspended ones a tick asked for may evict; a suspended one without a demand
    stays where it is, in the tier)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    result = RoundResult()
    free = sum(p.free for p in live.values() if not p.draining)
    compute_bound = False  # `place` said compute, not slots, is what the pool lacks
    can_evict = not may_grow(slots, pool.spec.max_replicas)
    # Only the sessions that wait are ordered: sorting all of them every round cost ~0.25 s at 100k
    # sessions, filtering them ~0.1 s.
    waiting = [s for s in sessions if waits_for_a_slot(records.get(s.name))]
    for session in sorted(waiting, key=lambda s: placement_order(s, records.get(s.name))):
        key = (session.namespace, session.name)
        record = records.get(session.name)
        rebind = None
        try:
            if record is None:
                check_family(session, pool)  # one admitted before its pool existed meets it here
                rebind = await rebind_from_status(ctx, pool, session, live, slots, logger)
            if rebind == "wait":
                result.settled.add(
                    session.name
                )  # writing Pending now would erase the binding from its status
                result.restoring = True
                continue
            if rebind == "restored":
                free -= 1
                result.changed = True
                continue
            if rebind == "suspended":  # it resumes on demand (a tick), never eagerly
                result.changed = True
                continue
            # First admissions and sessions whose pod died may evict; an evicted one waits for a free slot.
            if record is None:
                lost = rebind == "lost" and session.phase != Phase.EVICTED
            else:
                lost = record.state in (SessionState.LOST, SessionState.SUSPENDED)  # both may evict
            may_evict = (rebind == "new" or lost) and can_evict
            if free <= 0 and not may_evict:
                result.waiting += 1
                if compute_bound:
                    result.waiting_for_compute.add(session.name)
                continue
            spec = await placement_request(ctx, pool, session, record is not None)
            prefer_pod = ""
            if rebind == "new":  # never placed: a fork is resolved now (its parent may have moved on)
                spec, prefer_pod = await fork_request(ctx, session, spec, find_session)
        except AdmissionFailure as exc:
            await write_failed(ctx, session, exc.reason, exc.message)
            result.settled.add(session.name)
            result.changed = True
            continue
        placed = await ctx.store.place(
            pid,
            spec,
            may_evict=may_evict,
            min_idle_ms=pool.spec.min_idle_seconds * 1000,
            prefer_pod=prefer_pod,
        )
        if placed.placement is None:
            result.waiting += 1
            if placed.pending_reason == "compute":
                result.waiting_for_compute.add(session.name)
            if not may_evict:
                free = 0  # `place` found no free slot: nobody else without eviction will either
                compute_bound = placed.pending_reason == "compute"
            if placed.suspending and placed.victim is not None:  # its slot frees once the export is written
                result.changed = True
                victim_key = (session.namespace, placed.victim)
                ctx.sessions.notes[victim_key] = f"suspended to make room for session {session.name}"
            continue
        result.changed = True
        if placed.victim is not None:
            ctx.sessions.notes[(session.namespace, placed.victim)] = (
                f"evicted to make room for session {session.name}"
            )
        else:
            free -= 1
        if rebind == "lost":  # a new record says nothing of the lost KV: the worker must be told to reset
            where = placed.placement
            await ctx.store.mark_reset_required(pid, session.name, pod=where.pod, epoch=where.pod_epoch)
            ctx.sessions.notes[key] = (
                f"placed on {where.pod} after Redis lost its binding to a pod that is gone"
            )
    return result


async def placement_request(
    ctx: OperatorContext, pool: PoolView, session: SessionView, has_record: bool
) -> SessionSpec:
    """A lost or evicted session's request comes from its own full record (its playout target included);
    anyone else's from the CR."""
    pid = PoolId(pool.namespace, pool.name)
    full = await ctx.store.get_session(pid, session.name) if has_record else None
    return full.spec() if full is not None else await placement_spec(ctx, session, pool)


def newly_unplaced(
    ctx: OperatorContext, sessions: Sequence[SessionView], records: Mapping[str, SessionBinding]
) -> list[SessionView]:
    """Sessions Redis has as lost or evicted whose status does not say so yet."""
    reported = {
        SessionState.LOST: Phase.LOST,
        SessionState.EVICTED: Phase.EVICTED,
        SessionState.SUSPENDED: Phase.SUSPENDED,
    }
    return [
        s
        for s in sessions
        if (record := records.get(s.name)) is not None
        and record.state in reported
        and previous_status(ctx, s).get("phase") != reported[record.state]
    ]


async def expire_idle(
    ctx: OperatorContext,
    pool: PoolId,
    sessions: Sequence[SessionView],
    records: Mapping[str, SessionBinding],
    now_ms: int,
) -> int:
    expired = 0
    for session in sessions:
        record = records.get(session.name)
        timeout_s = session.spec.idle_timeout_seconds if session.spec else 0
        idle_states = (SessionState.PLACED, SessionState.SUSPENDED)  # a suspended one expires too
        if record is None or record.state not in idle_states or not timeout_s:
            continue
        if now_ms - record.last_tick_ms >= timeout_s * 1000:
            await ctx.store.release(pool, session.name, reason="idle-timeout")
            ctx.sessions.notes[(session.namespace, session.name)] = (
                f"no tick for {timeout_s} s; the slot was released"
            )
            expired += 1
    return expired


async def expire_suspending(ctx: OperatorContext, pool: PoolId, records: Mapping[str, SessionBinding]) -> int:
    """Sessions whose worker did not report their export in time are evicted (they block the pool's
    evictions while suspending); read from Redis only when some session of the pool is suspending."""
    if not any(r.state is SessionState.SUSPENDING for r in records.values()):
        return 0
    timeout_s = ctx.config.suspend_timeout_seconds
    expired = await ctx.store.expire_suspending(pool, timeout_ms=max(1, round(timeout_s * 1000)))
    for name in expired:
        ctx.sessions.notes[(pool.namespace, name)] = (
            f"its worker did not report the export within {timeout_s:g} s; its KV counts as lost"
        )
    return len(expired)


def transfer_event(note: Mapping[str, Any]) -> tuple[str, str]:
    """The Event (type, message) of a finished resume from the worker's note (contracts §2 `resumed_note`):
    how the state came to the new pod, its bytes and the seconds it took; a Warning when a direct pull from
    the pod that held it failed first and the shared tier's copy was used."""
    size, seconds, to = note.get("bytes"), float(note.get("seconds") or 0), note.get("to", "?")
    amount = "its export" if size is None else f"{size} bytes"
    if note.get("source") == "direct":
        rate = f" ({size / seconds / 1e6:.0f} MB/s)" if size and seconds > 0 else ""
        return "Normal", f"{amount} pulled from pod {note.get('from')} by pod {to} in {seconds:.3f} s{rate}"
    where = {"snapshot": "its snapshot in the shared tier", "host": "its own host memory"}.get(
        str(note.get("source")), "the shared tier"
    )
    message = f"{amount} read from {where} by pod {to} in {seconds:.3f} s"
    if note.get("direct_failed"):
        return "Warning", f"the direct transfer from pod {note.get('from')} failed; {message}"
    return "Normal", message


async def report_transfers(
    ctx: OperatorContext, pool: PoolId, sessions: Sequence[SessionView], records: Mapping[str, SessionBinding]
) -> None:
    """News of each finished resume (issue 12): a `Transferred` Event on the session with the bytes and time
    its worker noted; the note is then acked in Redis, so each is reported once."""
    for session in sessions:
        record = records.get(session.name)
        if record is None or not record.resumed_note:
            continue
        try:
            note = json.loads(record.resumed_note)
        except ValueError:
            note = None
        if isinstance(note, dict):
            kind, message = transfer_event(note)
            kopf.event(session.reference, type=kind, reason="Transferred", message=message)
        await ctx.store.ack_resumed_note(pool, session.name, record.resumed_note)


async def migrate_sessions(
    ctx: OperatorContext,
    state: PoolState,
    pool: PoolView,
    pods: Sequence[PodView],
    live: Mapping[str, PodRecord],
    records: Mapping[str, SessionBinding],
    waiting: int,
    logger: kopf.Logger,
) -> int:
    """Move the sessions of pods that are going away instead of waiting for them to end (issue 12,
    `plan_migrations`): stale pods of the same identity during a roll, and the pod a due scale-down chose
    (drained first, so nothing lands on it; retired once empty like a stale pod). Each placed session there
    is suspended with the demand to resume (`suspend(reason="migrate")`): its worker exports it, the next
    round places it elsewhere. Returns how many sessions started to move."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    plan = plan_migrations(
        state.observe(pool, pods, live),
        waiting=waiting,
        min_replicas=pool.spec.min_replicas,
        max_replicas=pool.spec.max_replicas,
    )
    targets = {
        name: "its node is drained" if name in state.cordoned_pods else "the pool rolls to a new spec"
        for name in plan.roll
    }
    if plan.scale_down is None:
        state.consolidation_since = None
    else:
        now = time.monotonic()
        if state.consolidation_since is None:
            state.consolidation_since = now
        if now - state.consolidation_since >= pool.spec.scale_down_delay_seconds:
            state.consolidation_since = None
            try:
                await ctx.store.set_draining(pid, plan.scale_down, draining=True)
            except UnknownPod:
                pass  # its record is gone: its sessions are lost, nothing to move
            else:
                state.scale_down_pods.add(plan.scale_down)
                logger.info(f"scaling down: moving the sessions of pod {plan.scale_down} to the other pods")
    for name in state.scale_down_pods:
        targets.setdefault(name, "the pool scales down")
    moved = 0
    for session, record in records.items():
        why = targets.get(record.pod) if record.state is SessionState.PLACED else None
        if why is not None and await ctx.store.suspend(pid, session, reason="migrate"):
            ctx.sessions.notes[(pool.namespace, session)] = f"moving off pod {record.pod}: {why}"
            moved += 1
    if moved:
        logger.info(f"migrating {moved} sessions off pods {sorted(targets)}")
    return moved


async def reconcile_pool(
    ctx: OperatorContext,
    pool: PoolView,
    sessions: Sequence[SessionView],
    pods: Sequence[PodView],
    previous_pool_status: Mapping[str, Any],
    find_session: SessionFinder,
    logger: kopf.Logger,
) -> dict[str, Any] | None:
    """One round; returns the pool status patch (None when unchanged). `find_session`: any session of the
    namespace (a fork's parent)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    state = ctx.pools[pid]
    # First the workers' Secret: its digest is part of the Pod template (a changed one rolls the pool).
    credentials = await ensure_worker_redis_secret(ctx, state, pool, pods, logger)
    pool = dataclasses.replace(pool, secret_hash=credentials.secret_hash)
    active = [s for s in sessions if needs_reconcile(s)]
    names = [s.name for s in active]
    # Under the pool's lock (admissions and releases take it too): the free-slot count and the may-evict
    # decision stay exact for the whole placement pass, and no status derived here is older than a write an
    # admission made in between.
    async with state.lock:
        live = await sync_pods(ctx, state, pid, pods, pool.template_hash)
        slots = state.observe(pool, pods, live)
        records = await ctx.store.get_bindings(pid, names)
        await apply_eviction_specs(ctx, pid, active, records)
        await report_transfers(ctx, pid, active, records)
        now_ms = await ctx.store.server_time_ms()
        by_name = {p.name: p for p in pods}
        url = ctx.config.session_url(pool.namespace, pool.name)
        # Report a loss before repairing it: a session placed again in this same round still shows `Lost`
        # (and its Event) once, rather than staying `Ready` while its pod and KV changed under it.
        await write_session_statuses(
            ctx,
            newly_unplaced(ctx, active, records),
            records,
            live,
            by_name,
            now_ms,
            default_playout=pool.spec.playout,
            url=url,
        )
        expired = await expire_idle(ctx, pid, active, records, now_ms)
        expired += await expire_suspending(ctx, pid, records)
        result = await place_sessions(ctx, pool, active, records, live, slots, find_session, logger)
        if not result.restoring:  # the front door takes the pool's record for a store that holds its data
            await write_pool_record(ctx, state, pool)
        if expired or result.changed:
            records = await ctx.store.get_bindings(pid, names)
            live = await live_pods(ctx, pid)
        if await migrate_sessions(ctx, state, pool, pods, live, records, result.waiting, logger):
            records = await ctx.store.get_bindings(pid, names)
            live = await live_pods(ctx, pid)
        unsettled = [s for s in active if s.name not in result.settled]
        # Waiting sessions say so while pods start (from zero: how long the pool's last pod took).
        booting = sum(1 for p in slots.values() if not p.registered and not p.stuck)
        last_startup = state.last_startup_seconds
        if last_startup is None:
            last_startup = previous_pool_status.get("lastPodStartupSeconds")
        await write_session_statuses(
            ctx,
            unsettled,
            records,
            live,
            by_name,
            now_ms,
            starting_pods=booting,
            last_startup_seconds=last_startup,
            default_playout=pool.spec.playout,
            waiting_for_compute=result.waiting_for_compute,
            compute_utilisation=pool.spec.compute_utilisation,
            url=url,
        )
    slots = state.observe(pool, pods, live)
    plan = plan_scaling(
        slots,
        waiting=result.waiting,
        min_replicas=pool.spec.min_replicas,
        max_replicas=pool.spec.max_replicas,
        session_capacity=pool.spec.session_capacity,
        scale_down_delay=pool.spec.scale_down_delay_seconds,
        now=time.monotonic(),
    )
    # Outside the lock: creating Pods only adds capacity, a stuck pod has no Redis record (nothing can be
    # placed on it), and draining is atomic in Redis (only if the pod is still empty), so none of these can
    # invalidate a placement.
    replaced = [name for name in plan.replace if await replace_stuck_pod(ctx, state, pool, name, logger)]
    created = 0
    refusal = template_refusal(state, pool)
    may_create = refusal is None or time.monotonic() >= refusal.retry_at
    if plan.create and may_create and credentials.usable:
        for _ in range(plan.create):
            if await create_worker_pod(ctx, state, pool, logger) is None:
                break
            created += 1
    retired = [name for name in plan.delete if await retire_worker_pod(ctx, state, pid, name, logger)]
    gone = {*replaced, *retired}
    existing = [p for p in pods if not p.deleting and p.name not in gone]
    await sync_busy_pods(ctx, state, pool, existing, live)  # busy label + the pool's PodDisruptionBudget
    ready = {p.name for p in existing if p.ready}
    starting = created + sum(1 for p in slots.values() if not p.registered and p.name not in gone)
    stale = sum(1 for p in slots.values() if p.stale and p.name not in gone)
    if not starting:
        state.startup_failure = None  # every pod registered: the last replacement worked
    refusal = state.template_refusal  # still the current template's, unless a Pod was created since
    replicas = len({p.name for p in existing} | set(state.expected_pods))
    serving = [r for name, r in live.items() if name in ready and not r.draining]
    compute_capacity = sum(compute_sessions(r.compute_fps, 0.0, pool.spec.playout.fps) for r in serving)
    observation = PoolObservation(
        replicas=replicas,
        updated_replicas=replicas - stale,
        ready_replicas=len(ready),
        capacity=sum(r.capacity for name, r in live.items() if name in ready and not r.draining),
        sessions=sum(r.used for r in live.values()),
        pending=result.waiting,
        min_replicas=pool.spec.min_replicas,
        max_replicas=pool.spec.max_replicas,
        starting=starting,
        stale=stale,
        startup_failure=state.startup_failure,
        template_refusal=refusal.message if refusal else None,
        credentials_problem=credentials.problem,
        compute_capacity=compute_capacity if pool.spec.compute_utilisation > 0 else None,
    )
    status = build_pool_status(
        previous_pool_status, observation, generation=pool.generation, now=now_rfc3339()
    )
    status["selector"] = pool_selector(pool.name)  # the Scale's status.selector (labelSelectorPath)
    if state.last_startup_seconds is not None:
        status["lastPodStartupSeconds"] = state.last_startup_seconds
    free_slots = sum(r.free for name, r in live.items() if name in ready and not r.draining)
    state.sample = PoolSample(
        phases={},  # counted by the caller from the sessions' statuses
        pending=observation.pending,
        free_slots=free_slots,
        capacity=observation.capacity,
        replicas=observation.replicas,
        ready=observation.ready_replicas,
        starting=observation.starting,
        stale=observation.stale,
        min_replicas=observation.min_replicas,
        max_replicas=observation.max_replicas,
        last_pod_startup_seconds=status.get("lastPodStartupSeconds", last_startup),
        compute_capacity=compute_capacity,
        compute_fps=sum(r.compute_fps for r in serving),
        demand_fps=sum(r.demand_fps for r in live.values()),
        waiting_for_compute=len(result.waiting_for_compute),
    )
    return status_patch(previous_pool_status, status, mirror_due=True)


async def retire_pool(
    ctx: OperatorContext,
    pool: PoolView,
    sessions: Sequence[SessionView],
    pods: Sequence[PodView],
    logger: kopf.Logger,
) -> bool:
    """A deleted pool: fail its sessions (`PoolDeleted`) and delete its Pods (garbage collection does too,
    but only once the pool is gone: a pool someone else's finalizer holds would keep its GPUs meanwhile; the
    Service and Secrets it owns are left to garbage collection); forget it in Redis, and delete its Redis
    user, once the Pods are gone (a terminating worker's heartbeat would re-create what was deleted earlier).
    True once done."""
    pid = PoolId(pool.namespace, pool.name)
    async with ctx.pools[pid].lock:
        for session in sessions:
            if not session.deleting and session.phase != Phase.FAILED:
                await write_failed(ctx, session, Reason.POOL_DELETED, f"pool {pool.name} was deleted")
        for pod in pods:
            if not pod.deleting:
                await ctx.kube.delete(PODS, pool.namespace, pod.name)
        if pods:
            return False
        await ctx.store.delete_pool(pid)
        if ctx.pool_users is not None:
            try:
                await ctx.pool_users.delete(pid)  # its Pods are gone: nothing logs in as it any more
            except AclForbidden as exc:  # then it could not be made either
                logger.warning(f"pool {pool.name}: {exc}")
    ctx.forget_pool(pid)
    logger.info(f"pool {pool.name} deleted: its sessions failed, its pods, Redis state and user are gone")
    return True
