"""vllm-omni's realtime video protocol on a session: `WS /v1/realtime/video?session=<id>`, server-paced at the
session's playout target, each chunk one fragmented-MP4 segment (docs/contracts.md §4 "Realtime video").

The messages are vllm-omni 0.30.0's (worker/realtime_messages.py): `session.start` -> `video.start`, then per
chunk `video.chunk_metadata` and one binary `m4s` segment until `session.stop` -> `session.done`;
`session.interaction` -> `session.interaction.queued`, `session.ping` -> `session.pong`, `error`. The
binding is ours: the query names the session, the token comes in the `Authorization` header or, within the
2 s an unauthenticated socket gets (worker/stream.py), in `session.start`; every check is a tick's.

Pacing: after `video.start` the stream generates the session's chunks itself, one tick at a time through
`WorkerService.tick` (the HTTP tick's path), and starts the next one only while its viewer holds less than
`buffer_chunks` chunks of play, a frame's margin kept: `held < (buffer_chunks x F - 1) / fps` (F: the last
chunk's frames), `held` being the worker's buffer model of the viewer (`SessionPlayout.floor`: what was
sent, less what has played since, never below 0: a viewer that ran dry restarts its clock at the next chunk).
The tick says `buffer_ms = held`, so its deadline is the stream's playback clock. A viewer that stops reading
stops its stream's sends and so its ticks.

Interactions apply from the next chunk: the stream keeps a prompt (`session.start`'s; blank: the session's
own) and the camera (held still at first, `EventBook`), and each chunk's tick carries them; an event's id is
in the metadata's `started_event_ids` of the first chunk it shaped, `active_event_ids` while it does, and
`completed_event_ids` when a later event replaced it.

How a stream ends: `session.stop` (the chunk being generated is still sent, then `session.done`); the session
reaching its `max_chunks` (the encoder's trailer, then `session.done`, as vllm-omni ends a finished
generation); an error a tick's client could not retry, sent as vllm-omni's `error` with our wire code, then
closed with `4000 + status` as the frame stream is; the stall clock; a newer connection (`superseded`).
None of them ends the session: it stays placed, and a new stream continues it at its next chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocketDisconnect

from ardiff.wire import CLOSE_NORMAL
from ardiff.worker.errors import (
    ChunkOutOfOrder,
    InvalidTick,
    MaxChunksReached,
    NotReady,
    PlacementRecovering,
    Rewound,
    TickInProgress,
    TooManyRequests,
    Unauthorized,
    WorkerError,
)
from ardiff.worker.messages import MAX_BUFFER_MS
from ardiff.worker.playout import PlayoutTarget, SessionPlayout, target_of
from ardiff.worker.realtime_messages import (
    IDLE_CAMERA,
    STREAM_FORMAT,
    VIDEO_CODEC_OPTIONS,
    Interaction,
    Ping,
    SessionTerms,
    Stop,
    StreamStart,
    Upstream,
    bind_start,
    error_message,
    read_control,
    read_start,
    start_token,
    upstream,
)
from ardiff.worker.stream import AUTH_TIMEOUT_SECONDS, SessionSocket, as_json
from ardiff.worker.ticks import OpenedStream

# Ticks answered with these are retried (after `retry_after`, or at once for another client's tick in flight)
# for as long as the stall clock allows; the stream goes on.
_RETRIED = (NotReady, PlacementRecovering, TickInProgress)
_IN_PROGRESS_WAIT_SECONDS = 0.1
# What a stream keeps of its interactions, whatever its client sends: those waiting for the next chunk (each
# message at most 128 KiB), and the ids an interaction may not repeat (vllm-omni keeps every id of a stream).
MAX_QUEUED_EVENTS = 64
RECENT_EVENT_IDS = 1024
# How long ending a connection may take when its client does not read (the close handshake included).
CLOSE_SECONDS = 1.0


@dataclass(frozen=True)
class ChunkEvents:
    """What one chunk is made with, and the events as its metadata reports them; committed to the stream's
    `EventBook` only once its tick succeeded (vllm-omni's transactional session model)."""

    prompt: str | None
    controls: list[dict[str, Any]]  # the tick's, as the reducer prepared them
    prepared: Any  # the reducer's ARDiffusionPreparedControls
    prompt_event: str | None
    controls_event: str | None
    started: list[str]
    active: list[str]
    completed: list[str]


class EventBook:
    """The prompt and controls of the stream's next chunk, and the interactions that set them.

    Interactions queue until the next chunk; LingBot's camera events (held keys as `state` transitions, or a
    `script` of keys per latent frame) go through vllm-omni's own reducer, which samples them into each
    chunk's `frames` control, keeps held keys from chunk to chunk and turns a press and release within one
    chunk into a one-frame pulse. The camera starts held still (`IDLE_CAMERA`)."""

    def __init__(self, protocol: Upstream, prompt: str | None) -> None:
        self.protocol = protocol
        self.prompt = prompt  # None: the session's own
        self.prompt_event: str | None = None
        self.controls_event: str | None = None
        self.queued: list[Interaction] = []
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()  # the latest event ids
        self.reducer = protocol.control_reducer()
        idle = self._event(0, None, (IDLE_CAMERA,))
        prepared = self.reducer.prepare(current_controls={}, events=[idle], chunk_index=0)
        self.reducer.commit(prepared)
        self.controls = {control.track: control for control in prepared.controls}

    def _event(self, number: int, prompt: str | None, controls: tuple[dict[str, Any], ...]) -> Any:
        inputs = tuple(self.protocol.control_input.from_dict(control) for control in controls)
        return self.protocol.session_event(event_id=number, prompt=prompt, controls=inputs)

    def queue(self, interaction: Interaction) -> None:
        """Take an interaction for the next chunk; `InvalidTick` if its id was used or the reducer refuses
        what it asks (checked on its own, changing nothing)."""
        if interaction.event_id in self.seen:
            raise InvalidTick(
                f"event_id_conflict: event {interaction.event_id!r} was sent already on this stream",
                param="interaction.event_id",
            )
        if len(self.queued) >= MAX_QUEUED_EVENTS:
            raise TooManyRequests(
                f"{MAX_QUEUED_EVENTS} interactions wait for the next chunk already: wait for it"
            )
        if interaction.controls is not None:
            try:
                event = self._event(0, None, interaction.controls)
                self.protocol.control_reducer().prepare(current_controls={}, events=[event], chunk_index=0)
            except ValueError as exc:
                message = f"session.interaction event.controls: {exc}"
                raise InvalidTick(message, param="interaction.event.controls") from None
        self.seen[interaction.event_id] = None
        if len(self.seen) > RECENT_EVENT_IDS:
            self.seen.popitem(last=False)
        self.queued.append(interaction)

    def next_chunk(self, chunk_index: int) -> ChunkEvents:
        """The queued events applied, not committed: what the next chunk is made with."""
        events = [
            self._event(number, interaction.prompt, interaction.controls or ())
            for number, interaction in enumerate(self.queued, start=1)
            if interaction.controls is not None
        ]
        prepared = self.reducer.prepare(
            current_controls=self.controls, events=events, chunk_index=chunk_index
        )
        prompt, prompt_event, controls_event = self.prompt, self.prompt_event, self.controls_event
        for interaction in self.queued:
            if interaction.prompt is not None:
                prompt, prompt_event = interaction.prompt, interaction.event_id
            if interaction.controls is not None:
                controls_event = interaction.event_id
        started = [interaction.event_id for interaction in self.queued]
        active = _ids(prompt_event, controls_event)
        before = _ids(self.prompt_event, self.controls_event)
        completed = [event for event in dict.fromkeys(before + started) if event not in active]
        controls = [control.to_dict() for control in prepared.controls]
        return ChunkEvents(
            prompt, controls, prepared, prompt_event, controls_event, started, active, completed
        )

    def commit(self, chunk: ChunkEvents) -> None:
        """The chunk was made: what it was made with is the stream's now."""
        self.reducer.commit(chunk.prepared)
        self.controls = {control.track: control for control in chunk.prepared.controls}
        self.prompt, self.prompt_event, self.controls_event = (
            chunk.prompt,
            chunk.prompt_event,
            chunk.controls_event,
        )
        del self.queued[: len(chunk.started)]

    def drop(self, chunk: ChunkEvents) -> None:
        """The chunk's tick refused what its events asked: they are dropped, nothing of them kept."""
        del self.queued[: len(chunk.started)]


def _ids(*events: str | None) -> list[str]:
    return list(dict.fromkeys(event for event in events if event is not None))


class RealtimeVideoStream(SessionSocket):
    """One realtime video connection to one session."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = self.service.settings
        self.request_id = f"video_stream-{uuid.uuid4().hex}"
        self.started = False  # video.start sent: errors carry the request id from then on
        self.chunks_sent = 0
        self.events: EventBook  # made once vllm-omni's pieces are loaded (`_stream`)
        self._stopping = asyncio.Event()  # session.stop, or the client gone: no new chunk is started
        self._progressed = asyncio.Event()  # the stall clock's: set by every sign of progress
        self._tasks: tuple[asyncio.Task[Any], ...] = ()
        self._encoder: Any = None
        self._encoding: asyncio.Future[bytes] | None = None
        self._last_retry: WorkerError | None = None
        self._authorization: str | None = None  # what the stream's ticks present

    # ---------------------------------------------------------------- errors and ends

    async def send_error(self, error: WorkerError, *, event_id: str | None = None) -> None:
        """vllm-omni's `error` message with our code (the request id once `video.start` named it)."""
        self.service.metrics.errors.labels(error.code).inc()
        request_id = self.request_id if self.started else None
        await self.send_json(error_message(error, request_id=request_id, event_id=event_id))

    async def fail(self, error: WorkerError) -> None:
        """Stop generating, then the error and the close (bounded: a client that does not read is dropped)."""
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in self._tasks if t is not current), return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(super().fail(error), CLOSE_SECONDS)

    # ---------------------------------------------------------------- opening

    async def _serve(self) -> None:
        if not self.session_id:
            await self.fail(InvalidTick("name the session: /v1/realtime/video?session=<id>", param="session"))
            return
        opened = await self._open()
        if opened is None:
            return
        stream, start = opened
        target = target_of(stream.record, self.settings)
        terms = SessionTerms(
            model=self.settings.model,
            seed=stream.record.seed if stream.record is not None else 0,
            width=self.settings.width,
            height=self.settings.height,
            fps=target.fps,
        )
        try:
            protocol = await asyncio.to_thread(upstream)
            bound = bind_start(start, terms, protocol)
        except WorkerError as error:
            await self.fail(error)
            return
        await self.streams.claim(self)
        await self._stream(stream, bound, target, protocol)

    async def _open(self) -> tuple[OpenedStream, dict[str, Any]] | None:
        """Authenticate (the header, else `session.start`'s `session_token` within `AUTH_TIMEOUT_SECONDS`) and
        open the session as a stream; the session and its `session.start`. None after failing the socket."""
        authorization = self.websocket.headers.get("authorization")
        header = bool(authorization) or self.settings.standalone  # standalone: no auth, as over HTTP
        wait = self.settings.realtime_start_timeout_seconds
        try:
            stream = await self.service.open_stream(self.session_id, authorization) if header else None
            message = await self._first_message(wait if header else min(wait, AUTH_TIMEOUT_SECONDS), header)
            if message is None:
                return None
            try:
                start = read_start(message)
            except WorkerError as error:
                # A malformed first message names nobody: without the header it is answered as no token is.
                if header:
                    raise
                raise Unauthorized(
                    f"without an Authorization header the first message must be a session.start carrying the "
                    f"session_token ({error.message})"
                ) from None
            if stream is None:
                authorization = f"Bearer {start_token(start)}"
                stream = await self.service.open_stream(self.session_id, authorization)
        except WorkerError as error:
            await self.fail(error)
            return None
        self._authorization = authorization
        return stream, start

    async def _first_message(self, seconds: float, authenticated: bool) -> dict[str, Any] | None:
        try:
            message = await asyncio.wait_for(self.websocket.receive(), seconds)
        except TimeoutError:
            if authenticated:
                raise InvalidTick("Timeout waiting for session.start", param="session.start") from None
            raise Unauthorized(
                f"no Authorization header and no session.start with the session_token in {seconds:g} s"
            ) from None
        return None if message["type"] == "websocket.disconnect" else message

    # ---------------------------------------------------------------- the stream

    async def _stream(
        self, stream: OpenedStream, bound: StreamStart, target: PlayoutTarget, protocol: Upstream
    ) -> None:
        view = stream.view
        reset = view["state"] == "reset_required"  # the protocol has no reset: a new stream starts it over
        next_chunk = 0 if reset else view["next_chunk_index"]
        self.events = EventBook(protocol, bound.prompt)
        await self.send_json(
            {
                "type": "video.start",
                "request_id": self.request_id,
                "format": STREAM_FORMAT,
                "config": bound.config,
                "session": {
                    "id": self.session_id,
                    "chunk_index": next_chunk,
                    "fps": target.fps,
                    "buffer_chunks": target.buffer_chunks,
                },
            }
        )
        self.started = True
        self._touch()
        pacer = asyncio.create_task(self._pace(target, protocol, next_chunk, reset))
        control = asyncio.create_task(self._control())
        watchdog = asyncio.create_task(self._watch())
        self._tasks = (pacer, control, watchdog)
        try:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            if control.done() and not control.cancelled():
                self._stopping.set()  # session.stop or gone: the chunk under way is still sent
                await asyncio.wait((pacer, watchdog), return_when=asyncio.FIRST_COMPLETED)
            if watchdog.done() and not watchdog.cancelled():
                await self.fail(watchdog.result())
            elif pacer.done() and not pacer.cancelled() and pacer.exception() is None:
                await self._end(pacer.result())
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._close_encoder()

    async def _end(self, outcome: WorkerError | bool) -> None:
        """The pacer's outcome: a final error, or `session.done` (True: stopped) and the normal close."""
        if isinstance(outcome, WorkerError):
            await self.fail(outcome)
            return
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, TimeoutError):
            done = {"type": "session.done", "request_id": self.request_id, "chunks": self.chunks_sent}
            await self.send_json({**done, "stopped": outcome})
            reason = "session stopped" if outcome else "session done"
            await asyncio.wait_for(self.close(CLOSE_NORMAL, reason), CLOSE_SECONDS)

    def _touch(self) -> None:
        self._progressed.set()

    async def _watch(self) -> WorkerError:
        """vllm-omni's stall clock: no chunk sent, no wait for the viewer and no ping for that long ends the
        stream (a client that stopped reading, a forward stuck, retries that never succeed)."""
        stall = self.settings.realtime_stall_timeout_seconds
        with contextlib.suppress(TimeoutError):
            while True:
                self._progressed.clear()
                await asyncio.wait_for(self._progressed.wait(), stall)
        last = f" (last: {self._last_retry.code})" if self._last_retry is not None else ""
        return NotReady(f"Stall timeout: no generation progress in {stall:g} s{last}")

    async def _control(self) -> str:
        """The client's messages after `session.start`, until `session.stop` or the client leaves."""
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return "gone"
            try:
                control = read_control(message, self.session_id)
            except WorkerError as error:
                await self.send_error(error)
                continue
            if isinstance(control, Stop):
                return "stop"
            if isinstance(control, Ping):
                self._touch()
                await self.send_json({"type": "session.pong"})
                continue
            try:
                self.events.queue(control)
            except WorkerError as error:
                await self.send_error(error, event_id=control.event_id)
                continue
            await self.send_json(
                {
                    "type": "session.interaction.queued",
                    "request_id": self.request_id,
                    "event_id": control.event_id,
                }
            )

    async def _pace(self, target: PlayoutTarget, protocol: Upstream, chunk_index: int, reset: bool) -> Any:
        """Generate and send chunks while the viewer's buffer is below its target. The outcome (`_end`): a
        final `WorkerError`, True once stopped, or False when the session reached its `max_chunks` (its
        trailer sent: a finished generation)."""
        viewer = SessionPlayout(target, time.perf_counter())  # this stream's viewer, as the worker models one
        frames = 0  # the last chunk's
        pending: ChunkEvents | None = None  # a chunk whose tick is retried (its events stay applied)
        while not self._stopping.is_set():
            held = viewer.floor(time.perf_counter())
            # A frame short of `buffer_chunks` chunks: the viewer's clock starts when the first chunk reaches
            # it, the worker's when it sent it; the frame's margin keeps the rule on the viewer's clock too.
            wanted = (target.buffer_chunks * frames - 1) / target.fps
            if pending is None and frames and held >= wanted:
                self._touch()  # waiting for the viewer to play is progress
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), held - wanted + 0.001)
                continue
            chunk = pending or self.events.next_chunk(chunk_index)
            body = {
                "request_id": f"{self.request_id}-{chunk_index}",
                "chunk_index": chunk_index,
                "prompt": chunk.prompt,
                "controls": list(chunk.controls),
                "reset": reset,
                "buffer_ms": min(MAX_BUFFER_MS, round(held * 1000)),
            }
            try:
                outcome = await shielded(self._tick(body))  # a forward is never abandoned half-way
            except MaxChunksReached:
                return await self._complete()
            except (ChunkOutOfOrder, Rewound) as error:  # another client ticked it: go on from where it is
                chunk_index, pending = error.extra["expected_chunk_index"], chunk
                continue
            except _RETRIED as error:
                self._last_retry, pending = error, chunk
                with contextlib.suppress(TimeoutError):
                    wait = error.retry_after_seconds or _IN_PROGRESS_WAIT_SECONDS
                    await asyncio.wait_for(self._stopping.wait(), wait)
                continue
            except InvalidTick as error:
                if not chunk.started:
                    return error
                # What the chunk's new events asked cannot be generated: they are dropped, the stream goes on.
                self.events.drop(chunk)
                pending = None
                await self.send_error(error, event_id=chunk.started[-1])
                continue
            except WorkerError as error:
                return error
            self.events.commit(chunk)
            self._last_retry, pending, reset = None, None, False
            frames = len(outcome.chunk.frames)
            await self._send_chunk(outcome.chunk, chunk, protocol, target)
            viewer.delivered(time.perf_counter(), frames, None)
            chunk_index += 1
        return True

    async def _tick(self, body: dict[str, Any]) -> Any:
        outcome = await self.service.tick(
            self.session_id, body, authorization=self._authorization, inject_fault=self.inject_fault
        )
        self.service.metrics.realtime_chunks.inc()
        return outcome

    async def _send_chunk(
        self, cached: Any, chunk: ChunkEvents, protocol: Upstream, target: PlayoutTarget
    ) -> None:
        """The chunk's frames as one fragmented-MP4 segment (the stream's encoder: the first segment opens
        with the init segment), after its `video.chunk_metadata`."""
        if self._encoder is None:
            self._encoder = protocol.create_encoder(
                output_format=STREAM_FORMAT, fps=target.fps, video_codec_options=dict(VIDEO_CODEC_OPTIONS)
            )
        started = time.perf_counter()
        self._encoding = asyncio.ensure_future(asyncio.to_thread(self._encoder.encode, cached.frames))
        segment = await shielded(self._encoding)
        self.service.metrics.realtime_encode_seconds.observe(time.perf_counter() - started)
        if segment:
            frames = len(cached.frames)
            await self._send_segment("media", segment, frames, cached.chunk_index, chunk)
            self.service.metrics.realtime_frames.inc(frames)
        self._touch()

    async def _send_segment(
        self, kind: str, segment: bytes, frames: int, chunk_index: int | None, chunk: ChunkEvents | None
    ) -> None:
        metadata = {
            "type": "video.chunk_metadata",
            "request_id": self.request_id,
            "kind": kind,
            "num_frames": frames,
            "byte_length": len(segment),
            "generation_chunk_index": chunk_index,
            "started_event_ids": chunk.started if chunk else [],
            "active_event_ids": chunk.active if chunk else [],
            "completed_event_ids": chunk.completed if chunk else [],
            "transport_chunk_index": self.chunks_sent,
            "served_by": self.service.placement.served_by.header,  # ours (issue 40): the Pod and its epoch
        }
        await self._send(as_json(metadata), segment)
        self.chunks_sent += 1
        self.service.metrics.realtime_bytes.inc(len(segment))

    async def _complete(self) -> bool:
        """The session reached its `max_chunks`: the encoder's trailer (the last chunk's held-back frame), as
        vllm-omni ends a finished generation."""
        encoder, self._encoder = self._encoder, None
        trailer = b"" if encoder is None else await asyncio.to_thread(encoder.close)
        if trailer:
            await self._send_segment("trailer", trailer, 0, None, None)
        return False

    async def _close_encoder(self) -> None:
        """Release the encoder once no thread encodes with it (a stream may end while one does)."""
        if self._encoding is not None and not self._encoding.done():
            await asyncio.wait((self._encoding,))
        encoder, self._encoder = self._encoder, None
        if encoder is not None:
            await asyncio.to_thread(encoder.close)


async def shielded(awaitable: Any) -> Any:
    """`awaitable`'s result; cancelling the caller leaves it running to its end (a forward, an encode), and
    what it raises then is retrieved, not reported as never retrieved."""
    task = asyncio.ensure_future(awaitable)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return await asyncio.shield(task)
