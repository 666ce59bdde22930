"""The worker's error taxonomy (docs/contracts.md §4): one class per code, each with its HTTP status.

`create_app()` maps every `WorkerError` to the envelope `{"error": {code, message, type, param, ...extra}}`
in one place; nothing else in the worker chooses a status code.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, ClassVar

from ardiff.errors import ArdiffError


class WorkerError(ArdiffError):
    status: ClassVar[int] = 500
    code = "internal_error"
    # Set on the codes a client may retry (docs/contracts.md §4): the answer carries `Retry-After`.
    retry_after_seconds: ClassVar[int | None] = None

    def __init__(self, message: str, *, param: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.param = param
        self.extra = extra

    def envelope(self) -> dict[str, Any]:
        phrase = HTTPStatus(self.status).phrase.replace(" ", "").replace("-", "")
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "type": phrase,
                "param": self.param,
                **self.extra,
            }
        }


class InvalidTick(WorkerError):
    status = 400
    code = "invalid_tick"


class Unauthorized(WorkerError):
    status = 401
    code = "unauthorized"


class UnknownSession(WorkerError):
    status = 404
    code = "unknown_session"


class ChunkOutOfOrder(WorkerError):
    status = 409
    code = "chunk_out_of_order"

    def __init__(self, message: str, *, expected_chunk_index: int) -> None:
        super().__init__(message, param="chunk_index", expected_chunk_index=expected_chunk_index)


class ResetRequired(WorkerError):
    status = 409
    code = "reset_required"


class TickInProgress(WorkerError):
    status = 409
    code = "tick_in_progress"


class MaxChunksReached(WorkerError):
    status = 409
    code = "max_chunks_reached"

    def __init__(self, message: str, *, max_chunks: int) -> None:
        super().__init__(message, param="chunk_index", max_chunks=max_chunks)


class SessionEvicted(WorkerError):
    status = 410
    code = "session_evicted"


class SessionClosed(WorkerError):
    status = 410
    code = "session_closed"


class BodyTooLarge(WorkerError):
    status = 413
    code = "body_too_large"


class Misdirected(WorkerError):
    status = 421
    code = "misdirected"

    def __init__(self, message: str, *, endpoint: str) -> None:
        super().__init__(message, endpoint=endpoint)


class AtCapacity(WorkerError):
    status = 429
    code = "at_capacity"


class TooManyRequests(WorkerError):
    """More requests for one session (and credential) are under way on this worker than it takes at once."""

    status = 429
    code = "too_many_requests"


class NotReady(WorkerError):
    status = 503
    code = "not_ready"
    retry_after_seconds = 1


class PlacementRecovering(WorkerError):
    """The placement store has no record this worker can trust for a session it may hold: Redis lost its
    data and the operator has not rebuilt the binding yet. Retryable; never a 404/410 for a live session."""

    status = 503
    code = "placement_recovering"
    retry_after_seconds = 1


class Resuming(WorkerError):
    """The session is suspended (its state lies in the shared tier) or being suspended: this tick asked for it
    to be resumed; retry, and follow the 421 that names its new pod."""

    status = 503
    code = "resuming"
    retry_after_seconds = 1


class Rewound(WorkerError):
    """The session resumed from a snapshot older than the chunk asked for: continue from the chunk named."""

    status = 409
    code = "rewound"

    def __init__(self, message: str, *, expected_chunk_index: int) -> None:
        super().__init__(message, param="chunk_index", expected_chunk_index=expected_chunk_index)


class ForwardFailed(WorkerError):
    status = 500
    code = "forward_failed"


class ModelUnavailable(ArdiffError):
    """The model could not be prepared or loaded (CLI/startup error, not an HTTP answer)."""

    code = "model_unavailable"


class SessionExportError(ArdiffError):
    """Export or import of a session's state failed (docs/contracts.md §9); a refused or failed import leaves
    the runtime as it was. Not an HTTP answer of the tick route."""

    code = "export_error"


class ExportUnsupported(SessionExportError):
    """This runtime's model family cannot export its sessions: they keep reset-on-evict."""

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
