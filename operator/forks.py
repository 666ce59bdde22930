"""Resolving a fork (issue 26: a session's `spec.forkFrom`) when it is first placed.

The parent must be an ARDiffusionSession of the same namespace, pool and family, placed, and keep the chunk
(default: its latest kept chunk) per its Redis record's `kept_chunks`. The child is then placed with
`fork_from` = that kept chunk's location and `prefer_pod` = the parent's pod, and takes the parent's seed,
prompt and image where its own spec leaves them out. Any refusal is an `AdmissionFailure` (the child ends
`Failed` with a Warning Event). The child gets no ownerReference to its parent: each outlives the other.
The parent's CR is looked up in the operator's sessions index (`SessionFinder`): the operator may list and
watch sessions, never `get` one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ardiff.kv.records import PoolId, SessionSpec, SessionState, kept_location
from ardiff.operator.admission import AdmissionFailure
from ardiff.operator.context import OperatorContext
from ardiff.operator.status import Reason
from ardiff.operator.views import SessionView

# (namespace, name, the pool to look in first) -> the session as the operator's index has it, None if absent.
SessionFinder = Callable[[str, str, str], SessionView | None]


async def fork_request(
    ctx: OperatorContext, session: SessionView, spec: SessionSpec, find_session: SessionFinder
) -> tuple[SessionSpec, str]:
    """The placement request of a session's first placement, and the pod to prefer: `spec` and "" when it is
    not a fork; else `spec` forking from its parent's kept chunk, and the parent's pod."""
    assert session.spec is not None
    fork = session.spec.fork_from
    if fork is None:
        return spec, ""
    if fork.session == session.name:
        raise AdmissionFailure(Reason.FORK_SOURCE_NOT_FOUND, "a session cannot fork from itself")
    parent = find_session(session.namespace, fork.session, session.spec.pool_ref)
    if parent is None or parent.spec is None:
        why = "no" if parent is None else "an invalid"
        raise AdmissionFailure(
            Reason.FORK_SOURCE_NOT_FOUND,
            f"spec.forkFrom.session: {why} ARDiffusionSession {fork.session!r} in {session.namespace}",
        )
    if parent.spec.pool_ref != session.spec.pool_ref or parent.spec.family != session.spec.family:
        raise AdmissionFailure(
            Reason.FORK_POOL_MISMATCH,
            f"parent {fork.session} is a {parent.spec.family} session of pool {parent.spec.pool_ref}, "
            f"this one a {session.spec.family} session of pool {session.spec.pool_ref}: a fork stays in its "
            "parent's pool and family",
        )
    record = await ctx.store.get_session(PoolId(session.namespace, parent.spec.pool_ref), fork.session)
    if record is None or record.state is not SessionState.PLACED:
        state = record.state.value if record is not None else "not placed yet"
        raise AdmissionFailure(
            Reason.CHUNK_NOT_KEPT,
            f"parent {fork.session} keeps no chunk: it is {state} (kept chunks live in the memory of the "
            "parent's pod, only while it is placed there)",
        )
    kept = record.kept_chunks
    chunk = fork.chunk if fork.chunk is not None else (kept[-1] if kept else None)
    if chunk is None or chunk not in kept:
        asked = "its latest kept chunk" if fork.chunk is None else f"chunk {fork.chunk}"
        held = f"it keeps {', '.join(map(str, kept))}" if kept else "it keeps none"
        if not kept and record.history_keep_chunks == 0:
            held += " (its spec.history.keepChunks is 0)"
        raise AdmissionFailure(
            Reason.CHUNK_NOT_KEPT,
            f"parent {fork.session} does not keep {asked}: {held}; chunk 0, a fresh session, is never kept",
        )
    child = dataclasses.replace(
        spec,
        fork_from=kept_location(record.pod, fork.session, chunk),
        seed=spec.seed if session.spec.seed is not None else record.seed,
        prompt=spec.prompt if session.spec.prompt is not None else record.prompt,
        image=spec.image if session.spec.image is not None else record.image,
    )
    return child, record.pod
