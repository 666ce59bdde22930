"""LingBot-World camera controls: `camera(...)` for the keys held in each latent frame of one tick,
`hold(keys)` for the same keys all tick, and a short demo tour."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

LINGBOT_CAMERA_SCHEMA = "lingbot.camera_actions.v1"
LINGBOT_CAMERA_KEYS = frozenset("wasdijkl")  # W/A/S/D move, I/J/K/L look
LINGBOT_FRAMES_PER_CHUNK = 3  # key states per tick: one per latent frame of an AR block


def camera(*frames: str | Iterable[str]) -> dict[str, Any]:
    """One tick's LingBot-World camera control: the keys held in each latent frame.

    `camera("w", "w", "wj")`: forward, forward, forward while turning left. Each frame is a string of keys
    or a list of keys; `""` holds nothing. Keys: W/A/S/D move, I/J/K/L look (up/left/down/right).
    """
    states = [
        sorted(set(keys.lower() if isinstance(keys, str) else (k.lower() for k in keys))) for keys in frames
    ]
    if len(states) != LINGBOT_FRAMES_PER_CHUNK:
        raise ValueError(
            f"camera frames must hold {LINGBOT_FRAMES_PER_CHUNK} key states (one per latent frame), "
            f"got {len(states)}"
        )
    unknown = sorted({k for keys in states for k in keys} - LINGBOT_CAMERA_KEYS)
    if unknown:
        raise ValueError(f"camera keys must be among {''.join(sorted(LINGBOT_CAMERA_KEYS))}, got {unknown}")
    return {"track": "camera", "schema": LINGBOT_CAMERA_SCHEMA, "data": {"mode": "frames", "frames": states}}


def hold(keys: str) -> dict[str, Any]:
    """A camera control holding the same keys for the whole tick (`hold("w")`: walk forward)."""
    return camera(*[keys] * LINGBOT_FRAMES_PER_CHUNK)


# A short walk for demos: forward, look around, strafe.
CAMERA_TOUR: tuple[dict[str, Any], ...] = (
    hold("w"),
    camera("w", "wj", "wj"),
    hold("j"),
    camera("w", "w", "wl"),
    hold("d"),
    camera("wl", "wl", "w"),
    hold("i"),
    camera("s", "s", ""),
)
