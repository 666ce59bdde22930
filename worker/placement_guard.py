"""The placement guard: whether a request may be served on this pod, and what the placement store's changes
mean for the sessions held here (docs/contracts.md §4).

It checks a session's record and token (`placed_record`: one Redis read; a refusal never tells which names
exist), points a session that lives elsewhere at its pod (421) and a suspended one's tick at its resume,
counts the requests under way per session (429 past `MAX_REQUESTS_PER_SESSION`), gives a session a slot
(`admit`, never more than capacity: the runner would evict silently, so sessions the store moved away are
released first), records each tick's progress (`touch`) and releases what the store took away (`release`,
the one teardown path for releases the client did not ask for, and `on_release`, the pod's `close`/`evict`
events). It reads and writes the session books, closes sessions in the runner on the forward thread, drops
the pod's exports of a released session (worker/exports.py) and held sessions it releases or needs the room
of (worker/transfer.py); exporting and importing are the continuity's (worker/continuity.py).
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ardiff.kv import errors as placement
from ardiff.kv.records import SessionRecord
from ardiff.worker.errors import (
    AtCapacity,
    NotReady,
    SessionEvicted,
    TooManyRequests,
)
from ardiff.worker.exports import Exports
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.placement_port import PlacementPort, bearer_token_sha256
from ardiff.worker.pod_state import ForwardThread, SessionBooks
from ardiff.worker.session_book import SessionBook, SessionStatus
from ardiff.worker.transfer import Transfer

log = logging.getLogger(__name__)

# Requests of one session (and credential) under way at once: a client has a tick in flight and perhaps a
# retry; more are refused (429) before they cost a Redis read, a wait for a migration or a decode.
MAX_REQUESTS_PER_SESSION = 4


class PlacementGuard:
    """The checks and releases of the module's docstring, for one pod, through its placement port (`link`:
    the store's, or standalone's, where every session may be served and nothing is recorded). `fence` is
    called when the store says a newer incarnation of this pod registered."""

    def __init__(
        self,
        link: PlacementPort,
        books: SessionBooks,
        forward: ForwardThread,
        exports: Exports,
        transfer: Transfer,
        metrics: WorkerMetrics,
        *,
        fence: Callable[[], None],
    ) -> None:
        self.link = link
        self.books = books
        self.forward = forward
        self.exports = exports
        self.transfer = transfer
        self.metrics = metrics
        self._fence = fence
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()

    # ---------------------------------------------------------------- placement checks

    async def placed_record(
        self, session_id: str, authorization: str | None, *, any_state: bool = False
    ) -> SessionRecord | None:
        """The session's record when it may be served here (`PlacementPort.placed_record`: None standalone);
        401/410/421 otherwise. `any_state` lets a DELETE of an evicted or closed session succeed (close is
        idempotent)."""
        return await self.link.placed_record(session_id, authorization, self, any_state=any_state)

    async def misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        """A draining worker still points a session's client at the pod it moved to (421), so that a migrated
        session's next tick reaches its new pod, which pulls it from here while this one waits to exit."""
        await self.link.misdirect_while_draining(session_id, authorization)

    def slot_token(self, session_id: str) -> str | None:
        """`LocalSessions.slot_token`: the token hash of a session holding a slot here."""
        book = self.books.get(session_id)
        return book.token_sha256 if book is not None and book.holds_slot else None

    def held_for_transfer(self, session_id: str) -> bool:
        return session_id in self.transfer.held

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

    # ---------------------------------------------------------------- admission and release

    async def admit(self, session_id: str, record: SessionRecord | None) -> None:
        """Give the session a slot; never more than `capacity` (the runner would evict silently)."""
        book = self.books.get(session_id)
        if book is not None and book.holds_slot:
            return
        capacity = self.books.capacity
        if self.books.admitted() >= capacity:
            await self._release_stale()
            if self.books.admitted() >= capacity:
                raise AtCapacity(f"this worker holds {capacity} session(s), its capacity")
        # Sessions held for a transfer are in the runner but hold no slot: they make room (tier copy kept).
        held = self.transfer.held
        while held and self.books.admitted() + len(held) >= capacity:
            await self.transfer.drop_held(next(iter(held)), "its room in the runner is needed")
        self.books[session_id] = SessionBook(session_id, token_sha256=record.token_sha256 if record else "")

    async def _release_stale(self) -> None:
        """Close sessions the store no longer places here (an evict event may not be consumed yet)."""
        candidates = [
            sid for sid, book in self.books.items() if book.holds_slot and sid not in self.books.in_flight
        ]
        for session_id in await self.link.moved_away(candidates):
            await self.release(session_id, reason="stale")

    async def release(self, session_id: str, *, reason: str, keep_book: bool = False) -> None:
        """The one teardown path for releases the client did not ask for (events, stale sessions)."""
        runtime = self.forward.runtime
        assert runtime is not None
        self.transfer.discard_held(session_id)  # closed or moved while held for a transfer: nothing to pull
        async with self.forward.lock.hold():
            held = session_id in self.books or session_id in runtime.resident_sessions()
            await self.forward.run(runtime.close, session_id)
            book = self.books.get(session_id)
            if keep_book and book is not None and book.status is not SessionStatus.CLOSED:
                self.books[session_id] = book.failed()
            else:
                self.books.pop(session_id, None)
        self.exports.release(session_id, keep_snapshot=reason == "suspend")
        if held:
            self.metrics.evictions.labels(reason).inc()
            log.info("released session %s (%s)", session_id, reason)

    async def on_release(self, event: Any) -> None:
        """A `close`/`evict` entry of this pod's stream: release the session's state in the runner."""
        binding = (await self.link.bindings([event.session]))[event.session]
        here = binding is not None and self.link.is_here(binding)
        book = self.books.get(event.session)
        if event.kind == "evict" and here and not binding.reset_required and book is not None:
            # Re-placed here and reset since the eviction: the event is older than the session's state.
            log.info("ignoring stale evict of %s", event.session)
            return
        await self.release(event.session, reason=event.kind, keep_book=here)

    # ---------------------------------------------------------------- Redis writes after a tick

    async def touch(self, session_id: str, *, chunk_index: int, reset_done: bool) -> None:
        async with self._recording(session_id, "tick"):
            await self.link.touch(session_id, chunk_index=chunk_index, reset_done=reset_done)

    async def note_history(self, session_id: str, kept: list[int], *, chunk_index: int | None = None) -> None:
        """The chunk boundaries this pod keeps of the session (issue 26), and a rewind's `chunk_index`."""
        async with self._recording(session_id, "kept chunks"):
            await self.link.note_history(session_id, kept=kept, chunk_index=chunk_index)

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
            await self.release(session_id, reason="evict")
            raise SessionEvicted(f"session {session_id!r} was moved off this pod during its {what}") from None
        except placement.PodFenced:
            self._fence()
            raise NotReady("this pod was fenced by a newer incarnation") from None
        except Exception as exc:  # Redis away or not answering: the chunk stands, a retry of it replays it
            log.warning("could not record session %s's %s in the placement store: %s", session_id, what, exc)
            raise NotReady(
                f"placement store unavailable ({type(exc).__name__}); the {what} stands: retry the same "
                "request"
            ) from exc

    async def mark_reset_required(self, session_id: str) -> None:
        try:
            await self.link.mark_reset_required(session_id)
        except Exception as exc:  # the local book already enforces the reset
            log.warning("could not mark %s reset_required in the placement store: %s", session_id, exc)
