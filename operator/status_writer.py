"""The one writer of the statuses the operator owns: every session and pool status write goes through here,
with the Events of the session phase transitions a round writes.

A session's status reaches the API by one of two paths, both owned here. Its create handler's (admission:
`operator/sessions.py` builds it) goes into kopf's own patch of the object (`write_admission_status`); every
later one, from a pool round, is merge-patched through the `status` subresource (`write_status`). Both
remember what they wrote (`OperatorContext.remember_status`), so that a round reading a watch that lags
behind does not write it again (`previous_status`). The first path is kept rather than folded into the
second, which would change behaviour: kopf sends that patch once the handler has returned, after the
object's own patch with its progress annotations, and it carries the whole admitted status rather than
`status_patch`'s difference from an older one; a write from inside the handler would come before kopf
records the handler's outcome, and its failure would fail the handler (the admission is retried).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import kopf

from ardiff.kv.records import PodRecord, SessionBinding
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import POOLS, SESSIONS
from ardiff.operator.session_cache import SessionKey
from ardiff.operator.specs import Playout
from ardiff.operator.status import (
    Phase,
    Reason,
    SessionObservation,
    build_failed_status,
    build_session_status,
    rfc3339,
    status_patch,
)
from ardiff.operator.views import PodView, PoolView, SessionView

# The Event (type, reason) of entering each phase that is news.
EVENTS_ON_ENTERING = {
    Phase.LOST: ("Warning", "Lost"),
    Phase.EVICTED: ("Warning", "Evicted"),
    Phase.EXPIRED: ("Normal", "Expired"),
    Phase.FAILED: ("Warning", "Failed"),
}
# Phases a session leaves by resuming with its KV (an export or a snapshot) rather than a reset.
RESUMABLE_PHASES = (Phase.SUSPENDED, Phase.SUSPENDING, Phase.LOST)


def now_rfc3339() -> str:
    return rfc3339(int(time.time() * 1000))


def write_admission_status(
    ctx: OperatorContext, key: SessionKey, patch: kopf.Patch, status: dict[str, Any]
) -> None:
    """The create handler's status: into kopf's patch of the session, which kopf writes through the `status`
    subresource once the handler returns (after its own progress annotations); remembered like every write."""
    patch.status.update(status)
    ctx.sessions.remember_status(key, status)


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


def previous_status(ctx: OperatorContext, session: SessionView) -> dict[str, Any]:
    """The CR's status as last seen, updated with what we wrote since (the watch may lag behind)."""
    return {**session.status, **ctx.sessions.written_status.get((session.namespace, session.name), {})}


async def write_status(
    ctx: OperatorContext, session: SessionView, previous: Mapping[str, Any], desired: Mapping[str, Any]
) -> bool:
    """Patch the session's status if anything worth writing changed since `previous` (`previous_status`);
    True if a write happened."""
    key: SessionKey = (session.namespace, session.name)
    patch = status_patch(previous, desired, mirror_due=ctx.sessions.mirror_due(key))
    if patch is None:
        return False
    post_transition_event(session, previous, desired)
    if await ctx.kube.patch_status(SESSIONS, session.namespace, session.name, patch):
        ctx.sessions.remember_status(key, patch)
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
    default_playout: Playout | None = None,
    waiting_for_compute: Collection[str] = frozenset(),
    compute_utilisation: float = 0.0,
    url: str | None = None,
) -> int:
    """Derive and write the statuses of `sessions`. `default_playout`: their pool's (each session's own
    spec.playout fields win); `waiting_for_compute`: those `place` left pending for compute, under the pool's
    `compute_utilisation`; `url`: their pool's base URL at the front door (`OperatorConfig.session_url`)."""
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
            playout=session.spec.playout.resolve(default_playout or Playout()) if session.spec else None,
            compute_utilisation=compute_utilisation if session.name in waiting_for_compute else None,
            url=url,
        )
        previous = previous_status(ctx, session)
        desired = build_session_status(
            previous,
            obs,
            session=session.name,
            generation=session.generation,
            now=now,
            message=ctx.sessions.notes.pop(key, None),
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
        if status_patch(previous, desired, mirror_due=ctx.sessions.mirror_due(key)) is not None:
            changed.append(write(session, previous, desired))
    return sum(await asyncio.gather(*changed))


async def write_pool_status(ctx: OperatorContext, pool: PoolView, patch: Mapping[str, Any]) -> None:
    await ctx.kube.patch_status(POOLS, pool.namespace, pool.name, patch)
