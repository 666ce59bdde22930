"""The tiny world's training data: the sessions' keys (never a held-out benchmark case), the record of what a
model directory was trained on, and the rendered clips (cached in OUT_DIR/data.npz)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ardiff.tiny_world import world

N_CHUNKS = 4
# In OUT_DIR/model: which sessions the model was trained on (the data options of the directory's last run;
# they include every earlier run's sessions when only --long-turns grew: `training_actions` draws them first).
TRAINING_RECORD = "training.json"


def training_actions(sessions: int, seed: int, long_turns: int = 0) -> list[world.Actions]:
    """The training sessions' keys: `sessions` of random held-key turning (`world.sample_actions`), then
    `long_turns` of long turning (`world.sample_long_turns`, from their own stream of the same seed). A
    session that holds `j` or `l` throughout is skipped (the next one drawn instead): those are the quality
    benchmark's held-out hold-`j`/hold-`l` cases, which training must not contain."""
    held = [world.held_actions(key, N_CHUNKS) for key in ("j", "l")]
    out: list[world.Actions] = []
    streams = (
        (sessions, np.random.default_rng(seed), world.sample_actions),
        (long_turns, np.random.default_rng([seed, 1]), world.sample_long_turns),
    )
    for count, rng, sample in streams:
        drawn: list[world.Actions] = []
        while len(drawn) < count:
            chunks = sample(rng, N_CHUNKS)
            if chunks not in held:
                drawn.append(chunks)
        out.extend(drawn)
    return out


def write_training_record(model_dir: Path, *, sessions: int, seed: int, long_turns: int) -> None:
    """MODEL_DIR/training.json: the options `training_actions` drew the training sessions with, so a quality
    benchmark can keep its held-out cases out of them (`trained_on`)."""
    record = {"sessions": sessions, "seed": seed, "long_turns": long_turns}
    (model_dir / TRAINING_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def trained_on(model_dir: Path) -> list[world.Actions] | None:
    """The sessions a model directory was trained on, from its training record; None without one."""
    path = model_dir / TRAINING_RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return training_actions(record["sessions"], record["seed"], record["long_turns"])


def make_dataset(out: Path, sessions: int, seed: int, long_turns: int = 0) -> dict[str, np.ndarray]:
    """Rendered sessions (uint8 frames) and their actions (`training_actions`), cached in OUT_DIR/data.npz."""
    path = out / "data.npz"
    if path.is_file():
        data = np.load(path, allow_pickle=False)
        if len(data["actions"]) != sessions + long_turns:
            raise SystemExit(
                f"{path} holds {len(data['actions'])} sessions, not --sessions + --long-turns = "
                f"{sessions + long_turns}: use a new directory (or the options it was made with)"
            )
        return {"clips": data["clips"], "actions": data["actions"]}
    cache: dict[float, np.ndarray] = {}
    clips, actions = [], []
    for chunks in training_actions(sessions, seed, long_turns):
        yaws = world.frame_yaws(world.latent_yaws(chunks))
        frames = []
        for yaw in yaws:
            key = round(float(yaw), 9)
            if key not in cache:
                cache[key] = world.render(yaw)
            frames.append(cache[key])
        clips.append(np.stack(frames))
        actions.append([["".join(keys) for keys in frames_] for frames_ in chunks])
    data = {"clips": np.stack(clips), "actions": np.asarray(actions, dtype="<U2")}
    np.savez(out / "data.tmp.npz", **data)
    (out / "data.tmp.npz").replace(path)
    return data


def chunk_actions(row: np.ndarray) -> list[list[list[str]]]:
    return [[list(keys) for keys in chunk] for chunk in row]


def turning_frames(actions: np.ndarray) -> np.ndarray:
    """(sessions, chunks, 3) key strings -> (sessions, latent frames) 1.0 where the camera turns into that
    latent frame (its keys are `j` or `l`: LingBot's yaw moves from the previous latent frame), else 0.0."""
    return (actions != "").reshape(len(actions), -1).astype(np.float64)
