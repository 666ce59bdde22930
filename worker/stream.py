"""WebSocket streaming of one session's ticks: `/v1/sessions/{id}/stream` (docs/contracts.md §4).

The stream carries the HTTP tick's contract over one connection: the client sends tick messages, the worker
answers each with a `chunk` message (the metadata echo, the frame shape, timings) followed by one binary
message per frame (JPEG or WebP, `?format=`). Every check is `WorkerService.tick`'s, so codes and rules are
the HTTP tick's; an error is a JSON `error` message (the HTTP envelope), and the errors that end what this
connection can do (401, 404, 410, 421, superseded, a 503 at open) are followed by a close with code
`4000 + status` and the error code as reason (a close reason holds 123 bytes, the message may not fit).

Auth: `Authorization: Bearer` where the client can set it, else an `auth` message first (browsers cannot set
headers on a WebSocket). The newest connection to a session wins: an older one gets `superseded` (a page
reload works). Back-pressure: a connection handles one message at a time and awaits each send, so a client
that stops reading stops its ticks; the worker buffers at most one chunk per connection.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import time
from typing import Any, cast

from pydantic import ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ardiff.wire import CLOSE_ERROR_BASE, CLOSE_NORMAL, CLOSE_SUPERSEDED
from ardiff.worker.encoding import FRAME_FORMATS, FrameFormat, encode_images
from ardiff.worker.errors import BodyTooLarge, ChunkNotKept, InvalidTick, Unauthorized, WorkerError
from ardiff.worker.messages import StreamAuth, StreamRewind, StreamTick
from ardiff.worker.service import WorkerService

log = logging.getLogger(__name__)

# A browser sends its auth message right after the socket opens; a socket that has not authenticated by
# then is closed (issue 23 item 10: an unauthenticated connection holds a place in the server's limit).
AUTH_TIMEOUT_SECONDS = 2.0
MAX_MESSAGE_BYTES = 1 << 20  # a tick message over it gets `body_too_large`, like an HTTP body
# The WebSocket layer's own limit (uvicorn's ws_max_size): a message over it closes the connection (1009).
MAX_FRAME_BYTES = 4 * MAX_MESSAGE_BYTES
# The statuses after which the connection cannot go on (the session is not, or no longer, served here).
_FINAL_STATUSES = frozenset({401, 404, 410, 421})


def ends_stream(error: WorkerError) -> bool:
    """Whether an error ends the connection: what it can no longer do, never a chunk not kept (the stream
    goes on from where it is)."""
    return error.status in _FINAL_STATUSES and not isinstance(error, ChunkNotKept)


def as_json(message: dict[str, Any]) -> str:
    """A message's text on the wire: compact, ASCII."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":"))


class Superseded(WorkerError):
    status = 409
    code = "superseded"


def close_code(error: WorkerError) -> int:
    return CLOSE_SUPERSEDED if isinstance(error, Superseded) else CLOSE_ERROR_BASE + error.status


class SessionStreams:
    """The open stream of each session; a newer connection supersedes the older one."""

    def __init__(self) -> None:
        self._open: dict[str, SessionSocket] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def claim(self, stream: SessionSocket) -> None:
        previous = self._open.get(stream.session_id)
        self._open[stream.session_id] = stream
        if previous is not None:
            await previous.fail(Superseded("a newer connection to this session took over the stream"))

    def release(self, stream: SessionSocket) -> None:
        if self._open.get(stream.session_id) is stream:
            del self._open[stream.session_id]


class SessionSocket(abc.ABC):
    """One WebSocket connection to one session: sending (serialised: a superseding connection may close this
    one mid-send), errors as messages, the closes, and the connection's lifetime. Each protocol (the frame
    stream here, OpenPI for robot sessions) serves its messages in `_serve`."""

    def __init__(
        self,
        websocket: WebSocket,
        service: WorkerService,
        streams: SessionStreams,
        session_id: str,
        *,
        inject_fault: bool = False,
    ) -> None:
        self.websocket = websocket
        self.service = service
        self.streams = streams
        self.session_id = session_id
        self.inject_fault = inject_fault  # test-only (ARDIFF_TEST_FAULTS): every forward of this stream fails
        self._send_lock = asyncio.Lock()
        self._closed = False

    async def _send(self, *messages: str | bytes) -> None:
        """The messages in order, none of another sender's between them."""
        async with self._send_lock:
            for message in messages:
                if self._closed:
                    raise WebSocketDisconnect(CLOSE_NORMAL)
                if isinstance(message, bytes):
                    await self.websocket.send_bytes(message)
                else:
                    await self.websocket.send_text(message)

    async def send_json(self, message: dict[str, Any]) -> None:
        await self._send(as_json(message))

    async def send_error(self, error: WorkerError) -> None:
        self.service.metrics.errors.labels(error.code).inc()
        message: dict[str, Any] = {"type": "error", **error.envelope()}
        if error.retry_after_seconds is not None:
            message["error"]["retry_after"] = error.retry_after_seconds
        await self.send_json(message)

    async def close(self, code: int, reason: str) -> None:
        async with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self.service.metrics.stream_closes.labels(str(code)).inc()
            if self.websocket.application_state is not WebSocketState.DISCONNECTED:
                with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                    await self.websocket.close(code=code, reason=reason[:123])

    async def fail(self, error: WorkerError) -> None:
        """The error as a message, then the close that says the connection is over."""
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await self.send_error(error)
        await self.close(close_code(error), error.code)

    async def run(self) -> None:
        await self.websocket.accept()
        self.service.metrics.streams_open.inc()
        try:
            await self._serve()
        except WebSocketDisconnect:
            pass
        finally:
            self.streams.release(self)
            self.service.metrics.streams_open.dec()
            await self.close(CLOSE_NORMAL, "bye")

    @abc.abstractmethod
    async def _serve(self) -> None:
        """Serve the connection's messages until it ends."""


class SessionStream(SessionSocket):
    """The frame stream: tick messages in, a chunk message and one image per frame out."""

    def __init__(
        self,
        websocket: WebSocket,
        service: WorkerService,
        streams: SessionStreams,
        session_id: str,
        *,
        frame_format: str | None = None,
        inject_fault: bool = False,
    ) -> None:
        super().__init__(websocket, service, streams, session_id, inject_fault=inject_fault)
        self.frame_format = frame_format

    async def _serve(self) -> None:
        frame_format = cast(FrameFormat, self.frame_format or "jpeg")
        if frame_format not in FRAME_FORMATS:
            formats = ", ".join(FRAME_FORMATS)
            await self.fail(
                InvalidTick(f"format must be one of {formats}, got {frame_format!r}", param="format")
            )
            return
        authorization = self.websocket.headers.get("authorization")
        if not authorization and not self.service.settings.standalone:  # standalone: no auth, as over HTTP
            authorization = await self._auth_message()
            if authorization is None:
                return
        try:
            view = (await self.service.open_stream(self.session_id, authorization)).view
        except WorkerError as error:
            await self.fail(error)
            return
        await self.streams.claim(self)
        await self.send_json(
            {
                "type": "ready",
                "session_id": self.session_id,
                "state": view["state"],
                "next_chunk_index": view["next_chunk_index"],
                "format": frame_format,
                "media_type": FRAME_FORMATS[frame_format],
            }
        )
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            value = self._json_of(message)
            if isinstance(value, dict) and value.get("type") == "rewind":
                if not await self._rewind(value, authorization):
                    return
                continue
            tick = await self._tick_message(message, value)
            if tick is None:
                continue
            if not await self._tick(tick, authorization, frame_format):
                return

    async def _auth_message(self) -> str | None:
        """The token from the first message, as an `Authorization` value; None after failing the stream."""
        try:
            message = await asyncio.wait_for(self.websocket.receive(), AUTH_TIMEOUT_SECONDS)
        except TimeoutError:
            await self.fail(
                Unauthorized(f"no Authorization header and no auth message in {AUTH_TIMEOUT_SECONDS:g} s")
            )
            return None
        if message["type"] == "websocket.disconnect":
            return None
        try:
            auth = StreamAuth.model_validate_json(message.get("text") or message.get("bytes") or b"")
        except ValidationError:
            await self.fail(
                Unauthorized(
                    'without an Authorization header the first message must be {"type": "auth", "token": ...}'
                )
            )
            return None
        return f"Bearer {auth.token}"

    @staticmethod
    def _json_of(message: dict[str, Any]) -> Any:
        """A text message's JSON, parsed once for both kinds (a rewind, a tick); None when it is not one
        (binary, too large, malformed: `_tick_message` answers those)."""
        raw = message.get("text")
        if raw is None or len(raw.encode()) > MAX_MESSAGE_BYTES:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def _rewind(self, value: dict[str, Any], authorization: str | None) -> bool:
        """Answer a rewind (issue 26) with a `rewound` message or an error; False once the connection is
        over (a chunk not kept is an answer, not the end of the stream)."""
        try:
            try:
                rewind = StreamRewind.model_validate(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                param = ".".join(str(part) for part in first.get("loc", ())) or "body"
                raise InvalidTick(f"{param}: {first.get('msg', 'invalid')}", param=param) from None
            answer = await self.service.rewind(self.session_id, rewind.chunk, authorization)
        except WorkerError as error:
            if ends_stream(error):
                await self.fail(error)
                return False
            await self.send_error(error)
            return True
        await self.send_json({"type": "rewound", **answer})
        return True

    async def _tick_message(self, message: dict[str, Any], value: Any) -> StreamTick | None:
        """The tick a message carries (`value`: its JSON), validated like the HTTP body; None after
        answering an error."""
        raw = message.get("text")
        if raw is None:
            await self.send_error(InvalidTick("tick messages are JSON text, not binary", param="body"))
            return None
        if len(raw.encode()) > MAX_MESSAGE_BYTES:
            await self.send_error(BodyTooLarge(f"a tick message holds at most {MAX_MESSAGE_BYTES} bytes"))
            return None
        if value is None and raw.strip() != "null":
            await self.send_error(InvalidTick("body: Invalid JSON", param="body"))
            return None
        try:
            return StreamTick.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(part) for part in first.get("loc", ())) or "body"
            await self.send_error(InvalidTick(f"{param}: {first.get('msg', 'invalid')}", param=param))
            return None

    async def _tick(self, body: StreamTick, authorization: str | None, frame_format: FrameFormat) -> bool:
        """Answer one tick; False once the connection is over."""
        try:
            outcome = await self.service.tick(
                self.session_id, body, authorization=authorization, inject_fault=self.inject_fault
            )
        except WorkerError as error:
            if ends_stream(error):
                await self.fail(error)
                return False
            await self.send_error(error)
            return True
        started = time.perf_counter()
        images = await asyncio.to_thread(encode_images, outcome.chunk.frames, frame_format)
        encode = time.perf_counter() - started
        frames = outcome.chunk.frames
        await self.send_json(
            {
                "type": "chunk",
                "metadata": {**outcome.chunk.metadata, "served_by": self.service.placement.served_by.header},
                "frame_shape": list(frames.shape),
                "frames": len(images),
                "media_type": FRAME_FORMATS[frame_format],
                "timing": outcome.timing(encode=encode),
            }
        )
        for image in images:
            await self._send(image)
        if body.close_session:
            await self.close(CLOSE_NORMAL, "session closed")
            return False
        return True
