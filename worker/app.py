"""The worker's HTTP API (docs/contracts.md §4): FastAPI routes over a `WorkerService`.

`create_app()` is the one place where exceptions become HTTP answers: every error is the envelope
`{"error": {code, message, type, param, ...}}`, request-shape errors are 400 `invalid_tick`, and a bug is a
500 `internal_error` (never a traceback).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ardiff import __version__
from ardiff.wire import FRONT_DOOR_HEADER, SERVED_BY_HEADER
from ardiff.worker.encoding import MP4, RAW
from ardiff.worker.errors import VIA_FRONT_DOOR, BodyTooLarge, InvalidTick, WorkerError
from ardiff.worker.messages import RewindBody
from ardiff.worker.placement_port import PlacementPort
from ardiff.worker.realtime import RealtimeVideoStream
from ardiff.worker.service import WorkerService
from ardiff.worker.stream import SessionStream, SessionStreams
from ardiff.worker.transfer import KEPT_PATH, PREFETCH_PATH, TRANSFER_PATH, Outgoing

log = logging.getLogger(__name__)

# A tick is a few hundred bytes (a camera trajectory a few KB); images come from the session record.
MAX_BODY_BYTES = 1 << 20
FAULT_HEADER = "ardiff-test-fault"


# ------------------------------------------------------------------------------ request/response models


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str
    type: str
    param: str | None = None


class ErrorEnvelope(BaseModel):
    error: ErrorInfo


class PlayoutView(BaseModel):
    """The session's playout target and what its viewer saw of it (worker/playout.py; None before a chunk)."""

    fps: float
    buffer_chunks: int
    time_to_first_chunk_s: float | None
    chunks_on_time: int
    chunks_late: int
    stall_s: float
    cpr: float | None


class SessionView(BaseModel):
    session_id: str
    state: str
    next_chunk_index: int
    last_request_id: str | None
    ticks: int
    resident: bool
    in_flight: bool = False
    playout: PlayoutView


class RewindView(BaseModel):
    session: str
    chunk_index: int
    kept_chunks: list[int]


class KVBlocksView(BaseModel):
    free: int
    total: int


class SessionList(BaseModel):
    ready: bool
    capacity: int
    admitted: int
    kv_blocks: KVBlocksView | None
    sessions: list[SessionView] | None = Field(
        description="the sessions this pod holds: only for the pool's transfer token (or standalone)"
    )


class Status(BaseModel):
    status: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorEnvelope} for status in statuses}


_FRAME_HEADERS = {
    "ardiff-chunk-metadata": {
        "description": "JSON: session_id, request_id, chunk_index, applied_event_ids",
        "schema": {"type": "string"},
    },
    "ardiff-frame-shape": {"description": "F,H,W,3", "schema": {"type": "string"}},
    "server-timing": {"description": "queue, forward, decode, encode (ms)", "schema": {"type": "string"}},
}
_TICK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the chunk's frames: raw uint8 FxHxWx3, or H.264 MP4",
        "content": {
            RAW: {"schema": {"type": "string", "format": "binary"}},
            MP4: {"schema": {"type": "string", "format": "binary"}},
        },
        "headers": _FRAME_HEADERS,
    },
    **_errors(400, 401, 404, 409, 410, 413, 421, 429, 500, 503),
}
_ROBOT_TICK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the action chunk: JSON {actions, action_shape}, or raw little-endian float32 actions "
        "followed by the uint8 predicted frames (shapes in the headers)",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            RAW: {"schema": {"type": "string", "format": "binary"}},
        },
        "headers": {
            **_FRAME_HEADERS,
            "ardiff-action-shape": {"description": "N,D (float32)", "schema": {"type": "string"}},
        },
    },
    **_errors(400, 401, 404, 409, 410, 413, 421, 429, 500, 503),
}
_SESSION_ERRORS = _errors(400, 401, 404, 409, 410, 421, 503)

SessionId = Annotated[str, Path(description="the ARDiffusionSession's name")]
bearer = HTTPBearer(auto_error=False, description="the session's token (Secret `<session>-token`)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


# ------------------------------------------------------------------------------------------ middleware


class BodyGuard:
    """Request bodies read only when a route asks for them, and within `limit` bytes.

    Nothing is refused before a route reads the body: the tick route authenticates first (issue 23 item 10),
    so a caller who may not tick gets 401 whatever the body. A body over `limit`, declared or streamed, is
    413 `body_too_large` at the read (a declared one before a byte of it is received). An answer that goes
    out before its request's body was read to the end closes the connection (`Connection: close`): the rest
    of the body is never received, and the connection cannot be kept busy with it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        over = declared is not None and declared.isdigit() and int(declared) > self.limit
        unread = b"transfer-encoding" in headers or (declared is not None and declared not in (b"", b"0"))
        received = 0

        async def limited_receive() -> Message:
            nonlocal received, unread
            if over:
                raise BodyOverflow(self.limit)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyOverflow(self.limit)
                unread = unread and message.get("more_body", False)
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, limited_receive, closing_send)


class FrontDoorMark:
    """Marks a request (or WebSocket) that came through the front door (`ardiff.wire.FRONT_DOOR_HEADER`,
    set by its Envoy on every request it forwards, a client's own copy replaced): the errors made while it is
    served name no Pod address (`worker.errors.VIA_FRONT_DOOR`)."""

    _HEADER = FRONT_DOOR_HEADER.encode()

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not any(
            name == self._HEADER for name, _ in scope["headers"]
        ):
            await self.app(scope, receive, send)
            return
        token = VIA_FRONT_DOOR.set(True)
        try:
            await self.app(scope, receive, send)
        finally:
            VIA_FRONT_DOOR.reset(token)


class ServedByHeader:
    """Every answer of a session route (`/v1/sessions/...`), errors included, names the Pod and epoch that
    served it (`ardiff.wire.SERVED_BY_HEADER`): a client's history tells a stale Pod's answers from its
    successor's."""

    _PREFIX = "/v1/sessions/"
    _HEADER = SERVED_BY_HEADER.encode()

    def __init__(self, app: ASGIApp, placement: PlacementPort) -> None:
        self.app = app
        self.placement = placement

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self._PREFIX):
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                served_by = self.placement.served_by.header.encode()
                message["headers"] = [*message.get("headers", ()), (self._HEADER, served_by)]
            await send(message)

        await self.app(scope, receive, named)


class BodyOverflow(StarletteHTTPException):
    """Raised from `receive`: an HTTPException, so FastAPI's body reading passes it on (it turns any other
    exception into a 400) and `create_app` answers it as `BodyTooLarge`."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")


class RouteError(WorkerError):
    """An unknown route (404) or method (405): Starlette's status, a code made from its phrase."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status  # type: ignore[misc]  # per instance: Starlette picks the status
        self.code = message.lower().replace(" ", "_")


def export_response(export: Outgoing) -> StreamingResponse:
    """An export pulled by another pod of the pool: its pieces with their length declared."""
    return StreamingResponse(
        export.body,
        media_type="application/octet-stream",
        headers={"content-length": str(export.size)},
    )


def _error_response(error: WorkerError) -> JSONResponse:
    retry = error.retry_after_seconds
    headers = None if retry is None else {"Retry-After": str(retry)}
    return JSONResponse(error.envelope(), status_code=error.status, headers=headers)


class AuthenticatedTickRoute(APIRoute):
    """The tick route (and the rewind's): the checks that need no body (`WorkerService.admitted`: placement
    and token among them) run before FastAPI reads and parses the body (issue 23 item 10). A caller who may
    not tick the session gets 401 whatever the body, and its bytes are never read, buffered or parsed; a
    tick that passes finds what it was admitted with in `request.state.admitted`."""

    def get_route_handler(self) -> Any:
        parse_and_tick = super().get_route_handler()

        async def authenticated_first(request: Request) -> Response:
            service: WorkerService = request.app.state.service
            session_id = request.path_params["session_id"]
            async with service.admitted(session_id, request.headers.get("authorization")) as admitted:
                request.state.admitted = admitted
                return await parse_and_tick(request)

        return authenticated_first


# ------------------------------------------------------------------------------------------ the app


def create_app(service: WorkerService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="ardiff worker",
        version=__version__,
        description="Ticks of the AR-diffusion sessions resident on this pod (vllm-omni paged-KV runner).",
        lifespan=lifespan,
    )
    app.state.service = service
    family = service.family
    app.add_middleware(BodyGuard, limit=max(MAX_BODY_BYTES, family.max_body_bytes))
    app.add_middleware(FrontDoorMark)
    app.add_middleware(ServedByHeader, placement=service.placement)

    # -------------------------------------------------------------- the one exception -> status mapping
    def count(error: WorkerError) -> JSONResponse:
        service.metrics.errors.labels(error.code).inc()
        return _error_response(error)

    @app.exception_handler(WorkerError)
    async def worker_error(request: Request, exc: WorkerError) -> JSONResponse:
        return count(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "path", "header", "query")]
        param = "body" if first.get("type") == "json_invalid" else ".".join(loc) or "body"
        return count(InvalidTick(f"{param}: {first.get('msg', 'invalid')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyOverflow):
            return count(BodyTooLarge(str(exc.detail)))
        error = RouteError(exc.status_code, str(exc.detail))
        return JSONResponse(error.envelope(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return count(WorkerError(f"internal error ({type(exc).__name__})"))

    # -------------------------------------------------------------- routes

    def authorization(credentials: HTTPAuthorizationCredentials | None) -> str | None:
        return None if credentials is None else f"{credentials.scheme} {credentials.credentials}"

    async def post_tick(
        request: Request,
        session_id: SessionId,
        body: Any,  # the family's tick body (LingBot: camera controls; DreamZero: an observation), set below
        credentials: Credentials = None,  # checked before the body is read (AuthenticatedTickRoute)
        accept: Annotated[str | None, Header()] = None,
        fault: Annotated[str | None, Header(alias=FAULT_HEADER, include_in_schema=False)] = None,
    ) -> Response:
        result = await service.tick_answer(
            request.state.admitted,
            body,
            family.choose_media_type(accept),
            inject_fault=service.settings.test_faults and fault == "forward",
        )
        return Response(result.body, media_type=result.media_type, headers=result.headers)

    post_tick.__annotations__["body"] = family.tick_body
    app.router.add_api_route(
        "/v1/sessions/{session_id}/ticks",
        post_tick,
        methods=["POST"],
        response_class=Response,
        responses=_TICK_RESPONSES if family.name == "lingbot" else _ROBOT_TICK_RESPONSES,
        summary="Generate the session's next chunk",
        route_class_override=AuthenticatedTickRoute,
    )

    streams = SessionStreams()

    @app.websocket("/v1/sessions/{session_id}/stream")
    async def stream_session(websocket: WebSocket, session_id: str) -> None:
        """Ticks over a WebSocket (docs/contracts.md §4): tick messages in, chunk messages and frames out."""
        fault = service.settings.test_faults and websocket.headers.get(FAULT_HEADER) == "forward"
        frame_format = websocket.query_params.get("format")
        stream = SessionStream(
            websocket, service, streams, session_id, frame_format=frame_format, inject_fault=fault
        )
        await stream.run()

    if family.name == "lingbot":

        @app.websocket("/v1/realtime/video")
        async def realtime_video(websocket: WebSocket, session: str = "") -> None:
            """vllm-omni's realtime video protocol on a session (`?session=<id>`): server-paced fragmented MP4
            (docs/contracts.md §4 "Realtime video")."""
            fault = service.settings.test_faults and websocket.headers.get(FAULT_HEADER) == "forward"
            await RealtimeVideoStream(websocket, service, streams, session, inject_fault=fault).run()

    if family.name == "dreamzero":

        @app.websocket("/v1/sessions/{session_id}/openpi")
        async def openpi_session(websocket: WebSocket, session_id: str) -> None:
            """An openpi policy client's WebSocket (msgpack-numpy observations in, action chunks out)."""
            from ardiff.worker.openpi import OpenPIConnection

            await OpenPIConnection(websocket, service, streams, session_id).run()

    @app.delete("/v1/sessions/{session_id}", response_model=SessionView, responses=_SESSION_ERRORS)
    async def delete_session(session_id: SessionId, credentials: Credentials = None) -> dict[str, Any]:
        return await service.close(session_id, authorization(credentials))

    @app.post("/v1/sessions/{session_id}/reset", response_model=SessionView, responses=_SESSION_ERRORS)
    async def reset_session(session_id: SessionId, credentials: Credentials = None) -> dict[str, Any]:
        return await service.reset(session_id, authorization(credentials))

    @app.get("/v1/sessions/{session_id}", response_model=SessionView, responses=_SESSION_ERRORS)
    async def get_session(session_id: SessionId, credentials: Credentials = None) -> dict[str, Any]:
        return await service.describe(session_id, authorization(credentials))

    async def rewind_session(
        request: Request,
        session_id: SessionId,
        body: RewindBody,
        credentials: Credentials = None,  # checked before the body is read (AuthenticatedTickRoute)
    ) -> dict[str, Any]:
        """Put the session back at one of its kept chunk boundaries (issue 26)."""
        return await service.rewind_admitted(request.state.admitted, body.chunk)

    app.router.add_api_route(
        "/v1/sessions/{session_id}/rewind",
        rewind_session,
        methods=["POST"],
        response_model=RewindView,
        responses=_errors(400, 401, 404, 409, 410, 413, 421, 429, 503),
        summary="Put the session back at a kept chunk boundary",
        route_class_override=AuthenticatedTickRoute,
    )

    @app.get(KEPT_PATH, include_in_schema=False)  # pod to pod: a fork placed on another pod pulls it
    async def kept_for_fork(
        session_id: str, chunk: int, credentials: Credentials = None
    ) -> StreamingResponse:
        """A session's kept chunk boundary, streamed to the pod a fork of it was placed on (the pool's
        transfer token)."""
        return export_response(service.send_kept(session_id, chunk, authorization(credentials)))

    @app.get(TRANSFER_PATH, include_in_schema=False)  # pod to pod, not for clients: contracts §4 "Transfer"
    async def export_for_transfer(session_id: str, credentials: Credentials = None) -> StreamingResponse:
        """A migrated session's export, streamed to the pod it was placed on (the pool's transfer token)."""
        held = await service.claim_transfer(session_id, authorization(credentials))
        return export_response(await service.send_transfer(session_id, held))

    @app.post(PREFETCH_PATH, include_in_schema=False, status_code=202)
    async def prefetch_session(session_id: str, credentials: Credentials = None) -> dict[str, str]:
        """The pod holding a migrated session placed here offers it: this pod pulls it in the background."""
        service.prefetch(session_id, authorization(credentials))
        return {"status": "accepted"}

    @app.get("/v1/sessions", response_model=SessionList, responses=_errors(401))
    async def list_sessions(credentials: Credentials = None) -> dict[str, Any]:
        """The pod's capacity and KV blocks; its sessions only with the pool's transfer token."""
        return service.list_sessions(authorization(credentials))

    @app.get("/healthz", response_model=Status)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=Status, responses=_errors(503))
    async def readyz() -> dict[str, str]:
        service.require_ready()
        return {"status": "ready"}

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def metrics() -> Response:
        return Response(service.render_metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
