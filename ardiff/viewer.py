"""`ardiff view SESSION`: a local web page that shows a session's frames and steers it with the keyboard.

The page (`viewer.html`) talks to this process only: `GET /{secret}/` serves it and `WS /{secret}/stream` is
proxied to the session's worker stream (`/v1/sessions/{id}/stream`, docs/contracts.md §4). Pod IPs are not
reachable from a laptop, and the session's token stays here (the page never sees it). The proxy follows the
session: a 421 `misdirected` to the endpoint it names, and a closed or unreachable worker (evicted, pod lost,
resuming) to wherever the session's status says it is once it is `Ready` again; the page then gets a fresh
`ready` message and continues at the chunk it names. It sends the session's phase to the page each second, and
before each stream opens the session's playout target (`{"type": "playout", "fps", "buffer_chunks"}`, from the
worker's session view; the defaults where it names none): the page plays at that rate from that buffer.

A second page plays the session as video (issue 38): `GET /{secret}/video` is a `<video>` element fed through
Media Source Extensions, its socket `WS /{secret}/realtime` proxied to the worker's realtime route
(`/v1/realtime/video?session=<id>`, vllm-omni's protocol: the worker paces the stream and sends fragmented
MP4). The page's first message is its `session.start`, which the proxy sends the worker (the token on the
upgrade) on every connection it opens while it follows the session; its keys become `session.interaction`s
holding the camera keys (vllm-omni's LingBot `state` events). Each page links to the other.

Only the page this run printed may use it (issue 23 item 10): both routes live under a secret path made per
run (another local user, or a web page probing `localhost`, cannot guess it), and answer 403 unless the
request is addressed to the viewer's own origin (its `Host` and, on the socket, the `Origin` a browser always
sends: a page of another origin, a DNS-rebound name among them, cannot open the stream and steer the session).

Messages from the page are forwarded as they are (the worker validates them: ticks, and `rewind` for the
page's step back); a superseded stream (the session opened elsewhere) or a closed session ends the proxying.

Branching (issue 26): the page's `POST fork {"chunk": N}` creates a fork of its session at kept chunk N
(`KubeSessions.fork`, a new name made here) and answers the child's page, `/{secret}/s/{child}/`, which the
page opens in a new tab; it is served like the first (a fork's page can fork again). Only the session named
on the command line and the forks this run made are served (at most `MAX_FORKS` of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import json
import logging
import secrets
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ardiff.client import KubernetesError, KubeSessions, SessionNotFound, base_url, is_ready
from ardiff.player import PlayoutTarget
from ardiff.wire import CLOSE_MISDIRECTED, CLOSE_NORMAL, CLOSE_SUPERSEDED, JSON
from ardiff.worker.net import url_host

log = logging.getLogger(__name__)

PHASE_POLL_SECONDS = 1.0
RECONNECT_SECONDS = 1.0
MAX_PAGE_MESSAGE_BYTES = 1 << 20
SECRET_BYTES = 16  # the per-run path's randomness: 128 bits, not guessable by a local process or a web page
# Ctrl-C stays prompt whatever the peers do: a close handshake, or a send to a page (or worker) that stopped
# reading, waits at most CLOSE_SECONDS before the connection is dropped; handlers get SHUTDOWN_SECONDS to end.
CLOSE_SECONDS = 1.0
SHUTDOWN_SECONDS = 3.0
MAX_FORKS = 64  # sessions one run of the viewer may create (each takes a runner slot of the pool)
MAX_FORK_BODY_BYTES = 1024
FORK_SUFFIX_BYTES = 2  # a fork's name: `{parent}-b{chunk}-{4 hex digits}`, cut to a DNS label's 63
MAX_NAME_LENGTH = 63


@dataclass(frozen=True)
class ViewerSettings:
    session: str
    namespace: str = "default"
    kubeconfig: Path | None = None
    frame_format: str = "jpeg"
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        if self.frame_format not in ("jpeg", "webp"):
            raise ValueError(f"viewer frame_format must be jpeg or webp, got {self.frame_format!r}")


PAGES = {"frames": "viewer.html", "video": "viewer_video.html"}


def page(session: str, mode: str = "frames") -> str:
    """A page (`frames`: the canvas of images; `video`: the MSE player) with the pages' style; it opens its
    socket relative to its own URL (`stream`, `realtime`: under the same secret path)."""
    files = importlib.resources.files("ardiff")
    html = (
        files.joinpath(PAGES[mode]).read_text().replace("__STYLE__", files.joinpath("viewer.css").read_text())
    )
    return html.replace("__SESSION__", session)


def fork_name(parent: str, chunk: int) -> str:
    """A new session name for a fork of `parent` at `chunk`: a DNS label of at most 63 characters."""
    suffix = f"-b{chunk}-{secrets.token_hex(FORK_SUFFIX_BYTES)}"
    return parent[: MAX_NAME_LENGTH - len(suffix)].rstrip("-") + suffix


def origin_of(host: str, port: int) -> str:
    """The viewer's origin when it listens on `host`:`port` (what its printed URL starts with)."""
    return f"http://{url_host(host)}:{port}"


def _websocket(base: str) -> str:
    scheme, _, rest = base.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}"


def stream_url(base: str, session: str, frame_format: str) -> str:
    """The worker's frame stream URL under an `http(s)://` base."""
    return f"{_websocket(base)}/v1/sessions/{session}/stream?format={frame_format}"


def realtime_url(base: str, session: str) -> str:
    """The worker's realtime video URL under an `http(s)://` base (vllm-omni's route, the session named)."""
    return f"{_websocket(base)}/v1/realtime/video?session={session}"


def endpoint_named(message: str) -> str | None:
    """The endpoint a worker's `misdirected` error names: in the frame stream's envelope, or in vllm-omni's
    flat `error` (the realtime route's)."""
    try:
        value = json.loads(message)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("type") != "error":
        return None
    error = value["error"] if isinstance(value.get("error"), dict) else value
    return error.get("endpoint") if error.get("code") == "misdirected" else None


@dataclass
class WorkerClosed:
    """How a worker stream ended: its close code, and the endpoint a `misdirected` error named."""

    code: int | None
    endpoint: str | None = None


class SessionViewer:
    """The page and its stream, for requests to `origin` under `/{secret}/` only (`origin`: set by `serve`
    once the port is known; until then every request is 403)."""

    def __init__(
        self, settings: ViewerSettings, sessions: KubeSessions, *, secret: str | None = None
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.secret = secret or secrets.token_urlsafe(SECRET_BYTES)
        self.origin: str | None = None
        self.forks: list[str] = []  # the sessions this run forked, oldest first (each served under s/{name}/)
        self._forking = 0  # forks asked of the API and not answered yet (they count toward MAX_FORKS)
        self._pages: dict[web.WebSocketResponse, web.Request] = {}  # the pages' sockets, with their requests

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_FORK_BODY_BYTES)
        for base in (f"/{self.secret}/", f"/{self.secret}/s/{{session}}/"):
            app.router.add_get(base, self._page)
            app.router.add_get(f"{base}stream", self._stream)
            app.router.add_post(f"{base}fork", self._fork)
            app.router.add_get(f"{base}video", self._video_page)
            app.router.add_get(f"{base}realtime", self._realtime)
        app.on_shutdown.append(self._close_pages)
        return app

    def session_url(self, session: str) -> str:
        """The path of a session's page: the first one's, or a fork's."""
        return f"/{self.secret}/" if session == self.settings.session else f"/{self.secret}/s/{session}/"

    def runner(self) -> web.AppRunner:
        """The app's runner, with the shutdown bound (`SHUTDOWN_SECONDS`) that `serve` uses."""
        return web.AppRunner(self.app(), shutdown_timeout=SHUTDOWN_SECONDS)

    def url(self) -> str:
        """The page's URL (with its secret path): the only one to open."""
        return f"{self.origin}/{self.secret}/"

    def _refuse_foreign(self, request: web.Request, *, origin_required: bool) -> None:
        """403 unless `request` is addressed to the viewer's own origin: its `Host` (a DNS-rebound name is
        another), and its `Origin` where a browser sends one (always on a WebSocket, so required there)."""
        own = self.origin
        origin = request.headers.get("Origin")
        if (
            own is None
            or f"http://{request.host}" != own
            or (origin is None and origin_required)
            or (origin is not None and origin != own)
        ):
            raise web.HTTPForbidden(text=f"the viewer serves only its own origin ({own})")

    async def _close_pages(self, app: web.Application) -> None:
        """Ctrl-C: close the pages' sockets, which ends their proxying (aiohttp would wait for them). A page
        that does not read (its send buffer full) or answer the close is dropped after `CLOSE_SECONDS`."""
        await asyncio.gather(*(_close_page(page, request) for page, request in list(self._pages.items())))

    def _session(self, request: web.Request) -> str:
        """The session a request is for: the first one, or a fork this run made (else 404)."""
        session = request.match_info.get("session", self.settings.session)
        if session != self.settings.session and session not in self.forks:
            message = f"the viewer serves {self.settings.session} and its forks only"
            raise web.HTTPNotFound(text=_error_json("unknown_session", message), content_type=JSON)
        return session

    async def _page(self, request: web.Request) -> web.Response:
        self._refuse_foreign(request, origin_required=False)  # a navigation sends no Origin
        return web.Response(text=page(self._session(request)), content_type="text/html")

    async def _video_page(self, request: web.Request) -> web.Response:
        self._refuse_foreign(request, origin_required=False)
        return web.Response(text=page(self._session(request), "video"), content_type="text/html")

    async def _fork(self, request: web.Request) -> web.Response:
        """`POST fork {"chunk": N}`: a fork of the page's session at its kept chunk N; the child's page."""
        self._refuse_foreign(request, origin_required=True)  # a browser's POST always sends Origin
        parent = self._session(request)
        try:
            chunk = json.loads(await request.text())["chunk"]
        except (ValueError, KeyError, TypeError):
            chunk = None
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            return _refusal(400, "invalid_fork", 'the body must be {"chunk": N} with an integer N >= 1')
        if len(self.forks) + self._forking >= MAX_FORKS:
            return _refusal(429, "too_many_forks", f"this viewer made its {MAX_FORKS} forks already")
        child = fork_name(parent, chunk)
        self._forking += 1
        try:
            await asyncio.to_thread(self.sessions.fork, parent, child, chunk)
        except KubernetesError as exc:
            # The API's refusal (404 no parent, 422 invalid, 409 name taken) as it is; no answer: 502.
            status = exc.status if exc.status is not None and 400 <= exc.status < 500 else 502
            return _refusal(status, exc.code, exc.message)
        finally:
            self._forking -= 1
        self.forks.append(child)
        url = self.session_url(child)
        print(f"forked {parent} at chunk {chunk} as {child}: {self.origin}{url}", flush=True)
        return web.json_response({"session": child, "chunk": chunk, "url": url})

    async def _status(self, session: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sessions.status, session)

    async def _stream(self, request: web.Request) -> web.WebSocketResponse:
        """The frame stream: the page's ticks to the worker's `/stream`, its chunks back."""
        frame_format = self.settings.frame_format
        return await self._serve_page(request, lambda base, session: stream_url(base, session, frame_format))

    async def _realtime(self, request: web.Request) -> web.WebSocketResponse:
        """The realtime video stream: the page's `session.start` and interactions to the worker's realtime
        route, its segments back."""
        return await self._serve_page(request, realtime_url, opening=True)

    async def _serve_page(
        self, request: web.Request, url_of: Callable[[str, str], str], *, opening: bool = False
    ) -> web.WebSocketResponse:
        """A page's socket, proxied to the session's worker at `url_of(base, session)` while the page stays
        (`opening`: the page's first message is sent first on every worker connection)."""
        self._refuse_foreign(request, origin_required=True)
        session = self._session(request)
        # Uncompressed: frames and segments are compressed already, deflating them again only costs CPU.
        browser = web.WebSocketResponse(
            max_msg_size=MAX_PAGE_MESSAGE_BYTES, timeout=CLOSE_SECONDS, compress=False
        )
        await browser.prepare(request)
        self._pages[browser] = request
        phases = asyncio.create_task(self._report_phase(browser, session))
        try:
            first = await self._opening(browser) if opening else None
            if first is not None or not opening:
                async with aiohttp.ClientSession() as http:
                    await self._proxy(browser, http, session, url_of, first)
        except SessionNotFound as exc:
            await _send(browser, {"type": "error", "error": {"code": exc.code, "message": exc.message}})
        finally:
            phases.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await phases
            self._pages.pop(browser, None)
            await browser.close()
        return browser

    async def _report_phase(self, browser: web.WebSocketResponse, session: str) -> None:
        """The session's phase (and why) whenever it changes, polled from its status."""
        last: tuple[Any, ...] | None = None
        while not browser.closed:
            try:
                status = await self._status(session)
            except Exception as exc:  # the API away for a moment: say so, keep polling
                status = {"phase": "Unknown", "reason": type(exc).__name__}
            now = (status.get("phase"), status.get("reason"), status.get("pod"))
            if now != last:
                last = now
                await _send(browser, {"type": "phase", "phase": now[0], "reason": now[1], "pod": now[2]})
            await asyncio.sleep(PHASE_POLL_SECONDS)

    @staticmethod
    async def _opening(browser: web.WebSocketResponse) -> str | None:
        """The page's first message, a `session.start` (the page never holds the token: one it names is
        dropped); None when the page left or sent something else."""
        message = await browser.receive()
        if message.type != aiohttp.WSMsgType.TEXT:
            return None
        try:
            start = json.loads(message.data)
        except ValueError:
            start = None
        if not isinstance(start, dict) or start.get("type") != "session.start":
            refused = {
                "type": "error",
                "code": "invalid_tick",
                "message": "the first message must be session.start",
            }
            await _send(browser, refused)
            return None
        start.pop("session_token", None)
        return json.dumps(start)

    async def _proxy(
        self,
        browser: web.WebSocketResponse,
        http: aiohttp.ClientSession,
        session: str,
        url_of: Callable[[str, str], str],
        opening: str | None,
    ) -> None:
        endpoint: str | None = None
        while not browser.closed:
            status = await self._wait_ready(browser, session)
            if status is None:
                return
            token = await asyncio.to_thread(self.sessions.token, session, status)
            base = (endpoint or base_url(status)).rstrip("/")
            url = url_of(base, session)
            auth = {"Authorization": f"Bearer {token}"}
            try:
                await self._send_playout(browser, http, f"{base}/v1/sessions/{session}", auth)
                async with http.ws_connect(url, headers=auth, max_msg_size=0) as worker:
                    if opening is not None:
                        await worker.send_str(opening)
                    closed = await self._pump(browser, worker)
            except aiohttp.ClientError as exc:
                log.info("worker stream %s unreachable (%s); following the session", url, exc)
                closed = WorkerClosed(code=None)
            if browser.closed:
                return
            if closed.code in (CLOSE_SUPERSEDED, CLOSE_NORMAL):
                return  # the session is streamed elsewhere now, or was closed
            endpoint = closed.endpoint if closed.code == CLOSE_MISDIRECTED else None
            if endpoint is None:
                await asyncio.sleep(RECONNECT_SECONDS)

    async def _send_playout(
        self, browser: web.WebSocketResponse, http: aiohttp.ClientSession, view_url: str, auth: dict[str, str]
    ) -> None:
        """The session's playout target, from its worker's session view (the defaults if the read fails: the
        stream then says why)."""
        async with http.get(view_url, headers=auth) as answer:
            view = await answer.json() if answer.status == 200 else {}
        target = PlayoutTarget.of_view(view)
        await _send(browser, {"type": "playout", "fps": target.fps, "buffer_chunks": target.buffer_chunks})

    async def _wait_ready(self, browser: web.WebSocketResponse, session: str) -> dict[str, Any] | None:
        while not browser.closed:
            status = await self._status(session)
            if is_ready(status):
                return status
            if status.get("phase") in ("Failed", "Expired"):
                await _send(
                    browser,
                    {
                        "type": "error",
                        "error": {
                            "code": "session_ended",
                            "message": status.get("message") or status["phase"],
                        },
                    },
                )
                await browser.close()
                return None
            await asyncio.sleep(PHASE_POLL_SECONDS)
        return None

    async def _pump(
        self, browser: web.WebSocketResponse, worker: aiohttp.ClientWebSocketResponse
    ) -> WorkerClosed:
        """Forward both ways until one side closes; how the worker's side ended (the browser's: code None
        and the browser closed)."""
        misdirected_to: str | None = None

        async def to_worker() -> None:
            async for message in browser:
                if message.type == aiohttp.WSMsgType.TEXT:
                    await worker.send_str(message.data)

        async def to_browser() -> None:
            nonlocal misdirected_to
            async for message in worker:
                if message.type == aiohttp.WSMsgType.TEXT:
                    misdirected_to = endpoint_named(message.data) or misdirected_to
                    await browser.send_str(message.data)
                elif message.type == aiohttp.WSMsgType.BINARY:
                    await browser.send_bytes(message.data)

        tasks = [asyncio.create_task(to_worker()), asyncio.create_task(to_browser())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if browser.closed:
            # Bounded as a whole: aiohttp's close timeout bounds each read while it waits for the worker's
            # answer, and a worker still sending frames would keep it reading. A timed-out close drops it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.close(), CLOSE_SECONDS)
            return WorkerClosed(code=None)
        return WorkerClosed(code=worker.close_code, endpoint=misdirected_to)


async def _close_page(browser: web.WebSocketResponse, request: web.Request) -> None:
    try:
        await asyncio.wait_for(
            browser.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"viewer stopped"), CLOSE_SECONDS
        )
    except TimeoutError:
        # Aborted, not closed: a transport's close waits until a page that stopped reading took its buffer.
        if request.transport is not None:
            request.transport.abort()


def _error_json(code: str, message: str) -> str:
    return json.dumps({"error": {"code": code, "message": message}})


def _refusal(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, text=_error_json(code, message), content_type=JSON)


async def _send(browser: web.WebSocketResponse, message: dict[str, Any]) -> None:
    if not browser.closed:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await browser.send_str(json.dumps(message))


async def serve(settings: ViewerSettings, *, open_browser: bool = False) -> None:
    """Serve the viewer until cancelled; prints the page's URL (and opens it, if asked)."""
    sessions = KubeSessions(settings.namespace, kubeconfig=settings.kubeconfig)
    await asyncio.to_thread(sessions.get, settings.session)  # an unknown session fails before serving
    viewer = SessionViewer(settings, sessions)
    runner = viewer.runner()
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    viewer.origin = origin_of(settings.host, runner.addresses[0][1])
    url = viewer.url()
    print(f"viewer of session {settings.session} at {url} (Ctrl-C to stop; as video: {url}video)", flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
