"""The operator's API client over real HTTP (a small aiohttp server on loopback): idempotent create/delete,
status merge patches, paged lists, logging in again when a token was rotated, basic auth, and TLS with the
CA given as data (kept in a private file while the client lives) and a client certificate."""

from __future__ import annotations

import ssl
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from aiohttp import web

from ardiff.devcluster.pki import CertificateAuthority
from ardiff.operator.kube import PODS, SESSIONS, KubeApi, KubeApiError


class FakeApiServer:
    """Accepts one bearer token (or user "u", password "p"); stores objects by path; 409 on a duplicate
    create, 404 on a missing one; lists a collection `PAGE` objects at a time."""

    PAGE = 2

    def __init__(self) -> None:
        self.token = "new"
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str, Any]] = []  # method, path and query, content type, body

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path_qs, request.headers.get("Content-Type", ""), body))
        accepted = {f"Bearer {self.token}", aiohttp.BasicAuth("u", "p").encode()}
        if request.headers.get("Authorization") not in accepted:
            return web.json_response({"reason": "Unauthorized"}, status=401)
        if request.method == "GET" and "limit" in request.query:
            return self.page(request.path, int(request.query.get("continue", "0")))
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

    def page(self, collection: str, start: int) -> web.Response:
        paths = sorted(p for p in self.objects if p.rpartition("/")[0] == collection)
        rest = start + self.PAGE < len(paths)
        return web.json_response(
            {
                "items": [self.objects[p] for p in paths[start : start + self.PAGE]],
                "metadata": {"continue": str(start + self.PAGE) if rest else ""},
            }
        )


async def serve(fake: FakeApiServer, tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeApiServer, str]]:
    fake = FakeApiServer()
    runner, port = await serve(fake)
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


async def test_the_proxy_environment_and_netrc_are_not_used(
    server: tuple[FakeApiServer, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As with kopf's own client, the API server is reached directly: a proxy in the environment (here one
    that refuses every connection) and a ~/.netrc are not used (the client once looked both up per call)."""
    fake, url = server
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard: nothing listens there
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login u password p\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    fake.token = "unknown"  # were the netrc's basic auth sent instead of no token, it would be accepted
    api = KubeApi(lambda: kopf.ConnectionInfo(server=url, insecure=True))
    try:
        with pytest.raises(KubeApiError) as failure:
            await api.get(PODS, "ns", "x")
    finally:
        await api.close()
    assert failure.value.status == 401  # it reached the server, and without the netrc's credentials
    assert [(r[0], r[1]) for r in fake.requests] == [("GET", "/api/v1/namespaces/ns/pods/x")] * 2


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


async def test_names_are_listed_page_by_page(server: tuple[FakeApiServer, str]) -> None:
    fake, url = server
    api = KubeApi(lambda: kopf.ConnectionInfo(server=url, token="new", insecure=True))
    names = {f"w-{i}" for i in range(5)}
    try:
        for name in names:
            await api.create(PODS, {"metadata": {"name": name, "namespace": "ns"}})
        await api.create(PODS, {"metadata": {"name": "elsewhere", "namespace": "other"}})
        assert await api.list_names(PODS, "ns") == {("ns", n) for n in names}
    finally:
        await api.close()
    assert [r[1] for r in fake.requests[-3:]] == [
        "/api/v1/namespaces/ns/pods?limit=500",
        "/api/v1/namespaces/ns/pods?limit=500&continue=2",
        "/api/v1/namespaces/ns/pods?limit=500&continue=4",
    ]


async def test_basic_auth_when_there_is_no_token(server: tuple[FakeApiServer, str]) -> None:
    fake, url = server
    api = KubeApi(lambda: kopf.ConnectionInfo(server=url, username="u", password="p", insecure=True))
    try:
        assert await api.get(PODS, "ns", "x") is None  # 404, not 401
    finally:
        await api.close()
    assert len(fake.requests) == 1


async def test_tls_with_the_ca_as_data_and_a_client_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = CertificateAuthority(tmp_path / "pki")
    served = ca.issue("server", common_name="api", server=True, ip_addresses=["127.0.0.1"])
    client = ca.issue("client", common_name="operator", client=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.cert_path))
    tls.load_cert_chain(served.cert, served.key)
    tls.verify_mode = ssl.CERT_REQUIRED  # the client certificate is needed too
    runner, port = await serve(FakeApiServer(), tls)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    def connect(**tls_options: Any) -> KubeApi:
        info = kopf.ConnectionInfo(
            server=f"https://127.0.0.1:{port}",
            token="new",
            certificate_path=str(client.cert),
            private_key_path=str(client.key),
            **tls_options,
        )
        return KubeApi(lambda: info)

    try:
        trusting = connect(ca_data=ca.cert_path.read_bytes())
        (ca_file,) = (tmp_path / "tmp").iterdir()
        assert stat.S_IMODE(ca_file.stat().st_mode) == 0o600
        assert ca_file.read_bytes() == ca.cert_path.read_bytes()
        try:
            assert await trusting.get(PODS, "ns", "x") is None
        finally:
            await trusting.close()
        assert not ca_file.exists()
        untrusting = connect()
        try:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await untrusting.get(PODS, "ns", "x")
        finally:
            await untrusting.close()
        insecure = connect(insecure=True)
        try:
            assert await insecure.get(PODS, "ns", "x") is None
        finally:
            await insecure.close()
        assert not list((tmp_path / "tmp").iterdir())  # none written without CA data
    finally:
        await runner.cleanup()
