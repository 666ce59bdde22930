"""The benchmarks' smoke runs as their tests run them: `benchmarks/<script> --smoke` in a child process (one
torch thread), its output's lines; a run that fails shows its output's tail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def smoke_run(script: str, *, timeout: float) -> list[str]:
    out = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout.splitlines()
