"""The client's exceptions: a worker's error answers, one class per wire code (`ardiff.wire.ErrorCode`), and
the client's own (an unreachable worker, a session that failed or was not ready in time, the Kubernetes API's
refusals)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ardiff.errors import ArdiffError
from ardiff.wire import ErrorCode, WireError


class WorkerAPIError(WireError):
    """An error answer of a worker (`{"error": {code, message, type, param, ...extras}}`). A subclass per
    `ErrorCode` (`ardiff.wire`: its code, status and `retryable`, the codes `SessionClient` retries within
    `retry_seconds`); an answer with an unknown code or no envelope is a `WorkerAPIError` itself."""

    code = "worker_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        extra: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status  # type: ignore[misc]  # the answer's own status, if it differs
        self.param = param
        self.extra = dict(extra or {})
        self.retry_after = retry_after  # seconds, from the answer's `Retry-After`


class InvalidTick(WorkerAPIError, wire=ErrorCode.INVALID_TICK):
    """The tick's body or a header is malformed; `param` names the field."""


class Unauthorized(WorkerAPIError, wire=ErrorCode.UNAUTHORIZED):
    """The token is not the session's (or the session does not exist)."""


class UnknownSession(WorkerAPIError, wire=ErrorCode.UNKNOWN_SESSION):
    """No such session on that worker."""


class ChunkOutOfOrder(WorkerAPIError, wire=ErrorCode.CHUNK_OUT_OF_ORDER):
    """The tick's `chunk_index` is not the next one: `expected_chunk_index` is."""

    @property
    def expected_chunk_index(self) -> int:
        return int(self.extra["expected_chunk_index"])


class ResetRequired(WorkerAPIError, wire=ErrorCode.RESET_REQUIRED):
    """The session's KV cache is gone (pod lost, evicted, failed forward): call `reset()` to start over."""


class TickInProgress(WorkerAPIError, wire=ErrorCode.TICK_IN_PROGRESS):
    """Another tick of the session is under way."""


class MaxChunksReached(WorkerAPIError, wire=ErrorCode.MAX_CHUNKS_REACHED):
    """The session reached its `max_chunks`."""

    @property
    def max_chunks(self) -> int:
        return int(self.extra["max_chunks"])


class SessionEvicted(WorkerAPIError, wire=ErrorCode.SESSION_EVICTED):
    """The session left this pod (evicted or its pod lost); it is re-placed, then needs a reset."""


class SessionClosed(WorkerAPIError, wire=ErrorCode.SESSION_CLOSED):
    """The session was closed."""


class BodyTooLarge(WorkerAPIError, wire=ErrorCode.BODY_TOO_LARGE):
    """The request body exceeds the worker's limit."""


class Misdirected(WorkerAPIError, wire=ErrorCode.MISDIRECTED):
    """The session is on another pod: `endpoint` (`SessionClient` follows it); None when the answer came
    through a front door, which names no Pod (the same base is asked again)."""

    @property
    def endpoint(self) -> str | None:
        endpoint = self.extra.get("endpoint")
        return str(endpoint) if endpoint else None


class AtCapacity(WorkerAPIError, wire=ErrorCode.AT_CAPACITY):
    """The worker holds as many sessions as it can."""


class TooManyRequests(WorkerAPIError, wire=ErrorCode.TOO_MANY_REQUESTS):
    """The session has as many requests under way on its worker as it takes at once (final for this one)."""


class NotReady(WorkerAPIError, wire=ErrorCode.NOT_READY):
    """The worker is loading or draining, or cannot reach the placement store (retryable)."""


class PlacementRecovering(WorkerAPIError, wire=ErrorCode.PLACEMENT_RECOVERING):
    """The placement store lost its data and the session's binding is being rebuilt (retryable)."""


class Resuming(WorkerAPIError, wire=ErrorCode.RESUMING):
    """The session is suspended and is being resumed (retryable; its new pod may then answer 421)."""


class Rewound(WorkerAPIError, wire=ErrorCode.REWOUND):
    """The session resumed from an older snapshot: it continues at `expected_chunk_index`; chunks the caller
    holds from that index on are superseded (ticking again with the same controls gives the same frames)."""

    @property
    def expected_chunk_index(self) -> int:
        return int(self.extra["expected_chunk_index"])


class ChunkNotKept(WorkerAPIError, wire=ErrorCode.CHUNK_NOT_KEPT):
    """A rewind named a chunk the session does not keep (its message lists the kept ones; a session keeps
    chunks only with `spec.history.keepChunks`, and never chunk 0: that is a `reset()`)."""

    @property
    def kept_chunks(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.extra["kept_chunks"])


class ForwardFailed(WorkerAPIError, wire=ErrorCode.FORWARD_FAILED):
    """The forward failed; the worker closed the session, which now needs a reset."""


# Every class above, by its code (a test checks it covers `ErrorCode`, and the worker's answers, exactly).
ERRORS_BY_CODE: dict[str, type[WorkerAPIError]] = {cls.code: cls for cls in WorkerAPIError.__subclasses__()}


class WorkerUnreachable(ArdiffError):
    """No answer from the endpoint (its pod is gone or restarting); the session's status says where next."""

    code = "worker_unreachable"


class SessionFailed(ArdiffError):
    """The session resource reached a phase it does not leave by itself (`Failed`, `Expired`)."""

    code = "session_failed"


class WaitTimeout(ArdiffError):
    code = "timeout"


class KubernetesError(ArdiffError):
    """The Kubernetes API refused a request (`status` is its HTTP status; 422 for an invalid resource)."""

    code = "kubernetes_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SessionNotFound(KubernetesError):
    code = "session_not_found"


class InvalidSession(KubernetesError):
    code = "invalid_session"


def error_from_response(response: httpx.Response) -> WorkerAPIError:
    """The typed exception of an error answer; an answer without the envelope keeps its status."""
    try:
        envelope = response.json()["error"]
        code, message = str(envelope["code"]), str(envelope["message"])
    except (ValueError, KeyError, TypeError):
        text = response.text[:200].strip() or response.reason_phrase
        return WorkerAPIError(f"HTTP {response.status_code}: {text}", status=response.status_code)
    extra = {k: v for k, v in envelope.items() if k not in ("code", "message", "type", "param")}
    cls = ERRORS_BY_CODE.get(code, WorkerAPIError)
    retry_after = response.headers.get("retry-after", "")
    error = cls(
        message,
        status=response.status_code,
        param=envelope.get("param"),
        extra=extra,
        retry_after=float(retry_after) if retry_after.isdigit() else None,
    )
    if cls is WorkerAPIError:
        error.code = code
    return error
