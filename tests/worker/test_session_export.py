"""The session export format (docs/contracts.md §9) without a model: the fake runtime's sessions, written and
read part by part, a valid safetensors document inside, and every refusal typed."""

from __future__ import annotations

import hashlib
import io
import json
import struct

import numpy as np
import pytest
import safetensors.numpy
import xxhash

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import (
    ExportCorrupt,
    ExportDuplicateSession,
    ExportIdentityMismatch,
    ExportNoCapacity,
    ExportNotIdle,
)
from ardiff.worker.fake_runtime import FakeRuntime, fake_frames
from ardiff.worker.runtime import run_tick
from ardiff.worker.session_book import CachedChunk, SessionBook
from ardiff.worker.session_export import DIGEST_BYTES, ITEM_SIZES, ExportReader, TensorPart, write_export

CONDITIONING = Conditioning(seed=7, prompt="a forest")


def tick(runtime: FakeRuntime, session: str, chunk: int):
    parsed = tick_rules.parse_tick(session, {"request_id": f"{session}-{chunk}", "chunk_index": chunk})
    return run_tick(runtime, runtime.ticks.prepare(parsed, CONDITIONING))


def ticked(runtime: FakeRuntime, session: str, chunks: int) -> SessionBook:
    book = SessionBook(session, token_sha256="cd" * 32)
    for chunk in range(chunks):
        output = tick(runtime, session, chunk)
        book = book.advanced(CachedChunk(f"{session}-{chunk}", chunk, output.frames, output.metadata))
    return book


def export(runtime: FakeRuntime, session: str, book: SessionBook) -> bytes:
    out = io.BytesIO()
    assert runtime.export_session(session, out, book=book) == out.tell()
    return out.getvalue()


class Trickle(io.RawIOBase):
    """A source that answers every read with at most 7 bytes (a socket would)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._data.read(min(size, 7) if size >= 0 else 7)


def test_a_fake_session_moves_to_another_runtime_with_its_book() -> None:
    source, target = FakeRuntime(height=8, width=8, capacity=2), FakeRuntime(height=8, width=8, capacity=2)
    book = ticked(source, "s", 2)
    blob = export(source, "s", book)
    source.close("s")
    tick(target, "other", 0)
    imported = target.import_session(Trickle(blob))
    assert imported.to_dict() == book.to_dict()
    assert imported.retry_of("s-1", 1) is not None  # a retried tick stays idempotent after the move
    assert set(target.resident_sessions()) == {"s", "other"}
    continued = tick(target, "s", 2)  # the fake fails a forward whose chunk is not the session's next
    parsed = tick_rules.parse_tick("s", {"request_id": "s-2", "chunk_index": 2})
    image = target.ticks.prepare(parsed, CONDITIONING).request.image
    np.testing.assert_array_equal(continued.frames, fake_frames(CONDITIONING, image, parsed))


def test_an_export_imported_as_another_session_is_a_fork_of_it() -> None:
    """Issue 26: `as_session` installs the export under the fork's id (the source stays), at the same chunk,
    with no token hash and no cached chunk of the parent's; the fork's next chunk is the parent's next one."""
    runtime = FakeRuntime(height=8, width=8, capacity=2)
    book = ticked(runtime, "parent", 2)
    forked = runtime.import_session(io.BytesIO(export(runtime, "parent", book)), as_session="child")
    assert forked == SessionBook("child", next_chunk_index=2, ticks=2)
    assert set(runtime.resident_sessions()) == {"parent", "child"}
    np.testing.assert_array_equal(tick(runtime, "child", 2).frames, tick(runtime, "parent", 2).frames)


def test_the_tensor_section_is_a_safetensors_document_written_part_by_part() -> None:
    calls: list[str] = []

    class Recorder(io.BytesIO):
        def write(self, data) -> int:  # type: ignore[override]
            calls.append(f"write {memoryview(data).nbytes}")
            return super().write(data)

    def part(name: str, values: np.ndarray) -> TensorPart:
        def data() -> bytes:
            calls.append(f"read {name}")
            return values.tobytes()

        return TensorPart(name, "F32", values.shape, data)

    first, second = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((4,), 2.5, dtype=np.float32)
    out = Recorder()
    book = SessionBook("s")
    write_export(
        out,
        session_id="s",
        identity={"runtime": "x"},
        book=book,
        state={"k": 1},
        tensors=[part("a", first), part("b", second)],
    )
    # Each part is read only when it is written (one part in memory at a time), then the digest.
    assert calls[-5:] == ["read a", "write 24", "read b", "write 16", f"write {DIGEST_BYTES}"]
    blob = out.getvalue()
    (header_len,) = struct.unpack("<Q", blob[12:20])
    header = json.loads(blob[20 : 20 + header_len])
    assert (header["session_id"], header["identity"], header["state"]) == ("s", {"runtime": "x"}, {"k": 1})
    tensors = safetensors.numpy.load(blob[20 + header_len : -DIGEST_BYTES])
    np.testing.assert_array_equal(tensors["a"], first)
    np.testing.assert_array_equal(tensors["b"], second)
    reader = ExportReader(io.BytesIO(blob))
    tensors = reader.tensors(lambda name, dtype, shape: None)  # any tensor: this test is the format's
    read = [(t.name, np.frombuffer(t.data, dtype=np.float32).reshape(t.shape)) for t in tensors]
    assert [name for name, _ in read] == ["a", "b"]
    np.testing.assert_array_equal(read[1][1], second)
    assert reader.book().to_dict() == book.to_dict()


def mangled_version(blob: bytes) -> bytes:
    return blob[:8] + struct.pack("<I", 3) + blob[12:]


def huge_header(blob: bytes) -> bytes:
    return blob[:12] + struct.pack("<Q", 1 << 40) + blob[20:]


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (mangled_version, "version 3 is not supported \\(this worker reads 1, 2\\)"),
        (huge_header, "claims 1099511627776 bytes"),
        (lambda blob: blob[:15], "truncated in the preamble"),
        (lambda blob: blob[:30], "truncated in the header"),
        (lambda blob: blob[:-DIGEST_BYTES], "no checksum"),
        (lambda blob: blob[:-1] + bytes([blob[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda blob: b"", "truncated"),
    ],
)
def test_a_corrupt_export_is_refused(mangle, message: str) -> None:
    source, target = FakeRuntime(height=8, width=8, capacity=2), FakeRuntime(height=8, width=8, capacity=2)
    blob = export(source, "s", ticked(source, "s", 1))
    with pytest.raises(ExportCorrupt, match=message):
        target.import_session(io.BytesIO(mangle(blob)))
    assert target.resident_sessions() == ()


def test_an_export_of_version_1_sha_256_is_still_read() -> None:
    """Version 2 checks with XXH3-128 (issue 42); a version 1 export (SHA-256), e.g. a session suspended into
    the shared tier before an upgrade, still imports, and its checksum is still checked."""
    source, target = FakeRuntime(height=8, width=8, capacity=2), FakeRuntime(height=8, width=8, capacity=2)
    book = ticked(source, "s", 2)
    blob = export(source, "s", book)
    assert struct.unpack("<I", blob[8:12]) == (2,)
    assert blob[-DIGEST_BYTES:] == xxhash.xxh3_128(blob[:-DIGEST_BYTES]).digest()
    body = blob[:8] + struct.pack("<I", 1) + blob[12:-DIGEST_BYTES]
    version_1 = body + hashlib.sha256(body).digest()
    with pytest.raises(ExportCorrupt, match="checksum mismatch"):
        target.import_session(io.BytesIO(version_1[:-1] + bytes([version_1[-1] ^ 1])))
    assert target.resident_sessions() == ()
    assert target.import_session(io.BytesIO(version_1)).to_dict() == book.to_dict()
    np.testing.assert_array_equal(tick(target, "s", 2).frames, tick(source, "s", 2).frames)


def test_import_refuses_a_foreign_a_duplicate_and_a_full_runtime() -> None:
    source = FakeRuntime(height=8, width=8, capacity=2)
    blob = export(source, "s", ticked(source, "s", 1))
    with pytest.raises(ExportIdentityMismatch) as mismatch:
        FakeRuntime(height=16, width=8, capacity=2).import_session(io.BytesIO(blob))
    assert mismatch.value.differences == {"height": (8, 16)}
    assert mismatch.value.code == "export_identity_mismatch"
    with pytest.raises(ExportDuplicateSession):
        source.import_session(io.BytesIO(blob))
    full = FakeRuntime(height=8, width=8, capacity=1)
    tick(full, "other", 0)
    with pytest.raises(ExportNoCapacity):
        full.import_session(io.BytesIO(blob))
    assert full.resident_sessions() == ("other",)
    with pytest.raises(ExportNotIdle):
        source.export_session("nobody", io.BytesIO(), book=SessionBook("nobody"))


# ---- declared sizes against the spec, before anything is allocated (issue 23 item 5) -----------------------


def with_index(blob: bytes, change) -> bytes:
    """`blob` with its tensor index changed by `change(index)` (offsets laid out again) and no tensor data:
    an export that declares what it does not carry."""
    (header_len,) = struct.unpack("<Q", blob[12:20])
    start = 20 + header_len
    (index_len,) = struct.unpack("<Q", blob[start : start + 8])
    index = json.loads(blob[start + 8 : start + 8 + index_len])
    change(index)
    offset = 0
    for info in index.values():
        size = int(np.prod(info["shape"])) * ITEM_SIZES[info["dtype"]]
        info["data_offsets"] = [offset, offset + size]
        offset += size
    encoded = json.dumps(index).encode()
    encoded += b" " * (-len(encoded) % 8)
    return blob[:start] + struct.pack("<Q", len(encoded)) + encoded


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda index: index.update({"kv/main/k/0": {"dtype": "F32", "shape": [1 << 28]}}), "kv/main/k/0"),
        (lambda index: index["book/last_chunk/frames"].update(shape=[12, 8, 4096, 3]), "frames"),
        (lambda index: index["book/last_chunk/frames"].update(shape=[100_000, 8, 8, 3]), "frames"),
        (lambda index: index["book/last_chunk/frames"].update(dtype="F32"), "frames"),
        (lambda index: index["book/last_chunk/frames"].update(shape=[12, 8, 8]), "frames"),
        (
            lambda index: index.update({"book/last_chunk/actions": {"dtype": "F32", "shape": [1 << 26, 8]}}),
            "actions",
        ),
        (
            lambda index: index.update({"book/last_chunk/actions": {"dtype": "F64", "shape": [24, 8]}}),
            "actions",
        ),
        (
            lambda index: index.update({"book/last_chunk/actions": {"dtype": "F32", "shape": [192]}}),
            "actions",
        ),
    ],
)
def test_a_declared_tensor_outside_the_spec_is_refused_before_it_is_read(change, message: str) -> None:
    import tracemalloc

    source, target = FakeRuntime(height=8, width=8, capacity=2), FakeRuntime(height=8, width=8, capacity=2)
    blob = with_index(export(source, "s", ticked(source, "s", 1)), change)
    tracemalloc.start()
    try:
        with pytest.raises(ExportCorrupt, match=f"{message}.* this worker expects"):
            target.import_session(io.BytesIO(blob))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # nothing of the declared sizes (up to 1 GiB) was allocated
    assert target.resident_sessions() == ()


def test_a_reader_allocates_what_arrives_not_what_is_declared() -> None:
    """A stream that declares a 64 GiB tensor and ends after 1 MiB of it: `export_corrupt` (truncated),
    having held about what arrived. Before: the reader made a buffer of the declared size first (a
    MemoryError here)."""
    import tracemalloc

    source = FakeRuntime(height=8, width=8, capacity=2)
    declared = with_index(
        export(source, "s", ticked(source, "s", 1)),
        lambda index: index.update({"big": {"dtype": "U8", "shape": [64 << 30]}}),
    )
    reader = ExportReader(io.BytesIO(declared + bytes(12 * 8 * 8 * 3) + bytes(1 << 20)))
    tracemalloc.start()
    try:
        with pytest.raises(ExportCorrupt, match="truncated in big"):
            for _ in reader.tensors(lambda name, dtype, shape: None):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


def test_a_download_s_tensors_are_views_of_its_buffer_and_a_kept_tensor_owns_its_memory() -> None:
    """A pulled export lies in one writable buffer (worker/export_download.py): the reader yields its tensors
    as views of it (no copy) and still checks the digest; `session_tensors.tensor` copies such a view (a
    tensor the session keeps must not hold the whole buffer), `staged` (KV pages, copied into the pool) does
    not. Pieces that split a tensor, or read-only bytes, are copied into its own buffer, as before."""
    import torch

    from ardiff.worker.pieces import BodyReader, PieceCollector
    from ardiff.worker.session_tensors import staged, tensor

    values = np.arange(3 << 18, dtype=np.float32)  # 3 MiB: across three pieces of the collector
    book = SessionBook("s")
    collector = PieceCollector(1 << 30)
    parts = [TensorPart("kv/0", "F32", values.shape, values.tobytes)]
    write_export(collector, session_id="s", identity={}, book=book, state={}, tensors=parts)
    pieces = collector.finish()
    buffer = bytearray(b"".join(pieces))

    (read,) = ExportReader(BodyReader(iter((memoryview(buffer),)))).tensors(lambda *_: None)
    assert isinstance(read.data, memoryview)
    assert read.data.obj is buffer
    kept, page = tensor(read), staged(read)
    np.testing.assert_array_equal(kept.numpy(), values)
    assert page.data_ptr() == torch.frombuffer(read.data, dtype=torch.uint8).data_ptr()
    assert kept.data_ptr() != page.data_ptr()

    (split,) = ExportReader(BodyReader(iter(pieces))).tensors(lambda *_: None)
    assert isinstance(split.data, bytearray)
    np.testing.assert_array_equal(tensor(split).numpy(), values)
    (readonly,) = ExportReader(BodyReader(iter((bytes(buffer),)))).tensors(lambda *_: None)
    assert isinstance(readonly.data, bytearray)

    buffer[len(buffer) // 2] ^= 1  # a view is still only trusted once the digest held
    with pytest.raises(ExportCorrupt, match="checksum mismatch"):
        list(ExportReader(BodyReader(iter((memoryview(buffer),)))).tensors(lambda *_: None))
