"""The placement port: what the worker asks of, and tells, the placement store, as one typed capability.

Two implementations: `PodLink` (worker/pod_link.py), the pool's Redis placement store, and `Standalone`
(here), a worker without one. Standalone mode is written once, as `Standalone`'s answers, rather than as a
branch at every call site: every session may be served (no record, no token), nothing is registered or
recorded, no other pod exists to pull from or point at, and no event ever arrives (so no closed book waits
for one). The worker's code asks the port and never which implementation it holds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ardiff.kv.records import PodEvent, SessionBinding, SessionRecord, token_sha256
from ardiff.wire import ServedBy
from ardiff.worker.background import Background
from ardiff.worker.settings import WorkerSettings

EventHandler = Callable[[PodEvent], Awaitable[None]]


def bearer_token_sha256(authorization: str | None) -> str | None:
    """`token_sha256` of the bearer token in an `Authorization` header, or None without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token_sha256(token.strip())


@dataclass(frozen=True)
class Membership:
    """What a pod brings to its pool's placement when it joins (`PlacementPort.join`) and what it does while a
    member: its `capacity` in sessions, whether its evictions `exports` them (suspend rather than drop), the
    `tasks` its loops run in, what it does when fenced (a newer incarnation registered) and with each of its
    events, and the tiers' `sweep` (None: no tier to sweep)."""

    capacity: int
    exports: bool
    tasks: Background
    on_fenced: Callable[[], None]
    on_event: EventHandler
    sweep: Callable[[], Awaitable[None]] | None


class LocalSessions(Protocol):
    """What the placement checks need to know of the sessions on this pod (worker/pod_sessions.py)."""

    def slot_token(self, session_id: str) -> str | None:
        """The token hash a session holding a slot here was admitted with; None when it holds none."""
        ...

    def held_for_transfer(self, session_id: str) -> bool:
        """The session is kept in the runner for its new pod to pull (worker/transfer.py)."""
        ...


@runtime_checkable
class PlacementPort(Protocol):
    """This pod's side of the placement store (docs/contracts.md §2, §4); `pod` is this pod's name."""

    pod: str

    @property
    def served_by(self) -> ServedBy:
        """This pod and its epoch (0 until it registered; standalone always), named in every answer."""
        ...

    @property
    def registered(self) -> bool:
        """The pod may be placed on (it registered; always, standalone)."""
        ...

    async def join(self, membership: Membership) -> None:
        """Register with the runtime's capacity (`Membership`), then keep the lease alive, consume the pod's
        events and run the tiers' sweep (if any) in its tasks."""
        ...

    def report_compute(self, compute_fps: float, tick_ms: float) -> None:
        """The frames/s this pod may be asked for and its time per full chunk (issue 25), for its record."""
        ...

    async def set_draining(self) -> None:
        """No new placements on this pod (a registered one; raises when the store cannot be told)."""
        ...

    async def close(self) -> None: ...

    async def placed_record(
        self, session_id: str, authorization: str | None, local: LocalSessions, *, any_state: bool = False
    ) -> SessionRecord | None:
        """The session's record when it may be served here (None standalone); 401/410/421/503 otherwise."""
        ...

    async def misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        """A draining pod points a session's client at the pod it moved to (421)."""
        ...

    async def moved_away(self, session_ids: list[str]) -> list[str]:
        """Those of `session_ids` the store now places elsewhere (a missing record is no verdict)."""
        ...

    def may_list_sessions(self, authorization: str | None) -> bool:
        """Whether `GET /v1/sessions` names the sessions (401 for a wrong credential)."""
        ...

    def keeps_closed_book(self, held_here: bool, record: SessionRecord | None) -> bool:
        """Whether a DELETEd session keeps its closed book (410 until the store's `close` event arrives)."""
        ...

    def is_here(self, record: SessionRecord | SessionBinding) -> bool: ...

    async def session(self, session: str) -> SessionRecord | None:
        """The session's record but its image (`image` empty: read once per session, `session_image`)."""
        ...

    async def session_image(self, session: str) -> bytes | None:
        """The session's first image (empty: none); None when it is no longer bound to a pod; `NotReady`
        when the store cannot be read."""
        ...

    async def bindings(self, sessions: Iterable[str]) -> dict[str, SessionBinding | None]: ...

    async def endpoint_of(self, pod: str) -> str | None: ...

    async def touch(self, session: str, *, chunk_index: int, reset_done: bool) -> None: ...

    async def mark_reset_required(self, session: str) -> None: ...

    async def mark_suspended(
        self, session: str, *, tier: str, location: str, size: int, chunk_index: int
    ) -> None: ...

    async def relocate_export(self, session: str, *, from_location: str, to_location: str) -> bool: ...

    async def request_resume(self, session: str) -> None: ...

    async def resumed(self, session: str, *, note: str = "") -> None: ...

    async def note_snapshot(self, session: str, *, location: str, chunk_index: int) -> None: ...

    async def note_history(
        self, session: str, *, kept: list[int], chunk_index: int | None = None
    ) -> None: ...


class Standalone:
    """A worker without a placement store (`redis_url` unset): the port's answers for that mode (the module's
    docstring). Nothing placed here has a record, so the placement-mode paths (suspend, resume, transfers,
    sweeps) find nothing to do."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.pod = settings.pod_name

    @property
    def served_by(self) -> ServedBy:
        return ServedBy(self.pod, 0)

    @property
    def registered(self) -> bool:
        return True  # ready once the runtime is loaded

    async def join(self, membership: Membership) -> None:
        return None  # nobody to register with: no lease, no events, no tier files of other pods to sweep

    def report_compute(self, compute_fps: float, tick_ms: float) -> None:
        return None

    async def set_draining(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def placed_record(
        self, session_id: str, authorization: str | None, local: LocalSessions, *, any_state: bool = False
    ) -> SessionRecord | None:
        return None  # every session may be served, nothing is authenticated

    async def misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        return None

    async def moved_away(self, session_ids: list[str]) -> list[str]:
        return []

    def may_list_sessions(self, authorization: str | None) -> bool:
        return True  # nothing is authenticated standalone (issue 23 item 10)

    def keeps_closed_book(self, held_here: bool, record: SessionRecord | None) -> bool:
        return False  # no `close` event ever comes: the id is free again at once

    def is_here(self, record: SessionRecord | SessionBinding) -> bool:
        return False

    async def session(self, session: str) -> SessionRecord | None:
        return None

    async def session_image(self, session: str) -> bytes:
        return b""

    async def bindings(self, sessions: Iterable[str]) -> dict[str, SessionBinding | None]:
        return dict.fromkeys(sessions)

    async def endpoint_of(self, pod: str) -> str | None:
        return None

    async def touch(self, session: str, *, chunk_index: int, reset_done: bool) -> None:
        return None

    async def mark_reset_required(self, session: str) -> None:
        return None  # the local book enforces the reset

    async def mark_suspended(
        self, session: str, *, tier: str, location: str, size: int, chunk_index: int
    ) -> None:
        return None

    async def relocate_export(self, session: str, *, from_location: str, to_location: str) -> bool:
        return False

    async def request_resume(self, session: str) -> None:
        return None

    async def resumed(self, session: str, *, note: str = "") -> None:
        return None

    async def note_snapshot(self, session: str, *, location: str, chunk_index: int) -> None:
        return None

    async def note_history(self, session: str, *, kept: list[int], chunk_index: int | None = None) -> None:
        return None
