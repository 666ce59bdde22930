"""Frames: a tick's raw body as an `FxHxWx3` uint8 array, and frames written as an H.264 MP4 or a PNG strip
(PyAV and Pillow: the client extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ardiff.errors import ArdiffError


def decode_frames(body: bytes, shape_header: str) -> np.ndarray:
    """The raw body as `FxHxWx3` uint8, checked against `ardiff-frame-shape` (`F,H,W,3`)."""
    try:
        shape = tuple(int(n) for n in shape_header.split(","))
    except ValueError:
        raise ValueError(f"ardiff-frame-shape must be F,H,W,3, got {shape_header!r}") from None
    if len(shape) != 4 or shape[3] != 3 or min(shape) <= 0:
        raise ValueError(f"ardiff-frame-shape must be F,H,W,3 with positive sizes, got {shape_header!r}")
    expected = shape[0] * shape[1] * shape[2] * shape[3]
    if len(body) != expected:
        raise ValueError(f"a {shape_header} chunk has {expected} bytes, the body has {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def write_mp4(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], fps: int | None = None) -> Path:
    """Write `FxHxWx3` uint8 frames (or a sequence of chunks) as an H.264 MP4 (PyAV: the client extra)."""
    try:
        from ardiff.worker.encoding import FPS, encode_mp4
    except ImportError as exc:  # PyAV
        raise ArdiffError(f"writing MP4 needs PyAV ({exc}); pip install 'ardiff[client]'") from None
    video = np.concatenate(list(frames)) if not isinstance(frames, np.ndarray) else frames
    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8 or not len(video):
        raise ValueError(f"frames must be a non-empty FxHxWx3 uint8 array, got {video.dtype} {video.shape}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(encode_mp4(video, fps or FPS))
    return target


def write_strip(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], count: int = 8) -> Path:
    """Write `count` frames taken evenly from the video (or a sequence of chunks) side by side as one PNG:
    a look at a rollout without a video player."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ArdiffError(f"writing PNG needs Pillow ({exc}); pip install 'ardiff[client]'") from None
    video = np.concatenate(list(frames)) if not isinstance(frames, np.ndarray) else frames
    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8 or not len(video):
        raise ValueError(f"frames must be a non-empty FxHxWx3 uint8 array, got {video.dtype} {video.shape}")
    if count < 1:
        raise ValueError(f"strip count must be >= 1, got {count}")
    picks = np.linspace(0, len(video) - 1, num=min(count, len(video))).round().astype(int)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate(list(video[picks]), axis=1)).save(target, format="PNG")
    return target
