"""`ardiff view`'s branch route (issue 26): the page's `POST fork {"chunk": N}` forks its session at N through
`KubeSessions.fork` under a new name and answers the child's page, which is then served (and can fork again);
bad bodies, other origins, sessions it did not fork and the API's refusals are clear JSON errors. The real
aiohttp app on a local port, with a stand-in for the cluster that records the forks asked of it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ardiff.client import InvalidSession, SessionNotFound
from ardiff.viewer import MAX_FORKS, SessionViewer, ViewerSettings, fork_name, origin_of

SESSION = "forest-walk"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ForkingSessions:
    """Pending sessions (the viewer only reports their phase) that record `fork(parent, child, at)`; a parent
    named `refuse-*` is refused the way the API server refuses."""

    def __init__(self) -> None:
        self.forks: list[tuple[str, str, int | None]] = []

    def status(self, name: str) -> dict[str, Any]:
        return {"phase": "Pending", "reason": "Scheduling"}

    def fork(self, parent: str, child: str, at: int | None = None) -> dict[str, Any]:
        self.forks.append((parent, child, at))
        return {"metadata": {"name": child}}


class RefusingSessions(ForkingSessions):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def fork(self, parent: str, child: str, at: int | None = None) -> dict[str, Any]:
        raise self.error


async def running(sessions: ForkingSessions) -> tuple[SessionViewer, web.AppRunner]:
    served = SessionViewer(ViewerSettings(session=SESSION), sessions)  # type: ignore[arg-type]
    runner = web.AppRunner(served.app(), shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    served.origin = origin_of("127.0.0.1", runner.addresses[0][1])
    return served, runner


@pytest.fixture
async def viewer() -> AsyncIterator[SessionViewer]:
    served, runner = await running(ForkingSessions())
    try:
        yield served
    finally:
        await runner.cleanup()


async def post_fork(viewer: SessionViewer, path: str, body: Any, **headers: str) -> tuple[int, Any]:
    headers = {"Origin": viewer.origin or "", **headers}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{viewer.origin}{path}fork", json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json(content_type=None)


def test_fork_names_are_new_dns_labels_that_say_their_parent_and_chunk() -> None:
    names = {fork_name(SESSION, 12) for _ in range(20)}
    assert len(names) > 1
    assert all(name.startswith(f"{SESSION}-b12-") and DNS_LABEL.match(name) for name in names)
    long = fork_name("a" * 62 + "z", 123456)
    assert len(long) == 63
    assert DNS_LABEL.match(long)
    assert fork_name("a" * 51 + "-" * 11 + "z", 5).count("--") == 0  # a cut never leaves a dash before `-b`


async def test_a_fork_is_created_at_the_chunk_and_its_page_is_served(viewer: SessionViewer) -> None:
    sessions: ForkingSessions = viewer.sessions  # type: ignore[assignment]
    status, answer = await post_fork(viewer, f"/{viewer.secret}/", {"chunk": 5})
    assert status == 200
    child = answer["session"]
    assert child.startswith(f"{SESSION}-b5-")
    assert answer == {"session": child, "chunk": 5, "url": f"/{viewer.secret}/s/{child}/"}
    assert sessions.forks == [(SESSION, child, 5)]
    assert viewer.forks == [child]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{viewer.origin}{answer['url']}") as page:
            assert page.status == 200
            assert f"session <code>{child}</code>" in await page.text()
        async with http.ws_connect(
            f"{viewer.origin.replace('http', 'ws')}{answer['url']}stream",  # type: ignore[union-attr]
            origin=viewer.origin,
            timeout=aiohttp.ClientWSTimeout(ws_close=0.1),
        ) as ws:
            assert (await ws.receive_json(timeout=10))["phase"] == "Pending"
    # The child's page forks the child.
    status, again = await post_fork(viewer, answer["url"], {"chunk": 9})
    assert status == 200
    assert sessions.forks[1] == (child, again["session"], 9)


async def test_only_its_session_and_its_forks_are_served(viewer: SessionViewer) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("s/other-walk/", "s/other-walk/stream"):
            url = f"{viewer.origin}/{viewer.secret}/{path}"
            async with http.get(url, headers={"Origin": viewer.origin or ""}) as other:
                assert other.status == 404, path
    status, _ = await post_fork(viewer, f"/{viewer.secret}/s/other-walk/", {"chunk": 2})
    assert status == 404
    assert viewer.sessions.forks == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("body", [{"chunk": 0}, {"chunk": True}, {"chunk": "3"}, {"at": 3}, [3], "x"])
async def test_a_bad_body_is_a_400_and_forks_nothing(viewer: SessionViewer, body: Any) -> None:
    status, answer = await post_fork(viewer, f"/{viewer.secret}/", body)
    assert status == 400
    assert answer["error"]["code"] == "invalid_fork"
    assert viewer.sessions.forks == []  # type: ignore[attr-defined]


async def test_a_fork_from_another_origin_or_without_one_is_refused(viewer: SessionViewer) -> None:
    async with aiohttp.ClientSession() as http:
        for headers in ({"Origin": "http://evil.example"}, {}):
            async with http.post(
                f"{viewer.origin}/{viewer.secret}/fork", json={"chunk": 2}, headers=headers
            ) as a:
                assert a.status == 403, headers
    assert viewer.sessions.forks == []  # type: ignore[attr-defined]


async def test_forks_are_bounded_per_run(viewer: SessionViewer) -> None:
    viewer.forks.extend(f"f{n}" for n in range(MAX_FORKS))
    status, answer = await post_fork(viewer, f"/{viewer.secret}/", {"chunk": 2})
    assert (status, answer["error"]["code"]) == (429, "too_many_forks")
    assert viewer.sessions.forks == []  # type: ignore[attr-defined]


class SlowSessions(ForkingSessions):
    def fork(self, parent: str, child: str, at: int | None = None) -> dict[str, Any]:
        time.sleep(0.5)  # the API's answer under way while the next request comes
        return super().fork(parent, child, at)


async def test_forks_under_way_count_toward_the_bound() -> None:
    served, runner = await running(SlowSessions())
    served.forks.extend(f"f{n}" for n in range(MAX_FORKS - 1))
    try:
        answers = await asyncio.gather(
            *(post_fork(served, f"/{served.secret}/", {"chunk": 2}) for _ in range(2))
        )
    finally:
        await runner.cleanup()
    assert sorted(status for status, _ in answers) == [200, 429]
    assert len(served.forks) == MAX_FORKS
    assert len(served.sessions.forks) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SessionNotFound("get session forest-walk: not found", status=404), 404),
        (InvalidSession("create session x: spec.forkFrom.chunk: Invalid value", status=422), 422),
        (SessionNotFound("get session forest-walk: cannot reach the Kubernetes API"), 502),
    ],
)
async def test_the_apis_refusal_is_passed_on_as_json(error: Exception, status: int) -> None:
    served, runner = await running(RefusingSessions(error))
    try:
        answered, answer = await post_fork(served, f"/{served.secret}/", {"chunk": 3})
    finally:
        await runner.cleanup()
    assert answered == status
    assert answer["error"] == {"code": error.code, "message": str(error)}  # type: ignore[attr-defined]
    assert served.forks == []
