"""The placement guard: whether a request may be served on this pod, and what the placement store's changes
mean for the sessions held here (docs/contracts.md §4).

It asks the pod's placement port whether a session may be served here (`placed_record`: its record and
token, one Redis read; a refusal never tells which names exist; a session that lives elsewhere is pointed at
its pod, 421, and a suspended one's tick at its resume), counts the requests under way per session (429 past
`MAX_REQUESTS_PER_SESSION`), records each tick's progress in the store (`touch`, `note_history`: the store's
refusals become answers) and releases what the store took away (`on_release`, the pod's `close`/`evict`
events). Sessions are admitted and released by their owner (worker/pod_sessions.py), the only thing the
guard talks to; exporting and importing are the continuity's (worker/continuity.py).
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ardiff.kv import errors as placement
from ardiff.kv.records import SessionRecord
from ardiff.worker.errors import NotReady, SessionEvicted, TooManyRequests
from ardiff.worker.placement_port import bearer_token_sha256
from ardiff.worker.pod_sessions import PodSessions

log = logging.getLogger(__name__)

# Requests of one session (and credential) under way at once: a client has a tick in flight and perhaps a
# retry; more are refused (429) before they cost a Redis read, a wait for a migration or a decode.
MAX_REQUESTS_PER_SESSION = 4


class PlacementGuard:
    """The checks and records of the module's docstring, for one pod's sessions, through their placement
    port (the store's, or standalone's, where every session may be served and nothing is recorded)."""

    def __init__(self, sessions: PodSessions) -> None:
        self.sessions = sessions
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()

    # ---------------------------------------------------------------- placement checks

    async def placed_record(
        self, session_id: str, authorization: str | None, *, any_state: bool = False
    ) -> SessionRecord | None:
        """The session's record when it may be served here (`PlacementPort.placed_record`: None standalone);
        401/410/421 otherwise. `any_state` lets a DELETE of an evicted or closed session succeed (close is
        idempotent)."""
        sessions = self.sessions
        return await sessions.placement.placed_record(
            session_id, authorization, sessions, any_state=any_state
        )

    async def misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        """A draining worker still points a session's client at the pod it moved to (421), so that a migrated
        session's next tick reaches its new pod, which pulls it from here while this one waits to exit."""
        await self.sessions.placement.misdirect_while_draining(session_id, authorization)

    @contextlib.contextmanager
    def counted(self, session_id: str, authorization: str | None) -> Iterator[None]:
        """At most `MAX_REQUESTS_PER_SESSION` requests of a session under way; more are 429 at once. Counted
        per presented credential, so requests with a wrong token (401 after one Redis read) never crowd out
        the session's own client."""
        key = (session_id, bearer_token_sha256(authorization) or "")
        if self._requests[key] >= MAX_REQUESTS_PER_SESSION:
            raise TooManyRequests(
                f"session {session_id!r} has {MAX_REQUESTS_PER_SESSION} requests under way on this worker"
            )
        self._requests[key] += 1
        try:
            yield
        finally:
            self._requests[key] -= 1
            if not self._requests[key]:
                del self._requests[key]

    # ---------------------------------------------------------------- the store's releases

    async def on_release(self, event: Any) -> None:
        """A `close`/`evict` entry of this pod's stream: release the session's state in the runner."""
        store = self.sessions.placement
        binding = (await store.bindings([event.session]))[event.session]
        here = binding is not None and store.is_here(binding)
        book = self.sessions.books.get(event.session)
        if event.kind == "evict" and here and not binding.reset_required and book is not None:
            # Re-placed here and reset since the eviction: the event is older than the session's state.
            log.info("ignoring stale evict of %s", event.session)
            return
        await self.sessions.release(event.session, event.kind, keep=here)

    # ---------------------------------------------------------------- Redis writes after a tick

    async def touch(self, session_id: str, *, chunk_index: int, reset_done: bool) -> None:
        async with self._recording(session_id, "tick"):
            await self.sessions.placement.touch(session_id, chunk_index=chunk_index, reset_done=reset_done)

    async def note_history(self, session_id: str, kept: list[int], *, chunk_index: int | None = None) -> None:
        """The chunk boundaries this pod keeps of the session (issue 26), and a rewind's `chunk_index`."""
        async with self._recording(session_id, "kept chunks"):
            await self.sessions.placement.note_history(session_id, kept=kept, chunk_index=chunk_index)

    @contextlib.asynccontextmanager
    async def _recording(self, session_id: str, what: str) -> AsyncIterator[None]:
        """A write of the session's progress (`what`) to the placement store, after the work it records: its
        refusals as answers."""
        try:
            yield
        except placement.UnknownSession:
            # Redis lost the record during the work: it stands (the KV and the book are here), the operator
            # rebuilds the binding and the next tick's write records the progress.
            log.warning(
                "no record of session %s to note its %s in (the store lost its data)", session_id, what
            )
        except placement.SessionNotHere:
            await self.sessions.release(session_id, "evict")
            raise SessionEvicted(f"session {session_id!r} was moved off this pod during its {what}") from None
        except placement.PodFenced:
            self.sessions.fence()
            raise NotReady("this pod was fenced (a newer incarnation, or its lease was reaped)") from None
        except Exception as exc:  # Redis away or not answering: the chunk stands, a retry of it replays it
            log.warning("could not record session %s's %s in the placement store: %s", session_id, what, exc)
            raise NotReady(
                f"placement store unavailable ({type(exc).__name__}); the {what} stands: retry the same "
                "request"
            ) from exc
