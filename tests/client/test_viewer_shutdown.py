"""Ctrl-C stops `ardiff view` promptly whatever its peers do: a page that stopped reading (its socket's send
buffer full of frames) and a worker that neither reads nor answers a close. The real aiohttp app and a real
worker-side WebSocket server on local ports; a stand-in for the cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ardiff.viewer import CLOSE_SECONDS, SHUTDOWN_SECONDS, SessionViewer, ViewerSettings, origin_of

SESSION = "forest-walk"
FRAME = b"\xff" * (1 << 20)


class ReadySessions:
    """The session Ready on the worker at `endpoint`, as `KubeSessions` reports it."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def status(self, name: str) -> dict[str, Any]:
        return {"phase": "Ready", "endpoint": self.endpoint, "pod": "pool-abc12"}

    def token(self, name: str, status: dict[str, Any]) -> str:
        return "session-token"


class FloodingWorker:
    """A worker stream that sends frames as fast as the viewer takes them and never reads (so it never
    answers a close handshake either)."""

    def __init__(self) -> None:
        self.streaming = asyncio.Event()

    async def stream(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoclose=False)
        await socket.prepare(request)
        self.streaming.set()
        transport = request.transport
        while transport is not None and not transport.is_closing():
            await socket.send_bytes(FRAME)
        return socket


async def serve(app: web.Application, **runner_options: Any) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, origin_of("127.0.0.1", runner.addresses[0][1])


@pytest.fixture
async def worker() -> AsyncIterator[tuple[FloodingWorker, str]]:
    flooding = FloodingWorker()
    app = web.Application()
    app.router.add_get("/v1/sessions/{session}/stream", flooding.stream)
    runner, endpoint = await serve(app, shutdown_timeout=0.5)
    try:
        yield flooding, endpoint
    finally:
        await runner.cleanup()


async def test_ctrl_c_ends_the_viewer_when_neither_the_page_nor_the_worker_reads(
    worker: tuple[FloodingWorker, str],
) -> None:
    flooding, endpoint = worker
    viewer = SessionViewer(ViewerSettings(session=SESSION), ReadySessions(endpoint))  # type: ignore[arg-type]
    runner = viewer.runner()
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    viewer.origin = origin_of("127.0.0.1", runner.addresses[0][1])
    stream = f"ws://127.0.0.1:{viewer.origin.rsplit(':', 1)[1]}/{viewer.secret}/stream"
    async with aiohttp.ClientSession() as http:
        page = await http.ws_connect(
            stream, origin=viewer.origin, max_msg_size=0, timeout=aiohttp.ClientWSTimeout(ws_close=0.5)
        )
        try:
            first = await page.receive(timeout=10)  # streaming, then the page stops reading
            assert first.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY)
            await asyncio.wait_for(flooding.streaming.wait(), timeout=10)
            await asyncio.sleep(1.0)  # loopback buffers fill: the viewer's sends to the page now block

            started = time.monotonic()
            await asyncio.wait_for(runner.cleanup(), timeout=30)
            took = time.monotonic() - started
        finally:
            await page.close()
    # Its handlers end on their own (a close of each side, bounded), before aiohttp would cancel them.
    assert took < CLOSE_SECONDS + SHUTDOWN_SECONDS, f"the viewer took {took:.1f}s to stop"
