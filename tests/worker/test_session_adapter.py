"""The session adapter over the real vllm-omni runner, in this process: bit-exact isolation, KV-block
accounting and fail-closed, observed on the runner's own latents and block pool.

Loads the tiny LingBot-World model once for the module (about 20 s on CPU).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import InvalidTick
from ardiff.worker.settings import WorkerSettings

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
    return adapter.forward(adapter.prepare(tick, CONDITIONING[session]), inject_fault=fault)


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
        adapter.prepare(tick, CONDITIONING["a"])
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
