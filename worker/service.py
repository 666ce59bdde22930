"""The worker's behaviour, independent of HTTP: the tick service of one pod, and what it is made of.

`WorkerService` loads the runtime and registers the pod in the background, serves the routes of worker/app.py
(ticks, close, reset, describe, the transfer endpoints, listing, metrics) and drains and stops the pod. A tick
is checked cheapest first (`admitted`: at most a few requests per session under way, the pod draining or not
ready, the session's placement and token), then its body, its chunk order (one tick per session in flight;
worker/ticks.py), its pictures' decoding (a thread pool) and its forward (worker/pod_state.py: one thread,
earliest playout deadline first; worker/playout.py models each viewer's buffer and keeps the playout
figures). The rest is its four collaborators', each in its own module:
- the placement port (worker/placement_port.py): the pool's store (worker/pod_link.py), or standalone;
- the one owner of the pod's sessions (worker/pod_sessions.py): their books, the forward thread, the exports
  and the sessions held for a transfer, with admission and the one release path;
- the two that talk only to that owner: the placement guard (worker/placement_guard.py: placement checks,
  request counts, progress records, the pod's events) and continuity (worker/continuity.py: suspend, resume,
  snapshots, sweeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ardiff.errors import ArdiffError
from ardiff.kv.records import SessionRecord
from ardiff.worker import tick_rules
from ardiff.worker.background import Background
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.continuity import Continuity
from ardiff.worker.encoding import RAW, MediaType
from ardiff.worker.errors import (
    ChunkNotKept,
    ForwardFailed,
    InvalidTick,
    NotReady,
    ResetRequired,
    Rewound,
    SessionClosed,
    SessionEvicted,
    SessionExportError,
    UnknownSession,
)
from ardiff.worker.families import ModelFamily, family_for, family_named
from ardiff.worker.host_tier import HostCopy
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.placement_guard import PlacementGuard
from ardiff.worker.placement_port import Membership, PlacementPort, Standalone
from ardiff.worker.playout import Playouts, TickEstimate, target_of, target_view
from ardiff.worker.pod_sessions import PodSessions
from ardiff.worker.runtime import SessionRuntime, run_tick
from ardiff.worker.session_book import CachedChunk, SessionBook, SessionStatus
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.ticks import (
    AdmittedTick,
    OpenedStream,
    TickInput,
    TickOutcome,
    TickResponse,
    check_order,
    timing_header,
)
from ardiff.worker.transfer import HeldForTransfer, Outgoing
from ardiff.worker.warm_up import warm_up

log = logging.getLogger(__name__)

RuntimeLoader = Callable[[], SessionRuntime]
# Threads that decode ticks' pictures (a robot tick's three cameras), off the event loop; at most one tick per
# session gets there (the in-flight check comes first), so the queue is bounded by the sessions placed here.
DECODE_THREADS = 2


def settings_family(settings: WorkerSettings) -> ModelFamily:
    """The model family of this worker's pipeline (LingBot-World for the fake runtime's, the default)."""
    try:
        return family_for(settings.pipeline)
    except ValueError:
        return family_named("lingbot")  # the runtime's load reports the unknown pipeline


class WorkerService:
    def __init__(
        self,
        settings: WorkerSettings,
        loader: RuntimeLoader,
        *,
        placement: PlacementPort | None = None,  # the pool's store (a PodLink); by default standalone
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.family = settings_family(settings)
        self.metrics = metrics or WorkerMetrics()
        self._loader = loader
        self._tasks = Background(self.metrics)
        # The four collaborators: the placement port, the sessions' owner, and the two that talk only to it.
        self.sessions = PodSessions(settings, placement or Standalone(settings), self.metrics, self._tasks)
        self.guard = PlacementGuard(self.sessions)
        self.continuity = Continuity(settings, self.sessions, self.metrics)
        self.playouts = Playouts()
        self.tick_estimate = TickEstimate(settings.compute_utilisation)
        self._decoder = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="ardiff-decode")
        self._draining = False

    # ---------------------------------------------------------------- lifecycle

    @property
    def placement(self) -> PlacementPort:
        """The pod's placement port (the pool's store, or standalone), as its sessions' owner holds it."""
        return self.sessions.placement

    @property
    def runtime(self) -> SessionRuntime | None:
        return self.sessions.runtime

    @property
    def failure(self) -> BaseException | None:
        """Why the worker stopped on its own (the load failed, or it was fenced); None otherwise."""
        return self.sessions.failure

    @property
    def capacity(self) -> int:
        return self.sessions.books.capacity

    @property
    def exports_sessions(self) -> bool:
        """A tier to suspend sessions to: evictions and migrations keep them instead of dropping them."""
        return self.sessions.exports.any_tier

    @property
    def loaded(self) -> bool:
        return self.runtime is not None

    @property
    def ready(self) -> bool:
        return self.loaded and self.placement.registered and not self._draining and not self.stopped.is_set()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def loading(self) -> bool:
        """The runtime is still loading on the forward thread (a load cannot be interrupted)."""
        return self.sessions.forward.loading

    @property
    def stopped(self) -> asyncio.Event:
        return self.sessions.stopped

    async def start(self) -> None:
        """Load the runtime and register, in the background: the HTTP server answers /healthz meanwhile."""
        self._tasks.spawn(self._load_and_register(), "ardiff-load")

    async def _load_and_register(self) -> None:
        try:
            runtime = await self.sessions.forward.load(self._loader)
            cap = self.settings.session_capacity
            self.sessions.books.capacity = runtime.capacity if cap is None else min(runtime.capacity, cap)
            if self.settings.compute_utilisation > 0:  # before the pod is ready (standalone) or registers
                await warm_up(runtime, self.family, self.sessions.forward, self.tick_estimate)
                self._report_compute()
            self.sessions.forward.runtime = runtime
            self.metrics.capacity.set(self.capacity)
            log.info(
                "runtime loaded: capacity=%d (runner %d) frame_size=%s",
                self.capacity,
                runtime.capacity,
                runtime.frame_size,
            )
            membership = Membership(
                self.capacity,
                exports=self.exports_sessions and runtime.supports_export,
                tasks=self._tasks,
                on_fenced=self.sessions.fence,
                on_event=self.on_event,
                sweep=self.continuity.sweep_tier_forever if self.exports_sessions else None,
            )
            await self.placement.join(membership)
        except Exception as exc:
            if isinstance(exc, ArdiffError):  # a user error (bad model, bad settings): no traceback
                log.error("worker failed to start: %s", exc)
            else:
                log.exception("worker failed to start")
            self.sessions.stop(exc)

    def _report_compute(self) -> None:
        """The tick estimate and the frames/s it admits, to the metrics and the pod's record (placement)."""
        compute_fps = self.tick_estimate.compute_fps
        self.metrics.tick_seconds.set(self.tick_estimate.tick_s)
        self.metrics.compute_fps.set(compute_fps)
        self.placement.report_compute(compute_fps, self.tick_estimate.tick_s * 1000)

    async def drain(self) -> None:
        """SIGTERM: no new placements, new ticks get 503, the ticks already accepted finish."""
        if self._draining:
            return
        self._draining = True
        log.info("draining: %d tick(s) in flight", len(self.sessions.books.in_flight))
        await self.sessions.drain()

    async def stop(self) -> None:
        await self._tasks.stop()
        loading = self.loading  # stopped while the model loads: the process exits without waiting
        await self.sessions.shutdown()
        if not loading:
            self._decoder.shutdown(wait=True)

    def _require_loaded(self) -> SessionRuntime:
        """The runtime once the model is loaded (close and describe also serve while draining)."""
        if self.runtime is None:
            raise NotReady("worker is not ready (loading)")
        return self.runtime

    def require_ready(self) -> SessionRuntime:
        if not self.ready or self.runtime is None:
            state = "draining" if self._draining else "loading" if not self.loaded else "not registered"
            raise NotReady(f"worker is not ready ({state})")
        return self.runtime

    async def on_event(self, event: Any) -> None:
        """An entry of this pod's stream: `suspend` exports the session (continuity), `close`/`evict` release
        its state in the runner (the placement guard)."""
        if self.runtime is None:
            return
        if event.kind == "suspend":
            await self.continuity.suspend(event.session, event.reason)
            return
        await self.guard.on_release(event)

    # ---------------------------------------------------------------- ticks

    @contextlib.asynccontextmanager
    async def admitted(self, session_id: str, authorization: str | None) -> AsyncIterator[AdmittedTick]:
        """The checks of a tick that need no body, cheapest first: at most `MAX_REQUESTS_PER_SESSION` under
        way (held until the tick ends), a draining pod's 421, readiness, then placement and token (one Redis
        read). The HTTP tick runs them before its body is read (issue 23 item 10: a body from a caller who
        may not tick costs nothing); `tick` runs them for the stream and OpenPI."""
        arrived = time.perf_counter()
        with self.guard.counted(session_id, authorization):
            if self._draining:
                await self.guard.misdirect_while_draining(session_id, authorization)
            self.require_ready()
            record = await self.guard.placed_record(session_id, authorization)
            yield AdmittedTick(session_id, record, arrived)

    async def tick(
        self,
        session_id: str,
        body: TickInput,
        *,
        authorization: str | None,
        inject_fault: bool = False,
    ) -> TickOutcome:
        """Generate the session's next chunk (or replay the last one for a retried request id); every
        contract of docs/contracts.md §4 is checked here, for the HTTP tick and the stream alike."""
        async with self.admitted(session_id, authorization) as admitted:
            return await self.tick_admitted(admitted, body, inject_fault=inject_fault)

    async def tick_admitted(
        self, admitted: AdmittedTick, body: TickInput, *, inject_fault: bool = False
    ) -> TickOutcome:
        """`tick` once `admitted`: the body parsed once, one tick in flight, the chunk order (checked once;
        again only if the book changed meanwhile), then the family's decoding and the session's first picture
        (on its first tick here) in the decode pool, then the forward."""
        session_id, record, arrived = admitted.session_id, admitted.record, admitted.arrived
        runtime = self._require_loaded()
        tick = self.family.parse_tick(session_id, body)
        if session_id not in self.playouts:
            self._forget_released_playouts()
        playout = self.playouts.of(session_id, target_of(record, self.settings), arrived)
        deadline = playout.deadline(arrived, tick_rules.fields_of(body).get("buffer_ms"))
        prefetch = self.sessions.transfer.prefetch_of(session_id)
        if prefetch is not None:  # the session is being pulled here already: its tick waits for that
            await asyncio.shield(prefetch)
        with self.sessions.books.exclusive(session_id):
            book = self.sessions.books.get(session_id)
            resumed = (
                record is not None and bool(record.resume_from) and (book is None or not book.holds_slot)
            )
            if resumed:
                book = await self.continuity.resume(session_id, record)
            cached = book.retry_of(tick.request_id, tick.chunk_index) if book else None
            if cached is not None:
                return TickOutcome(cached)
            if resumed and not tick.reset and tick.chunk_index > book.next_chunk_index:
                raise Rewound(
                    f"session {session_id!r} resumed from a snapshot at chunk {book.next_chunk_index}; "
                    "continue from there (the same controls give the same frames)",
                    expected_chunk_index=book.next_chunk_index,
                )
            check_order(tick, book, record)
            prompt = tick.prompt if tick.prompt is not None else record.prompt if record else ""
            if not prompt.strip():
                raise InvalidTick(
                    "prompt must contain non-empty text (the tick's, else the session's)", param="prompt"
                )
            seed = record.seed if record else 0
            loop = asyncio.get_running_loop()
            tick = await loop.run_in_executor(self._decoder, self.family.decode_tick, tick)
            picture = await self.sessions.picture(session_id, record, runtime.frame_size, self._decoder)
            conditioning = Conditioning(seed=seed, prompt=prompt, picture=picture)
            prepared = await asyncio.to_thread(runtime.ticks.prepare, tick, conditioning)
            admitted_book = await self.sessions.admit(session_id, record)
            # The book the order was checked against, or admission's for a session that held no slot.
            checked = book if book is not None and book.holds_slot else admitted_book
            self.sessions.pictures.keep(session_id, seed, picture)
            async with self.sessions.forward.lock.hold(deadline):
                started = time.perf_counter()
                queued = started - arrived
                book = self.sessions.books.get(session_id)
                if book is None:
                    raise SessionEvicted(f"session {session_id!r} was released while its tick was queued")
                if book is not checked:  # closed, reset or rewound since the order was checked
                    check_order(tick, book, None)
                if tick.reset:  # the session starts over: its kept history is of another world
                    self.sessions.exports.history.drop(session_id)
                try:
                    output = await self.sessions.forward.run(
                        run_tick, runtime, prepared, inject_fault=inject_fault
                    )
                except Exception as exc:
                    log.warning(
                        "forward of session %s chunk %d failed: %r", session_id, tick.chunk_index, exc
                    )
                    await self.sessions.release_held(session_id, "failed", keep=True)
                    failure: Exception | None = exc
                else:
                    failure = None
                    chunk = CachedChunk(
                        tick.request_id, tick.chunk_index, output.frames, output.metadata, output.actions
                    )
                    advanced = self.sessions.books[session_id] = book.advanced(
                        chunk, closed=tick.close_session
                    )
                    busy = time.perf_counter() - started
                    keep = record.history_keep_chunks if record is not None and not tick.close_session else 0
                    kept = await self._keep_boundary(session_id, advanced, keep) if keep else None
            if failure is not None:
                await self.sessions.mark_reset_required(session_id)
                raise ForwardFailed(
                    f"the forward of chunk {tick.chunk_index} failed ({type(failure).__name__}); the session "
                    "was closed and needs reset=true, chunk_index=0"
                )
            await self.guard.touch(session_id, chunk_index=tick.chunk_index + 1, reset_done=tick.reset)
            if kept is not None:
                with contextlib.suppress(NotReady):  # logged; the next tick's note lists them again
                    await self.guard.note_history(session_id, kept)
            every = self.settings.snapshot_every_chunks
            if every and (tick.chunk_index + 1) % every == 0 and not tick.close_session:
                await self.continuity.snapshot(session_id)
            self.metrics.ticks.inc()
            self.metrics.frames.inc(len(output.frames))
            self.metrics.tick_latency.labels("queue").observe(queued)
            self.metrics.tick_latency.labels("forward").observe(output.forward_s)
            self.metrics.tick_latency.labels("total").observe(time.perf_counter() - arrived)
            self.metrics.delivered(playout.delivered(time.perf_counter(), len(output.frames), deadline))
            if tick.chunk_index > 0:  # a full chunk (a session's first is shorter)
                self.tick_estimate.add(busy, len(output.frames))
                self._report_compute()
            return TickOutcome(chunk, queue=queued, forward=output.forward_s, decode=output.decode_s)

    async def _keep_boundary(self, session_id: str, book: SessionBook, keep_chunks: int) -> list[int]:
        """In the tick's forward lock hold: keep the session's state at its new boundary (worker/history.py);
        the boundaries kept now. One that does not fit the budget, or fails to export, is not kept (logged,
        counted): the tick goes on."""
        try:
            await self.sessions.forward.run(
                self.sessions.exports.keep_boundary, session_id, book, keep_chunks
            )
        except Exception as exc:
            log.warning("chunk %d of session %s not kept: %s", book.next_chunk_index, session_id, exc)
            self.metrics.history_dropped.inc()
        else:
            self.metrics.history_kept.inc()
        return self.sessions.exports.history.chunks(session_id)

    async def tick_answer(
        self,
        admitted: AdmittedTick,
        body: TickInput,
        media_type: MediaType | str,
        *,
        inject_fault: bool = False,
    ) -> TickResponse:
        """The HTTP tick once `admitted` (the route admits it before its body is read): `tick_admitted`, then
        its answer as `media_type` (the family's encoding: frames, actions), the metadata and timings in
        headers."""
        if getattr(body, "return_frames", False) and media_type != RAW:
            raise InvalidTick(
                "predicted frames come in the raw answer (Accept: application/octet-stream)",
                param="return_frames",
            )
        outcome = await self.tick_admitted(admitted, body, inject_fault=inject_fault)
        chunk = outcome.chunk
        started = time.perf_counter()
        if media_type == RAW or chunk.actions is not None:  # a copy or small JSON: not worth a thread hop
            body, shapes = self.family.encode(chunk, media_type)
        else:
            body, shapes = await asyncio.to_thread(self.family.encode, chunk, media_type)
        encode = time.perf_counter() - started
        headers = {
            "ardiff-chunk-metadata": json.dumps(chunk.metadata, ensure_ascii=True, separators=(",", ":")),
            **shapes,
            "server-timing": timing_header(outcome.timing(encode=encode)),
        }
        return TickResponse(body, media_type, headers)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- pod-to-pod transfer (contracts §4)

    async def claim_transfer(self, session_id: str, authorization: str | None) -> HeldForTransfer | HostCopy:
        """What a pull of the session from this pod gets (`Transfer.claim`)."""
        return await self.sessions.transfer.claim(session_id, authorization)

    async def send_transfer(self, session_id: str, held: HeldForTransfer | HostCopy) -> Outgoing:
        """The body of that pull (`Transfer.send`)."""
        return await self.sessions.transfer.send(session_id, held)

    def send_kept(self, session_id: str, chunk: int, authorization: str | None) -> Outgoing:
        """The body of a pull of the session's kept chunk by the pod a fork of it was placed on."""
        return self.sessions.transfer.send_kept(session_id, chunk, authorization)

    def prefetch(self, session_id: str, authorization: str | None) -> None:
        """The pod holding a migrated session placed here offers it: pull it now, in the background."""
        self.sessions.transfer.prefetch(session_id, authorization, self._prefetch)

    async def _prefetch(self, session_id: str) -> None:
        if self.ready:  # standalone, nothing is offered: no record places it here
            await self.continuity.resume_offered(session_id)

    # ---------------------------------------------------------------- other routes

    async def close(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        """DELETE: close the session in the runner (idempotent); the operator's release frees the slot.

        A closed book (410 until the operator's `close` event is consumed) is kept only for a session of this
        pod: one it holds a book for, or one placed here. Any other (suspended, evicted, lost, deleted
        through whichever pod its client asked) gets no `close` event here, so its book would outlive it and
        answer 410 to a later session of the same name placed here."""
        self._require_loaded()
        record = await self.guard.placed_record(session_id, authorization, any_state=True)
        closed = await self.sessions.close(session_id, record)
        view = {
            **closed.describe(),
            "resident": False,
            "in_flight": False,
            "playout": self._playout_view(session_id, record),
        }
        if session_id not in self.sessions.books:
            self.playouts.pop(session_id, None)
        return view

    async def rewind(self, session_id: str, chunk: int, authorization: str | None) -> dict[str, Any]:
        """Put the session back at its kept chunk boundary `chunk` (issue 26): the next chunk is `chunk`, and
        with the same controls the same frames as the first time. Its state is replaced by the kept export
        under the forward lock (the book too: its cached chunk is the one before the boundary, so a retried
        request id replays consistently), the boundaries after it are dropped (history is linear), and the
        store's `chunk_index` and `kept_chunks` follow. `ChunkNotKept` lists the boundaries kept."""
        async with self.admitted(session_id, authorization) as admitted:
            return await self.rewind_admitted(admitted, chunk)

    async def rewind_admitted(self, admitted: AdmittedTick, chunk: int) -> dict[str, Any]:
        """`rewind` once `admitted` (the checks of a tick that need no body)."""
        session_id, record = admitted.session_id, admitted.record
        runtime = self._require_loaded()
        history = self.sessions.exports.history
        with self.sessions.books.exclusive(session_id):
            book = self.sessions.books.get(session_id)
            if book is None and record is None:
                raise UnknownSession(f"no session {session_id!r} on this worker")
            if book is not None and book.status is SessionStatus.CLOSED:
                raise SessionClosed(f"session {session_id!r} was closed on this worker")
            copy = history.get(session_id, chunk)
            if copy is None or book is None:
                kept = history.chunks(session_id)
                raise ChunkNotKept(
                    f"session {session_id!r} keeps no chunk {chunk} here (it keeps {kept}; a session keeps "
                    "spec.history.keepChunks boundaries, never its start: reset for chunk 0)",
                    kept_chunks=kept,
                )
            async with self.sessions.forward.lock.hold():
                await self.sessions.release_held(session_id, "rewind")
                try:
                    installed = await self.sessions.forward.run(runtime.import_session, copy.reader())
                except SessionExportError as exc:
                    log.warning("rewind of session %s to chunk %d failed: %s", session_id, chunk, exc)
                    await self.sessions.release_held(session_id, "failed", keep=True)
                    failure: SessionExportError | None = exc
                else:
                    failure = None
                    self.sessions.books[session_id] = dataclasses.replace(
                        installed, token_sha256=book.token_sha256
                    )
                    kept = history.drop_after(session_id, chunk)
            if failure is not None:
                await self.sessions.mark_reset_required(session_id)
                raise ResetRequired(
                    f"session {session_id!r} could not be rewound ({failure.code}); send reset=true with "
                    "chunk_index=0"
                )
            await self.guard.note_history(session_id, kept, chunk_index=chunk)
        self.metrics.rewinds.inc()
        log.info("rewound session %s to chunk %d (kept %s)", session_id, chunk, kept)
        return {"session": session_id, "chunk_index": chunk, "kept_chunks": kept}

    async def reset(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        self.require_ready()
        with self.guard.counted(session_id, authorization):
            record = await self.guard.placed_record(session_id, authorization)
        with self.sessions.books.exclusive(session_id):
            book = self.sessions.books.get(session_id)
            if book is None and record is None:
                raise UnknownSession(f"no session {session_id!r} on this worker")
            if book is not None and book.status is SessionStatus.CLOSED:
                raise SessionClosed(f"session {session_id!r} was closed on this worker")
            book = (await self.sessions.release(session_id, "reset", keep=True)).after
            await self.guard.touch(session_id, chunk_index=0, reset_done=True)
        return self._describe(session_id, book, record)

    async def describe(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        self._require_loaded()
        with self.guard.counted(session_id, authorization):
            record = await self.guard.placed_record(session_id, authorization)
        if session_id not in self.sessions.books and record is None:
            raise UnknownSession(f"no session {session_id!r} on this worker")
        return self._view(session_id, record)

    async def open_stream(self, session_id: str, authorization: str | None) -> OpenedStream:
        """A stream may open for a session that may tick here (the checks of a tick); its view and record."""
        self.require_ready()
        with self.guard.counted(session_id, authorization):
            record = await self.guard.placed_record(session_id, authorization)
        return OpenedStream(self._view(session_id, record), record)

    def _view(self, session_id: str, record: SessionRecord | None) -> dict[str, Any]:
        book = self.sessions.books.get(session_id)
        view = self._describe(session_id, book, record)
        if record is not None and record.reset_required and book is None:
            view["state"] = SessionStatus.RESET_REQUIRED.value
        elif record is not None and record.resume_from and book is None:
            view["next_chunk_index"] = record.chunk_index  # imported on its first tick, continued there
        return view

    def _describe(
        self, session_id: str, book: SessionBook | None, record: SessionRecord | None = None
    ) -> dict[str, Any]:
        resident = self.runtime is not None and session_id in self.runtime.resident_sessions()
        view = (book or SessionBook(session_id)).describe()
        return {
            **view,
            "resident": resident,
            "in_flight": session_id in self.sessions.books.in_flight,
            "playout": self._playout_view(session_id, record),
        }

    def _playout_view(self, session_id: str, record: SessionRecord | None) -> dict[str, Any]:
        """The session's playout figures; before its first tick here, its target (the record's, else the
        settings')."""
        playout = self.playouts.get(session_id)
        if playout is None:
            return target_view(target_of(record, self.settings))
        return playout.view(time.perf_counter())

    def list_sessions(self, authorization: str | None) -> dict[str, Any]:
        """The pod's capacity and KV blocks for anyone (the numbers `/metrics` serves); the sessions it
        holds only to the pool's transfer token (401 for any other credential; a pool without one lists
        them to nobody), or to anyone standalone, where nothing is authenticated (issue 23 item 10)."""
        named = self.placement.may_list_sessions(authorization)
        blocks = self.runtime.kv_blocks() if self.runtime is not None else None
        return {
            "ready": self.ready,
            "capacity": self.capacity,
            "admitted": self.sessions.books.admitted(),
            "kv_blocks": None if blocks is None else {"free": blocks.free, "total": blocks.total},
            "sessions": [self._describe(sid, book) for sid, book in sorted(self.sessions.books.items())]
            if named
            else None,
        }

    def _forget_released_playouts(self) -> None:
        """Drop the playouts of sessions this pod no longer holds (released, moved, deleted)."""
        self.playouts.keep_only(set(self.sessions.books) | self.sessions.books.in_flight)

    def render_metrics(self) -> bytes:
        self._forget_released_playouts()
        playing = {session_id for session_id, book in self.sessions.books.items() if book.holds_slot}
        self.metrics.history_bytes.set(self.sessions.exports.history.used_bytes)
        return self.metrics.render(
            self.runtime,
            admitted=self.sessions.books.admitted(),
            ready=self.ready,
            playback_ratio=self.playouts.pod_cpr(time.perf_counter(), playing),
        )
