"""The production path on a CUDA device: vllm-omni's own platform (no CPU shims), bf16, the tiny checkpoint
built by the tiny-config factory. Deselected on CPU (`-m 'not gpu'`); run with `pytest -m gpu tests/worker`.
"""

from __future__ import annotations

import pytest

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.runtime import run_tick
from ardiff.worker.settings import WorkerSettings

pytestmark = pytest.mark.gpu

CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]},
}


def test_tiny_model_ticks_on_the_gpu_in_bf16_and_frees_its_blocks(tiny_model_cache):
    import torch

    from ardiff.worker import cpu_platform
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    assert torch.cuda.is_available()
    runtime = load_vllm_runtime(WorkerSettings(model_cache=str(tiny_model_cache), kv_memory_fraction=0.2))
    try:
        assert not cpu_platform.needs_cpu_platform()
        assert runtime.capacity == 2
        empty = runtime.kv_blocks()
        latents = {}
        for session in ("a", "b"):
            for chunk in range(3):
                tick = tick_rules.parse_tick(
                    session, {"request_id": f"{session}{chunk}", "chunk_index": chunk, "controls": [CAMERA]}
                )
                output = run_tick(
                    runtime, runtime.ticks.prepare(tick, Conditioning(seed=3, prompt="a forest"))
                )
                assert output.frames.shape == ((9 if chunk == 0 else 12), 64, 64, 3)
                assert output.latents.dtype == torch.bfloat16
                latents[session, chunk] = output.latents.float().cpu()
        # same seed, prompt and controls: two sessions produce the same rollout, independently (GPU kernels
        # need not be bit-exact, so within bf16 tolerance)
        assert all(torch.allclose(latents["a", c], latents["b", c], atol=2e-2) for c in range(3))
        for session in ("a", "b"):
            runtime.close(session)
        assert runtime.kv_blocks() == empty
    finally:
        runtime.shutdown()
