"""DreamZero (`DreamZeroPipeline`): robot observations in, an action chunk (and predicted frames) out.

Two KV branches per session (positive and negative, for classifier-free guidance), text and image
cross-attention, model-owned state (`DreamZeroState`: frame buffer, VAE encoder stream, prompt embeddings).
A tick carries vllm-omni's tick fields and an observation: three cameras (PNG/JPEG or raw uint8 with a shape)
and the joint (7), cartesian (6) and gripper (1) vectors; each is checked before anything is queued, and a
bad one is a 400 naming the field. The pipeline reads `session_id` and `robot_obs` from the request's extra
args; its roboarena transform stitches the cameras. The answer is the action chunk (`action_horizon x 8`
float32: 7 joints and the gripper) as JSON or raw float32, and on request the chunk's predicted frames,
decoded from its latents. Its sessions export like LingBot's: both KV branches, their cross-attention and the
pipeline's own state (`dreamzero_state`), so they suspend, migrate and fork.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import io
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from ardiff.model_families import pipelines_of
from ardiff.wire import JSON, OCTET_STREAM, parse_accept
from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import InvalidTick
from ardiff.worker.messages import CAMERAS, RobotTickBody
from ardiff.worker.runtime import ChunkOutput, PreparedTick
from ardiff.worker.session_book import CachedChunk

if TYPE_CHECKING:
    from ardiff.worker.families import SessionState, TickGeometry

name = "dreamzero"
pipelines = pipelines_of(name)  # ardiff/model_families.py: the operator reads it too
embedded_model = "tiny-dreamzero"
tick_body = RobotTickBody
max_body_bytes = 4 << 20  # three raw 180x320 cameras in base64 are ~0.7 MB
default_dtype = "bfloat16"  # the pipeline casts to bfloat16 throughout; CPU runs it in bfloat16 too
cpu_float32_modules = ("vae",)  # but its VAE: a bfloat16 Conv3d takes minutes on a CPU
EMBODIMENT = "roboarena"
# What an openpi client is told on connect (vllm-omni's deploy config for DreamZero-DROID).
POLICY_SERVER_CONFIG: dict[str, Any] = {
    "image_resolution": [180, 320],
    "n_external_cameras": 2,
    "needs_wrist_camera": True,
    "needs_stereo_camera": False,
    "needs_session_id": True,
    "action_space": "joint_position",
}
# The stitched canvas of three 176x320 views (roboarena/DROID transform): the predicted frames' size.
FRAME_SIZE = (352, 640)
frame_size = FRAME_SIZE
MAX_FRAMES_PER_CAMERA = 4  # DreamZero keeps the last 4 stitched frames
MIN_SIDE, MAX_SIDE = 32, 1024
RAW = OCTET_STREAM


def checkpoint_ok(model_dir: Path) -> bool:
    """DreamZero's layout: a root `config.json` with `action_head_cfg` (+ `action_head.*` safetensors)."""
    from ardiff.worker.tiny.dreamzero import is_dreamzero_checkpoint

    return is_dreamzero_checkpoint(model_dir)


def ensure_tiny_model(cache_dir: str | Path, *, seed: int = 0) -> Path:
    from ardiff.worker.tiny.dreamzero import ensure_tiny_dreamzero

    return ensure_tiny_dreamzero(cache_dir, seed=seed)


def write_tiny_model(directory: str | Path, *, seed: int = 0) -> Path:
    from ardiff.worker.tiny.dreamzero import write_tiny_dreamzero

    return write_tiny_dreamzero(directory, seed=seed)


def od_config_extras(settings: Any, model_dir: Path) -> dict[str, Any]:
    """The tokenizer from the checkpoint when it ships one; the robot transform and the openpi handshake;
    a tiny checkpoint's inference settings (fewer denoising steps)."""
    from ardiff.worker.tiny.dreamzero import tiny_settings

    model_config: dict[str, Any] = {
        "default_robot_embodiment": EMBODIMENT,
        "policy_server_config": dict(POLICY_SERVER_CONFIG),
    }
    tiny = tiny_settings(model_dir)
    if tiny is not None:
        model_config.update(tiny.get("inference", {}))
    extras: dict[str, Any] = {"model_config": model_config}
    if (model_dir / "tokenizer").is_dir():
        extras["model_paths"] = {"tokenizer": str(model_dir / "tokenizer")}
    return extras


@contextlib.contextmanager
def loading(model_dir: Path) -> Iterator[None]:
    """While the pipeline is built: a tiny checkpoint's encoders take its tiny sizes."""
    from ardiff.worker.tiny.dreamzero import tiny_encoders

    with tiny_encoders(model_dir):
        yield


def check_pipeline(pipeline: Any) -> None:
    """Nothing to check: DreamZero's pipeline decodes a chunk's predicted frames with its own VAE."""


def session_state() -> SessionState:
    """The pipeline's `DreamZeroState` of a session in an export (its own heavy module)."""
    from ardiff.worker.families import dreamzero_state

    return dreamzero_state


# ------------------------------------------------------------------------------------------ ticks


@dataclasses.dataclass(frozen=True)
class RobotTick:
    """vllm-omni's tick with the observation: the vectors checked, the cameras as sent (`images`) until
    `decode_tick` has read them into `robot_obs` (what `prepare` turns into the pipeline's `robot_obs`)."""

    tick: Any
    robot_obs: dict[str, Any]
    return_frames: bool
    images: dict[str, Any] = dataclasses.field(default_factory=dict)  # empty once decoded

    def __getattr__(self, item: str) -> Any:  # session_id, request_id, chunk_index, reset, prompt, ...
        return getattr(self.tick, item)


def parse_tick(session_id: str, body: Mapping[str, Any] | BaseModel) -> RobotTick:
    """vllm-omni's tick rules, then the observation's cheap part: all three cameras present, the vectors.
    No picture is read here: the worker decodes them (`decode_tick`) once the tick passed its checks. A
    validated `RobotTickBody` (HTTP) is read as it is (its fields, `vars`), an OpenPI mapping by key."""
    tick = tick_rules.parse_tick(session_id, body)
    fields = tick_rules.fields_of(body)
    observation = fields.get("observation")
    if isinstance(observation, BaseModel):
        observation = vars(observation)
    if not isinstance(observation, dict):
        raise InvalidTick("observation is required", param="observation")
    images = observation.get("images") or {}
    missing = [camera for camera in CAMERAS if camera not in images]
    if missing:
        raise InvalidTick(
            f"observation.images lacks camera(s) {missing}", param=f"observation.images.{missing[0]}"
        )
    robot_obs: dict[str, Any] = {}
    for field, size in (("joint_position", 7), ("cartesian_position", 6), ("gripper_position", 1)):
        robot_obs[f"observation/{field}"] = vector(observation.get(field), field, size)
    cameras = {camera: images[camera] for camera in CAMERAS}
    return RobotTick(tick, robot_obs, bool(fields.get("return_frames", False)), cameras)


def decode_tick(tick: RobotTick) -> RobotTick:
    """The tick with its cameras decoded (PNG/JPEG/raw, up to 3 x 1024x1024 pixels: the dear part, run off the
    event loop), every camera of one shape."""
    pixels = {camera: decode_image(camera, image) for camera, image in tick.images.items()}
    shapes = {camera: array.shape for camera, array in pixels.items()}
    if len(set(shapes.values())) != 1:
        camera = next(c for c in CAMERAS if shapes[c] != shapes[CAMERAS[0]])
        raise InvalidTick(
            f"every camera must have one shape; {CAMERAS[0]} is {list(shapes[CAMERAS[0]])}, "
            f"{camera} is {list(shapes[camera])}",
            param=f"observation.images.{camera}.shape",
        )
    robot_obs = {**{f"observation/{camera}": array for camera, array in pixels.items()}, **tick.robot_obs}
    return dataclasses.replace(tick, robot_obs=robot_obs, images={})


def decode_image(camera: str, image: dict[str, Any]) -> np.ndarray:
    """A camera's uint8 `(H, W, 3)` or `(T, H, W, 3)` pixels; `InvalidTick` names what is wrong. An array
    (the openpi WebSocket's msgpack-numpy) is checked like raw pixels."""
    param = f"observation.images.{camera}"
    if isinstance(image, BaseModel):  # a validated `CameraImage`: its fields as they are
        image = vars(image)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise InvalidTick(f"{param} must be uint8, got {image.dtype}", param=f"{param}.dtype")
        return _checked_pixels(param, image)
    try:
        data = base64.b64decode(image.get("data", ""), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidTick(f"{param}.data must be base64", param=f"{param}.data") from None
    encoding = image.get("encoding")
    if encoding == "raw":
        shape = image.get("shape")
        if not shape:
            raise InvalidTick(f"{param}.shape is required for raw pixels", param=f"{param}.shape")
        if image.get("dtype", "uint8") != "uint8":
            raise InvalidTick(f"{param}.dtype must be uint8", param=f"{param}.dtype")
        expected = int(np.prod(shape))
        if len(data) != expected:
            raise InvalidTick(
                f"{param}: shape {list(shape)} needs {expected} bytes of uint8, got {len(data)}",
                param=f"{param}.shape",
            )
        array = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    else:
        if image.get("shape") is not None:
            raise InvalidTick(f"{param}.shape is for raw pixels only", param=f"{param}.shape")
        import PIL.Image

        try:
            with PIL.Image.open(io.BytesIO(data)) as picture:
                if picture.format != encoding.upper():
                    raise ValueError(picture.format)
                if picture.width * picture.height > MAX_SIDE * MAX_SIDE:
                    raise ValueError("too large")
                array = np.asarray(picture.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError, PIL.Image.DecompressionBombError):
            raise InvalidTick(
                f"{param}.data is not a readable {encoding.upper()}", param=f"{param}.data"
            ) from None
    return _checked_pixels(param, array)


def _checked_pixels(param: str, array: np.ndarray) -> np.ndarray:
    if array.ndim not in (3, 4) or array.shape[-1] != 3:
        raise InvalidTick(
            f"{param} must be [H, W, 3] or [T, H, W, 3], got {list(array.shape)}", param=f"{param}.shape"
        )
    height, width = array.shape[-3:-1]
    if array.ndim == 4 and not 1 <= array.shape[0] <= MAX_FRAMES_PER_CAMERA:
        raise InvalidTick(
            f"{param} holds 1 to {MAX_FRAMES_PER_CAMERA} frames, got {array.shape[0]}", param=f"{param}.shape"
        )
    if not (MIN_SIDE <= height <= MAX_SIDE and MIN_SIDE <= width <= MAX_SIDE):
        raise InvalidTick(
            f"{param} sides must be in [{MIN_SIDE}, {MAX_SIDE}], got {height}x{width}", param=f"{param}.shape"
        )
    return np.ascontiguousarray(array)


def vector(value: Any, field: str, size: int) -> np.ndarray:
    """`size` finite numbers as float32; the length (and an array's dtype) is checked before any conversion,
    so nothing is allocated for what could never fit."""
    param = f"observation.{field}"
    if isinstance(value, np.ndarray):
        fits = value.dtype.kind in "biuf" and value.size == size
    else:
        fits = isinstance(value, list) and len(value) == size
    try:
        array = np.asarray(value, dtype=np.float64).reshape(-1) if fits else None
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is None or array.shape != (size,) or not np.all(np.isfinite(array)):
        raise InvalidTick(f"{param} must be {size} finite numbers", param=param)
    return array.astype(np.float32)


def bind(pipeline: Any, od_config: Any, geometry: TickGeometry) -> DreamZeroTicks:
    """DreamZero's requests need no pre-process: its pipeline reads the observation from the extra args."""
    return DreamZeroTicks(pipeline, geometry)


@dataclasses.dataclass(frozen=True)
class DreamZeroTicks:
    """DreamZero's ticks on one loaded pipeline (`FamilyRunner`): the observation goes in the request's extra
    args; a chunk is its actions, and its predicted frames decoded by the pipeline's VAE when asked."""

    pipeline: Any
    geometry: TickGeometry

    def prepare(self, tick: RobotTick, conditioning: Conditioning) -> PreparedTick:
        """The engine request: the runner's tick plus `session_id` and `robot_obs` in the extra args."""
        from vllm_omni.diffusion.request import OmniDiffusionRequest
        from vllm_omni.inputs.data import OmniDiffusionSamplingParams

        runner_tick = dataclasses.replace(
            tick.tick, prompt=conditioning.prompt, controls=(), close_session=False
        )
        robot_obs = {**tick.robot_obs, "prompt": conditioning.prompt, "session_id": tick.session_id}
        extra_args = {**runner_tick.to_extra_args(), "session_id": tick.session_id, "robot_obs": robot_obs}
        request = OmniDiffusionRequest(
            prompt=conditioning.prompt,
            sampling_params=OmniDiffusionSamplingParams(seed=conditioning.seed, extra_args=extra_args),
            request_id=tick.request_id,
        )
        return PreparedTick(
            tick.session_id,
            request,
            close_after=tick.close_session,
            metadata=tick_rules.metadata_of(tick.tick),
            return_frames=tick.return_frames,
        )

    def decode(self, prepared: PreparedTick, output: Any, forward_s: float) -> ChunkOutput:
        import torch

        with torch.inference_mode():
            actions = np.ascontiguousarray(np.asarray(output.output["actions"], dtype=np.float32))
            started = time.perf_counter()
            if prepared.return_frames:
                frames = _predicted_frames(self.pipeline, output.output["video"])
            else:
                frames = np.zeros((0, *FRAME_SIZE, 3), dtype=np.uint8)
            decoded = time.perf_counter()
        return ChunkOutput(
            frames=frames,
            metadata=dict(prepared.metadata),
            forward_s=forward_s,
            decode_s=decoded - started,
            latents=output.output["video"],
            actions=actions,
        )


def _predicted_frames(pipeline: Any, video: Any) -> np.ndarray:
    """A chunk's predicted latents `(B, C, T, h, w)` decoded by the pipeline's VAE to uint8 `(T, H, W, 3)`."""
    import torch

    pixels = pipeline.decode_video_latents(video)  # (B, 3, T, H, W) in [-1, 1]
    frames = ((pixels[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return np.ascontiguousarray(frames.permute(1, 2, 3, 0).cpu().numpy())


def choose_media_type(accept: str | None) -> str:
    """JSON unless `Accept` prefers raw bytes (`application/octet-stream`)."""
    best, best_quality = JSON, 0.0
    for quality, media in parse_accept(accept):
        if media in (JSON, RAW) and quality > best_quality:
            best, best_quality = media, quality
    return best


def encode(chunk: CachedChunk, media_type: str) -> tuple[bytes, dict[str, str]]:
    """JSON `{actions, action_shape}`; or raw little-endian float32 actions followed by the uint8 frames,
    shapes in `ardiff-action-shape` and `ardiff-frame-shape`. Frames come only in the raw answer."""
    actions = chunk.actions if chunk.actions is not None else np.zeros((0, 0), dtype=np.float32)
    headers = {
        "ardiff-action-shape": ",".join(str(n) for n in actions.shape),
        "ardiff-action-dtype": "float32",
        "ardiff-frame-shape": ",".join(str(n) for n in chunk.frames.shape),
    }
    if media_type == RAW:
        body = actions.astype("<f4").tobytes() + np.ascontiguousarray(chunk.frames).tobytes()
        return body, headers
    if len(chunk.frames):
        raise InvalidTick(
            "predicted frames come in the raw answer (Accept: application/octet-stream), not in JSON",
            param="return_frames",
        )
    body = json.dumps({"actions": actions.tolist(), "action_shape": list(actions.shape)}).encode()
    return body, headers
