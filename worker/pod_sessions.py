"""`PodSessions`: the one owner of this pod's sessions (issue 41).

It holds what a session is made of on this pod: its book (worker/session_book.py, in `SessionBooks`), its
state in the runtime behind the forward thread and its lock (worker/pod_state.py), the exports the pod writes
and answers for (worker/exports.py) and the sessions held for their new pod to pull (worker/transfer.py), and
the pod's placement port (worker/placement_port.py), and each admitted session's first picture, decoded once
(worker/conditioning.py `SessionPictures`). The placement guard, the continuity and the transfer
reach a session's state only through it.

A session gets a slot by `admit` (never more than capacity: the runner would evict its least recently used
session silently, so sessions the store moved away are released first) and loses its state by `release`, the
one teardown path: a DELETE, a reset, the store's `close`/`evict` events, a stale session, a suspension, a
failed forward, a rewind and the end of a hold for a transfer all go through it, and differ only in their
`ReleaseRule` (which runtime call, what becomes of the book and of the exports, whether it counts as an
eviction). A migrated session's slot alone is freed by `hold_for_transfer` (its state stays for the pull).
A session's state is written out by `export` and installed by `import_`, on the forward thread under its lock.
The pod stops serving (`stop`) when its runtime fails to load or the store fences it (a newer incarnation
registered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from ardiff.kv.records import SessionRecord
from ardiff.worker.background import Background
from ardiff.worker.conditioning import SessionPictures, conditioning_image
from ardiff.worker.errors import AtCapacity, SessionEvicted
from ardiff.worker.exports import Exports
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.placement_port import PlacementPort
from ardiff.worker.pod_state import ForwardThread, SessionBooks
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.session_book import SessionBook, SessionStatus
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.transfer import Transfer

log = logging.getLogger(__name__)

T = TypeVar("T")


def _failed_unless_closed(book: SessionBook) -> SessionBook | None:
    """A released session placed here again keeps a book that demands a reset; a closed one is forgotten."""
    return None if book.status is SessionStatus.CLOSED else book.failed()


@dataclass(frozen=True)
class ReleaseRule:
    """What a release for one reason does (`PodSessions.release`).

    `runner`: the call into the runtime (None: the runtime already dropped the state, a failed forward);
    `becomes`: what a kept book becomes (None: unchanged, its state is replaced next; a result of None drops
    it); `stand_in`: a session without a book gets a fresh one to keep (a DELETE's closed book answers 410);
    `exports`: `history` drops its kept chunks only, `all` its snapshot and unreported suspension too, and
    `suspended` all but its snapshot (it resumes from it); `discards_held`: a session held for a transfer is
    not pulled any more; `evicts`: a release the client did not ask for (counted, logged)."""

    runner: Literal["close", "reset"] | None
    becomes: Callable[[SessionBook], SessionBook | None] | None
    exports: Literal["history", "all", "suspended"] | None
    discards_held: bool = False
    evicts: bool = False
    stand_in: bool = False


# Why a session is released; the evictions' reasons are the labels of `ardiff_session_evictions`.
ReleaseReason = Literal["delete", "close", "evict", "stale", "suspend", "reset", "failed", "rewind", "unheld"]
_EVICTION = ReleaseRule("close", _failed_unless_closed, "all", discards_held=True, evicts=True)
RELEASES: dict[ReleaseReason, ReleaseRule] = {
    # DELETE by the session's client (idempotent); the store's release frees the slot.
    "delete": ReleaseRule("close", SessionBook.closed, "history", discards_held=True, stand_in=True),
    # The store's events, a session it no longer places here, a suspension whose state is not held.
    "close": _EVICTION,
    "evict": _EVICTION,
    "stale": _EVICTION,
    "suspend": ReleaseRule("close", _failed_unless_closed, "suspended", discards_held=True, evicts=True),
    # The session starts over at chunk 0: its kept history is of another world.
    "reset": ReleaseRule("reset", SessionBook.after_reset, "history"),
    # A forward (or a rewind's import) failed: the session needs a reset.
    "failed": ReleaseRule(None, SessionBook.failed, "history"),
    # Its state is replaced by a kept boundary's (the caller imports it next, under the same lock hold).
    "rewind": ReleaseRule("close", None, None),
    # A session held for its new pod to pull (no book, no slot) leaves the runner: pulled elsewhere or not.
    "unheld": ReleaseRule("close", None, None),
}


@dataclass(frozen=True)
class Released:
    """A release's outcome: the session's book before and after it (None: none, or dropped)."""

    before: SessionBook | None
    after: SessionBook | None


class PodSessions:
    """The sessions of one pod (the module's docstring): `books`, `forward`, `exports`, `transfer` and the
    `placement` port, with `admit` and `release`; `stopped` is set (and `failure` says why) when the pod must
    stop serving them."""

    def __init__(
        self, settings: WorkerSettings, placement: PlacementPort, metrics: WorkerMetrics, tasks: Background
    ) -> None:
        self.settings = settings
        self.placement = placement
        self.metrics = metrics
        self.forward = ForwardThread(settings.tick_order)
        self.books = SessionBooks()
        self.exports = Exports(settings, self.forward)
        self.pictures = SessionPictures()  # the admitted sessions' first pictures, decoded once
        self.transfer = Transfer(settings, self, metrics, tasks)
        self.stopped = asyncio.Event()  # set when the worker must exit on its own (fenced, load failed)
        self.failure: BaseException | None = None

    @property
    def runtime(self) -> SessionRuntime | None:
        return self.forward.runtime

    def stop(self, failure: BaseException) -> None:
        """The pod can serve no session any more (`failure` says why): the worker exits."""
        self.failure = failure
        self.stopped.set()

    def fence(self) -> None:
        """The store says a newer incarnation of this pod registered: its sessions are that one's now."""
        self.stop(RuntimeError("fenced: a newer incarnation of this pod registered"))

    async def drain(self) -> None:
        """The pod goes: no new placements (the store is told), the ticks under way finish, then what outlives
        the pod is handed on (the host tier's copies spilled, the held sessions pulled or given up)."""
        try:
            await self.placement.set_draining()
        except Exception as exc:
            log.warning("could not mark pod draining in the placement store: %s", exc)
        await self.books.idle.wait()
        await self.transfer.spill_host_tier()
        await self.transfer.await_handoffs()

    async def shutdown(self) -> None:
        """The worker exits: the store's client closed, the runtime shut down. Stopped while the model loads,
        the process exits without waiting for the load (server.serve): nothing else is touched."""
        await self.placement.close()
        if self.forward.loading:
            self.forward.abandon()
            return
        if self.runtime is not None:
            await self.forward.run(self.runtime.shutdown)
        self.forward.shutdown()

    # ---------------------------------------------------------------- what the placement checks ask

    def slot_token(self, session_id: str) -> str | None:
        """`LocalSessions.slot_token`: the token hash of a session holding a slot here."""
        book = self.books.get(session_id)
        return book.token_sha256 if book is not None and book.holds_slot else None

    def held_for_transfer(self, session_id: str) -> bool:
        return session_id in self.transfer.held

    # ---------------------------------------------------------------- admission and release

    async def admit(self, session_id: str, record: SessionRecord | None) -> SessionBook:
        """Give the session a slot; never more than `capacity` (the runner would evict silently). Its book."""
        book = self.books.get(session_id)
        if book is not None and book.holds_slot:
            return book
        capacity = self.books.capacity
        if self.books.admitted() >= capacity:
            await self._release_stale()
            if self.books.admitted() >= capacity:
                raise AtCapacity(f"this worker holds {capacity} session(s), its capacity")
        # Sessions held for a transfer are in the runner but hold no slot: they make room (tier copy kept).
        held = self.transfer.held
        while held and self.books.admitted() + len(held) >= capacity:
            await self.transfer.drop_held(next(iter(held)), "its room in the runner is needed")
        book = SessionBook(session_id, token_sha256=record.token_sha256 if record else "")
        self.books[session_id] = book
        return book

    async def picture(
        self, session_id: str, record: SessionRecord | None, frame_size: tuple[int, int], decoder: Executor
    ) -> np.ndarray:
        """The session's first picture at `frame_size`: the one kept since its first tick here (`pictures`,
        kept by its tick once admitted), else its record's image read from the store and decoded in
        `decoder` (standalone, and a session without an image: its seed's)."""
        seed = record.seed if record is not None else 0
        picture = self.pictures.get(session_id, seed)
        if picture is not None:
            return picture
        image = await self.placement.session_image(session_id) if record is not None else b""
        if image is None:  # released since its record was read: that record's image is gone
            raise SessionEvicted(f"session {session_id!r} was released while its tick was read")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(decoder, conditioning_image, image, seed, *frame_size)

    async def _release_stale(self) -> None:
        """Close sessions the store no longer places here (an evict event may not be consumed yet)."""
        candidates = [
            sid for sid, book in self.books.items() if book.holds_slot and sid not in self.books.in_flight
        ]
        for session_id in await self.placement.moved_away(candidates):
            await self.release(session_id, "stale")

    async def release(self, session_id: str, reason: ReleaseReason, *, keep: bool = False) -> Released:
        """`release_held` under the forward lock (a session held for a transfer is discarded before the wait
        for it: no pull may claim it meanwhile)."""
        if RELEASES[reason].discards_held:
            self.transfer.discard_held(session_id)
        async with self.forward.lock.hold():
            return await self.release_held(session_id, reason, keep=keep)

    async def release_held(self, session_id: str, reason: ReleaseReason, *, keep: bool = False) -> Released:
        """The one teardown path (the module's docstring), with the forward lock held: the session's state in
        the runtime, its book (kept, as its rule says, when `keep`; else dropped: the id is free again) and
        its exports, as `RELEASES[reason]` says."""
        rule = RELEASES[reason]
        runtime = self.forward.runtime
        assert runtime is not None
        if rule.discards_held:  # closed or moved while held for a transfer: nothing to pull
            self.transfer.discard_held(session_id)
        held = rule.evicts and (session_id in self.books or session_id in runtime.resident_sessions())
        if rule.runner == "close":
            await self.forward.run(runtime.close, session_id)
        elif rule.runner == "reset":
            await self.forward.run(runtime.reset, session_id)
        self.pictures.drop(session_id)
        before = self.books.get(session_id)
        kept = before if before is not None or not rule.stand_in else SessionBook(session_id)
        after = kept
        if kept is not None and rule.becomes is not None:
            after = rule.becomes(kept) if keep else None
            if after is None:
                self.books.pop(session_id, None)
            else:
                self.books[session_id] = after
        if rule.exports == "history":
            self.exports.history.drop(session_id)
        elif rule.exports is not None:
            self.exports.release(session_id, keep_snapshot=rule.exports == "suspended")
        if held:
            self.metrics.evictions.labels(reason).inc()
            log.info("released session %s (%s)", session_id, reason)
        return Released(before, after)

    def hold_for_transfer(self, session_id: str, book: SessionBook, location: str) -> None:
        """A migrated session's slot is freed (the store freed it), its state kept in the runner for its new
        pod to pull (`Transfer.hold`): released but for its state, which the transfer releases later."""
        self.books.pop(session_id, None)
        self.pictures.drop(session_id)
        self.exports.snapshots.pop(session_id, None)  # its new pod adopts the snapshot
        self.exports.history.drop(session_id)  # kept chunks never travel: they stay with the pod
        self.metrics.evictions.labels("suspend").inc()
        self.transfer.hold(session_id, book, location)

    async def close(self, session_id: str, record: SessionRecord | None) -> SessionBook:
        """A DELETE by the session's client (idempotent): released, its closed book (the view answered).

        A closed book (410 until the store's `close` event is consumed) is kept only for a session of this
        pod: one it holds a book for, or one placed here (`PlacementPort.keeps_closed_book`). Any other
        (suspended, evicted, lost, deleted through whichever pod its client asked) gets no `close` event
        here, so its book would outlive it and answer 410 to a later session of the same name placed here."""
        self.transfer.discard_held(session_id)  # deleted while held for a transfer: nothing to pull
        async with self.forward.lock.hold():
            keep = self.placement.keeps_closed_book(session_id in self.books, record)
            released = await self.release_held(session_id, "delete", keep=keep)
        return (released.before or SessionBook(session_id)).closed()

    async def export(self, session_id: str, write: Callable[..., T], *args: Any) -> T:
        """Write the session's state out (`write(session_id, *args)`: one of `Exports`' writers) on the
        forward thread under its lock: between the session's ticks, never during another session's forward."""
        async with self.forward.lock.hold():
            return await self.forward.run(write, session_id, *args)

    async def import_(self, read: Callable[..., SessionBook], *args: Any, **kwargs: Any) -> SessionBook:
        """Install an export as a session (`read`: the runtime's `import_session`, or one of `Exports`'
        readers) on the forward thread under its lock; the book that travelled with it."""
        async with self.forward.lock.hold():
            return await self.forward.run(read, *args, **kwargs)

    async def mark_reset_required(self, session_id: str) -> None:
        """Tell the store the session lost its state; the local book already enforces the reset."""
        try:
            await self.placement.mark_reset_required(session_id)
        except Exception as exc:
            log.warning("could not mark %s reset_required in the placement store: %s", session_id, exc)
