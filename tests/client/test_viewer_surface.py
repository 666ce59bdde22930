"""`ardiff view`'s page and stream serve only the page this run printed (issue 23 item 10): a secret path made
per run and the viewer's own origin. The real aiohttp app on a local port, with a stand-in for the cluster."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ardiff.viewer import SessionViewer, ViewerSettings, origin_of

SESSION = "forest-walk"


class PendingSessions:
    """The session's status as `KubeSessions` reports it: Pending, so the viewer only reports its phase."""

    def status(self, name: str) -> dict[str, Any]:
        assert name == SESSION
        return {"phase": "Pending", "reason": "Scheduling"}

    def token(self, name: str, status: dict[str, Any]) -> str:
        raise AssertionError("a Pending session is not streamed")


@pytest.fixture
async def viewer() -> AsyncIterator[SessionViewer]:
    served = SessionViewer(ViewerSettings(session=SESSION), PendingSessions())  # type: ignore[arg-type]
    runner = web.AppRunner(served.app(), shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.origin = origin_of("127.0.0.1", runner.addresses[0][1])
    try:
        yield served
    finally:
        await runner.cleanup()


async def test_each_run_has_its_own_secret_path() -> None:
    first, second = (SessionViewer(ViewerSettings(session=SESSION), PendingSessions()) for _ in range(2))  # type: ignore[arg-type]
    assert first.secret != second.secret
    assert len(first.secret) >= 20


async def test_the_page_is_served_only_under_the_secret_path_to_its_own_host(viewer: SessionViewer) -> None:
    assert viewer.url() == f"{viewer.origin}/{viewer.secret}/"
    async with aiohttp.ClientSession() as http:
        async with http.get(viewer.url()) as page:
            assert page.status == 200
            assert SESSION in await page.text()
        for path in ("/", "/stream", f"/{viewer.secret[:-1]}/", f"/{viewer.secret}x/stream"):
            async with http.get(f"{viewer.origin}{path}") as other:
                assert other.status == 404, path
        # A name that resolves here but is not the viewer's (DNS rebinding), or a page of another origin.
        port = viewer.origin.rsplit(":", 1)[1]
        for headers in ({"Host": f"evil.example:{port}"}, {"Origin": "http://evil.example"}):
            async with http.get(viewer.url(), headers=headers) as refused:
                assert refused.status == 403, headers
                assert SESSION not in await refused.text()


async def test_the_stream_opens_only_from_the_viewers_own_origin(viewer: SessionViewer) -> None:
    stream = f"ws://127.0.0.1:{viewer.origin.rsplit(':', 1)[1]}/{viewer.secret}/stream"
    async with aiohttp.ClientSession() as http:
        # (The viewer reads the page's socket only while it streams: a close waits for no answer here.)
        async with http.ws_connect(
            stream, origin=viewer.origin, timeout=aiohttp.ClientWSTimeout(ws_close=0.1)
        ) as ws:
            message = json.loads((await ws.receive(timeout=10)).data)
            assert (message["type"], message["phase"]) == ("phase", "Pending")
        for origin in ("http://evil.example", f"http://localhost:{viewer.origin.rsplit(':', 1)[1]}", None):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with http.ws_connect(stream, origin=origin):
                    pass
            assert refused.value.status == 403, origin
        with pytest.raises(aiohttp.WSServerHandshakeError) as unknown:
            async with http.ws_connect(f"{viewer.origin.replace('http', 'ws')}/stream", origin=viewer.origin):
                pass
        assert unknown.value.status == 404
