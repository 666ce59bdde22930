"""The session adapter: the one module that touches the runner's and the pipeline's per-session state.

vllm-omni's `ARDiffusionModelRunner` owns each session's paged KV (created lazily at its first tick,
released on reset, close, failed forward or silent LRU eviction); LingBot-World's pipeline owns the rest
(chunk counter, RNG state, camera tail, encoder cache, the per-session streaming VAE decoder). Everything
the worker needs from either (run a tick, decode its frames, reset, close, list residents, count free KV
blocks) goes through `ARDiffusionSessionAdapter`, so suspend/resume/migrate (DESIGN §10) has one place to
export and import from.

It implements `ardiff.worker.runtime.SessionRuntime`. Private vllm-omni members used here, on purpose and
nowhere else: `runner._sessions`, `runner._session_capacity`, `runner._ar_diffusion_kv_cache_spec`,
`pipeline._decode_chunk_to_pixels` (the streaming decoder), and LingBot's pre-processed camera key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import torch
import vllm_omni.diffusion.models.lingbot_world.pipeline as lingbot_pipeline
from vllm_omni.diffusion.data import OmniDiffusionConfig
from vllm_omni.diffusion.models.lingbot_world.camera import (
    CameraTrajectory,
    build_plucker_embedding,
    interpolate_camera_trajectory,
)
from vllm_omni.diffusion.registry import get_diffusion_pre_process_func
from vllm_omni.diffusion.request import OmniDiffusionRequest
from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker
from vllm_omni.inputs.data import OmniDiffusionSamplingParams

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning, conditioning_image
from ardiff.worker.errors import InvalidTick
from ardiff.worker.runtime import ChunkOutput, KVBlocks, PreparedTick

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerTick:
    """What `forward` runs: the pre-processed engine request, and whether to close the session after it.

    `close_session` is taken off the runner's tick and applied here after the frames are decoded: the runner
    would close (and drop the streaming decoder) before the adapter decodes.
    """

    request: OmniDiffusionRequest
    close_after: bool


class ARDiffusionSessionAdapter:
    def __init__(self, worker: DiffusionWorker, od_config: OmniDiffusionConfig) -> None:
        runner = worker.model_runner
        pipeline = runner.pipeline if runner is not None else None
        spec = getattr(runner, "_ar_diffusion_kv_cache_spec", None)
        if runner is None or runner.kv_cache is None or spec is None:
            raise TypeError("the worker's runner is not an ARDiffusionModelRunner with a KV cache")
        if not callable(getattr(pipeline, "_decode_chunk_to_pixels", None)):
            raise TypeError(f"{type(pipeline).__name__} has no per-session streaming decoder")
        self._worker = worker
        self._od_config = od_config
        self._runner = runner
        self._pipeline = pipeline
        self._pre_process = get_diffusion_pre_process_func(od_config)
        model_config = od_config.model_config
        self._height = int(model_config["ar_diffusion_height"])
        self._width = int(model_config["ar_diffusion_width"])
        # One request is one AR block: `frames_per_block` latent frames through the causal VAE's time factor.
        self._latent_frames = spec.frames_per_block
        self._num_frames = (spec.frames_per_block - 1) * int(pipeline.vae_scale_factor_temporal) + 1
        self._resident: tuple[str, ...] = ()
        log.info(
            "session adapter: %s capacity=%d kv_blocks=%d frames_per_tick=%d at %dx%d",
            type(pipeline).__name__,
            self.capacity,
            self.kv_blocks().total,
            self._num_frames,
            self._height,
            self._width,
        )

    # ---------------------------------------------------------------- SessionRuntime

    @property
    def capacity(self) -> int:
        return int(self._runner._session_capacity)

    @property
    def frame_size(self) -> tuple[int, int]:
        return self._height, self._width

    def prepare(self, tick: Any, conditioning: Conditioning) -> PreparedTick:
        image = conditioning_image(conditioning.image, conditioning.seed, self._height, self._width)
        runner_tick = dataclasses.replace(tick, prompt=conditioning.prompt, close_session=False)
        sampling = OmniDiffusionSamplingParams(
            height=self._height,
            width=self._width,
            num_frames=self._num_frames,
            output_type="latent",  # the tick path returns latents; decoded below by the session's decoder
            seed=conditioning.seed,
            extra_args=runner_tick.to_extra_args(),
        )
        request = OmniDiffusionRequest(
            prompt={"prompt": conditioning.prompt, "multi_modal_data": {"image": PIL.Image.fromarray(image)}},
            sampling_params=sampling,
            request_id=tick.request_id,
        )
        try:
            if self._pre_process is not None:
                request = self._pre_process(request)
            self._check_camera_geometry(request)
        except ValueError as exc:
            raise InvalidTick(str(exc), param=tick_rules.param_for(str(exc), "controls")) from None
        return PreparedTick(tick.session_id, RunnerTick(request, close_after=tick.close_session))

    def forward(self, prepared: PreparedTick, *, inject_fault: bool = False) -> ChunkOutput:
        session_id, runner_tick = prepared.session_id, prepared.request
        started = time.perf_counter()
        try:
            with self._failing_pipeline() if inject_fault else contextlib.nullcontext():
                output = self._worker.execute_model(runner_tick.request, self._od_config)
            if getattr(output, "error", None):
                raise RuntimeError(f"the runner reported: {output.error}")
            latents = output.output["payload"]["latents"]
            metadata = dict(output.output["metadata"]["ar_diffusion"])
            forwarded = time.perf_counter()
            with torch.inference_mode():
                frames = self._pipeline._decode_chunk_to_pixels(latents, session_id=session_id)
            decoded = time.perf_counter()
        except Exception:
            # The runner already released a failed forward's KV; a failed decode leaves it: close either way.
            self.close(session_id)
            raise
        if runner_tick.close_after:
            self.close(session_id)
        self._refresh()
        return ChunkOutput(
            frames=np.ascontiguousarray(frames),
            metadata={**metadata, "applied_event_ids": list(metadata["applied_event_ids"])},
            forward_s=forwarded - started,
            decode_s=decoded - forwarded,
            latents=latents,
        )

    def reset(self, session_id: str) -> None:
        self._runner.reset_session(session_id)
        self._refresh()

    def close(self, session_id: str) -> None:
        self._runner.close_session(session_id)
        self._refresh()

    def resident_sessions(self) -> tuple[str, ...]:
        return self._resident

    def kv_blocks(self) -> KVBlocks:
        cache = self._runner.kv_cache
        # Block 0 is vLLM's null block; the rest of the pool is what sessions draw from.
        return KVBlocks(free=cache.manager.block_pool.get_num_free_blocks(), total=cache.num_blocks - 1)

    def shutdown(self) -> None:
        self._worker.shutdown()

    # ---------------------------------------------------------------- helpers

    def _refresh(self) -> None:
        # A snapshot the event loop may read while the forward thread mutates the runner's dict.
        self._resident = tuple(self._runner._sessions)

    def _check_camera_geometry(self, request: OmniDiffusionRequest) -> None:
        """What LingBot checks only inside its forward: a trajectory covers the tick's frames and yields a
        valid camera embedding. Run here with the pipeline's own camera functions, so a malformed control is
        a 400 and never fails a forward (which would close the session)."""
        trajectory = request.sampling_params.extra_args.get(lingbot_pipeline._PREPROCESSED_CAMERA_KEY)
        if trajectory is None:
            return
        frames = int(trajectory.poses.shape[0])
        if frames < self._num_frames:
            raise ValueError(
                f"camera trajectory needs at least {self._num_frames} frames per tick, got {frames}."
            )
        clipped = CameraTrajectory(
            poses=trajectory.poses[: self._num_frames], intrinsics=trajectory.intrinsics[: self._num_frames]
        )
        build_plucker_embedding(
            interpolate_camera_trajectory(clipped, self._latent_frames),
            height=self._height,
            width=self._width,
            target_height=self._height,
            target_width=self._width,
            device=torch.device("cpu"),
            dtype=torch.float32,
        )

    @contextlib.contextmanager
    def _failing_pipeline(self) -> Iterator[None]:
        """Test-only (ARDIFF_TEST_FAULTS): the pipeline's forward raises inside the runner's bound session."""

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected forward fault (ARDIFF_TEST_FAULTS)")

        self._pipeline.forward = fail
        try:
            yield
        finally:
            del self._pipeline.forward
