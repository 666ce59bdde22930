"""The session adapter over the real vllm-omni runner, in this process: bit-exact isolation, KV-block
accounting and fail-closed, observed on the runner's own latents and block pool; export/import of a session
(docs/contracts.md §9) continuing bit-identically in this runtime and in a fresh process, and its refusals.

Loads the tiny LingBot-World model once for the module (about 20 s on CPU).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import (
    ExportCorrupt,
    ExportDuplicateSession,
    ExportIdentityMismatch,
    ExportNoCapacity,
    ExportNotIdle,
    ExportUnsupported,
    InvalidTick,
)
from ardiff.worker.runtime import run_tick
from ardiff.worker.session_book import CachedChunk, SessionBook
from ardiff.worker.settings import WorkerSettings
from tests.worker.test_session_export import with_index

pytestmark = pytest.mark.slow

CAMERA = [
    {"track": "camera", "schema": "lingbot.camera_actions.v1", "data": {"mode": "frames", "frames": frames}}
    for frames in ([["w"], ["w"], ["w", "j"]], [["a"], [], ["d"]], [["w", "l"], ["w"], []])
]
CONDITIONING = {
    "a": Conditioning(seed=1234, prompt="camera moving forward through a forest"),
    "b": Conditioning(seed=999, prompt="walk down the city street at night"),
}


@pytest.fixture(scope="module")
def adapter(tiny_model_cache):
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    runtime = load_vllm_runtime(
        WorkerSettings(
            model="tiny-lingbot-world", model_cache=str(tiny_model_cache), cpu_free_memory_bytes=1 << 30
        )
    )
    yield runtime
    runtime.shutdown()


def run(adapter, session: str, chunk: int, *, reset: bool = False, fault: bool = False):
    tick = tick_rules.parse_tick(
        session,
        {
            "request_id": f"{session}-{chunk}",
            "chunk_index": chunk,
            "controls": [CAMERA[chunk % 3]],
            "reset": reset,
        },
    )
    return run_tick(adapter, adapter.ticks.prepare(tick, CONDITIONING[session]), inject_fault=fault)


def test_a_session_alone_equals_the_same_session_interleaved_bit_for_bit(adapter):
    alone = [run(adapter, "a", chunk).latents.clone() for chunk in range(4)]
    adapter.close("a")
    interleaved = []
    for chunk in range(4):
        run(adapter, "b", chunk)
        interleaved.append(run(adapter, "a", chunk).latents.clone())
    assert all(torch.equal(x, y) for x, y in zip(alone, interleaved, strict=True))
    assert alone[0].shape == (1, 16, 3, 8, 8)
    assert not torch.equal(alone[0], alone[1])  # the rollout moves on
    for session in ("a", "b"):
        adapter.close(session)


def test_reset_and_close_return_every_block_and_the_runner_holds_its_sessions(adapter):
    empty = adapter.kv_blocks()
    assert empty.free == empty.total
    for chunk in range(3):
        run(adapter, "a", chunk)
        run(adapter, "b", chunk)
    assert set(adapter.resident_sessions()) == {"a", "b"}
    held = adapter.kv_blocks()
    assert held.free < empty.free
    adapter.reset("a")
    assert adapter.resident_sessions() == ("b",)
    adapter.close("b")
    assert adapter.resident_sessions() == ()
    assert adapter.kv_blocks() == empty
    adapter.close("b")  # idempotent
    # a reset session starts over: its first chunk is a first chunk again (9 frames)
    assert run(adapter, "a", 0).frames.shape == (9, 64, 64, 3)
    adapter.close("a")
    assert adapter.kv_blocks() == empty


def test_reset_tick_reproduces_the_first_chunk(adapter):
    first = run(adapter, "a", 0)
    run(adapter, "a", 1)
    again = run(adapter, "a", 0, reset=True)
    assert torch.equal(first.latents, again.latents)
    np.testing.assert_array_equal(first.frames, again.frames)
    adapter.close("a")


def test_injected_fault_fails_closed_for_that_session_only(adapter):
    empty = adapter.kv_blocks()
    run(adapter, "a", 0)
    run(adapter, "b", 0)
    with pytest.raises(RuntimeError, match="injected forward fault"):
        run(adapter, "a", 1, fault=True)
    assert adapter.resident_sessions() == ("b",)
    assert run(adapter, "b", 1).frames.shape == (12, 64, 64, 3)
    assert run(adapter, "a", 0, reset=True).frames.shape == (9, 64, 64, 3)
    for session in ("a", "b"):
        adapter.close(session)
    assert adapter.kv_blocks() == empty


def test_frames_come_from_the_sessions_streaming_decoder(adapter):
    chunks = [run(adapter, "a", chunk).frames for chunk in range(3)]
    assert [c.shape[0] for c in chunks] == [9, 12, 12]
    assert all(c.dtype == np.uint8 for c in chunks)
    assert chunks[1].std() > 1
    adapter.close("a")


@pytest.mark.parametrize(
    ("control", "message"),
    [
        (
            {
                "track": "camera",
                "schema": "lingbot.camera_actions.v1",
                "data": {"mode": "frames", "frames": [["w"]]},
            },
            "expected 3, got 1",
        ),
        (
            {
                "track": "camera",
                "schema": "lingbot.camera_trajectory.v1",
                "data": {"poses": [np.eye(4).tolist()] * 4, "intrinsics": [[50, 50, 32, 32]] * 4},
            },
            "at least 9 frames",
        ),
        (
            {
                "track": "camera",
                "schema": "lingbot.camera_trajectory.v1",
                "data": {"poses": [np.eye(4).tolist()] * 9, "intrinsics": [[0, 50, 32, 32]] * 9},
            },
            "focal lengths",
        ),
    ],
)
def test_prepare_rejects_what_the_forward_would_fail_on(adapter, control, message):
    tick = tick_rules.parse_tick("c", {"request_id": "x", "chunk_index": 0, "controls": [control]})
    with pytest.raises(InvalidTick, match=message) as caught:
        adapter.ticks.prepare(tick, CONDITIONING["a"])
    assert caught.value.param == "controls"
    assert adapter.resident_sessions() == ()


def test_make_tiny_model_is_deterministic_for_a_seed(adapter, tiny_model_cache, tiny_model_dir):
    """The CLI's checkpoint and the one the worker generated into its cache are the same bytes."""

    def digests(root: Path) -> dict[str, str]:
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    written = digests(tiny_model_dir)
    assert written == digests(Path(tiny_model_cache) / "tiny-lingbot-world-seed0")
    assert {
        "model_index.json",
        "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
    } <= written.keys()
    assert sum(p.stat().st_size for p in tiny_model_dir.rglob("*") if p.is_file()) < 8 << 20


# ---- export / import (docs/contracts.md §9) ---------------------------------------------------------------


def book_after(session: str, chunk: int, output) -> SessionBook:
    cached = CachedChunk(f"{session}-{chunk}", chunk, output.frames, output.metadata)
    return SessionBook(session, token_sha256="ab" * 32).advanced(cached)


def export(adapter, session: str, book: SessionBook) -> bytes:
    out = io.BytesIO()
    written = adapter.export_session(session, out, book=book)
    assert written == out.tell()
    return out.getvalue()


def twin(adapter, chunks: int) -> list:
    """Session `a` ticked `chunks` times without interruption: what every continuation must equal."""
    outputs = [run(adapter, "a", chunk) for chunk in range(chunks)]
    adapter.close("a")
    return outputs


def assert_same(outputs, expected) -> None:
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        assert torch.equal(got.latents, want.latents)
        np.testing.assert_array_equal(got.frames, want.frames)


@pytest.fixture(scope="module")
def exported(adapter):
    """The uninterrupted twin (6 chunks); `a` exported after 3 chunks interleaved with `b` (then closed)."""
    reference = twin(adapter, 6)
    empty = adapter.kv_blocks()
    for chunk in range(3):
        run(adapter, "b", chunk)
        last = run(adapter, "a", chunk)
    book = book_after("a", 2, last)
    blob = export(adapter, "a", book)
    for session in ("a", "b"):
        adapter.close(session)
    assert adapter.kv_blocks() == empty
    return reference, book, blob


def test_an_export_closed_and_imported_continues_bit_identically_beside_another_session(adapter, exported):
    reference, book, blob = exported
    empty = adapter.kv_blocks()
    run(adapter, "b", 0)
    imported = adapter.import_session(io.BytesIO(blob))
    assert imported.to_dict() == book.to_dict()  # the worker's book travels: a retried tick stays a retry
    assert imported.retry_of("a-2", 2) is not None
    assert set(adapter.resident_sessions()) == {"a", "b"}
    continued = []
    for chunk in range(3, 6):
        run(adapter, "b", chunk - 2)
        continued.append(run(adapter, "a", chunk))
    assert_same(continued, reference[3:])
    assert export(adapter, "a", book) != blob  # it moved on
    for session in ("a", "b"):
        adapter.close(session)
    assert adapter.kv_blocks() == empty


def test_an_export_is_read_only_and_the_session_goes_on(adapter, exported):
    reference, book, blob = exported
    for chunk in range(3):
        run(adapter, "a", chunk)
    assert export(adapter, "a", book) == blob  # the same state gives the same bytes
    assert_same([run(adapter, "a", chunk) for chunk in range(3, 6)], reference[3:])
    adapter.close("a")


def test_an_export_imports_into_a_fresh_worker_process(adapter, exported, tiny_model_cache, tmp_path):
    reference, book, blob = exported
    (tmp_path / "a.export").write_bytes(blob)
    subprocess.run(
        [sys.executable, "-m", "tests.worker.session_import_child", str(tmp_path), str(tiny_model_cache)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=True,
        timeout=240,
    )
    result = torch.load(tmp_path / "continued.pt", weights_only=False)  # written by the child above
    assert result["book"] == book.to_dict()
    for (latents, frames), want in zip(result["chunks"], reference[3:], strict=True):
        assert torch.equal(latents, want.latents)
        np.testing.assert_array_equal(frames.numpy(), want.frames)
    assert result["other_session_frames"] == 12  # `b` ticked beside it


def flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1 :]


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda blob: blob[: len(blob) // 2], "truncated"),
        (lambda blob: blob[:-1], "truncated"),
        (lambda blob: flip(blob, len(blob) - 1000), "checksum mismatch"),  # inside the tensor data
        (lambda blob: flip(blob, 40), "checksum mismatch|not JSON|header"),  # inside the header
        (lambda blob: blob + b"\0", "after its checksum"),
        (lambda blob: b"PK" + blob[2:], "bad magic"),
    ],
)
def test_a_corrupt_export_is_refused_and_nothing_is_left_behind(adapter, exported, mangle, message):
    _, _, blob = exported
    run(adapter, "b", 0)
    before = adapter.kv_blocks()
    with pytest.raises(ExportCorrupt, match=message):
        adapter.import_session(io.BytesIO(mangle(blob)))
    assert adapter.resident_sessions() == ("b",)
    assert adapter.kv_blocks() == before
    assert "a" not in adapter._pipeline._ar_sessions
    assert "a" not in adapter._pipeline._streaming_decode_states
    adapter.close("b")


def test_import_refuses_a_mismatch_a_duplicate_and_a_full_worker(adapter, exported, monkeypatch):
    _, book, blob = exported
    run(adapter, "b", 0)
    before = adapter.kv_blocks()
    with monkeypatch.context() as patch:
        patch.setitem(
            adapter.__dict__, "identity", {**adapter.identity, "height": 128, "weights_sha256": "0"}
        )
        foreign = export(adapter, "b", dataclasses.replace(book, session_id="b"))
    with pytest.raises(ExportIdentityMismatch) as mismatch:
        adapter.import_session(io.BytesIO(foreign))
    assert mismatch.value.differences == {
        "height": (128, 64),
        "weights_sha256": ("0", adapter.identity["weights_sha256"]),
    }
    own_b = export(adapter, "b", dataclasses.replace(book, session_id="b"))
    with pytest.raises(ExportDuplicateSession, match="'b' is already resident"):
        adapter.import_session(io.BytesIO(own_b))
    with monkeypatch.context() as patch:
        patch.setattr(adapter._runner.kv_cache, "session_capacity", 1)
        with pytest.raises(ExportNoCapacity, match="holds 1 sessions"):
            adapter.import_session(io.BytesIO(blob))
    assert adapter.resident_sessions() == ("b",)
    assert adapter.kv_blocks() == before
    with pytest.raises(ExportNotIdle, match="'a' is not resident"):
        export(adapter, "a", book)
    adapter.close("b")


def test_a_pipeline_without_export_support_says_so(adapter, exported, monkeypatch):
    _, book, blob = exported
    monkeypatch.setattr(adapter, "_pipeline", object())
    with pytest.raises(ExportUnsupported, match="no model family knows its session state"):
        export(adapter, "a", book)
    with pytest.raises(ExportUnsupported, match="reset-on-evict"):
        adapter.import_session(io.BytesIO(blob))


# ---- imports refuse before they write (issue 23 item 5) -------------------------------------------------


def kv_pool(adapter) -> list[torch.Tensor]:
    kv = adapter._runner.kv_cache
    return [cache(layer) for layer in range(kv.num_layers) for cache in (kv.key_cache, kv.value_cache)]


def test_an_altered_export_writes_no_kv_page(adapter, exported):
    """Only the last byte (the checksum) differs: every tensor reads well, the digest does not hold. Before:
    the KV pages were written as the parts arrived, before the checksum was read."""
    _, _, blob = exported
    assert adapter.resident_sessions() == ()
    for tensor in kv_pool(adapter):
        tensor.fill_(7.0)  # free blocks only (no session is resident): whatever an import writes shows
    with pytest.raises(ExportCorrupt, match="checksum mismatch"):
        adapter.import_session(io.BytesIO(flip(blob, len(blob) - 1)))
    assert all(bool((tensor == 7.0).all()) for tensor in kv_pool(adapter))
    assert adapter.resident_sessions() == ()
    imported = adapter.import_session(io.BytesIO(blob))  # the export itself imports
    assert imported.session_id == "a"
    adapter.close("a")


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("kv/main/k/0", [1 << 20, 16, 2, 32]),
        ("cross/text/main/v/1", [1, 512, 2, 3200]),
        ("kv/main/v/1", [9, 16]),
    ],
)
def test_a_tensor_declared_outside_the_spec_is_refused_before_anything_is_read(
    adapter, exported, name, shape
):
    """A KV page tensor must be (blocks, *page) of the pool's dtype, a cross-attention one (1, length, heads,
    head size): anything else is refused before its bytes are read or a buffer made for them. Before: no
    declared shape was checked; the reader made a buffer of each declared size (here up to 512 MiB) and read
    on until the stream ran out."""
    _, _, blob = exported
    before = adapter.kv_blocks()
    with pytest.raises(ExportCorrupt, match=f"{name} is F32 .* this worker expects F32"):
        adapter.import_session(io.BytesIO(with_index(blob, lambda index: index[name].update(shape=shape))))
    assert adapter.resident_sessions() == ()
    assert adapter.kv_blocks() == before


# ---- same-pod forks by shared blocks (issue 26 item 3; worker/block_share.py) -----------------------------


def run_as(adapter, session: str, chunk: int, conditioning: Conditioning):
    tick = tick_rules.parse_tick(
        session,
        {"request_id": f"{session}-{chunk}", "chunk_index": chunk, "controls": [CAMERA[chunk % 3]]},
    )
    return run_tick(adapter, adapter.ticks.prepare(tick, conditioning))


def self_kv_blocks(adapter, session: str) -> int:
    kv = adapter._runner.kv_cache
    return sum(len(kv.block_table(a)) for a in adapter._runner._sessions[session].adapters.values())


@pytest.mark.parametrize("share", [True, False], ids=["shared", "copied"])
def test_a_fork_on_the_parents_pod_continues_bit_identically_and_shares_its_blocks(adapter, exported, share):
    from ardiff.worker.block_share import shared_blocks

    reference, _, blob = exported
    empty = adapter.kv_blocks()
    for chunk in range(3):
        run(adapter, "a", chunk)  # the parent, at the export's boundary again
    held = self_kv_blocks(adapter, "a")
    before = adapter.kv_blocks()
    forked = adapter.import_session(io.BytesIO(blob), as_session="fork", share_with="a" if share else None)
    assert (forked.session_id, forked.next_chunk_index) == ("fork", 3)
    taken = before.free - adapter.kv_blocks().free
    assert held > 0
    assert taken == (0 if share else held)
    assert shared_blocks(adapter._runner.kv_cache) == (held if share else 0)
    children, parents = [], []
    for chunk in range(3, 6):
        children.append(run_as(adapter, "fork", chunk, CONDITIONING["a"]))
        parents.append(run(adapter, "a", chunk))
    assert_same(children, reference[3:])
    assert_same(parents, reference[3:])
    adapter.close("a")  # the parent goes first: the child keeps the blocks it still shares
    assert self_kv_blocks(adapter, "fork") > 0
    assert_same([run_as(adapter, "fork", 6, CONDITIONING["a"])], [run_as_twin(adapter, 6)])
    adapter.close("fork")
    assert adapter.kv_blocks() == empty


def run_as_twin(adapter, chunks: int):
    """Chunk `chunks` of an uninterrupted `a` (a twin session, closed afterwards)."""
    for chunk in range(chunks):
        run_as(adapter, "twin", chunk, CONDITIONING["a"])
    out = run_as(adapter, "twin", chunks, CONDITIONING["a"])
    adapter.close("twin")
    return out


def test_a_parent_that_moved_on_is_copied_not_shared(adapter, exported):
    from ardiff.worker.block_share import shared_blocks

    reference, _, blob = exported
    empty = adapter.kv_blocks()
    for chunk in range(4):
        run(adapter, "a", chunk)  # one chunk past the export: its blocks no longer hold the export's pages
    before = adapter.kv_blocks().free
    adapter.import_session(io.BytesIO(blob), as_session="fork", share_with="a")
    assert before - adapter.kv_blocks().free > 0
    assert shared_blocks(adapter._runner.kv_cache) == 0
    assert_same([run_as(adapter, "fork", chunk, CONDITIONING["a"]) for chunk in range(3, 6)], reference[3:])
    for session in ("a", "fork"):
        adapter.close(session)
    assert adapter.kv_blocks() == empty
