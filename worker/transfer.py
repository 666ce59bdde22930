"""Pod-to-pod transfer of a migrating session (issue 12 item 3; docs/contracts.md §4 "Transfer").

The new pod pulls: `GET /internal/v1/sessions/{id}/export` on the pod that still holds the session, with
the pool's transfer token as a bearer token. Pull rather than push because only the new pod knows when it
needs the session (its first tick) and that it has room for it; the old pod only keeps it for a while.

Streamed both ways, never the whole export in memory: the holder writes the export (docs/contracts.md §9) on
its forward thread into a bounded queue of `PIECE_BYTES` pieces that the HTTP response drains (a slow reader
slows the writer; at most `QUEUE_PIECES` pieces wait), and the puller feeds the body to the runtime's
import as it arrives. The export's own SHA-256 covers the transfer: a stream cut off or altered is
`export_corrupt`, and the importing runtime releases whatever it built.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import httpx

from ardiff.worker.errors import ExportCorrupt, TransferFailed

T = TypeVar("T")

TRANSFER_PATH = "/internal/v1/sessions/{session_id}/export"
# The holder offers a session to the pod it was placed on, which pulls it at once (not at its first tick).
PREFETCH_PATH = "/internal/v1/sessions/{session_id}/prefetch"
PIECE_BYTES = 1 << 20
QUEUE_PIECES = 8
CONNECT_TIMEOUT_SECONDS = 2.0
# Between two pieces of the body: a holder that stops sending for this long counts as gone.
READ_TIMEOUT_SECONDS = 30.0
# Tests only (ARDIFF_TEST_TRANSFER_STALL_SECONDS): bytes sent before the stall (the export's header).
STALL_AFTER_BYTES = 4096


@dataclass(frozen=True)
class TransferResult:
    """What a finished transfer moved: its bytes and wall time (both sides record them)."""

    bytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class _End:
    """The last item of a transfer's queue: the export was written (error None) or failed."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class QueueWriter:
    """A `Writable` for the forward thread: hands `PIECE_BYTES` pieces to the event loop's bounded queue,
    blocking while it is full (back-pressure from the socket down to the export)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes | _End], *, stall: float = 0.0
    ) -> None:
        self._loop = loop
        self._queue = queue
        self._buffer = bytearray()
        self._stall = stall
        self.aborted = threading.Event()  # set by the reader side when the puller went away
        self.sent = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        written = view.nbytes
        while view.nbytes:
            limit = STALL_AFTER_BYTES if self._stall and self.sent == 0 else PIECE_BYTES
            if not self._buffer and view.nbytes >= limit:  # a whole piece of a large part: copied once
                self._send(bytes(view[:limit]))
                view = view[limit:]
                continue
            room = limit - len(self._buffer)
            self._buffer += view[:room]
            view = view[room:]
            if len(self._buffer) >= limit:
                self._flush()
        return written

    def finish(self, error: BaseException | None = None) -> None:
        """Send what is buffered (unless it failed) and the end marker."""
        if error is None:
            self._flush()
        if not self.aborted.is_set():
            self._put(_End(error))

    def _flush(self) -> None:
        if not self._buffer:
            return
        piece = bytes(self._buffer)
        self._buffer.clear()
        self._send(piece)

    def _send(self, piece: bytes) -> None:
        self._put(piece)
        self.sent += len(piece)
        if self._stall and self.sent == len(piece):
            time.sleep(self._stall)  # the fault a test injects: the holder dies while the puller waits

    def _put(self, item: bytes | _End) -> None:
        if self.aborted.is_set():
            raise TransferFailed("the pulling pod went away mid-transfer")
        asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop).result()


async def stream_pieces(
    queue: asyncio.Queue[bytes | _End], job: asyncio.Future[object], writer: QueueWriter
) -> AsyncIterator[bytes]:
    """The export's pieces as the forward thread writes them. An export that fails ends the iteration with
    `TransferFailed`, so the HTTP body is cut off without its last chunk (the puller sees a truncated stream).
    When the consumer stops early, the writer is told and the queue drained until the export has given up."""
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise TransferFailed(f"the export failed mid-transfer: {item.error}") from item.error
                break
            yield item
        await job
    finally:
        if not job.done():
            writer.aborted.set()
            while not job.done():
                while not queue.empty():
                    queue.get_nowait()
                await asyncio.sleep(0.01)


class BodyReader:
    """A `Readable` over a streamed HTTP body: what the runtime's import reads from, piece by piece. A body
    cut off (the holder died, the connection dropped) is `export_corrupt`; the import cleans up after it."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._pending = memoryview(b"")
        self.received = 0

    def read(self, size: int) -> bytes:
        while not self._pending.nbytes:
            try:
                piece = next(self._pieces)
            except StopIteration:
                return b""
            except httpx.HTTPError as exc:
                cause = f"{type(exc).__name__}: {exc}"
                raise ExportCorrupt(
                    f"the direct transfer was cut off after {self.received} bytes ({cause})"
                ) from None
            self._pending = memoryview(piece)
            self.received += len(piece)
        out, self._pending = self._pending[:size], self._pending[size:]
        return bytes(out)


def transfer_url(endpoint: str, session_id: str) -> str:
    return endpoint.rstrip("/") + TRANSFER_PATH.format(session_id=session_id)


def pull_client() -> httpx.Client:
    """One per worker, reused: making an httpx client builds an SSL context (~0.2 s), too slow per pull."""
    return httpx.Client(timeout=httpx.Timeout(READ_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS))


def pull(
    client: httpx.Client, endpoint: str, session_id: str, token: str, consume: Callable[[BodyReader], T]
) -> tuple[T, TransferResult]:
    """Blocking (the forward thread): GET the session's export from the pod at `endpoint` and `consume` it as
    it arrives (the runtime's import). `TransferFailed` when the holder cannot be reached or refuses;
    `ExportCorrupt` (from the import) when the body is cut off or does not check out."""
    url = transfer_url(endpoint, session_id)
    started = time.perf_counter()
    try:
        with client.stream("GET", url, headers={"authorization": f"Bearer {token}"}) as response:
            if response.status_code != 200:
                response.read()
                raise TransferFailed(f"{url} answered {response.status_code}: {_error_text(response)}")
            body = BodyReader(response.iter_raw())  # as it arrives: no re-chunking into a second buffer
            result = consume(body)
    except httpx.HTTPError as exc:
        raise TransferFailed(f"{url}: {type(exc).__name__}: {exc}") from None
    return result, TransferResult(body.received, time.perf_counter() - started)


def _error_text(response: httpx.Response) -> str:
    """The envelope's code and message, else the start of the body."""
    try:
        error = response.json()["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
