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


class ForwardFailed(WorkerError):
    status = 500
    code = "forward_failed"


class ModelUnavailable(ArdiffError):
    """The model could not be prepared or loaded (CLI/startup error, not an HTTP answer)."""

    code = "model_unavailable"
