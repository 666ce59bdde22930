"""What a caller without a session's token can learn from, and cost, a worker (issue 23 item 10; contracts §4,
§10), against a real worker process (fake runtime, placement mode on the shared Redis).

- the listing names sessions only to the pool's transfer token;
- an unknown session and a known one with a wrong token get the same answer (no oracle of names);
- a tick is authenticated before its body is read or parsed;
- a stream that does not authenticate is closed after 2 s;
- the HTTP server bounds request heads, connections and idle time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ardiff.kv.records import PoolId
from tests.worker.conftest import CAMERA, TRANSFER_TOKEN, launch_fake_pod

POOL = PoolId("default", f"wk-surface-{uuid.uuid4().hex[:6]}")
POD = "surface-worker-0"
TOKEN = "surface-token"
REFUSAL = ("unauthorized", "missing or wrong bearer token for this session", "Unauthorized", None)


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url):
    process = launch_fake_pod(launch_worker, redis_url, POOL, POD)
    yield process
    process.stop()


@pytest.fixture
def place(placer, worker):
    return placer(POOL, POD, TOKEN, close_on=worker)


def tick_body(chunk_index: int = 0) -> dict[str, Any]:
    return {"request_id": f"r-{chunk_index}", "chunk_index": chunk_index, "controls": [CAMERA]}


def answer(response: httpx.Response) -> tuple[int, tuple[Any, ...]]:
    """A refusal as a caller sees it: the status and the envelope's code, message, type and param."""
    assert response.headers["content-type"] == "application/json", response.text
    error = response.json()["error"]
    return response.status_code, (error["code"], error["message"], error["type"], error["param"])


def raw_exchange(worker, head: bytes, body: bytes = b"", *, timeout: float = 5.0) -> bytes:
    """Send a request head (and part of a body) over a socket; what the worker answers within `timeout`."""
    with socket.create_connection(("127.0.0.1", worker.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        received = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in received and time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            received += data
        return received


def tick_head(session: str, token: str | None, content_length: int, **headers: str) -> bytes:
    lines = [f"POST /v1/sessions/{session}/ticks HTTP/1.1", "Host: worker", "Content-Type: application/json"]
    lines.append(f"Content-Length: {content_length}")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ------------------------------------------------------------------------------------------ the listing


async def test_the_listing_names_sessions_only_to_the_pools_transfer_token(worker, place):
    session = await place()
    assert worker.tick(session, 0, token=TOKEN).status_code == 200

    anonymous = worker.client.get(f"{worker.url}/v1/sessions")
    assert anonymous.status_code == 200, anonymous.text
    summary = anonymous.json()
    # The pod's numbers (what /metrics serves too), no names.
    assert summary["sessions"] is None
    assert (summary["ready"], summary["capacity"], summary["admitted"]) == (True, 2, 1)
    assert "kv_blocks" in summary
    assert session not in anonymous.text

    # A session's token is not the pool's; a wrong one is refused rather than read as no token.
    for token in (TOKEN, "forged"):
        refused = worker.client.get(f"{worker.url}/v1/sessions", headers=worker.headers(token))
        assert answer(refused) == (
            401,
            ("unauthorized", "missing or wrong pool transfer token", "Unauthorized", None),
        )
    pool = worker.client.get(f"{worker.url}/v1/sessions", headers=worker.headers(TRANSFER_TOKEN)).json()
    assert [(s["session_id"], s["ticks"]) for s in pool["sessions"]] == [(session, 1)]
    assert pool["admitted"] == 1


# ------------------------------------------------------------------------------------------ no oracle


async def test_an_unknown_session_and_a_wrong_token_get_the_same_answer(worker, place):
    known = await place()
    assert worker.tick(known, 0, token=TOKEN).status_code == 200
    unknown = f"s-{uuid.uuid4().hex[:8]}"  # a valid name no session has
    before = worker.client.get(f"{worker.url}/metrics").text

    def requests(session: str, token: str | None) -> list[httpx.Response]:
        headers = worker.headers(token)
        base = f"{worker.url}/v1/sessions/{session}"
        return [
            worker.client.post(f"{base}/ticks", json=tick_body(1), headers=headers),
            worker.client.get(base, headers=headers),
            worker.client.post(f"{base}/reset", headers=headers),
            worker.client.delete(base, headers=headers),
        ]

    for session, token in [
        (known, "forged"),
        (known, None),
        (unknown, "forged"),
        (unknown, None),
        (unknown, TOKEN),  # a token of another session
        ("Not_A_Name", TOKEN),  # no session can have it
    ]:
        answers = [answer(response) for response in requests(session, token)]
        assert answers == [(401, REFUSAL)] * 4, (session, token, answers)

    # A stream opened for either closes alike.
    for session in (known, unknown):
        async with connect(
            f"ws://127.0.0.1:{worker.port}/v1/sessions/{session}/stream",
            additional_headers={"Authorization": "Bearer forged"},
        ) as ws:
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert (message["type"], message["error"]["code"]) == ("error", "unauthorized")
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 10)
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4401, "unauthorized")

    # Nor do the worker's error counters tell them apart (metrics are not authenticated).
    after = worker.client.get(f"{worker.url}/metrics").text
    assert 'ardiff_tick_errors_total{code="unknown_session"}' not in after
    assert before.count("unknown_session") == after.count("unknown_session") == 0
    # The session itself was left alone.
    assert worker.tick(known, 1, token=TOKEN).status_code == 200


# ------------------------------------------------------------------------------------------ auth before body


async def test_a_tick_is_authenticated_before_its_body_is_read(worker, place):
    session = await place()
    unknown = f"s-{uuid.uuid4().hex[:8]}"
    for name, token in [(session, "forged"), (session, None), (unknown, "forged")]:
        # A body declared as 1,000,000 bytes of which 10 arrive: answered at once, the rest never awaited.
        started = time.monotonic()
        reply = raw_exchange(worker, tick_head(name, token, 1_000_000), b"{not json!")
        assert reply.startswith(b"HTTP/1.1 401 "), (name, token, reply[:200])
        assert time.monotonic() - started < 2.0
        # Malformed, or declared over the limit: still 401, nothing parsed.
        malformed = worker.client.post(
            f"{worker.url}/v1/sessions/{name}/ticks",
            content=b"{not json",
            headers={"content-type": "application/json", **worker.headers(token)},
        )
        assert answer(malformed) == (401, REFUSAL)
        huge = raw_exchange(worker, tick_head(name, token, 64 << 20), b"x" * 1000)
        assert huge.startswith(b"HTTP/1.1 401 "), huge[:200]

    # The session's own client still gets the body's errors.
    authorized = {"content-type": "application/json", **worker.headers(TOKEN)}
    url = f"{worker.url}/v1/sessions/{session}/ticks"
    malformed = worker.client.post(url, content=b"{not json", headers=authorized)
    assert answer(malformed)[1][0] == "invalid_tick"
    declared = raw_exchange(worker, tick_head(session, TOKEN, 2 << 20), b"x" * 1000)
    assert declared.startswith(b"HTTP/1.1 413 "), declared[:200]

    def streamed():  # no Content-Length: chunked, over the limit
        for _ in range(3):
            yield b" " * (1 << 20)

    over = worker.client.post(url, content=streamed(), headers=authorized)
    assert answer(over) == (
        413,
        ("body_too_large", f"request body exceeds {1 << 20} bytes", "RequestEntityTooLarge", None),
    )
    assert worker.tick(session, 0, token=TOKEN).status_code == 200


# ------------------------------------------------------------------------------------------ the stream's auth


async def test_a_stream_that_does_not_authenticate_is_closed_after_2_s(worker, place):
    session = await place()
    url = f"ws://127.0.0.1:{worker.port}/v1/sessions/{session}/stream"
    async with connect(url) as ws:  # no header, no auth message
        started = time.monotonic()
        message = json.loads(await asyncio.wait_for(ws.recv(), 15))
        waited = time.monotonic() - started
        assert message["error"]["code"] == "unauthorized"
        assert "in 2 s" in message["error"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 4401
    assert 1.8 <= waited <= 3.0, waited
    # An auth message within the time still opens it.
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "auth", "token": TOKEN}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "ready"


# ------------------------------------------------------------------------------------------ the HTTP server


def test_a_request_head_over_16_kib_is_refused(worker):
    # httptools (uvicorn's default parser) buffered any head: 64 MiB of headers were answered 200.
    small = raw_exchange(worker, b"GET /healthz HTTP/1.1\r\nHost: w\r\nX-Pad: " + b"a" * 8000 + b"\r\n\r\n")
    assert small.startswith(b"HTTP/1.1 200 ")
    with socket.create_connection(("127.0.0.1", worker.port), timeout=5) as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: w\r\nX-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n"
        try:
            sock.sendall(head)
            reply = sock.recv(4096)
        except ConnectionResetError:  # refused while the head was still being sent
            reply = b""
    assert not reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert reply == b"" or reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert worker.client.get(f"{worker.url}/healthz").status_code == 200


async def test_idle_and_slow_connections_are_closed_after_10_s(worker, place):
    """A connection that sends nothing, one that trickles its head a byte a second, and one idle after an
    answer: each is closed 10 s after it last had to send a request head (before: never, never, 30 s). A
    stream, once upgraded, is no longer waiting for a head: it stays open however quiet."""
    session = await place()
    silent = socket.create_connection(("127.0.0.1", worker.port))
    trickle = socket.create_connection(("127.0.0.1", worker.port))
    idle = socket.create_connection(("127.0.0.1", worker.port))
    stream = socket.create_connection(("127.0.0.1", worker.port))
    started = time.monotonic()
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
    assert idle.recv(4096).startswith(b"HTTP/1.1 200 ")
    upgrade = [
        f"GET /v1/sessions/{session}/stream HTTP/1.1",
        "Host: w",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
        f"Authorization: Bearer {TOKEN}",
    ]
    stream.sendall(("\r\n".join(upgrade) + "\r\n\r\n").encode())
    assert stream.recv(4096).startswith(b"HTTP/1.1 101 ")
    closed_at: dict[str, float] = {}
    sockets = {"silent": silent, "trickle": trickle, "idle": idle, "stream": stream}
    for sock in sockets.values():
        sock.setblocking(False)
    trickled = iter(b"GET /healthz HTTP/1.1\r\nHost: w\r\nX-Slow: " + b"s" * 100)
    try:
        while not {"silent", "trickle", "idle"} <= set(closed_at) and time.monotonic() - started < 16:
            if "trickle" not in closed_at:
                with contextlib.suppress(OSError):  # closed already: seen by the reads below
                    trickle.send(bytes([next(trickled)]))
            for name, sock in sockets.items():
                if name in closed_at:
                    continue
                try:
                    if sock.recv(4096) == b"":
                        closed_at[name] = time.monotonic() - started
                except BlockingIOError:
                    pass
                except OSError:
                    closed_at[name] = time.monotonic() - started
            await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)  # past the others' deadline
        assert "stream" not in closed_at
        with pytest.raises(BlockingIOError):  # open, nothing to read (its `ready` was read above)
            stream.recv(4096)
    finally:
        for sock in sockets.values():
            sock.close()
    assert set(closed_at) == {"silent", "trickle", "idle"}, closed_at
    assert all(9.0 <= seconds <= 12.5 for seconds in closed_at.values()), closed_at


def test_the_512th_open_connection_is_answered_503(worker):
    """uvicorn's limit_concurrency=512 counts the asking connection: 511 others open, it is refused."""
    worker.client.close()  # its pooled keep-alive connection would be one more
    worker.client = httpx.Client(timeout=120)
    held: list[socket.socket] = []
    try:
        for _ in range(510):
            held.append(socket.create_connection(("127.0.0.1", worker.port)))
        time.sleep(0.5)  # accepted
        served = raw_exchange(worker, b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
        assert served.startswith(b"HTTP/1.1 200 "), served[:200]
        held.append(socket.create_connection(("127.0.0.1", worker.port)))
        time.sleep(0.5)
        refused = raw_exchange(worker, b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.5)
    assert worker.client.get(f"{worker.url}/healthz").status_code == 200
