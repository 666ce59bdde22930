"""The wire vocabulary, declared once: the worker's error codes with their HTTP status and retryability (and
the error envelope they travel in), the session stream's close codes, the custom resources' API group,
version, kinds and plurals, the media types a tick answers in (with the `Accept` header's parsing), and the
front door's URL layout and header (issue 37).

The worker raises `WireError` subclasses (`ardiff.worker.errors`), the client raises its own
(`ardiff.client`), each naming its `ErrorCode` (`class Rewound(WorkerError, wire=ErrorCode.REWOUND)`) instead
of repeating the code and status; the operator and the client take the resource names from here. Only the
standard library and the shared error base are imported: every component can depend on this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from http import HTTPStatus
from typing import Any, ClassVar

from ardiff.errors import ArdiffError

GROUP = "ardiffusion.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
POOL_KIND = "ARDiffusionWorkerPool"
POOL_PLURAL = "ardiffusionworkerpools"
SESSION_KIND = "ARDiffusionSession"
SESSION_PLURAL = "ardiffusionsessions"

OCTET_STREAM = "application/octet-stream"  # raw frames (and DreamZero's raw actions + frames)
MP4 = "video/mp4"
JSON = "application/json"

RETRY_AFTER_SECONDS = 1  # the `Retry-After` of every retryable answer (docs/contracts.md §4)

# The front door (issue 37, docs/contracts.md "Front door"): a session's `status.url` is
# `<public URL>/pools/<namespace>/<pool>`, and every session route goes under it as under `status.endpoint`.
FRONT_DOOR_POOLS = "pools"
# Set by the front door on every request it forwards (a client's own copy is replaced): the worker then names
# no Pod address in its answers (a `misdirected` error's `endpoint`).
FRONT_DOOR_HEADER = "ardiff-front-door"


# Every answer of a session route names the Pod and its incarnation (epoch) that served it, so a history of
# answers tells a stale Pod's from its successor's (issue 40): `<pod>/<epoch>`, epoch 0 before the Pod
# registered and on a standalone worker. The streams carry the same in each chunk's metadata (`served_by`).
SERVED_BY_HEADER = "ardiff-served-by"


@dataclass(frozen=True)
class ServedBy:
    """The Pod and the epoch (its incarnation in the placement store; 0: none) that answered."""

    pod: str
    epoch: int

    def __post_init__(self) -> None:
        if not self.pod or "/" in self.pod:
            raise ValueError(f"served-by pod must be a non-empty name without '/', got {self.pod!r}")
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise ValueError(f"served-by epoch must be a non-negative integer, got {self.epoch!r}")

    @property
    def header(self) -> str:
        return f"{self.pod}/{self.epoch}"

    @classmethod
    def parse(cls, value: str) -> ServedBy:
        """From a `SERVED_BY_HEADER` value; ValueError when it is not one."""
        pod, slash, epoch = value.rpartition("/")
        if not slash or not epoch.isdigit():
            raise ValueError(f"{SERVED_BY_HEADER} must be <pod>/<epoch>, got {value!r}")
        return cls(pod, int(epoch))


def front_door_url(public_url: str, namespace: str, pool: str) -> str:
    """The base URL of a pool's sessions at the front door whose public URL is `public_url`."""
    return f"{public_url.rstrip('/')}/{FRONT_DOOR_POOLS}/{namespace}/{pool}"


class ErrorCode(Enum):
    """Every error code the worker's tick API answers with (docs/contracts.md §4): code, HTTP status, and
    whether a client may retry it (exactly the 503s, each answered with `Retry-After`)."""

    INVALID_TICK = ("invalid_tick", 400)
    UNAUTHORIZED = ("unauthorized", 401)
    UNKNOWN_SESSION = ("unknown_session", 404)
    CHUNK_NOT_KEPT = ("chunk_not_kept", 404)
    CHUNK_OUT_OF_ORDER = ("chunk_out_of_order", 409)
    RESET_REQUIRED = ("reset_required", 409)
    TICK_IN_PROGRESS = ("tick_in_progress", 409)
    MAX_CHUNKS_REACHED = ("max_chunks_reached", 409)
    REWOUND = ("rewound", 409)
    SESSION_EVICTED = ("session_evicted", 410)
    SESSION_CLOSED = ("session_closed", 410)
    BODY_TOO_LARGE = ("body_too_large", 413)
    MISDIRECTED = ("misdirected", 421)
    AT_CAPACITY = ("at_capacity", 429)
    TOO_MANY_REQUESTS = ("too_many_requests", 429)
    FORWARD_FAILED = ("forward_failed", 500)
    NOT_READY = ("not_ready", 503, True)
    PLACEMENT_RECOVERING = ("placement_recovering", 503, True)
    RESUMING = ("resuming", 503, True)

    def __init__(self, code: str, status: int, retryable: bool = False) -> None:
        self.code = code
        self.status = status
        self.retryable = retryable


# The session stream (WebSocket, docs/contracts.md §4): a final error closes it with CLOSE_ERROR_BASE + its
# status and the code as the reason; `superseded` (409) is the stream's own: a newer connection took over.
CLOSE_NORMAL = 1000
CLOSE_ERROR_BASE = 4000
CLOSE_SUPERSEDED = CLOSE_ERROR_BASE + 409
CLOSE_MISDIRECTED = CLOSE_ERROR_BASE + ErrorCode.MISDIRECTED.status


class WireError(ArdiffError):
    """An error answer of the worker's API, on either side of the wire. A subclass names its code once,
    `class X(Base, wire=ErrorCode.X)`, and gets its `code`, `status` and `retryable` from it."""

    status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, *, wire: ErrorCode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if wire is not None:
            cls.code, cls.status, cls.retryable = wire.code, wire.status, wire.retryable


def error_envelope(
    code: str, status: int, message: str, *, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    """`{"error": {code, message, type, param, ...extra}}`: every error answer's body (docs/contracts.md §4),
    the worker's and the front door's; `type` is the status's phrase in CamelCase."""
    phrase = HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    return {"error": {"code": code, "message": message, "type": phrase, "param": param, **extra}}


def parse_accept(accept: str | None) -> list[tuple[float, str]]:
    """The (quality, lower-cased media type) pairs of an `Accept` header, in the header's order; a missing
    `q` is 1, an unreadable one 0. Each caller ranks them against what it offers."""
    offered: list[tuple[float, str]] = []
    for part in (accept or "").split(","):
        media, *params = (item.strip() for item in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        offered.append((quality, media.lower()))
    return offered
