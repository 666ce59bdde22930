"""The worker's error taxonomy (docs/contracts.md §4): one class per wire code (`ardiff.wire.ErrorCode`: the
code, its HTTP status and retryability are declared there), and the errors that are no HTTP answer.

`create_app()` maps every `WorkerError` to the envelope `{"error": {code, message, type, param, ...extra}}`
in one place; nothing else in the worker chooses a status code.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ardiff.errors import ArdiffError
from ardiff.wire import RETRY_AFTER_SECONDS, ErrorCode, WireError, error_envelope


class WorkerError(WireError):
    """An answer of the worker's HTTP API; a subclass per `ErrorCode` (`ardiff.wire`: its code, status and
    retryability). Not raised as itself but for an unexpected failure (500 `internal_error`)."""

    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.param = param
        self.extra = extra

    @property
    def retry_after_seconds(self) -> int | None:
        """The answer's `Retry-After`, on the codes a client may retry (docs/contracts.md §4)."""
        return RETRY_AFTER_SECONDS if self.retryable else None

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.code, self.status, self.message, param=self.param, **self.extra)


class InvalidTick(WorkerError, wire=ErrorCode.INVALID_TICK):
    """The tick's body or a header is malformed; `param` names the field."""


class Unauthorized(WorkerError, wire=ErrorCode.UNAUTHORIZED):
    """No valid bearer token for the session (also an id with no session: no oracle of names)."""


class UnknownSession(WorkerError, wire=ErrorCode.UNKNOWN_SESSION):
    """No such session on this worker (standalone, and the pool-token export route, only)."""


class ChunkNotKept(WorkerError, wire=ErrorCode.CHUNK_NOT_KEPT):
    """A rewind (or a fork's pull) names a chunk boundary this pod does not keep: `kept_chunks` are the
    ones it does."""

    def __init__(self, message: str, *, kept_chunks: list[int]) -> None:
        super().__init__(message, param="chunk", kept_chunks=kept_chunks)


class ChunkOutOfOrder(WorkerError, wire=ErrorCode.CHUNK_OUT_OF_ORDER):
    """The tick's `chunk_index` is not the next one: `expected_chunk_index` is."""

    def __init__(self, message: str, *, expected_chunk_index: int) -> None:
        super().__init__(message, param="chunk_index", expected_chunk_index=expected_chunk_index)


class ResetRequired(WorkerError, wire=ErrorCode.RESET_REQUIRED):
    """The session's KV is gone: only a reset tick (chunk 0) continues it."""


class TickInProgress(WorkerError, wire=ErrorCode.TICK_IN_PROGRESS):
    """Another tick of the session is under way."""


class MaxChunksReached(WorkerError, wire=ErrorCode.MAX_CHUNKS_REACHED):
    """The session reached its `max_chunks`."""

    def __init__(self, message: str, *, max_chunks: int) -> None:
        super().__init__(message, param="chunk_index", max_chunks=max_chunks)


class SessionEvicted(WorkerError, wire=ErrorCode.SESSION_EVICTED):
    """The session left this pod (evicted, or moved during its tick)."""


class SessionClosed(WorkerError, wire=ErrorCode.SESSION_CLOSED):
    """The session was closed."""


class BodyTooLarge(WorkerError, wire=ErrorCode.BODY_TOO_LARGE):
    """The request body exceeds the worker's limit."""


# Set while a request that came through the front door is served (issue 37: its `ardiff-front-door` header,
# which Envoy sets and a client cannot; worker/app.py `FrontDoorMark`): its answers name no Pod address.
VIA_FRONT_DOOR: ContextVar[bool] = ContextVar("ardiff_via_front_door", default=False)


class Misdirected(WorkerError, wire=ErrorCode.MISDIRECTED):
    """The session is placed on another pod: `endpoint` is the owning pod's, left out for a request that came
    through the front door (its client reconnects there, and no Pod address leaves the cluster)."""

    def __init__(self, message: str, *, endpoint: str) -> None:
        if VIA_FRONT_DOOR.get():
            super().__init__(message)
        else:
            super().__init__(message, endpoint=endpoint)


class AtCapacity(WorkerError, wire=ErrorCode.AT_CAPACITY):
    """This worker holds as many sessions as it can."""


class TooManyRequests(WorkerError, wire=ErrorCode.TOO_MANY_REQUESTS):
    """More requests for one session (and credential) are under way on this worker than it takes at once."""


class NotReady(WorkerError, wire=ErrorCode.NOT_READY):
    """The worker is loading or draining, or cannot reach the placement store."""


class PlacementRecovering(WorkerError, wire=ErrorCode.PLACEMENT_RECOVERING):
    """The placement store has no record this worker can trust for a session it may hold: Redis lost its
    data and the operator has not rebuilt the binding yet. Retryable; never a 404/410 for a live session."""


class Resuming(WorkerError, wire=ErrorCode.RESUMING):
    """The session is suspended (its state lies in the shared tier) or being suspended: this tick asked for it
    to be resumed; retry, and follow the 421 that names its new pod."""


class Rewound(WorkerError, wire=ErrorCode.REWOUND):
    """The session resumed from a snapshot older than the chunk asked for: continue from the chunk named."""

    def __init__(self, message: str, *, expected_chunk_index: int) -> None:
        super().__init__(message, param="chunk_index", expected_chunk_index=expected_chunk_index)


class ForwardFailed(WorkerError, wire=ErrorCode.FORWARD_FAILED):
    """The forward failed; the session is closed, others keep working."""


class ModelUnavailable(ArdiffError):
    """The model could not be prepared or loaded (CLI/startup error, not an HTTP answer)."""

    code = "model_unavailable"


class SessionExportError(ArdiffError):
    """Export or import of a session's state failed (docs/contracts.md §9); a refused or failed import leaves
    the runtime as it was. Not an HTTP answer of the tick route."""

    code = "export_error"


class ExportUnsupported(SessionExportError):
    """This runtime's pipeline holds session state no family module knows: they keep reset-on-evict."""

    code = "export_unsupported"


class ExportNotIdle(SessionExportError):
    """No resident session of that id, or it is not at a tick boundary (a tick in flight)."""

    code = "export_not_idle"


class ExportCorrupt(SessionExportError):
    """Not a session export, an unknown version, a truncated stream, a checksum mismatch or a bad header."""

    code = "export_corrupt"


class ExportIdentityMismatch(SessionExportError):
    """The export was made by a worker of another model, pipeline, resolution, dtype, weights or KV layout."""

    code = "export_identity_mismatch"

    def __init__(self, differences: dict[str, tuple[Any, Any]]) -> None:
        listed = ", ".join(f"{k}: export {a!r} != worker {b!r}" for k, (a, b) in sorted(differences.items()))
        super().__init__(f"the export does not match this worker: {listed}")
        self.differences = differences


class ExportDuplicateSession(SessionExportError):
    code = "export_duplicate_session"


class ExportNoCapacity(SessionExportError):
    """The runtime holds as many sessions as it can, or has too few free KV blocks for this one."""

    code = "export_no_capacity"


class TransferFailed(SessionExportError):
    """A pod-to-pod transfer could not start or did not finish (source gone, refused, cut off); the importing
    worker falls back to the shared tier's copy (docs/contracts.md §4, "Transfer")."""

    code = "transfer_failed"
