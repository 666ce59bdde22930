"""`benchmarks/playout.py --smoke` runs (< 60 s): its three arms place, play and report every figure."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("fifo", "deadline", "deadline+bound")


def test_the_playout_benchmark_smoke_run_reports_its_three_arms() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/playout.py", "--smoke"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    header = next(line.split() for line in lines if line.split()[:2] == ["arm", "arrivals"])
    rows = {
        line.split()[0]: dict(zip(header, line.split(), strict=True))
        for line in lines
        if line.split()[:1] and line.split()[0] in ARMS
    }
    assert set(rows) == set(ARMS)
    for arm, row in rows.items():
        assert int(row["admitted"]) > 0, (arm, row)
        assert 0 < float(row["cpr_mean"]) <= 1, (arm, row)
        assert 0 <= float(row["cpr_all"]) <= float(row["cpr_mean"]), (arm, row)
        assert 0 <= float(row["on_time"]) <= 1, (arm, row)
        assert float(row["pod_seconds"]) > 0, (arm, row)
        assert not math.isnan(float(row["ttfc_p50"])), (arm, row)
