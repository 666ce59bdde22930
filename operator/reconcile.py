"""One pool's level-triggered reconcile: Redis + Pods + session CRs in, placements, statuses and Pods out.

Each round re-derives everything from what it reads (batched: one Redis read for all of a pool's sessions),
so a missed event or an operator restart converges on the next round. Writes happen only on change.

Order of a round; 1-3 under the pool's lock (admissions and releases take it too):
1. pods: reap expired leases, forget pods that no longer exist, keep terminating pods from new placements;
2. sessions: expire idle ones, restore bindings Redis lost, place waiting / lost / evicted ones;
3. statuses: re-read if 2 changed anything, derive, patch what changed (events on phase transitions);
4. scaling: create pods for waiting sessions, drain and delete empty ones;
5. the pool's status.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import kopf

from ardiff.kv.acl import AclForbidden, InvalidPoolUser, check_password, pool_username
from ardiff.kv.errors import UnknownPod
from ardiff.kv.records import PodRecord, PoolId, SessionBinding, SessionSpec, SessionState
from ardiff.operator.admission import AdmissionFailure, check_family, placement_spec
from ardiff.operator.context import OperatorContext, SessionKey, TemplateRefusal
from ardiff.operator.disruption import pool_selector, sync_busy_pods
from ardiff.operator.kube import PODS, POOLS, SECRETS, SERVICES, SESSIONS, KubeApiError
from ardiff.operator.metrics import PoolSample
from ardiff.operator.pods import (
    REDIS_CA_KEY,
    REDIS_PASSWORD_KEY,
    REDIS_URL_KEY,
    REDIS_USERNAME_KEY,
    TRANSFER_TOKEN_KEY,
    build_pool_service,
    build_worker_pod,
    build_worker_redis_secret,
    new_redis_password,
    new_transfer_token,
    read_redis_ca,
    secret_data_hash,
    worker_pod_name,
)
from ardiff.operator.scaling import PodSlots, may_grow, plan_migrations, plan_scaling
from ardiff.operator.status import (
    Phase,
    PoolObservation,
    Reason,
    SessionObservation,
    build_failed_status,
    build_pool_status,
    build_session_status,
    rfc3339,
    status_patch,
)
from ardiff.operator.views import PodView, PoolView, SessionView, epoch_ms

# A created pod the index has not reported within this long is no longer counted (its creation was undone).
EXPECTED_POD_TTL_SECONDS = 60.0
# After the API refuses a Pod of the pool's template, the next try waits this long, doubling up to the max
# (a template only the API server can judge may become valid without a spec change: a newer server, a fixed
# admission webhook).
TEMPLATE_RETRY_FIRST_SECONDS = 10.0
TEMPLATE_RETRY_MAX_SECONDS = 300.0
# Why a pool's workers have no usable Redis credentials: the reason of its Progressing condition and of the
# Warning Event (once) that says so.
SECRET_CONFLICT = "SecretConflict"
ACL_FORBIDDEN = "RedisAclForbidden"
CREDENTIALS_MISSING = "RedisCredentialsMissing"
# The keys of `<pool>-workers-redis` the operator writes (any other key is left as it is).
WORKER_SECRET_KEYS = (REDIS_URL_KEY, REDIS_CA_KEY, TRANSFER_TOKEN_KEY, REDIS_USERNAME_KEY, REDIS_PASSWORD_KEY)


def now_rfc3339() -> str:
    return rfc3339(int(time.time() * 1000))


def needs_reconcile(session: SessionView) -> bool:
    """Sessions a pool round looks after: admitted (their create handler wrote a status; until then it is
    theirs, and kopf re-runs it after a restart), not being deleted, valid, and not finished."""
    if not session.status or session.deleting or session.spec is None:
        return False
    if session.phase == Phase.EXPIRED:
        return False
    # A session that arrived before its pool is admitted once the pool exists.
    return session.phase != Phase.FAILED or session.status.get("reason") == Reason.UNKNOWN_POOL


def pod_slots(
    ctx: OperatorContext, pool: PoolView, pods: Iterable[PodView], live: Mapping[str, PodRecord]
) -> dict[str, PodSlots]:
    """The pool's pods as scaling sees them: existing (not terminating) and just created ones. A pod without a
    Redis record is `stuck` once it has been seen without one for `spec.startupTimeoutSeconds` (by this
    operator process: a restarted operator gives such pods a fresh deadline); one made from another template
    than the spec's is `stale`."""
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
        )
    return slots


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


@dataclass
class RoundResult:
    waiting: int = 0  # sessions that need a slot and did not get one
    changed: bool = False  # a placement, restore or failure happened: bindings must be read again
    # Sessions whose status this round must not rewrite: failed now, or bound to a pod that must re-register
    # before their binding can be restored.
    settled: set[str] = field(default_factory=set)


def placement_order(session: SessionView, record: SessionBinding | None) -> tuple[int, int, int, str, str]:
    """Waiting sessions' order (docs/contracts.md §2): `lost` ones first (their pod died while they were in
    use), by priority then most recent activity (last tick, latest first); then suspended ones a tick asked
    for (their users are ticking), by priority then the demand's time; then the others (new, evicted) by
    priority then creation time. A lost session without a record (Redis lost its data) ranks by its status."""
    assert session.spec is not None
    lost = record.state is SessionState.LOST if record is not None else session.phase == Phase.LOST
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
    pool: PoolId,
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
    if session.phase == Phase.SUSPENDED and (location := session.status.get("exportLocation")):
        restored_suspended = await ctx.store.restore_suspended(
            pool,
            await placement_spec(ctx, session),
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
    spec = await placement_spec(ctx, session)
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
    logger: kopf.Logger,
) -> RoundResult:
    """Restore bindings Redis lost; place sessions that wait for a slot, in `placement_order` (first
    admissions, lost sessions and suspended ones a tick asked for may evict; a suspended one without a demand
    stays where it is, in the tier)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    result = RoundResult()
    free = sum(p.free for p in live.values() if not p.draining)
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
                rebind = await rebind_from_status(ctx, pid, session, live, slots, logger)
            if rebind == "wait":
                result.settled.add(
                    session.name
                )  # writing Pending now would erase the binding from its status
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
                continue
            spec = await placement_request(ctx, pid, session, record is not None)
        except AdmissionFailure as exc:
            await write_failed(ctx, session, exc.reason, exc.message)
            result.settled.add(session.name)
            result.changed = True
            continue
        placed = await ctx.store.place(
            pid, spec, may_evict=may_evict, min_idle_ms=pool.spec.min_idle_seconds * 1000
        )
        if placed.placement is None:
            result.waiting += 1
            if not may_evict:
                free = 0  # `place` found no free slot: nobody else without eviction will either
            if placed.suspending and placed.victim is not None:  # its slot frees once the export is written
                result.changed = True
                victim_key = (session.namespace, placed.victim)
                ctx.notes[victim_key] = f"suspended to make room for session {session.name}"
            continue
        result.changed = True
        if placed.victim is not None:
            ctx.notes[(session.namespace, placed.victim)] = f"evicted to make room for session {session.name}"
        else:
            free -= 1
        if rebind == "lost":  # a new record says nothing of the lost KV: the worker must be told to reset
            where = placed.placement
            await ctx.store.mark_reset_required(pid, session.name, pod=where.pod, epoch=where.pod_epoch)
            ctx.notes[key] = f"placed on {where.pod} after Redis lost its binding to a pod that is gone"
    return result


async def placement_request(
    ctx: OperatorContext, pool: PoolId, session: SessionView, has_record: bool
) -> SessionSpec:
    """A lost or evicted session's request comes from its own full record; anyone else's from the CR."""
    full = await ctx.store.get_session(pool, session.name) if has_record else None
    return full.spec() if full is not None else await placement_spec(ctx, session)


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
            ctx.notes[(session.namespace, session.name)] = f"no tick for {timeout_s} s; the slot was released"
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
        ctx.notes[(pool.namespace, name)] = (
            f"its worker did not report the export within {timeout_s:g} s; its KV counts as lost"
        )
    return len(expired)


EVENTS_ON_ENTERING = {
    Phase.LOST: ("Warning", "Lost"),
    Phase.EVICTED: ("Warning", "Evicted"),
    Phase.EXPIRED: ("Normal", "Expired"),
    Phase.FAILED: ("Warning", "Failed"),
}


# Phases a session leaves by resuming with its KV (an export or a snapshot) rather than a reset.
RESUMABLE_PHASES = (Phase.SUSPENDED, Phase.SUSPENDING, Phase.LOST)


def post_transition_event(
    session: SessionView, previous: Mapping[str, Any], status: Mapping[str, Any]
) -> None:
    """News only: entering Lost/Evicted/Expired/Failed/Suspended, being placed again after losing the KV, and
    resuming (from a suspension, or from a snapshot after a pod loss)."""
    phase, before = status.get("phase"), previous.get("phase")
    message = status.get("message", "")
    if phase == Phase.SUSPENDED and before != Phase.SUSPENDED:
        exported = (
            f"exported {status.get('bytes')} bytes to the {status.get('tier')} tier; it continues at chunk "
            f"{status.get('suspendedChunk')}: {message}"
        )
        kopf.event(session.reference, type="Normal", reason="Suspended", message=exported)
    elif phase == Phase.READY and before in RESUMABLE_PHASES and not status.get("resetRequired"):
        kopf.event(
            session.reference,
            type="Normal",
            reason="Resumed",
            message=f"on {status.get('pod')}, from its {'export' if before != Phase.LOST else 'snapshot'}",
        )
    elif phase in EVENTS_ON_ENTERING and (
        phase != before or (phase == Phase.FAILED and status.get("reason") != previous.get("reason"))
    ):  # a session Failed as UnknownPool fails again once its pool exists (e.g. FamilyMismatch)
        kind, reason = EVENTS_ON_ENTERING[Phase(phase)]
        if phase == Phase.FAILED:  # as the create handler words it: the cause first
            message = f"{status.get('reason')}: {message}"
        kopf.event(session.reference, type=kind, reason=reason, message=message)
    elif status.get("reason") == Reason.RESET_REQUIRED and previous.get("reason") != Reason.RESET_REQUIRED:
        kopf.event(
            session.reference, type="Normal", reason="Replaced", message=f"on {status.get('pod')}: {message}"
        )


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


def previous_status(ctx: OperatorContext, session: SessionView) -> dict[str, Any]:
    """The CR's status as last seen, updated with what we wrote since (the watch may lag behind)."""
    return {**session.status, **ctx.written_status.get((session.namespace, session.name), {})}


async def write_status(
    ctx: OperatorContext, session: SessionView, previous: Mapping[str, Any], desired: Mapping[str, Any]
) -> bool:
    """Patch the session's status if anything worth writing changed since `previous` (`previous_status`);
    True if a write happened."""
    key: SessionKey = (session.namespace, session.name)
    patch = status_patch(previous, desired, mirror_due=ctx.mirror_due(key))
    if patch is None:
        return False
    post_transition_event(session, previous, desired)
    if await ctx.kube.patch_status(SESSIONS, session.namespace, session.name, patch):
        ctx.remember_status(key, patch)
    return True


async def write_failed(ctx: OperatorContext, session: SessionView, reason: Reason, message: str) -> None:
    previous = previous_status(ctx, session)
    status = build_failed_status(
        previous,
        session=session.name,
        reason=reason,
        message=message,
        generation=session.generation,
        now=now_rfc3339(),
    )
    await write_status(ctx, session, previous, status)


async def write_session_statuses(
    ctx: OperatorContext,
    sessions: Iterable[SessionView],
    records: Mapping[str, SessionBinding],
    live: Mapping[str, PodRecord],
    pods: Mapping[str, PodView],
    now_ms: int,
    *,
    starting_pods: int = 0,
    last_startup_seconds: float | None = None,
) -> int:
    now = now_rfc3339()
    limit = asyncio.Semaphore(ctx.config.status_write_concurrency)

    def desired_status(session: SessionView) -> tuple[dict[str, Any], dict[str, Any]]:
        key = (session.namespace, session.name)
        record = records.get(session.name)
        pod = live.get(record.pod) if record is not None else None
        view = pods.get(record.pod) if record is not None else None
        obs = SessionObservation(
            record=record,
            pod=pod,
            pod_ready=bool(view and view.ready),
            now_ms=now_ms,
            starting_pods=starting_pods,
            last_startup_seconds=last_startup_seconds,
        )
        previous = previous_status(ctx, session)
        desired = build_session_status(
            previous,
            obs,
            session=session.name,
            generation=session.generation,
            now=now,
            message=ctx.notes.pop(key, None),
        )
        return previous, desired

    async def write(session: SessionView, previous: dict[str, Any], desired: dict[str, Any]) -> bool:
        async with limit:
            return await write_status(ctx, session, previous, desired)

    # Derived in one pass, written concurrently: a task only for a status that changed. A task per session
    # per round was the round's largest cost at 100,000 sessions (py-spy: 14% of the operator's time creating
    # them, against 10% deriving the statuses).
    changed = []
    for session in sessions:
        previous, desired = desired_status(session)
        key = (session.namespace, session.name)
        if status_patch(previous, desired, mirror_due=ctx.mirror_due(key)) is not None:
            changed.append(write(session, previous, desired))
    return sum(await asyncio.gather(*changed))


async def ensure_service(ctx: OperatorContext, pool: PoolView) -> None:
    service = build_pool_service(pool.namespace, pool.name)
    kopf.adopt(service, owner=pool.reference)
    await ctx.kube.create(SERVICES, service)


@dataclass(frozen=True)
class WorkerCredentials:
    """What a round made of the pool's `<pool>-workers-redis` Secret: whether worker Pods may start with it
    (its URL logs in as the pool's Redis user, which exists on every node), the digest of its data (None: no
    Secret of the pool's), and otherwise why not: (reason, message) for the pool's Progressing condition."""

    usable: bool
    secret_hash: str | None
    problem: tuple[str, str] | None = None


def stored_user(data: Mapping[str, str]) -> tuple[str, str] | None:
    """The Redis user and password a workers' Secret names (keys `redis-username`, `redis-password`)."""
    username, password = (
        base64.b64decode(data.get(key) or "").decode(errors="replace")
        for key in (REDIS_USERNAME_KEY, REDIS_PASSWORD_KEY)
    )
    return (username, password) if username and password else None


async def ensure_worker_redis_secret(
    ctx: OperatorContext, pool: PoolView, pods: Sequence[PodView], logger: kopf.Logger
) -> WorkerCredentials:
    """Create the pool's `<pool>-workers-redis` Secret, or bring it up to date: the operator's worker URL
    (it may have changed since it was written) with the pool's own Redis user in it, the transfer token.

    With `--worker-redis-users operator` the operator makes the user (`ardiff-pool.<ns>.<pool>`, a random
    password, a new one when the key `redis-password` is removed) on every Redis node before the Secret
    names it; while Pods made from an older Secret run (their env is fixed at start) the user keeps
    accepting the passwords it had. With `administrator` the Secret's `redis-username` and `redis-password`
    are the administrator's, and no ACL command is sent. A Secret of that name the pool does not own is left
    alone. Each problem is reported once (a Warning Event) and blocks new worker Pods."""
    url = ctx.config.worker_redis_url
    pid = PoolId(pool.namespace, pool.name)
    operator_made = ctx.config.worker_redis_users == "operator"
    fresh_user = (pool_username(pid), new_redis_password())
    ca = read_redis_ca(url)
    # Made without a URL or a user: those are written once the user exists (below).
    secret = build_worker_redis_secret(pool.namespace, pool.name, None, transfer_token=new_transfer_token())
    kopf.adopt(secret, owner=pool.reference)
    name = secret["metadata"]["name"]
    # Read first: every round comes here, and a create would be refused (409) but for the first.
    stored = await ctx.kube.get(SECRETS, pool.namespace, name) or await ctx.kube.create_or_get(
        SECRETS, secret
    )
    if stored is None:  # deleted between the two calls: the next round creates it
        return WorkerCredentials(False, None)
    owners = stored["metadata"].get("ownerReferences") or []
    if not any(owner.get("uid") == pool.uid for owner in owners):
        message = f"Secret {name} exists and is not owned by this pool: rename or delete it"
        return credentials_problem(ctx, pool, SECRET_CONFLICT, message, None)
    stored_data: dict[str, str] = stored.get("data") or {}
    # The transfer token is made once and kept (a new one would split the pool's running pods); a Secret
    # written before it existed gets one.
    token = stored_data.get(TRANSFER_TOKEN_KEY) or secret["data"][TRANSFER_TOKEN_KEY]
    user = stored_user(stored_data)
    if operator_made and (user is None or user[0] != fresh_user[0] or not valid_password(user[1])):
        user = fresh_user  # first made, rotated (its password removed), or edited into something else
    if user is None:
        message = (
            f"Secret {name} names no Redis user: with --worker-redis-users administrator, make the pool's "
            f"user (`ardiff kv redis-user {pool.namespace} {pool.name}` prints its rules) and write its name "
            f"and password into keys {REDIS_USERNAME_KEY} and {REDIS_PASSWORD_KEY}"
        )
        return credentials_problem(ctx, pool, CREDENTIALS_MISSING, message, secret_data_hash(stored_data))
    data = build_worker_redis_secret(
        pool.namespace,
        pool.name,
        url,
        ca,
        transfer_token=base64.b64decode(token).decode(),
        user=user,
    )["data"]
    digest = secret_data_hash(data)
    if operator_made:
        assert ctx.pool_users is not None, "configure() gives an operator that makes users its PoolUsers"
        rolling = any(p.secret_hash != digest for p in pods)  # older Pods log in with an older password
        try:
            sync = await ctx.pool_users.ensure(pid, user[1], keep_previous=rolling)
        except AclForbidden as exc:
            return credentials_problem(ctx, pool, ACL_FORBIDDEN, str(exc), secret_data_hash(stored_data))
        if sync.changed:
            logger.info(f"redis user {user[0]} made or updated on {', '.join(sync.changed)}")
    if any(stored_data.get(k) != data.get(k) for k in WORKER_SECRET_KEYS):
        # Merge patch: a key no longer made (a CA no longer named) is removed; others of the Secret stay.
        patch = {"data": {k: data.get(k) for k in WORKER_SECRET_KEYS}}
        await ctx.kube.patch(SECRETS, pool.namespace, name, patch)
    ctx.credential_problems.pop(pid, None)
    return WorkerCredentials(True, digest)


def valid_password(password: str) -> bool:
    try:
        check_password(password)
    except InvalidPoolUser:
        return False
    return True


def credentials_problem(
    ctx: OperatorContext, pool: PoolView, reason: str, message: str, secret_hash: str | None
) -> WorkerCredentials:
    """Report why the pool's workers have no usable credentials: a Warning Event the first time."""
    pid = PoolId(pool.namespace, pool.name)
    if ctx.credential_problems.get(pid) != reason:
        ctx.credential_problems[pid] = reason
        kopf.event(pool.reference, type="Warning", reason=reason, message=message)
    return WorkerCredentials(False, secret_hash, (reason, message))


async def create_worker_pod(ctx: OperatorContext, pool: PoolView, logger: kopf.Logger) -> str | None:
    """Create one worker Pod with a fresh name (a name collision just draws another); None when the pool's
    template is outside the operator's pod policy (operator/pod_policy.py) or the API refuses it as invalid
    (`refuse_template` records and reports either)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    refused = ctx.config.pod_policy.violations(pool.spec.pod)
    if refused:  # the chart's admission policy refuses such a pool too: this one predates it, or has none
        refuse_template(ctx, pool, f"the operator does not make this Pod: {'; '.join(refused)}", logger)
        return None
    while True:
        name = worker_pod_name(pool.name)
        body = build_worker_pod(
            pool.namespace, pool.name, pool.spec, pod_name=name, secret_hash=pool.secret_hash
        )
        kopf.adopt(body, owner=pool.reference)
        ctx.expected_pods[pid][name] = time.monotonic()
        try:
            created = await ctx.kube.create(PODS, body)
        except KubeApiError as exc:
            del ctx.expected_pods[pid][name]  # it does not exist: nothing is starting
            if exc.status != 422:
                raise
            refuse_template(ctx, pool, exc.message, logger)
            return None
        if created is not None:
            logger.info(f"created worker pod {name}")
            ctx.template_refusals.pop(pid, None)
            return name
        del ctx.expected_pods[pid][name]


def refuse_template(ctx: OperatorContext, pool: PoolView, message: str, logger: kopf.Logger) -> None:
    """Back off from a template the API refuses; the first refusal of a template is news (a Warning Event)."""
    pid = PoolId(pool.namespace, pool.name)
    previous = ctx.template_refusals.get(pid)
    again = previous is not None and previous.template_hash == pool.template_hash
    delay = (
        min(previous.delay * 2, TEMPLATE_RETRY_MAX_SECONDS)
        if previous and again
        else TEMPLATE_RETRY_FIRST_SECONDS
    )
    ctx.template_refusals[pid] = TemplateRefusal(pool.template_hash, message, time.monotonic() + delay, delay)
    logger.warning(f"the API refused a worker pod of pool {pool.name} (next try in {delay:.0f} s): {message}")
    if not again:
        kopf.event(pool.reference, type="Warning", reason="InvalidPodTemplate", message=message)


def template_refusal(ctx: OperatorContext, pool: PoolView) -> TemplateRefusal | None:
    """The refusal of the pool's current template, if any (one of an older template is forgotten)."""
    pid = PoolId(pool.namespace, pool.name)
    refusal = ctx.template_refusals.get(pid)
    if refusal is not None and refusal.template_hash != pool.template_hash:
        del ctx.template_refusals[pid]
        return None
    return refusal


async def replace_stuck_pod(ctx: OperatorContext, pool: PoolView, name: str, logger: kopf.Logger) -> bool:
    """Delete a pod that did not register within the startup timeout (it holds nothing; the plan creates its
    successor) and report it: a Warning Event, and the pool's `Progressing` condition until a round sees every
    pod registered. False when it registered at the last moment (then it is kept)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    if await ctx.store.get_pod(pid, name) is not None:
        return False
    message = (
        f"worker pod {name} did not register within {pool.spec.startup_timeout_seconds} s "
        "(spec.startupTimeoutSeconds): replaced it"
    )
    logger.warning(message)
    kopf.event(pool.reference, type="Warning", reason="StartupTimeout", message=message)
    ctx.startup_failures[pid] = message
    ctx.expected_pods[pid].pop(name, None)
    await ctx.kube.delete(PODS, pool.namespace, name)
    return True


async def migrate_sessions(
    ctx: OperatorContext,
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
        pod_slots(ctx, pool, pods, live),
        waiting=waiting,
        min_replicas=pool.spec.min_replicas,
        max_replicas=pool.spec.max_replicas,
    )
    targets = {
        name: "its node is drained" if name in ctx.cordoned_pods[pid] else "the pool rolls to a new spec"
        for name in plan.roll
    }
    if plan.scale_down is None:
        ctx.consolidation_since.pop(pid, None)
    else:
        now = time.monotonic()
        since = ctx.consolidation_since.setdefault(pid, now)
        if now - since >= pool.spec.scale_down_delay_seconds:
            ctx.consolidation_since.pop(pid, None)
            try:
                await ctx.store.set_draining(pid, plan.scale_down, draining=True)
            except UnknownPod:
                pass  # its record is gone: its sessions are lost, nothing to move
            else:
                ctx.scale_down_pods[pid].add(plan.scale_down)
                logger.info(f"scaling down: moving the sessions of pod {plan.scale_down} to the other pods")
    for name in ctx.scale_down_pods[pid]:
        targets.setdefault(name, "the pool scales down")
    moved = 0
    for session, record in records.items():
        why = targets.get(record.pod) if record.state is SessionState.PLACED else None
        if why is not None and await ctx.store.suspend(pid, session, reason="migrate"):
            ctx.notes[(pool.namespace, session)] = f"moving off pod {record.pod}: {why}"
            moved += 1
    if moved:
        logger.info(f"migrating {moved} sessions off pods {sorted(targets)}")
    return moved


async def retire_worker_pod(ctx: OperatorContext, pool: PoolId, name: str, logger: kopf.Logger) -> bool:
    """Drain the pod (only if it holds no session), then delete it.

    Its Redis record stays, draining, until the Pod is gone (`sync_pods` removes it then): a dying worker's
    heartbeat would re-create a record removed now, and sessions could be placed on it.
    """
    try:
        drained = await ctx.store.drain_pod(pool, name, only_if_empty=True)
    except UnknownPod:
        drained = True  # its record is already gone (lease expired): nothing can be placed on it
    if not drained:
        logger.info(f"kept worker pod {name}: it received a session before it could be drained")
        return False
    await ctx.kube.delete(PODS, pool.namespace, name)
    ctx.empty_since.pop((pool, name), None)
    logger.info(f"deleted empty worker pod {name}")
    return True


async def reconcile_pool(
    ctx: OperatorContext,
    pool: PoolView,
    sessions: Sequence[SessionView],
    pods: Sequence[PodView],
    previous_pool_status: Mapping[str, Any],
    logger: kopf.Logger,
) -> dict[str, Any] | None:
    """One round; returns the pool status patch (None when unchanged)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    # First the workers' Secret: its digest is part of the Pod template (a changed one rolls the pool).
    credentials = await ensure_worker_redis_secret(ctx, pool, pods, logger)
    pool = dataclasses.replace(pool, secret_hash=credentials.secret_hash)
    active = [s for s in sessions if needs_reconcile(s)]
    names = [s.name for s in active]
    # Under the pool's lock (admissions and releases take it too): the free-slot count and the may-evict
    # decision stay exact for the whole placement pass, and no status derived here is older than a write an
    # admission made in between.
    async with ctx.locks[pid]:
        live = await sync_pods(ctx, pid, pods, pool.template_hash)
        slots = pod_slots(ctx, pool, pods, live)
        records = await ctx.store.get_bindings(pid, names)
        await report_transfers(ctx, pid, active, records)
        now_ms = await ctx.store.server_time_ms()
        by_name = {p.name: p for p in pods}
        # Report a loss before repairing it: a session placed again in this same round still shows `Lost`
        # (and its Event) once, rather than staying `Ready` while its pod and KV changed under it.
        await write_session_statuses(
            ctx, newly_unplaced(ctx, active, records), records, live, by_name, now_ms
        )
        expired = await expire_idle(ctx, pid, active, records, now_ms)
        expired += await expire_suspending(ctx, pid, records)
        result = await place_sessions(ctx, pool, active, records, live, slots, logger)
        if expired or result.changed:
            records = await ctx.store.get_bindings(pid, names)
            live = await live_pods(ctx, pid)
        if await migrate_sessions(ctx, pool, pods, live, records, result.waiting, logger):
            records = await ctx.store.get_bindings(pid, names)
            live = await live_pods(ctx, pid)
        unsettled = [s for s in active if s.name not in result.settled]
        # Waiting sessions say so while pods start (from zero: how long the pool's last pod took).
        booting = sum(1 for p in slots.values() if not p.registered and not p.stuck)
        last_startup = ctx.pod_startup_seconds.get(pid, previous_pool_status.get("lastPodStartupSeconds"))
        await write_session_statuses(
            ctx,
            unsettled,
            records,
            live,
            by_name,
            now_ms,
            starting_pods=booting,
            last_startup_seconds=last_startup,
        )
    slots = pod_slots(ctx, pool, pods, live)
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
    replaced = [name for name in plan.replace if await replace_stuck_pod(ctx, pool, name, logger)]
    created = 0
    refusal = template_refusal(ctx, pool)
    may_create = refusal is None or time.monotonic() >= refusal.retry_at
    if plan.create and may_create and credentials.usable:
        for _ in range(plan.create):
            if await create_worker_pod(ctx, pool, logger) is None:
                break
            created += 1
    retired = [name for name in plan.delete if await retire_worker_pod(ctx, pid, name, logger)]
    gone = {*replaced, *retired}
    existing = [p for p in pods if not p.deleting and p.name not in gone]
    await sync_busy_pods(ctx, pool, existing, live)  # busy label + the pool's PodDisruptionBudget
    ready = {p.name for p in existing if p.ready}
    starting = created + sum(1 for p in slots.values() if not p.registered and p.name not in gone)
    stale = sum(1 for p in slots.values() if p.stale and p.name not in gone)
    if not starting:
        ctx.startup_failures.pop(pid, None)  # every pod registered: the last replacement worked
    refusal = ctx.template_refusals.get(pid)  # still the current template's, unless a Pod was created since
    replicas = len({p.name for p in existing} | set(ctx.expected_pods[pid]))
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
        startup_failure=ctx.startup_failures.get(pid),
        template_refusal=refusal.message if refusal else None,
        credentials_problem=credentials.problem,
    )
    status = build_pool_status(
        previous_pool_status, observation, generation=pool.generation, now=now_rfc3339()
    )
    status["selector"] = pool_selector(pool.name)  # the Scale's status.selector (labelSelectorPath)
    if (startup := ctx.pod_startup_seconds.get(pid)) is not None:
        status["lastPodStartupSeconds"] = startup
    free_slots = sum(r.free for name, r in live.items() if name in ready and not r.draining)
    ctx.pool_samples[pid] = PoolSample(
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
    )
    return status_patch(previous_pool_status, status, mirror_due=True)


async def write_pool_status(ctx: OperatorContext, pool: PoolView, patch: Mapping[str, Any]) -> None:
    await ctx.kube.patch_status(POOLS, pool.namespace, pool.name, patch)


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
    async with ctx.locks[pid]:
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
