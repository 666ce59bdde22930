"""A yaw-only world for the trained tiny model: a numpy ray-caster seen from one fixed spot.

The camera stands still at a fixed start pose and only turns (`j` left, `l` right, or idle). Its poses come
from LingBot's own action integration (`integrate_lingbot_camera_actions`: 6 degrees of yaw per latent frame),
chained chunk by chunk through the tail pose as the pipeline does. Pixel frame 0 is the start pose; each later
latent frame gives 4 pixel frames, their yaw interpolated from the previous latent frame's, so a chunk of 3
latent frames is 9 pixel frames for chunk 0 and 12 after (the pipeline's own frame counts).

The renderer's focal length makes one latent frame of turning move the centre of the picture by 8 px, one
latent cell of the Wan VAE: a floor checkerboard, coloured striped pillars and a sky whose hue follows the
azimuth. Rendering is pure numpy and deterministic; only `latent_yaws` imports vllm-omni (lazily).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

HEIGHT = WIDTH = 64
YAW_STEP_DEGREES = 6.0  # LingBot's yaw per latent frame of `j`/`l`
# One latent frame of turning moves the picture's centre by one latent cell (8 px).
FOCAL_PX = 8.0 / math.tan(math.radians(YAW_STEP_DEGREES))
CAMERA_HEIGHT = 0.10  # the floor is this far below the eye
TILE = 0.12
FRAMES_PER_LATENT = 4
LATENT_FRAMES_PER_CHUNK = 3
KEYS = ((), ("j",), ("l",))  # idle, turn left, turn right
Actions = list[list[list[str]]]  # a session's keys per chunk and latent frame
PROMPT = "camera turning in the world"
# (azimuth degrees, distance, radius, rgb): azimuth 0 is straight ahead at the start, positive to the right.
PILLARS = (
    (0.0, 1.3, 0.12, (230, 40, 40)),
    (-24.0, 0.9, 0.09, (40, 200, 60)),
    (20.0, 0.8, 0.08, (40, 80, 230)),
    (45.0, 1.4, 0.13, (240, 220, 40)),
    (-50.0, 1.1, 0.10, (230, 60, 220)),
    (70.0, 0.9, 0.09, (40, 220, 230)),
    (-78.0, 1.5, 0.14, (255, 140, 20)),
    (100.0, 1.2, 0.10, (255, 255, 255)),
    (-110.0, 0.8, 0.09, (120, 60, 20)),
    (160.0, 1.0, 0.12, (150, 230, 120)),
    (-150.0, 1.3, 0.12, (60, 60, 160)),
)
PILLAR_TOP = -0.30  # pillars stand on the floor (y = CAMERA_HEIGHT) and rise above the eye
FLOOR_DARK = np.array((60.0, 60.0, 72.0))
FLOOR_LIGHT = np.array((205.0, 200.0, 185.0))
FOG_RGB = np.array((150.0, 160.0, 190.0))

_v, _u = np.meshgrid(np.arange(HEIGHT) + 0.5, np.arange(WIDTH) + 0.5, indexing="ij")
# Camera-space rays (OpenCV: x right, y down, z forward), as LingBot's poses assume.
_RAYS = np.stack(((_u - WIDTH / 2) / FOCAL_PX, (_v - HEIGHT / 2) / FOCAL_PX, np.ones_like(_u)), axis=-1)
_RAYS /= np.linalg.norm(_RAYS, axis=-1, keepdims=True)


def render(yaw: float) -> np.ndarray:
    """The view at `yaw` radians (positive = turned right) from the fixed spot: uint8 (64, 64, 3)."""
    cos, sin = math.cos(yaw), math.sin(yaw)
    rotation = np.array(((cos, 0.0, sin), (0.0, 1.0, 0.0), (-sin, 0.0, cos)))
    d = _RAYS @ rotation.T
    dx, dy, dz = d[..., 0], d[..., 1], d[..., 2]
    azimuth = np.arctan2(dx, dz)
    up = np.clip(-dy, 0.0, 1.0)
    image = np.stack(
        (
            110 + 50 * up + 45 * np.sin(azimuth),
            140 + 60 * up + 35 * np.sin(2 * azimuth + 1.0),
            215 - 30 * np.cos(azimuth) + 20 * up,
        ),
        axis=-1,
    )
    depth = np.full((HEIGHT, WIDTH), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_floor = np.where(dy > 1e-4, CAMERA_HEIGHT / dy, np.inf)
    floor_hit = np.isfinite(s_floor) & (s_floor < 8.0)
    px = np.where(floor_hit, s_floor * dx, 0.0)
    pz = np.where(floor_hit, s_floor * dz, 0.0)
    checker = ((np.floor(px / TILE) + np.floor(pz / TILE)).astype(np.int64) & 1)[..., None].astype(float)
    region = np.floor(px / (4 * TILE)) * 3 + np.floor(pz / (4 * TILE)) * 5
    tint = np.stack([0.8 + 0.2 * np.sin(region + k * 2.1) for k in range(3)], axis=-1)
    floor = (checker * FLOOR_LIGHT + (1 - checker) * FLOOR_DARK) * tint
    fog = np.clip(s_floor / 3.0, 0.0, 1.0)[..., None]
    floor = floor * (1 - fog) + fog * FOG_RGB
    image = np.where(floor_hit[..., None], floor, image)
    depth = np.where(floor_hit, s_floor, depth)
    a = dx * dx + dz * dz
    for azimuth_deg, distance, radius, rgb in PILLARS:
        cx = distance * math.sin(math.radians(azimuth_deg))
        cz = distance * math.cos(math.radians(azimuth_deg))
        b = -2 * (cx * dx + cz * dz)
        c = cx * cx + cz * cz - radius * radius
        disc = b * b - 4 * a * c
        with np.errstate(invalid="ignore", divide="ignore"):
            s = (-b - np.sqrt(np.maximum(disc, 0.0))) / (2 * a)
        y = s * dy
        hit = (disc > 0) & (s > 1e-3) & (s < depth) & (y <= CAMERA_HEIGHT) & (y >= PILLAR_TOP)
        hx, hz = s * dx - cx, s * dz - cz
        shade = 0.55 + 0.45 * np.clip((hx * 0.6 - hz * 0.8) / radius, -1, 1)
        stripe = 0.85 + 0.15 * (np.floor((y - PILLAR_TOP) / 0.08) % 2)
        colour = np.asarray(rgb, dtype=float) * (shade * stripe)[..., None]
        image = np.where(hit[..., None], colour, image)
        depth = np.where(hit, s, depth)
    return np.clip(image, 0, 255).astype(np.uint8)


def latent_yaws(chunks: Sequence[Sequence[Sequence[str]]]) -> np.ndarray:
    """The yaw (radians) of every latent frame of a session, from LingBot's own action integration.

    `chunks` holds each chunk's per-latent-frame key lists (3 per chunk); the first chunk's first latent frame
    is the start image (its keys should be empty). Chunks chain through the previous chunk's tail pose.
    """
    import torch
    from vllm_omni.diffusion.models.lingbot_world.actions import integrate_lingbot_camera_actions

    yaws: list[float] = []
    tail: torch.Tensor | None = None
    pitch = 0.0
    for frames in chunks:
        trajectory, pitch = integrate_lingbot_camera_actions(
            [list(keys) for keys in frames],
            width=WIDTH,
            height=HEIGHT,
            initial_pose=tail,
            initial_pitch=pitch,
        )
        poses = trajectory.poses.double()
        tail = poses[-1]
        # Camera-to-world rotation about y: its forward column is (sin yaw, 0, cos yaw).
        yaws.extend(math.atan2(float(p[0, 2]), float(p[2, 2])) for p in poses)
    return np.asarray(yaws)


def frame_yaws(latent: np.ndarray) -> np.ndarray:
    """Pixel-frame yaws: frame 0 at latent frame 0, then 4 frames interpolated towards each later one."""
    out = [float(latent[0])]
    for previous, current in itertools.pairwise(latent):
        out.extend(previous + (current - previous) * i / FRAMES_PER_LATENT for i in range(1, 5))
    return np.asarray(out)


def render_session(chunks: Sequence[Sequence[Sequence[str]]]) -> np.ndarray:
    """Ground-truth pixel frames of a session: uint8 (1 + 4 * (latent frames - 1), 64, 64, 3)."""
    return np.stack([render(yaw) for yaw in frame_yaws(latent_yaws(chunks))])


def chunk_frame_slices(n_chunks: int) -> list[slice]:
    """Which pixel frames each chunk produces (9 for chunk 0, 12 for each later one)."""
    first = 1 + FRAMES_PER_LATENT * (LATENT_FRAMES_PER_CHUNK - 1)
    per = FRAMES_PER_LATENT * LATENT_FRAMES_PER_CHUNK
    return [slice(0, first)] + [slice(first + per * k, first + per * (k + 1)) for k in range(n_chunks - 1)]


def _session_keys(n_chunks: int, next_keys: Callable[[], list[str]]) -> Actions:
    """A session's keys per chunk and latent frame: none for the start image (the start pose), then
    `next_keys()` for each latent frame after it, in order."""
    return [
        [[] if chunk == 0 and k == 0 else next_keys() for k in range(LATENT_FRAMES_PER_CHUNK)]
        for chunk in range(n_chunks)
    ]


def sample_actions(rng: np.random.Generator, n_chunks: int, *, hold: float = 0.65) -> Actions:
    """Random held-key turning: each latent frame keeps the previous keys with probability `hold`."""
    current: tuple[str, ...] = ()

    def next_keys() -> list[str]:
        nonlocal current
        if rng.random() > hold:
            current = KEYS[int(rng.integers(len(KEYS)))]
        return list(current)

    return _session_keys(n_chunks, next_keys)


def sample_long_turns(
    rng: np.random.Generator, n_chunks: int, *, keep: float = 0.95, idle: float = 0.15
) -> Actions:
    """Long turning: a direction (`j` or `l`) drawn at random and kept with probability `keep` per latent
    frame; each latent frame after the start image turns that way, or pauses (idle) with probability `idle`.
    So a session reaches views far from the start (6 degrees per turning latent frame) that `sample_actions`
    rarely does, with pauses on the way as held-key turning has."""
    current = str(rng.choice(("j", "l")))

    def next_keys() -> list[str]:
        nonlocal current
        if rng.random() > keep:
            current = "l" if current == "j" else "j"
        return [] if rng.random() < idle else [current]

    return _session_keys(n_chunks, next_keys)


def held_actions(key: str | None, n_chunks: int) -> Actions:
    """Hold one key (or none) for the whole session."""
    keys = [key] if key else []
    return [[[] if chunk == 0 and k == 0 else list(keys) for k in range(3)] for chunk in range(n_chunks)]


def held_out_cases(
    n: int, seed: int, n_chunks: int, trained: Sequence[Actions]
) -> tuple[list[tuple[str, Actions]], int]:
    """`n` named control sequences to measure a model on: hold `j`, hold `l`, then random held-key turning
    (`sample_actions`) from `seed`, skipping any sequence in `trained` (the model's training sessions) or
    already a case. Returns the cases and how many random draws were skipped."""
    out = [("hold-j", held_actions("j", n_chunks)), ("hold-l", held_actions("l", n_chunks))]
    seen = {_key(actions) for actions in trained} | {_key(actions) for _, actions in out}
    rng = np.random.default_rng(seed)
    skipped = 0
    while len(out) < n:
        actions = sample_actions(rng, n_chunks)
        key = _key(actions)
        if key in seen:
            skipped += 1
            continue
        seen.add(key)
        out.append((f"random-{len(out) - 1}", actions))
    return out[:n], skipped


def _key(actions: Actions) -> tuple[tuple[tuple[str, ...], ...], ...]:
    return tuple(tuple(tuple(keys) for keys in chunk) for chunk in actions)


def start_image() -> np.ndarray:
    """The session's conditioning image: the view at the start pose."""
    return render(0.0)


def horizontal_shift(a: np.ndarray, b: np.ndarray) -> float:
    """How far (px, positive = right) the content of frame `a` moved in frame `b`: the horizontal move, up to
    half the width, whose overlap of the two (grey) frames differs least (mean squared difference).

    Not phase correlation: it whitens the spectrum, so with blurred frames (every generated one) the high
    frequencies, where blur leaves little but the border effects both frames share, vote for no move at all;
    a Gaussian blur of 1 px made it read 47 of 64 true turns as 0 px. The overlap search reads them all."""
    x, y = a.astype(np.float64).mean(-1), b.astype(np.float64).mean(-1)
    width = x.shape[1]
    moves = range(-(width // 2), width // 2 + 1)
    overlaps = {dx: (y[:, dx:], x[:, : width - dx]) if dx >= 0 else (y[:, :dx], x[:, -dx:]) for dx in moves}
    errors = {dx: float(np.mean((moved - still) ** 2)) for dx, (moved, still) in overlaps.items()}
    return float(min(moves, key=lambda dx: (errors[dx], abs(dx))))  # a tie (a flat picture) is no move


def nearest_yaw(frame: np.ndarray, step_degrees: float = 1.0) -> float:
    """The yaw (radians, in [-pi, pi)) whose true view is nearest `frame` (mean squared difference), on a grid
    of `step_degrees`: where in the world a generated picture says the camera looks, whatever it drew."""
    yaws, views = _view_bank(step_degrees)
    errors = ((views - frame.astype(np.float32)[None]) ** 2).mean((1, 2, 3))
    return float(yaws[int(np.argmin(errors))])


@functools.cache
def _view_bank(step_degrees: float) -> tuple[np.ndarray, np.ndarray]:
    yaws = np.radians(np.arange(-180.0, 180.0, step_degrees))
    return yaws, np.stack([render(yaw) for yaw in yaws]).astype(np.float32)
