"""The puller's end of the pod-to-pod wire (worker/export_download.py) against a holder that can lie: a real
HTTP/1.1 server on loopback (asyncio streams, answering as written here), so that a body longer than declared,
one cut off, a refusal and a stall are each what the socket carries. The whole transfer between real workers
is tests/worker/test_continuity.py's, its stalls tests/worker/test_stalls.py's, over TLS
tests/worker/test_tls.py's."""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from ardiff.worker.errors import ExportCorrupt, TransferFailed
from ardiff.worker.export_download import StagingMemory, download
from ardiff.worker.pieces import BodyReader

CONTEXT = ssl.create_default_context()
BODY = os.urandom(3 << 20)

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def holder(answer: Answer) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server answering every request with `answer`; the requests' heads, as received."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        try:
            await answer(reader, writer)
        except ConnectionError:
            pass  # the puller hung up: what a cancelled pull does
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/internal/v1/sessions/s/export", heads
    finally:
        server.close()


def sends(head: bytes, *parts: bytes, pause: float = 0.0) -> Answer:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)

    return answer


def ok(length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n{framing}\r\n\r\n".encode()


def chunked(*parts: bytes) -> list[bytes]:
    return [f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in parts] + [b"0\r\n\r\n"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_lands_in_one_buffer_that_the_reader_takes_as_views(framing: str) -> None:
    parts = [BODY] if framing == "content-length" else chunked(BODY[: 1 << 20], BODY[1 << 20 :])
    length = len(BODY) if framing == "content-length" else None
    async with holder(sends(ok(length), *parts)) as (url, heads):
        body, result = await download(url, "the-token", size=len(BODY), context=CONTEXT)
    assert bytes(body) == BODY
    assert (result.bytes, result.seconds > 0) == (len(BODY), True)
    assert b"authorization: Bearer the-token" in heads[0]
    assert not body.readonly  # the reader may wrap it without a copy
    reader = BodyReader(iter((body,)))
    first = reader.view(1 << 20)
    assert first.obj is body.obj  # a view of the one buffer, not a copy
    assert bytes(first) == BODY[: 1 << 20]


async def test_a_holder_that_declares_more_than_the_export_is_refused_before_anything_is_received() -> None:
    async with holder(sends(ok(len(BODY) + 1), BODY + b"x")) as (url, _):
        with pytest.raises(
            TransferFailed, match=f"declared {len(BODY) + 1} bytes, more than the {len(BODY)}"
        ):
            await download(url, "t", size=len(BODY), context=CONTEXT)


async def test_a_chunked_body_longer_than_the_export_is_refused() -> None:
    async with holder(sends(ok(None), *chunked(BODY, b"more"))) as (url, _):
        with pytest.raises(TransferFailed, match=f"sent more than the {len(BODY)} bytes"):
            await download(url, "t", size=len(BODY), context=CONTEXT)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_cut_off_is_export_corrupt_with_what_came(framing: str) -> None:
    half = BODY[: len(BODY) // 2]
    parts = [half] if framing == "content-length" else chunked(half)[:1]  # no last chunk: cut off
    length = len(BODY) if framing == "content-length" else None
    async with holder(sends(ok(length), *parts)) as (url, _):
        with pytest.raises(ExportCorrupt, match=f"cut off after {len(half)} bytes"):
            await download(url, "t", size=len(BODY), context=CONTEXT)


async def test_a_refusal_names_the_holders_error_code() -> None:
    envelope = b'{"error": {"code": "unknown_session", "message": "not held here"}}'
    head = (
        f"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {len(envelope)}\r\n\r\n"
    )
    async with holder(sends(head.encode(), envelope)) as (url, _):
        with pytest.raises(TransferFailed, match="answered 404: unknown_session: not held here"):
            await download(url, "t", size=len(BODY), context=CONTEXT)


async def test_a_holder_nobody_listens_for_is_a_failed_transfer() -> None:
    async with holder(sends(ok(0))) as (url, _):
        pass  # closed: nothing listens there any more
    with pytest.raises(TransferFailed, match="ConnectionRefusedError"):
        await download(url, "t", size=len(BODY), context=CONTEXT)


async def test_a_cancelled_pull_hangs_up_at_once() -> None:
    """The holder sends a little and stalls; the pull is cancelled (the worker shuts down): the download
    returns at once and the holder sees the connection go, rather than a thread reading on for the read
    timeout."""
    hung_up = asyncio.Event()

    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(ok(len(BODY)) + BODY[:4096])
        await writer.drain()
        assert await asyncio.wait_for(reader.read(1), timeout=10) == b""  # the puller hung up
        hung_up.set()

    async with holder(stalls) as (url, _):
        pull = asyncio.create_task(download(url, "t", size=len(BODY), context=CONTEXT))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        pull.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pull
        assert time.monotonic() - started < 1.0
        await asyncio.wait_for(hung_up.wait(), timeout=2.0)


async def test_pulls_that_fit_land_in_the_staging_memory_one_at_a_time_and_others_in_fresh_memory() -> None:
    """The pod's staging memory is lent to one pull at a time: the body lands in it (a view of it, the same
    memory pull after pull, given back after the import); a pull while it is lent, or a body larger than it,
    gets fresh memory; a pull that fails gives it back itself."""
    staging = StagingMemory(len(BODY))
    async with holder(sends(ok(len(BODY)), BODY)) as (url, _):
        body, _ = await download(url, "t", size=len(BODY), context=CONTEXT, staging=staging)
        memory = body.obj
        assert staging.holds(memory)
        assert bytes(body) == BODY
        other, _ = await download(url, "t", size=len(BODY), context=CONTEXT, staging=staging)
        assert not staging.holds(other.obj)  # lent meanwhile: fresh memory
        assert bytes(other) == BODY
        del body
        staging.give_back(memory)
        again, _ = await download(url, "t", size=len(BODY), context=CONTEXT, staging=staging)
        assert again.obj is memory  # nothing viewed it: lent again, the same pages
        del again
        staging.give_back(memory)
    async with holder(sends(ok(len(BODY)), BODY[:1000])) as (url, _):
        with pytest.raises(ExportCorrupt, match="cut off after 1000 bytes"):
            await download(url, "t", size=len(BODY), context=CONTEXT, staging=staging)
    assert staging.lend(len(BODY)) is memory  # the failed pull gave it back
    staging.give_back(memory)
    cut = chunked(BODY[:1000])[:-1]  # a chunked body cut off within a read: the read's frame views it
    async with holder(sends(ok(None), *cut)) as (url, _):
        with pytest.raises(ExportCorrupt, match="cut off after 1000 bytes"):
            await download(url, "t", size=len(BODY), context=CONTEXT, staging=staging)
    assert staging.lend(len(BODY)) is not None  # given back (or let go, if still viewed), never stuck lent
    small = StagingMemory(1 << 20)
    async with holder(sends(ok(len(BODY)), BODY)) as (url, _):  # a body larger than it
        body, _ = await download(url, "t", size=len(BODY), context=CONTEXT, staging=small)
    assert not small.holds(body.obj)
    assert bytes(body) == BODY
    assert StagingMemory(0).lend(1) is None  # a pod without any


def test_staging_memory_still_viewed_after_its_pull_is_let_go_never_written_again() -> None:
    staging = StagingMemory(1 << 20)
    memory = staging.lend(1 << 20)
    assert memory is not None
    kept = memoryview(memory)[:16]  # a view that outlived its import (a tensor kept by mistake)
    staging.give_back(memory)
    again = staging.lend(1 << 20)
    assert again is not None
    assert again is not memory  # fresh memory: the view still reads what it read
    kept.release()
