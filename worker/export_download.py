"""The puller's end of the pod-to-pod wire (docs/contracts.md §4 "Transfer"): one HTTP/1.1 GET of an export
from the pod that holds it, read straight from the socket into one buffer.

The body is received into one buffer (the pod's `StagingMemory` when it has one free and large enough, else
`pieces.fresh_memory`: never zeroed twice as a `bytearray`'s would be; its pages provided at once when the
holder declares the body's length, else, the store's size being only a bound, as the bytes arrive) by
`http.client`'s `readinto`, in a thread: the kernel's copy is the only copy, with no per-piece object or join
on the way, so a pull costs about what the wire and the memory cost (issue 42 item 1: httpx's streaming spent
several CPU-seconds per GB in its parser and buffers). The export reader then reads its tensors as views of
that buffer (worker/pieces.py `BodyReader`). The deadline and a cancelled pull are looked at between two reads
of at most `READ_INTO_BYTES`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import mmap
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from ardiff.worker.errors import ExportCorrupt, TransferFailed
from ardiff.worker.pieces import fresh_memory

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 2.0
# Between two reads of the body: a holder that stops sending for this long counts as gone.
READ_TIMEOUT_SECONDS = 30.0
# A whole pull: this long, plus the export's bytes at the slowest rate a pool's network should give (100 MB/s,
# a tenth of 10 GbE): a 4 GiB session gets 53 s. A holder slower than that counts as stalled; the puller reads
# the shared tier's copy instead.
TRANSFER_BASE_SECONDS = 10.0
TRANSFER_MIN_BYTES_PER_SECOND = 100e6
# One read of the body into the buffer (the kernel fills what it has; this bounds how long a read may block).
READ_INTO_BYTES = 16 << 20
# An answer other than 200 is read this far for its error envelope.
ERROR_BODY_BYTES = 64 << 10


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


def peer_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """How this worker verifies the pool's other pods over https: against the pool's CA (`tls_ca_file`; the
    Secret of a pool's TLS may carry none, when a public CA signed its certificate), else the system's CAs."""
    if ca_file is None or not Path(ca_file).exists():
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=ca_file)


def error_text(body: bytes) -> str:
    """An error answer's envelope code and message, else the start of its body."""
    try:
        error = json.loads(body)["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


class StagingMemory:
    """Host memory this pod keeps between pulls to receive exports into (`transfer_staging_bytes`, issue 42):
    its pages provided once, so a pull that fits costs the kernel's copy alone, not the first touch of fresh
    memory, most of a pull's CPU on these machines (docs/benchmarks.md "The transfer code per side"), as a
    GPU node keeps pinned host buffers. One pull at a time has it (`lend`, `give_back`); another, or a
    larger export, gets fresh memory as without it.

    An import reads its tensors as views of the body and copies whatever a session keeps, so after it nothing
    views this memory. Should a view outlive it (a failed import's traceback still alive, or a tensor kept by
    mistake), the memory is let go rather than written again under it: CPython refuses to resize a mapping
    with views, which is how `give_back` asks."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._memory: mmap.mmap | None = None
        self._lent = False
        self._lock = threading.Lock()  # pulls lend it on their threads

    def lend(self, size: int) -> mmap.mmap | None:
        """The memory for a body of `size` bytes; None when it is lent or too small."""
        with self._lock:
            if self._lent or not 0 < size <= self.size:
                return None
            if self._memory is None:
                self._memory = fresh_memory(self.size)
            self._lent = True
            return self._memory

    def holds(self, memory: object) -> bool:
        """Whether `memory` (what a body lies in) is this staging memory."""
        return memory is not None and memory is self._memory

    def give_back(self, memory: object) -> None:
        """After the pull's import or its failure (`memory`: what its body lies in; anything but this
        memory is ignored): lent again if nothing views it, else let go."""
        with self._lock:
            if self._memory is None or memory is not self._memory:
                return
            self._lent = False
            try:
                self._memory.resize(self.size)  # the same size: a no-op, refused while a view of it exists
            except BufferError:
                log.warning("the transfer staging memory is still viewed after its pull: let go, not reused")
                self._memory = None


class _Pull:
    """One GET, run in a thread; `abort()` (from the event loop) ends a read under way at once."""

    def __init__(
        self,
        url: str,
        token: str,
        size: int,
        context: ssl.SSLContext,
        deadline: float,
        staging: StagingMemory | None,
    ) -> None:
        self.url, self._token, self._size, self._deadline = url, token, size, deadline
        self._staging = staging
        self.body: memoryview | None = None
        parts = urllib.parse.urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self._path = path or "/"
        if parts.scheme == "https":
            self._connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=CONNECT_TIMEOUT_SECONDS, context=context
            )
        else:
            self._connection = http.client.HTTPConnection(
                parts.hostname or "", parts.port, timeout=CONNECT_TIMEOUT_SECONDS
            )
        self.received = 0

    def abort(self) -> None:
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        """The pull; its body is left in `body`, not returned: a thread's result outlives the call in its
        future, and a view of the staging memory must go with its import."""
        try:
            try:
                response = self._answer()
            except (OSError, http.client.HTTPException) as exc:
                raise TransferFailed(f"{self.url}: {type(exc).__name__}: {exc}") from None
            try:
                self.body = self._body(response)
            except (OSError, http.client.HTTPException) as exc:
                if time.monotonic() >= self._deadline:
                    raise self._late() from None
                cause = f"{type(exc).__name__}: {exc}"
                raise ExportCorrupt(
                    f"the direct transfer was cut off after {self.received} bytes ({cause})"
                ) from None
        finally:
            self._connection.close()

    def _answer(self) -> http.client.HTTPResponse:
        self._connection.request("GET", self._path, headers={"authorization": f"Bearer {self._token}"})
        assert self._connection.sock is not None
        self._connection.sock.settimeout(min(READ_TIMEOUT_SECONDS, self._left()))
        response = self._connection.getresponse()
        if response.status != 200:
            raise TransferFailed(
                f"{self.url} answered {response.status}: {error_text(response.read(ERROR_BODY_BYTES))}"
            )
        return response

    def _body(self, response: http.client.HTTPResponse) -> memoryview:
        declared = response.length  # None when the holder streams it chunked
        if declared is not None and declared > self._size:
            raise TransferFailed(
                f"{self.url} declared {declared} bytes, more than the {self._size} of the export"
            )
        capacity = self._size if declared is None else declared
        # A declared length is the body's: its pages are provided at once. Without one the size is only a
        # bound (a kept chunk's is the pod's whole history budget): pages come as the bytes arrive.
        staged = self._staging.lend(capacity) if self._staging is not None else None
        buffer = staged if staged is not None else fresh_memory(capacity, at_once=declared is not None)
        view = memoryview(buffer)
        try:
            return self._receive(response, view, declared, capacity)
        except BaseException:
            if staged is not None:  # nothing of it is kept: the next pull may have it
                with contextlib.suppress(BufferError):  # a read's frame in the traceback may view it still
                    view.release()
                self._staging.give_back(staged)
            raise

    def _receive(
        self, response: http.client.HTTPResponse, view: memoryview, declared: int | None, capacity: int
    ) -> memoryview:
        sock = self._connection.sock
        assert sock is not None
        while self.received < capacity:
            left = self._left()
            if left <= 0:
                raise self._late()
            sock.settimeout(min(READ_TIMEOUT_SECONDS, left))
            try:
                n = response.readinto(view[self.received : self.received + READ_INTO_BYTES])
            except http.client.IncompleteRead as exc:  # a chunked body cut off, within this read
                self.received += len(exc.partial)
                raise
            if not n:
                break
            self.received += n
        if declared is not None and self.received < declared:
            raise http.client.IncompleteRead(b"", declared - self.received)
        if declared is None and self.received == capacity and response.read(1):
            raise TransferFailed(f"{self.url} sent more than the {self._size} bytes of the export")
        return view[: self.received]

    def _left(self) -> float:
        return self._deadline - time.monotonic()

    def _late(self) -> TransferFailed:
        seconds = transfer_deadline_seconds(self._size)
        return TransferFailed(
            f"{self.url}: not done within {seconds:.0f} s ({self.received} of {self._size} bytes)"
        )


async def download(
    url: str, token: str, *, size: int, context: ssl.SSLContext, staging: StagingMemory | None = None
) -> tuple[memoryview, TransferResult]:
    """GET an export (`transfer_url`, `kept_url`) from the pod holding it into memory (the pod's `staging`
    memory when the body fits it and it is free: the caller gives it back after the import,
    `staging.give_back(body.obj)`): at most `size` bytes (what the store recorded for it), within
    `transfer_deadline_seconds(size)`. `TransferFailed` when the holder cannot be reached, refuses, sends
    more, or is not done in time; `ExportCorrupt` when the body is cut off (a body that ends early with no
    word of it is `export_corrupt` at the import: the digest does not hold)."""
    started = time.perf_counter()
    pull = _Pull(url, token, size, context, time.monotonic() + transfer_deadline_seconds(size), staging)
    try:
        await asyncio.to_thread(pull.run)
    except asyncio.CancelledError:
        pull.abort()  # the thread's read ends with an error; nobody waits for it
        raise
    body, pull.body = pull.body, None
    assert body is not None
    return body, TransferResult(pull.received, time.perf_counter() - started)
