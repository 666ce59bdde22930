"""LingBot-World (`LingBotWorldCausalDMDPipeline`): camera controls in, frames out; one KV branch.

A tick is vllm-omni's `ARDiffusionTickRequest` (controls: one `camera` track); the conditioning image and the
seed come from the session record; the chunk's latents are decoded by the session's own streaming VAE decoder
into uint8 `F x H x W x 3` frames, answered raw or as MP4. Its sessions export (contracts §9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from ardiff.model_families import pipelines_of
from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.encoding import RAW, encode_frames
from ardiff.worker.encoding import choose_media_type as _choose_media_type
from ardiff.worker.errors import InvalidTick
from ardiff.worker.messages import TickBody
from ardiff.worker.runtime import ChunkOutput, PreparedTick
from ardiff.worker.session_book import CachedChunk

if TYPE_CHECKING:
    from ardiff.worker.families import SessionState, TickGeometry

name = "lingbot"
pipelines = pipelines_of(name)  # ardiff/model_families.py: the operator reads it too
embedded_model = "tiny-lingbot-world"
tick_body = TickBody
max_body_bytes = 1 << 20  # a tick is a few hundred bytes (a camera trajectory a few KB)
default_dtype = None
cpu_float32_modules = ()  # float32 throughout on CPU already
frame_size = None  # the pipeline's configured height and width


def checkpoint_ok(model_dir: Path) -> bool:
    """A diffusers-style directory (`model_index.json`, `transformer/`, `vae/`, ...)."""
    return (model_dir / "model_index.json").is_file()


def ensure_tiny_model(cache_dir: str | Path, *, seed: int = 0) -> Path:
    from ardiff.worker.tiny.model import ensure_tiny_model as ensure

    return ensure(cache_dir, seed=seed)


def write_tiny_model(directory: str | Path, *, seed: int = 0) -> Path:
    from ardiff.worker.tiny.model import write_tiny_model as write

    return write(directory, seed=seed)


def od_config_extras(settings: Any, model_dir: Path) -> dict[str, Any]:
    return {}


@contextlib.contextmanager
def loading(model_dir: Path) -> Iterator[None]:
    """While the pipeline is built: a checkpoint marked tiny is built by the real DiT class (any device)."""
    from ardiff.worker.tiny.model import install_tiny_transformer_factory

    install_tiny_transformer_factory()
    yield


def check_pipeline(pipeline: Any) -> None:
    """A LingBot pipeline decodes each session's chunks with its own streaming VAE decoder."""
    if not callable(getattr(pipeline, "_decode_chunk_to_pixels", None)):
        raise TypeError(f"{type(pipeline).__name__} has no per-session streaming decoder")


def session_state() -> SessionState:
    """LingBot-World's sessions export (contracts §9): `_ar_sessions` and the streaming decoder's cache."""
    from ardiff.worker.families import lingbot_state

    return lingbot_state


def parse_tick(session_id: str, body: Mapping[str, Any] | BaseModel) -> Any:
    return tick_rules.parse_tick(session_id, body)


def decode_tick(tick: Any) -> Any:
    """Nothing left to decode: a LingBot tick's controls are read by `parse_tick`."""
    return tick


def bind(pipeline: Any, od_config: Any, geometry: TickGeometry) -> LingBotTicks:
    from vllm_omni.diffusion.registry import get_diffusion_pre_process_func

    return LingBotTicks(pipeline, geometry, get_diffusion_pre_process_func(od_config))


@dataclasses.dataclass(frozen=True)
class LingBotTicks:
    """LingBot's ticks on one loaded pipeline (`FamilyRunner`): its pre-process builds the request, the
    session's own streaming VAE decoder decodes the chunk."""

    pipeline: Any
    geometry: TickGeometry
    pre_process: Callable[[Any], Any] | None  # the pipeline's own (`get_diffusion_pre_process_func`), if any

    def prepare(self, tick: Any, conditioning: Conditioning) -> PreparedTick:
        """The engine request of a tick, through LingBot's own pre-process; `InvalidTick` names the field.

        `close_session` is taken off the runner's tick and applied after the frames are decoded: the runner
        would close (and drop the streaming decoder) before they are."""
        from vllm_omni.diffusion.request import OmniDiffusionRequest
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        height, width = self.geometry.frame_size
        image = conditioning.picture_at(height, width)
        runner_tick = dataclasses.replace(tick, prompt=conditioning.prompt, close_session=False)
        sampling = OmniDiffusionSamplingParams(
            height=height,
            width=width,
            num_frames=self.geometry.frames_per_tick,
            output_type="latent",  # the tick path returns latents; decoded by the session's decoder
            seed=conditioning.seed,
            extra_args=runner_tick.to_extra_args(),
        )
        import PIL.Image

        request = OmniDiffusionRequest(
            prompt={"prompt": conditioning.prompt, "multi_modal_data": {"image": PIL.Image.fromarray(image)}},
            sampling_params=sampling,
            request_id=tick.request_id,
        )
        try:
            if self.pre_process is not None:
                request = self.pre_process(request)
            self._check_camera_geometry(request)
        except ValueError as exc:
            raise InvalidTick(str(exc), param=tick_rules.param_for(str(exc), "controls")) from None
        return PreparedTick(tick.session_id, request, close_after=tick.close_session)

    def _check_camera_geometry(self, request: Any) -> None:
        """What LingBot checks only inside its forward: a trajectory covers the tick's frames and yields a
        valid camera embedding. Run here with the pipeline's own camera functions, so a malformed control is a
        400 and never fails a forward (which would close the session). The trajectory is the one LingBot's
        pre-process left in the request's extra args (under a private key)."""
        import torch
        from vllm_omni.diffusion.models.lingbot_world.camera import (
            CameraTrajectory,
            build_plucker_embedding,
            interpolate_camera_trajectory,
        )
        from vllm_omni.diffusion.models.lingbot_world.pipeline import _PREPROCESSED_CAMERA_KEY

        trajectory = request.sampling_params.extra_args.get(_PREPROCESSED_CAMERA_KEY)
        if trajectory is None:
            return
        frames, needed = int(trajectory.poses.shape[0]), self.geometry.frames_per_tick
        if frames < needed:
            raise ValueError(f"camera trajectory needs at least {needed} frames per tick, got {frames}.")
        clipped = CameraTrajectory(poses=trajectory.poses[:needed], intrinsics=trajectory.intrinsics[:needed])
        height, width = self.geometry.frame_size
        build_plucker_embedding(
            interpolate_camera_trajectory(clipped, self.geometry.latent_frames_per_tick),
            height=height,
            width=width,
            target_height=height,
            target_width=width,
            device=torch.device("cpu"),
            dtype=torch.float32,
        )

    def decode(self, prepared: PreparedTick, output: Any, forward_s: float) -> ChunkOutput:
        """The chunk's latents decoded by the session's own streaming VAE decoder (the pipeline's
        `_decode_chunk_to_pixels`: uint8 F,H,W,3)."""
        import torch

        latents = output.output["payload"]["latents"]
        metadata = dict(output.output["metadata"]["ar_diffusion"])
        started = time.perf_counter()
        with torch.inference_mode():
            frames = self.pipeline._decode_chunk_to_pixels(latents, session_id=prepared.session_id)
        return ChunkOutput(
            frames=np.ascontiguousarray(frames),
            metadata={**metadata, "applied_event_ids": list(metadata["applied_event_ids"])},
            forward_s=forward_s,
            decode_s=time.perf_counter() - started,
            latents=latents,
        )


def choose_media_type(accept: str | None) -> str:
    return _choose_media_type(accept)


def encode(chunk: CachedChunk, media_type: str) -> tuple[bytes, dict[str, str]]:
    """Frames raw (uint8 F,H,W,3) or as MP4, the shape in `ardiff-frame-shape`."""
    body = encode_frames(chunk.frames, media_type if media_type != RAW else RAW)  # type: ignore[arg-type]
    return body, {"ardiff-frame-shape": ",".join(str(n) for n in chunk.frames.shape)}
