"""An export in host memory, in pieces of `PIECE_BYTES` (docs/contracts.md §9): what the host tier keeps
(worker/host_tier.py) and what a transfer sends and receives (worker/transfer.py).

Writing an export into pieces copies device memory into host memory, fast, under the forward lock; sending or
storing the pieces then needs no lock. A runtime imports from a `BodyReader` over them as from a file.
"""

from __future__ import annotations

from collections.abc import Iterator

from ardiff.worker.errors import TransferFailed

PIECE_BYTES = 1 << 20


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
