"""Frames on the wire: raw uint8 FxHxWx3 (default) or an H.264 MP4, chosen by the `Accept` header."""

from __future__ import annotations

import io
from typing import Literal

import av
import numpy as np

from ardiff.wire import MP4, OCTET_STREAM, parse_accept

RAW = OCTET_STREAM

MediaType = Literal["application/octet-stream", "video/mp4"]
FPS = 16  # LingBot-World's frame rate


def choose_media_type(accept: str | None) -> MediaType:
    """MP4 when `Accept` prefers `video/mp4`; raw frames otherwise (also for types we don't offer)."""
    if not accept:
        return RAW
    for quality, media in sorted(parse_accept(accept), key=lambda item: -item[0]):
        if quality <= 0:
            continue
        if media == MP4:
            return MP4
        if media in (RAW, "application/*", "*/*"):
            return RAW
    return RAW


def encode_mp4(frames: np.ndarray, fps: int = FPS) -> bytes:
    """H.264 (yuv420p) in an MP4 container; H and W are multiples of 16, so yuv420p needs no padding."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "18"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def encode_frames(frames: np.ndarray, media_type: MediaType) -> bytes:
    if media_type == MP4:
        return encode_mp4(frames)
    return np.ascontiguousarray(frames).tobytes()


# The stream sends one image per frame (a browser draws each on a canvas without a video decoder).
FrameFormat = Literal["jpeg", "webp"]
FRAME_FORMATS: dict[str, str] = {"jpeg": "image/jpeg", "webp": "image/webp"}
IMAGE_QUALITY = 90


def encode_images(frames: np.ndarray, frame_format: FrameFormat) -> list[bytes]:
    """Each frame of `FxHxWx3` uint8 as one JPEG or WebP image."""
    from PIL import Image  # the worker's dependency; the client's MP4 path must not need it

    images = []
    for frame in frames:
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format=frame_format.upper(), quality=IMAGE_QUALITY)
        images.append(buffer.getvalue())
    return images
