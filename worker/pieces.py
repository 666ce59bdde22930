"""An export in host memory, in pieces of `PIECE_BYTES` (docs/contracts.md §9): what the host tier keeps
(worker/host_tier.py) and what a transfer sends and receives (worker/transfer.py).

Writing an export into pieces copies device memory into host memory, fast, under the forward lock; sending or
storing the pieces then needs no lock. A runtime imports from a `BodyReader` over them as from a file.

The pieces are cut from memory mappings whose pages the kernel provides at once (`fresh_memory`): on these
machines a page's first touch costs more than copying into it (issue 42: ~0.33 CPU-seconds per GiB provided
in bulk, ~0.6 touched one by one, against ~0.075 for the copy), and a `bytearray` touches every page twice
(zeroed, then written). The export is written under the forward lock, so this is a migration's stall.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

from ardiff.worker.errors import TransferFailed

PIECE_BYTES = 1 << 20
# Pieces are cut from mappings of this size (a 26 GB export is ~1,600 of them, far below the kernel's
# per-process limit of 65,530 mappings); the unused end of an export's last one is given back.
REGION_BYTES = 16 << 20


def fresh_memory(size: int, *, at_once: bool = True) -> mmap.mmap:
    """`size` bytes of zeroed, writable host memory, its pages provided now (MAP_POPULATE) rather than one
    fault at a time as they are first written; `at_once=False` where `size` is only a bound (what is never
    written never becomes resident)."""
    populate = mmap.MAP_POPULATE if at_once else 0
    return mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)


class PieceCollector:
    """A `Writable` gathering an export in `PIECE_BYTES` pieces, at most `room` bytes (`full(size)` is raised
    past it: the host tier's budget). Each byte is copied once, into the piece it ends in."""

    def __init__(self, room: int, full: type[Exception] = TransferFailed) -> None:
        self.room = room
        self._full = full
        self.pieces: list[memoryview] = []
        self._region: mmap.mmap | None = None
        self._cut = REGION_BYTES  # of the region: none yet
        self._filled = PIECE_BYTES  # of the last piece: none yet
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        written = view.nbytes
        if self.size + written > self.room:
            raise self._full(f"the export passed the {self.room} bytes it may take")
        self.size += written
        while view.nbytes:
            if self._filled == PIECE_BYTES:
                self._next_piece()
            taken = min(PIECE_BYTES - self._filled, view.nbytes)
            self.pieces[-1][self._filled : self._filled + taken] = view[:taken]
            self._filled += taken
            view = view[taken:]
        return written

    def _next_piece(self) -> None:
        if self._region is None or self._cut == REGION_BYTES:
            self._region, self._cut = fresh_memory(REGION_BYTES), 0
        self.pieces.append(memoryview(self._region)[self._cut : self._cut + PIECE_BYTES])
        self._cut += PIECE_BYTES
        self._filled = 0

    def finish(self) -> tuple[memoryview, ...]:
        """The pieces, the last one cut to what was written; the last region's unused pieces are given back
        to the kernel."""
        if self.pieces and self._filled < PIECE_BYTES:
            self.pieces[-1] = self.pieces[-1][: self._filled]
            self._filled = PIECE_BYTES
        if self._region is not None and self._cut < REGION_BYTES:
            self._region.madvise(mmap.MADV_DONTNEED, self._cut, REGION_BYTES - self._cut)
            self._cut = REGION_BYTES
        return tuple(self.pieces)


class BodyReader:
    """A `ViewSource` over an export's pieces (a download, a host-tier copy), what a runtime imports from: it
    answers views of the pieces, never copies."""

    def __init__(self, pieces: Iterator[bytes | bytearray | memoryview]) -> None:
        self._pieces = pieces
        self._pending = memoryview(b"")
        self.received = 0

    def view(self, size: int) -> memoryview:
        while not self._pending.nbytes:
            piece = next(self._pieces, None)
            if piece is None:
                return memoryview(b"")
            self._pending = memoryview(piece).cast("B")
            self.received += self._pending.nbytes
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def read(self, size: int) -> bytes:
        return bytes(self.view(size))
