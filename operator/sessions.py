"""One session's admission (its create handler) and release (its delete handler).

Both take the pool's lock (operator/pool_state.py), so that a pool round never sees half of them: `place`'s
may-evict decision and the round's free-slot count stay exact. Neither writes the round's books.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kopf

from ardiff.kv.errors import NotReplicated
from ardiff.kv.records import PlaceResult, PoolId, SessionSpec
from ardiff.operator.admission import AdmissionFailure, check_family, placement_spec, resolve_playout
from ardiff.operator.context import OperatorContext
from ardiff.operator.forks import SessionFinder, fork_request
from ardiff.operator.pool_state import PoolState
from ardiff.operator.scaling import may_grow
from ardiff.operator.slots import live_pods
from ardiff.operator.status import Reason, SessionObservation, build_failed_status, build_session_status
from ardiff.operator.status_writer import now_rfc3339
from ardiff.operator.views import PodView, PoolView, SessionView

# A write Redis applied but no replica acknowledged (NotReplicated) is tried again after this long.
NOT_REPLICATED_RETRY_SECONDS = 1.0


def failed_status(session: SessionView, reason: Reason, message: str, logger: kopf.Logger) -> dict[str, Any]:
    kopf.event(session.reference, type="Warning", reason="Failed", message=f"{reason}: {message}")
    logger.warning(f"session {session.name} failed: {reason}: {message}")
    return build_failed_status(
        session.status,
        session=session.name,
        reason=reason,
        message=message,
        generation=session.generation,
        now=now_rfc3339(),
    )


async def admit(
    ctx: OperatorContext,
    session: SessionView,
    pool: PoolView | None,
    pods: Sequence[PodView],
    find_session: SessionFinder,
    logger: kopf.Logger,
) -> dict[str, Any]:
    """Token Secret and image, a fork's parent (`fork_request`), then `place` (evicting only when the pool
    cannot grow); returns the status."""
    if session.spec is None:
        return failed_status(session, Reason.INVALID_SPEC, session.invalid_reason or "invalid spec", logger)
    try:
        spec = await placement_spec(ctx, session, pool, create_token=True)
    except AdmissionFailure as exc:
        return failed_status(session, exc.reason, exc.message, logger)
    if pool is None:
        message = f"no ARDiffusionWorkerPool {session.spec.pool_ref!r} in {session.namespace}"
        return failed_status(session, Reason.UNKNOWN_POOL, message, logger)
    if pool.deleting:
        return failed_status(session, Reason.POOL_DELETED, f"pool {pool.name} is being deleted", logger)
    try:
        check_family(session, pool)
        spec, prefer_pod = await fork_request(ctx, session, spec, find_session)
    except AdmissionFailure as exc:
        return failed_status(session, exc.reason, exc.message, logger)
    pid = PoolId(pool.namespace, pool.name)
    state = ctx.pools[pid]
    async with state.lock:
        try:
            placed = await place(ctx, state, pool, pods, spec, prefer_pod=prefer_pod)
        except NotReplicated as exc:
            # Applied on the master, not (yet) on a replica: a failover may lose it, so nothing is reported
            # from it. `place` is idempotent: the retry returns the same slot once a replica acknowledges.
            logger.warning(
                f"session {session.name}: {exc}; admission retried in {NOT_REPLICATED_RETRY_SECONDS} s"
            )
            raise kopf.TemporaryError(str(exc), delay=NOT_REPLICATED_RETRY_SECONDS) from None
    if placed.placement is None:
        state.kick()  # the pool may need another pod
    if placed.victim is not None:
        # A victim on a pod that exports is suspended (it keeps its slot until exported; this session is
        # placed by a later round, once the slot is free); any other is evicted.
        verb = "suspended" if placed.suspending else "evicted"
        ctx.sessions.notes[(session.namespace, placed.victim)] = (
            f"{verb} to make room for session {session.name}"
        )
        state.kick()  # the victim's status changes in the pool's next round
        logger.info(f"session {session.name} {verb} session {placed.victim}")
    # `place` read the binding, its pod's record and the time after its change: nothing more to read.
    observed = placed.observed
    where = observed.binding.pod if observed.binding is not None else ""
    observation = SessionObservation(
        record=observed.binding,
        pod=observed.pod,
        pod_ready=any(p.name == where and p.ready for p in pods),
        now_ms=observed.now_ms,
        playout=resolve_playout(session, pool),
        compute_utilisation=pool.spec.compute_utilisation
        if placed.pending_reason == "compute" and pool.spec is not None
        else None,
        url=ctx.config.session_url(pool.namespace, pool.name),
    )
    return build_session_status(
        session.status, observation, session=session.name, generation=session.generation, now=now_rfc3339()
    )


async def place(
    ctx: OperatorContext,
    state: PoolState,
    pool: PoolView,
    pods: Sequence[PodView],
    spec: SessionSpec,
    *,
    prefer_pod: str = "",
) -> PlaceResult:
    """`place` without eviction first: a free slot needs nothing else (O(1) in the pool's pods). Only when
    none is free are the pod records read, to tell whether the pool may still grow; if it cannot, `place`
    again with eviction (under the same lock: the decision is as exact as one call with eviction).
    `prefer_pod`: a fork's parent's pod, taken when it fits."""
    pid = PoolId(pool.namespace, pool.name)
    min_idle_ms = pool.spec.min_idle_seconds * 1000 if pool.spec else 0
    placed = await ctx.store.place(pid, spec, may_evict=False, min_idle_ms=min_idle_ms, prefer_pod=prefer_pod)
    if placed.placement is not None or pool.spec is None:
        return placed
    if may_grow(state.slots(pool, pods, await live_pods(ctx, pid)), pool.spec.max_replicas):
        return placed
    return await ctx.store.place(pid, spec, may_evict=True, min_idle_ms=min_idle_ms, prefer_pod=prefer_pod)


async def release(ctx: OperatorContext, session: SessionView, logger: kopf.Logger) -> None:
    """Free the session's slot; its pod's worker gets `close` through its stream (the one teardown path)."""
    ctx.sessions.forget((session.namespace, session.name))
    if session.spec is None:
        return
    pid = PoolId(session.namespace, session.spec.pool_ref)
    state = ctx.pools[pid]
    async with state.lock:
        await ctx.store.release(pid, session.name, reason="deleted")
    state.kick()  # a waiting session may take the slot
    logger.info(f"session {session.name} released")
