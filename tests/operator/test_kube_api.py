"""The operator's API client over real HTTP (a small aiohttp server on loopback): idempotent create/delete,
status merge patches, and logging in again when a token was rotated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from aiohttp import web

from ardiff.operator.kube import PODS, SESSIONS, KubeApi, KubeApiError


class FakeApiServer:
    """Accepts one bearer token; stores objects by path; 409 on a duplicate create, 404 on a missing one."""

    def __init__(self) -> None:
        self.token = "new"
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, request.headers.get("Content-Type", ""), body))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"reason": "Unauthorized"}, status=401)
        if request.method == "POST":
            path = f"{request.path}/{body['metadata']['name']}"
            if path in self.objects:
                return web.json_response({"reason": "AlreadyExists"}, status=409)
            self.objects[path] = body
            return web.json_response(body, status=201)
        path = request.path.removesuffix("/status")
        if path not in self.objects:
            return web.json_response({"reason": "NotFound"}, status=404)
        if request.method == "DELETE":
            return web.json_response(self.objects.pop(path))
        if request.method == "PATCH":
            self.objects[path].setdefault("status", {}).update(body["status"])
        return web.json_response(self.objects[path])


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_create_get_patch_delete_are_idempotent(server: tuple[FakeApiServer, str]) -> None:
    fake, url = server
    api = KubeApi(lambda: kopf.ConnectionInfo(server=url, token="new", insecure=True))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w-abcde", "namespace": "ns"}}
    try:
        assert await api.create(PODS, pod) == pod
        assert await api.create(PODS, pod) is None  # 409: it exists
        assert await api.get(PODS, "ns", "w-abcde") == pod
        assert await api.get(PODS, "ns", "nope") is None
        assert await api.delete(PODS, "ns", "w-abcde") is True
        assert await api.delete(PODS, "ns", "w-abcde") is False  # 404: already gone
        session = {"metadata": {"name": "s", "namespace": "ns"}}
        await api.create(SESSIONS, session)
        assert await api.patch_status(SESSIONS, "ns", "s", {"phase": "Ready", "pod": None}) is True
        assert await api.patch_status(SESSIONS, "ns", "gone", {"phase": "Ready"}) is False
    finally:
        await api.close()
    method, path, content_type, body = fake.requests[-2]
    assert (method, path, content_type) == (
        "PATCH",
        "/apis/ardiffusion.dev/v1alpha1/namespaces/ns/ardiffusionsessions/s/status",
        "application/merge-patch+json",
    )
    assert body == {"status": {"phase": "Ready", "pod": None}}  # null removes a field in a merge patch


async def test_a_rotated_token_is_fetched_again_once(server: tuple[FakeApiServer, str]) -> None:
    fake, url = server
    tokens = iter(["old", "new", "newer"])
    api = KubeApi(lambda: kopf.ConnectionInfo(server=url, token=next(tokens), insecure=True))
    try:
        assert await api.get(PODS, "ns", "x") is None  # 401 with "old", then 404 with "new"
        fake.token = "rotated-elsewhere"
        with pytest.raises(KubeApiError) as failure:  # "newer" is refused too: no second retry
            await api.get(PODS, "ns", "x")
    finally:
        await api.close()
    assert failure.value.status == 401
    assert [r[0] for r in fake.requests] == ["GET"] * 4
