"""What the tiny world's training stages share: the progress line, the learning-rate schedule, the resumable
run state (OUT_DIR/state.json), atomic checkpoint writes and the frames-to-tensor conversion."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SAVE_EVERY_SECONDS = 180.0


class Progress:
    """One line per update: stage, step, elapsed/budget, ETA, and the latest figures."""

    def __init__(self, stage: str, budget_s: float, elapsed_s: float) -> None:
        self.stage, self.budget, self.start = stage, budget_s, time.monotonic() - elapsed_s
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def update(self, step: int, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (1.0 if self.tty else 30.0):
            return
        self.last = now
        done = min(1.0, self.elapsed() / self.budget) if self.budget > 0 else 1.0
        bar = "#" * int(24 * done) + "-" * (24 - int(24 * done))
        eta = max(0.0, self.budget - self.elapsed())
        line = (
            f"[{self.stage}] |{bar}| {100 * done:5.1f}% step {step} "
            f"{clock(self.elapsed())}/{clock(self.budget)} ETA {clock(eta)} {text}"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)


def clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def cosine(base: float, fraction: float, step: int, warmup: int = 30) -> float:
    return (
        base
        * min(1.0, (step + 1) / warmup)
        * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, fraction))))
    )


def load_state(out: Path) -> dict[str, Any]:
    path = out / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def save_state(out: Path, state: dict[str, Any]) -> None:
    tmp = out / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / "state.json")


def atomic_torch_save(value: Any, path: Path) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(value, tmp)
    tmp.replace(path)


def to_tensor(frames: np.ndarray) -> Any:
    """uint8 (B, T, H, W, 3) -> float (B, 3, T, H, W) in [-1, 1]."""
    import torch

    return torch.from_numpy(frames).float().div(127.5).sub(1).permute(0, 4, 1, 2, 3).contiguous()
