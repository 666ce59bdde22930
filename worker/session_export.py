"""The session export format (docs/contracts.md §9): one session at a tick boundary as a byte stream.

    magic "ARDSESS\\0" | u32 version | u64 H | header JSON (H bytes)
    | safetensors document (u64 S | its JSON header | tensor data) | checksum of every byte before it

The checksum is XXH3-128 (version 2): it finds a body cut off, altered by a fault or mixed up, at a seventh of
SHA-256's CPU per byte (issue 42), and a transfer's bytes are the most a migration pays for. Neither is a
defence against a peer who forges an export (an unkeyed digest never was): the pool's transfer token decides
who may send one, and a TLS pool's bytes are authenticated by TLS. Version 1 (SHA-256) is still read, so a
session suspended before an upgrade resumes after it; any other version is refused.

Written and read in parts: a writer is given each tensor's dtype and shape up front and its bytes one part
at a time (`TensorPart.data` is called when the part is written, so at most one part is in host memory); a
reader yields each part as it arrives and checks the digest after the last one. Whatever a reader yields is
untrusted until its iteration has ended without `ExportCorrupt`. No pickle; torch-free (the runtimes convert
their own tensors), so the fake runtime shares it.

The worker's `SessionBook` travels in the header (its cached chunk's frames and a robot policy's actions as
the tensors `book/last_chunk/frames` and `book/last_chunk/actions`, written first), so a retried tick stays
idempotent after a move.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, runtime_checkable

import xxhash

from ardiff.worker.errors import ExportCorrupt, ExportIdentityMismatch
from ardiff.worker.session_book import SessionBook

MAGIC = b"ARDSESS\x00"
VERSION = 2
FORMAT = "ardiff-session-export"
# Each version's checksum (a hashlib-like constructor) and its size; a writer writes VERSION.
CHECKSUMS: dict[int, tuple[Callable[[], Any], int]] = {1: (hashlib.sha256, 32), 2: (xxhash.xxh3_128, 16)}
DIGEST_BYTES = CHECKSUMS[VERSION][1]
# Bounds on the two JSON headers: a corrupted length must not make a reader allocate gigabytes.
MAX_HEADER_BYTES = 64 << 20
# A `Readable`'s tensor is read in pieces of at most this size into a buffer that grows as they arrive: what a
# reader holds is what the stream carried, whatever the index declared.
READ_BYTES = 1 << 20
# The most frames a cached chunk may hold (a LingBot chunk has 9 or 12; a DreamZero one none unless asked for)
# and the most action values (DreamZero's chunk is 24 x 8): the book's tensors are bounded.
MAX_BOOK_FRAMES = 64
MAX_BOOK_ACTION_VALUES = 1 << 14
# safetensors dtype codes and their item sizes (the subset the runtimes use).
ITEM_SIZES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
BOOK_FRAMES = "book/last_chunk/frames"
BOOK_ACTIONS = "book/last_chunk/actions"

_PREAMBLE = struct.Struct("<8sIQ")  # magic, version, header length
_U64 = struct.Struct("<Q")


# A runtime's spec of the tensors it imports: `check(name, dtype, shape)` raises `ExportCorrupt` (use
# `refuse_tensor`) for a tensor it would not take, before the reader allocates anything for it.
TensorCheck = Callable[[str, str, tuple[int, ...]], None]


class Writable(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


@runtime_checkable
class ViewSource(Protocol):
    """A source whose bytes already lie in memory (a download, a host-tier copy): `view` answers the next
    bytes, at most `size`, as a view of the buffer they lie in. A tensor lying whole in one writable buffer is
    yielded as a view of it, not copied."""

    def view(self, size: int, /) -> memoryview: ...


@dataclass(frozen=True)
class TensorPart:
    """One tensor of an export: dtype (a safetensors code), shape, and its little-endian bytes on demand."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: Callable[[], bytes | bytearray | memoryview]

    def __post_init__(self) -> None:
        if self.dtype not in ITEM_SIZES:
            raise ValueError(
                f"export tensor {self.name} dtype must be one of {sorted(ITEM_SIZES)}, got {self.dtype}"
            )

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEM_SIZES[self.dtype]


@dataclass(frozen=True)
class ReadTensor:
    """A tensor as a reader yields it: a writable buffer the caller may wrap without copying — its own, or a
    view of the buffer it arrived in (a `ViewSource`'s), which a caller keeping it past the import copies."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytearray | memoryview


def refuse_tensor(name: str, dtype: str, shape: tuple[int, ...], expected: str) -> NoReturn:
    raise ExportCorrupt(
        f"session export tensor {name} is {dtype} {list(shape)}; this worker expects {expected}"
    )


def check_book_tensor(name: str, dtype: str, shape: tuple[int, ...], frame_size: tuple[int, int]) -> bool:
    """Whether `name` is one of the book's tensors, refused unless it fits: the cached chunk's frames, uint8
    `(F, H, W, 3)` at this worker's frame size with 0 to `MAX_BOOK_FRAMES` frames; its actions, float32
    `(horizon, dims)` of at most `MAX_BOOK_ACTION_VALUES` values."""
    if name == BOOK_FRAMES:
        height, width = frame_size
        if (
            dtype != "U8"
            or len(shape) != 4
            or shape[1:] != (height, width, 3)
            or not 0 <= shape[0] <= MAX_BOOK_FRAMES
        ):
            refuse_tensor(name, dtype, shape, f"U8 [0..{MAX_BOOK_FRAMES}, {height}, {width}, 3] frames")
        return True
    if name == BOOK_ACTIONS:
        if dtype != "F32" or len(shape) != 2 or not 0 < math.prod(shape) <= MAX_BOOK_ACTION_VALUES:
            refuse_tensor(
                name, dtype, shape, f"F32 [horizon, dims] actions of 1..{MAX_BOOK_ACTION_VALUES} values"
            )
        return True
    return False


def check_identity(export: Mapping[str, Any], worker: Mapping[str, Any]) -> None:
    """`ExportIdentityMismatch` naming every field whose value differs (a missing one counts as None)."""
    differences = {
        key: (export.get(key), worker.get(key))
        for key in sorted(set(export) | set(worker))
        if export.get(key) != worker.get(key)
    }
    if differences:
        raise ExportIdentityMismatch(differences)


class _HashingWriter:
    def __init__(self, out: Writable) -> None:
        self._out = out
        self.digest = CHECKSUMS[VERSION][0]()
        self.written = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self._out.write(view)
        self.written += view.nbytes


def write_export(
    out: Writable,
    *,
    session_id: str,
    identity: Mapping[str, Any],
    book: SessionBook,
    state: Mapping[str, Any],
    tensors: Sequence[TensorPart],
) -> int:
    """Write one session to `out`, part by part; returns the bytes written (digest included)."""
    if book.session_id != session_id:
        raise ValueError(f"export book is for {book.session_id!r}, not {session_id!r}")
    parts = list(tensors)
    book_dict = book.to_dict()
    last = book.last_chunk
    if last is not None:
        chunk = book_dict["last_chunk"]
        if last.actions is not None:
            actions = last.actions.astype("<f4")
            parts.insert(0, TensorPart(BOOK_ACTIONS, "F32", tuple(actions.shape), actions.tobytes))
            del chunk["actions"], chunk["action_shape"]
        parts.insert(0, TensorPart(BOOK_FRAMES, "U8", tuple(last.frames.shape), last.frames.tobytes))
        del chunk["frames"], chunk["frame_shape"]
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"export tensor names must be unique, got {names}")
    header = json.dumps(
        {
            "format": FORMAT,
            "session_id": session_id,
            "identity": dict(identity),
            "book": book_dict,
            "state": dict(state),
        },
        sort_keys=True,
    ).encode()
    offsets, layout = 0, {}
    for part in parts:
        layout[part.name] = {
            "dtype": part.dtype,
            "shape": list(part.shape),
            "data_offsets": [offsets, offsets + part.nbytes],
        }
        offsets += part.nbytes
    st_header = json.dumps(layout).encode()
    st_header += b" " * (-len(st_header) % 8)  # safetensors aligns the data to 8 bytes

    writer = _HashingWriter(out)
    writer.write(_PREAMBLE.pack(MAGIC, VERSION, len(header)))
    writer.write(header)
    writer.write(_U64.pack(len(st_header)))
    writer.write(st_header)
    for part in parts:
        data = memoryview(part.data()).cast("B")
        if data.nbytes != part.nbytes:
            raise ValueError(
                f"export tensor {part.name} has {data.nbytes} bytes, its shape needs {part.nbytes}"
            )
        writer.write(data)
    digest = writer.digest.digest()
    out.write(digest)
    return writer.written + len(digest)


class ExportReader:
    """Reads an export from `source` in parts: the header at once, then `tensors()` one by one."""

    def __init__(self, source: Readable | ViewSource) -> None:
        self._source = source
        preamble = self._read_exactly(_PREAMBLE.size, "the preamble")  # its version names the checksum
        magic, version, header_len = _PREAMBLE.unpack(preamble)
        if magic != MAGIC:
            raise ExportCorrupt("not a session export (bad magic)")
        if version not in CHECKSUMS:
            raise ExportCorrupt(
                f"session export version {version} is not supported (this worker reads "
                f"{', '.join(map(str, sorted(CHECKSUMS)))})"
            )
        checksum, self._digest_bytes = CHECKSUMS[version]
        self._digest = checksum()
        self._digest.update(preamble)
        header = self._json(header_len, "header")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ExportCorrupt("session export header is not an object of the expected format")
        try:
            self.session_id: str = header["session_id"]
            self.identity: dict[str, Any] = dict(header["identity"])
            self.state: dict[str, Any] = dict(header["state"])
            self._book: dict[str, Any] = dict(header["book"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportCorrupt(f"session export header lacks {exc}") from None
        (st_len,) = _U64.unpack(self._read(_U64.size, "the tensor index"))
        self._layout = self._tensor_layout(self._json(st_len, "tensor index"))
        self._book_tensors: dict[str, bytearray | memoryview] = {}
        self._verified = False

    def tensor_shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {t.name: (t.dtype, t.shape) for t in self._layout}

    def tensors(self, check: TensorCheck) -> Iterator[ReadTensor]:
        """Each tensor in order (the book's are kept, not yielded), once `check` accepted every one the index
        declares; then the digest is checked. Until the iteration has ended, nothing read is trusted."""
        for entry in self._layout:
            check(entry.name, entry.dtype, entry.shape)
        for entry in self._layout:
            data = self._read_into(math.prod(entry.shape) * ITEM_SIZES[entry.dtype], entry.name)
            if entry.name in (BOOK_FRAMES, BOOK_ACTIONS):
                self._book_tensors[entry.name] = data
                continue
            yield ReadTensor(entry.name, entry.dtype, entry.shape, data)
        digest = self._read_up_to(self._digest_bytes)
        if len(digest) != self._digest_bytes:
            raise ExportCorrupt("session export is truncated (no checksum)")
        if digest != self._digest.digest():
            raise ExportCorrupt("session export checksum mismatch: the stream was altered")
        if self._next(1):
            raise ExportCorrupt("session export has bytes after its checksum")
        self._verified = True

    def book(self) -> SessionBook:
        """The worker's book that travelled with the session; only once `tensors()` has been read through."""
        if not self._verified:
            raise RuntimeError("the export's book is only trusted once its tensors and checksum were read")
        value = dict(self._book)
        last = value.get("last_chunk")
        if last is not None:
            frames, actions = self._book_tensors.get(BOOK_FRAMES), self._book_tensors.get(BOOK_ACTIONS)
            if frames is None:
                raise ExportCorrupt("session export book has a cached chunk without its frames")
            shapes = self.tensor_shapes()
            last = {**last, "frames": bytes(frames), "frame_shape": list(shapes[BOOK_FRAMES][1])}
            if actions is not None:
                last |= {"actions": bytes(actions), "action_shape": list(shapes[BOOK_ACTIONS][1])}
            value["last_chunk"] = last
        elif self._book_tensors:
            raise ExportCorrupt(f"session export carries {sorted(self._book_tensors)} but no cached chunk")
        try:
            book = SessionBook.from_dict(value)  # a cached chunk's bytes must fill its shape
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportCorrupt(f"session export book is malformed: {exc}") from None
        if book.session_id != self.session_id:
            raise ExportCorrupt(f"session export book is for {book.session_id!r}, not {self.session_id!r}")
        return book

    # ---------------------------------------------------------------- parsing

    def _next(self, size: int) -> bytes | memoryview:
        """The source's next bytes, at most `size` (fewer where it has less at hand; none at its end): a view
        source's as they lie, a `Readable`'s at most `READ_BYTES` at a time."""
        if isinstance(self._source, ViewSource):
            return self._source.view(size)
        return self._source.read(min(size, READ_BYTES))

    def _read_up_to(self, size: int) -> bytes:
        """`size` bytes, fewer only at the end of the stream (a source may answer a read with less)."""
        chunks, left = [], size
        while left:
            chunk = self._next(left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read_into(self, size: int, what: str) -> bytearray | memoryview:
        """`size` bytes: as the view they lie in when a `ViewSource` holds them whole in one writable buffer
        (no copy: a download's), else into a fresh buffer that grows as they arrive (no joined copy: a tensor
        part is the largest thing a reader holds, up to gigabytes at real sizes; and a stream cut short never
        made the reader hold what it only declared)."""
        data = bytearray()
        while len(data) < size:
            chunk = self._next(size - len(data))
            if not chunk:
                raise ExportCorrupt(f"session export is truncated in {what} ({len(data)} of {size} bytes)")
            self._digest.update(chunk)
            if len(chunk) == size and isinstance(chunk, memoryview) and not chunk.readonly:
                return chunk
            data += chunk
        return data

    def _read_exactly(self, size: int, what: str) -> bytes:
        data = self._read_up_to(size)
        if len(data) != size:
            raise ExportCorrupt(f"session export is truncated in {what} ({len(data)} of {size} bytes)")
        return data

    def _read(self, size: int, what: str) -> bytes:
        data = self._read_exactly(size, what)
        self._digest.update(data)
        return data

    def _json(self, size: int, what: str) -> Any:
        if size > MAX_HEADER_BYTES:
            raise ExportCorrupt(f"session export {what} claims {size} bytes (at most {MAX_HEADER_BYTES})")
        try:
            return json.loads(self._read(size, f"the {what}"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportCorrupt(f"session export {what} is not JSON: {exc}") from None

    @staticmethod
    def _tensor_layout(index: Any) -> list[ReadTensor]:
        """The tensors in data order; their offsets must tile the data exactly."""
        if not isinstance(index, dict):
            raise ExportCorrupt("session export tensor index is not an object")
        entries = []
        try:
            for name, info in index.items():
                if name == "__metadata__":
                    continue
                dtype, shape, (start, end) = (
                    info["dtype"],
                    tuple(int(n) for n in info["shape"]),
                    info["data_offsets"],
                )
                if dtype not in ITEM_SIZES or any(n < 0 for n in shape):
                    raise ValueError(f"{name}: dtype {dtype} shape {shape}")
                if end - start != math.prod(shape) * ITEM_SIZES[dtype]:
                    raise ValueError(f"{name}: offsets {start}..{end} do not fit its shape")
                entries.append((int(start), ReadTensor(name, dtype, shape, bytearray())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportCorrupt(f"session export tensor index is malformed: {exc}") from None
        entries.sort(key=lambda e: e[0])
        position = 0
        for start, entry in entries:
            if start != position:
                raise ExportCorrupt(
                    f"session export tensor {entry.name} starts at {start}, expected {position}"
                )
            position += math.prod(entry.shape) * ITEM_SIZES[entry.dtype]
        return [entry for _, entry in entries]
