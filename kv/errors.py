"""Typed errors of the placement store, and the status codes its Lua scripts return (kv/lua/_lib.lua).

Every error subclasses `ardiff.errors.ArdiffError` with a stable `code`; the worker maps them to HTTP statuses
(`SessionNotHere` → 410/421 by `state`, `UnknownSession` → 404, `PodFenced` → the worker stops serving).
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from ardiff.errors import ArdiffError

if TYPE_CHECKING:
    from ardiff.kv.records import SessionState


class ScriptStatus(IntEnum):
    """First element of every script reply; must match the constants at the top of kv/lua/_lib.lua."""

    OK = 0
    STALE_PLAN = 1  # internal: the call did not declare every key it needs; retried with them
    POD_FENCED = 2
    SESSION_NOT_HERE = 3
    UNKNOWN_SESSION = 4
    UNKNOWN_POD = 5
    CAPACITY_BELOW_USED = 6


class PlacementError(ArdiffError):
    code = "placement_error"


class InvalidPlacementArgument(PlacementError, ValueError):
    """A bad argument, rejected before anything is sent to Redis."""

    code = "invalid_argument"


class InvalidRedisUrl(PlacementError, ValueError):
    code = "invalid_redis_url"


class PodFenced(PlacementError):
    """A newer incarnation of the pod registered, or this one's lease lapsed and the operator reaped it
    (`current_epoch` 0): this one must stop serving its sessions."""

    code = "pod_fenced"

    def __init__(self, pod: str, epoch: int, current_epoch: int) -> None:
        why = (
            f"the pod's record has epoch {current_epoch}"
            if current_epoch
            else "its lease lapsed and the operator reaped it (its sessions were placed again)"
        )
        super().__init__(f"pod {pod} epoch {epoch} is fenced: {why}")
        self.pod = pod
        self.epoch = epoch
        self.current_epoch = current_epoch


class SessionNotHere(PlacementError):
    """The session exists but is not placed on the calling pod incarnation.

    `state` says why (evicted/closed → 410, lost → reset on re-placement, placed elsewhere → 421 with
    `endpoint`, the owning pod's endpoint, or "" when unknown).
    """

    code = "session_not_here"

    def __init__(self, session: str, state: SessionState, pod: str, endpoint: str = "") -> None:
        where = f"placed on pod {pod}" if state == "placed" else f"{state} (pod {pod or '-'})"
        super().__init__(f"session {session} is not here: it is {where}")
        self.session = session
        self.state = state
        self.pod = pod
        self.endpoint = endpoint


class UnknownSession(PlacementError):
    """The session has no placement record: the store's condition, not the worker's 404 answer of that
    code (`ardiff.wire.ErrorCode.UNKNOWN_SESSION`); the worker decides what a caller sees (contracts §4)."""

    code = "unknown_session"

    def __init__(self, session: str) -> None:
        super().__init__(f"session {session} has no placement record")
        self.session = session


class UnknownPod(PlacementError):
    code = "unknown_pod"

    def __init__(self, pod: str) -> None:
        super().__init__(f"pod {pod} is not registered")
        self.pod = pod


class CapacityBelowUsed(PlacementError):
    code = "capacity_below_used"

    def __init__(self, pod: str, capacity: int, used: int) -> None:
        super().__init__(f"pod {pod} capacity must be >= its {used} placed sessions, got {capacity}")
        self.pod = pod
        self.capacity = capacity
        self.used = used


class PlacementContention(PlacementError):
    """A script kept finding new keys to declare (the pool changed under it on every attempt)."""

    code = "placement_contention"


class FunctionsNotLoaded(PlacementError):
    """The Redis node that holds the pool has no copy of this version's function library (kv/scripts.py
    `Library`): it restarted empty, or a failover or resharding put the pool on a node that never had it. Only
    the operator loads libraries (they are global to a node); it does so at startup and in every pool round.
    Nothing was run: retrying once the operator has loaded it is safe, and the worker and the front door
    answer a retryable 503 meanwhile (never a lost session)."""

    code = "placement_functions_not_loaded"

    def __init__(self, library: str, operation: str) -> None:
        super().__init__(
            f"placement {operation}: Redis has no function library {library} (restarted empty or failed over "
            f"to a node without it); the operator loads it again within a round: retry"
        )
        self.library, self.operation = library, operation


class NotReplicated(PlacementError):
    """A write was applied on the master but fewer replicas than asked acknowledged it within the timeout
    (`wait_replicas`): a failover now may lose it. The operation itself succeeded; repeating it is safe (every
    script but `register_pod` and `evict_lru` is idempotent) and waits for the replicas again."""

    code = "not_replicated"

    def __init__(self, operation: str, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(
            f"placement {operation} was applied on the master but only {acked} of {wanted} replicas "
            f"acknowledged it within {timeout_ms} ms: a failover may lose it"
        )
        self.operation, self.acked, self.wanted = operation, acked, wanted
