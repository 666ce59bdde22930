"""What conditions a session: its seed, its prompt and its first image, all from the session record.

The image arrives as PNG/JPEG bytes (≤ 1 MiB, resolved by the operator from the CR) and is decoded once per
session on a pod (`SessionPictures`); a session without one gets a deterministic image derived from its seed,
so a rollout is reproducible from the record alone.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import PIL.Image

from ardiff.worker.errors import InvalidTick

# A decoded image larger than this is refused before it is resized (LingBot's own source-image bound).
MAX_SOURCE_PIXELS = 4096 * 4096


@dataclass(frozen=True)
class Conditioning:
    """The inputs of one tick that come from the session record (the prompt may be overridden per tick):
    its seed, its prompt and its first picture at the tick resolution (`conditioning_image` of the record's
    image; None: the seed's own, `seed_image`)."""

    seed: int
    prompt: str
    picture: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"conditioning seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError(f"conditioning prompt must contain non-empty text, got {self.prompt!r}")
        picture = self.picture
        if picture is not None and (picture.dtype != np.uint8 or picture.ndim != 3 or picture.shape[2] != 3):
            raise ValueError(f"conditioning picture must be uint8 HxWx3, got {picture.dtype} {picture.shape}")

    def picture_at(self, height: int, width: int) -> np.ndarray:
        """The first picture as uint8 `height x width x 3` (the tick resolution)."""
        if self.picture is None:
            return seed_image(self.seed, height, width)
        if self.picture.shape[:2] != (height, width):
            raise ValueError(f"conditioning picture is {self.picture.shape[:2]}, the ticks {(height, width)}")
        return self.picture


class SessionPictures:
    """Each session's first picture, read from the store and decoded once per session on this pod (the
    record's image is up to 1 MiB of PNG/JPEG), not on every tick. `PodSessions` keeps one for each session
    it admitted (so at most its capacity) and drops it whenever the session is released: a session placed
    here again reads its record's image again."""

    def __init__(self) -> None:
        self._pictures: dict[str, tuple[int, np.ndarray]] = {}  # session -> (seed, picture)

    def get(self, session_id: str, seed: int) -> np.ndarray | None:
        kept = self._pictures.get(session_id)
        return kept[1] if kept is not None and kept[0] == seed else None

    def keep(self, session_id: str, seed: int, picture: np.ndarray) -> None:
        self._pictures[session_id] = (seed, picture)

    def drop(self, session_id: str) -> None:
        self._pictures.pop(session_id, None)


def seed_image(seed: int, height: int, width: int) -> np.ndarray:
    """A deterministic uint8 HxWx3 picture for `seed`: smooth colour gradients plus a little texture."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fy, fx, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
        channels.append(np.sin(2 * np.pi * (fy * ys / height + fx * xs / width) + phase))
    picture = (np.stack(channels, axis=-1) + 1.0) * 110.0 + rng.uniform(0, 35, size=(height, width, 3))
    return np.clip(picture, 0, 255).astype(np.uint8)


def conditioning_image(image: bytes, seed: int, height: int, width: int) -> np.ndarray:
    """The session's first image as uint8 HxWx3 at the tick resolution; `InvalidTick` if it cannot be read."""
    if not image:
        return seed_image(seed, height, width)
    try:
        with PIL.Image.open(io.BytesIO(image)) as source:
            if source.width * source.height > MAX_SOURCE_PIXELS:
                raise ValueError("too many pixels")
            picture = source.convert("RGB").resize((width, height), PIL.Image.Resampling.BICUBIC)
    except (OSError, ValueError, PIL.Image.DecompressionBombError):
        raise InvalidTick(
            f"the session's image must be a PNG or JPEG of at most {MAX_SOURCE_PIXELS} pixels", param="image"
        ) from None
    return np.asarray(picture, dtype=np.uint8)
