"""The benchmarks' smoke runs as their tests run them: `benchmarks/<script> --smoke` in a child process (one
torch thread), its output's lines; a run that fails shows its output's tail. A benchmark that needs the dev
cluster runs in-process on the test session's (`benchmark_module`), and readers of the printed tables."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def benchmark_module(name: str) -> ModuleType:
    """`benchmarks/<name>.py` imported, its directory on `sys.path` (last) as when it runs: the benchmarks
    import each other by bare name."""
    directory = str(ROOT / "benchmarks")
    if directory not in sys.path:
        sys.path.append(directory)
    return importlib.import_module(name)


def rows_under(lines: list[str], header: str, cells: int) -> list[list[str]]:
    """The cells of the rows under the first line that starts with `header` (leading spaces ignored): each
    following line of `cells` whitespace-separated cells, a rule of dashes skipped, up to the first that is
    not one. A header not printed fails the test with the output's tail."""
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(header)]
    assert starts, f"no line starts with {header!r}:\n" + "\n".join(lines[-40:])
    rows = []
    for line in lines[starts[0] + 1 :]:
        if set(line.strip()) == {"-"}:
            continue
        if len(line.split()) != cells:
            break
        rows.append(line.split())
    return rows


def markdown_rows(lines: list[str], first: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header's first cell is `first`, by header cell."""

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    start = next(i for i, line in enumerate(lines) if line.startswith("|") and cells(line)[0] == first)
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line), strict=True)))
    return rows


def number(cell: str) -> float:
    """A printed figure as a float: thousands' commas and a unit suffix (x, %, s, ms) dropped."""
    return float(cell.replace(",", "").removesuffix("ms").rstrip("x%s"))
