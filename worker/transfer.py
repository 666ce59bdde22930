"""Pod-to-pod transfer of a migrating session (issue 12 item 3; docs/contracts.md §4 "Transfer").

The new pod pulls: `GET /internal/v1/sessions/{id}/export` on the pod that still holds the session, with
the pool's transfer token as a bearer token. Pull rather than push because only the new pod knows when it
needs the session (its first tick) and that it has room for it; the old pod only keeps it for a while.

Neither side holds its forward lock while bytes cross the network (issue 23 item 6): a peer that stalls must
not stall the other sessions' ticks. The holder writes the export (docs/contracts.md §9) into host memory
under its lock (`PieceCollector`, pieces of `PIECE_BYTES`: a copy of device memory, fast) and sends the pieces
without it; the puller downloads the body into memory (`download`: at most the bytes the store recorded for
the export, within `transfer_deadline_seconds`), then imports it under its lock. Each side holds one export
in host memory for the transfer. The export's own SHA-256 covers the transfer: a body cut off or altered is
`export_corrupt` at the import, which releases whatever it built.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ardiff.worker.errors import ExportCorrupt, TransferFailed

TRANSFER_PATH = "/internal/v1/sessions/{session_id}/export"
# The holder offers a session to the pod it was placed on, which pulls it at once (not at its first tick).
PREFETCH_PATH = "/internal/v1/sessions/{session_id}/prefetch"
PIECE_BYTES = 1 << 20
CONNECT_TIMEOUT_SECONDS = 2.0
# Between two pieces of the body: a holder that stops sending for this long counts as gone.
READ_TIMEOUT_SECONDS = 30.0
# A whole pull: this long, plus the export's bytes at the slowest rate a pool's network should give (100 MB/s,
# a tenth of 10 GbE): a 4 GiB session gets 53 s. A holder slower than that counts as stalled; the puller reads
# the shared tier's copy instead.
TRANSFER_BASE_SECONDS = 10.0
TRANSFER_MIN_BYTES_PER_SECOND = 100e6
# Tests only (ARDIFF_TEST_TRANSFER_STALL_SECONDS): bytes sent before the stall (the export's header).
STALL_AFTER_BYTES = 4096


def transfer_deadline_seconds(size: int) -> float:
    """How long a pull of an export of `size` bytes may take, end to end."""
    return TRANSFER_BASE_SECONDS + size / TRANSFER_MIN_BYTES_PER_SECOND


@dataclass(frozen=True)
class TransferResult:
    """What a finished transfer moved: its bytes and wall time (both sides record them)."""

    bytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class PieceCollector:
    """A `Writable` gathering an export in `PIECE_BYTES` pieces, at most `room` bytes (`full(size)` is raised
    past it: the host tier's budget)."""

    def __init__(self, room: int, full: type[Exception] = TransferFailed) -> None:
        self.room = room
        self._full = full
        self.pieces: list[bytes] = []
        self._buffer = bytearray()
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.size += view.nbytes
        if self.size > self.room:
            raise self._full(f"the export passed the {self.room} bytes it may take")
        self._buffer += view
        while len(self._buffer) >= PIECE_BYTES:
            self.pieces.append(bytes(self._buffer[:PIECE_BYTES]))
            del self._buffer[:PIECE_BYTES]
        return view.nbytes

    def finish(self) -> tuple[bytes, ...]:
        if self._buffer:
            self.pieces.append(bytes(self._buffer))
            self._buffer.clear()
        return tuple(self.pieces)


class BodyReader:
    """A `Readable` over an export's pieces (a download, a host-tier copy), what a runtime imports from."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._pending = memoryview(b"")
        self.received = 0

    def read(self, size: int) -> bytes:
        while not self._pending.nbytes:
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            self._pending = memoryview(piece)
            self.received += len(piece)
        out, self._pending = self._pending[:size], self._pending[size:]
        return bytes(out)


def transfer_url(endpoint: str, session_id: str) -> str:
    return endpoint.rstrip("/") + TRANSFER_PATH.format(session_id=session_id)


def peer_verify(ca_file: str | None) -> ssl.SSLContext | bool:
    """How this worker verifies the pool's other pods over https: against the pool's CA (`tls_ca_file`; the
    Secret of a pool's TLS may carry none, when a public CA signed its certificate), else the system's CAs."""
    if ca_file is None or not Path(ca_file).exists():
        return True
    return ssl.create_default_context(cafile=ca_file)


def pull_client(verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """One per worker, reused: making an httpx client builds an SSL context (~0.2 s), too slow per pull."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(READ_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS), verify=verify
    )


async def download(
    client: httpx.AsyncClient, endpoint: str, session_id: str, token: str, *, size: int
) -> tuple[tuple[bytes, ...], TransferResult]:
    """GET the session's export from the pod at `endpoint` into memory: at most `size` bytes (what the store
    recorded for it), within `transfer_deadline_seconds(size)`. `TransferFailed` when the holder cannot be
    reached, refuses, sends more, or is not done in time; a body cut off short is `export_corrupt` at the
    import (the digest does not hold)."""
    url = transfer_url(endpoint, session_id)
    deadline = transfer_deadline_seconds(size)
    started = time.perf_counter()
    pieces: list[bytes] = []
    received, answered = 0, False
    try:
        async with asyncio.timeout(deadline):
            async with client.stream("GET", url, headers={"authorization": f"Bearer {token}"}) as response:
                answered = True
                if response.status_code != 200:
                    await response.aread()
                    raise TransferFailed(f"{url} answered {response.status_code}: {_error_text(response)}")
                async for piece in response.aiter_raw():
                    received += len(piece)
                    if received > size:
                        raise TransferFailed(f"{url} sent more than the {size} bytes of the export")
                    pieces.append(piece)
    except TimeoutError:
        raise TransferFailed(
            f"{url}: not done within {deadline:.0f} s ({received} of {size} bytes)"
        ) from None
    except httpx.HTTPError as exc:
        if not answered:
            raise TransferFailed(f"{url}: {type(exc).__name__}: {exc}") from None
        raise ExportCorrupt(
            f"the direct transfer was cut off after {received} bytes ({type(exc).__name__}: {exc})"
        ) from None
    return tuple(pieces), TransferResult(received, time.perf_counter() - started)


def _error_text(response: httpx.Response) -> str:
    """The envelope's code and message, else the start of the body."""
    try:
        error = response.json()["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
