"""The fake runtime's DreamZero mode (control-plane tests of DreamZero pools): actions out, deterministic, two
KV branches per session, exported and imported with the cached actions in the book."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from ardiff.worker.conditioning import Conditioning
from ardiff.worker.fake_runtime import FakeRuntime
from ardiff.worker.families import dreamzero
from ardiff.worker.runtime import run_tick
from ardiff.worker.server import load_runtime
from ardiff.worker.session_book import CachedChunk, SessionBook
from ardiff.worker.settings import WorkerSettings


def robot_tick(session: str, chunk: int, seed: int, *, return_frames: bool = False):
    rng = np.random.default_rng(seed)
    images = {
        camera: {"encoding": "raw", "shape": [32, 32, 3], "data": ""}
        for camera in ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
    }
    for image in images.values():
        image["data"] = base64.b64encode(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8).tobytes()).decode()
    body = {
        "request_id": f"{session}-{chunk}",
        "chunk_index": chunk,
        "return_frames": return_frames,
        "observation": {
            "images": images,
            "joint_position": [0.1] * 7,
            "cartesian_position": [0.0] * 6,
            "gripper_position": [seed / 10],
        },
    }
    return dreamzero.decode_tick(dreamzero.parse_tick(session, body))


def forward(runtime: FakeRuntime, tick, seed: int = 1):
    return run_tick(runtime, runtime.ticks.prepare(tick, Conditioning(prompt="stack the cups", seed=seed)))


def test_a_dreamzero_pool_gets_the_robot_mode() -> None:
    settings = WorkerSettings(pipeline="DreamZeroPipeline", model="tiny-dreamzero", runtime="fake")
    runtime = load_runtime(settings)
    assert runtime.supports_export is True
    assert runtime.identity["family"] == "dreamzero"
    assert "family" not in load_runtime(WorkerSettings(runtime="fake")).identity
    with pytest.raises(ValueError, match="fake runtime family must be one of"):
        FakeRuntime(height=64, width=64, capacity=1, family="sora")


def test_actions_are_deterministic_and_two_branches_hold_blocks() -> None:
    runtime = FakeRuntime(height=64, width=64, capacity=2, family="dreamzero")
    lingbot = FakeRuntime(height=64, width=64, capacity=2)
    assert runtime.kv_blocks().total == 2 * lingbot.kv_blocks().total
    first = forward(runtime, robot_tick("a", 0, seed=3))
    assert first.actions is not None
    assert (first.actions.shape, first.actions.dtype, first.frames.shape[0]) == ((24, 8), np.float32, 0)
    twin = forward(runtime, robot_tick("b", 0, seed=3))
    assert np.array_equal(first.actions, twin.actions)  # same seed, prompt, chunk and observation
    other = forward(runtime, robot_tick("b", 1, seed=4, return_frames=True))
    assert not np.array_equal(other.actions, first.actions)
    assert other.frames.shape == (12, 64, 64, 3)
    blocks = runtime.kv_blocks()
    assert blocks.total - blocks.free == 2 * (3 + 6)  # two branches of a's 3 and b's 6 blocks
    runtime.close("a")
    runtime.close("b")
    assert runtime.kv_blocks().free == runtime.kv_blocks().total


def test_a_session_moves_with_its_cached_actions_and_continues_as_its_twin() -> None:
    """Before: the fake's DreamZero sessions refused to export (reset-on-evict), and a book's cached actions
    had no place in the export (bytes in its JSON header)."""
    source = FakeRuntime(height=64, width=64, capacity=2, family="dreamzero")
    target = FakeRuntime(height=64, width=64, capacity=2, family="dreamzero")
    first = forward(source, robot_tick("a", 0, seed=3))
    book = SessionBook("a").advanced(CachedChunk("a-0", 0, first.frames, first.metadata, first.actions))
    out = io.BytesIO()
    source.export_session("a", out, book=book)
    moved = target.import_session(io.BytesIO(out.getvalue()))
    assert moved.to_dict() == book.to_dict()
    assert np.array_equal(moved.retry_of("a-0", 0).actions, first.actions)
    assert moved.last_chunk.frames.shape == (0, 64, 64, 3)
    twin = [forward(source, robot_tick("b", chunk, seed=3)).actions for chunk in range(2)]
    assert np.array_equal(forward(target, robot_tick("a", 1, seed=3)).actions, twin[1])
