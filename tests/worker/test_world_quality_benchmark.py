"""`benchmarks/world_quality.py --smoke` runs: the trained tiny world and the random checkpoint each render
the three cases, every chunk scored against the ray-caster and every turn read, and the targets judged."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_smoke import markdown_rows, smoke_run

pytestmark = pytest.mark.slow  # two child processes load a tiny model each

MODELS = ("`tiny-world-trained`", "`tiny-lingbot-world`")


def test_the_world_quality_benchmark_smoke_run_scores_both_models() -> None:
    lines = smoke_run("world_quality.py", timeout=540)
    assert lines[0] == "3 held-out cases x 4 chunks (seed 1000), 64x64, same run"
    rows = {row["model"]: row for row in markdown_rows(lines, "model")}
    assert tuple(rows) == MODELS, lines
    for row in rows.values():
        psnr = [float(value) for value in row["PSNR chunk 0/1/2/3 (dB)"].split(" / ")]
        ssim = [float(value) for value in row["SSIM chunk 0/1/2/3"].split(" / ")]
        assert len(psnr) == len(ssim) == 4
        assert all(0 < value < 100 for value in psnr)
        assert all(-1 <= value <= 1 for value in ssim)
        assert float(row["mean PSNR"]) == pytest.approx(sum(psnr) / 4, abs=0.01)
        # hold j and hold l turn in every chunk: at least their 8 (case, chunk)s are turns
        for column in ("turn direction", "and at least half as far", "by the nearest true views"):
            right, turns = map(int, re.match(r"(\d+)/(\d+) \(\d+%\)$", row[column]).groups())
            assert 8 <= turns <= 12
            assert 0 <= right <= turns
    trained, random = (float(rows[model]["mean PSNR"]) for model in MODELS)
    assert trained > random  # the trained world renders the ray-caster's views; random weights do not
    verdict = (
        r"^PSNR gain [-+][\d.]+ dB \(target >= \+6\): (met|NOT met); "
        r"turn direction \d+% \(target >= 90%\): (met|NOT met)$"
    )
    assert re.search(verdict, "\n".join(lines), re.MULTILINE)
