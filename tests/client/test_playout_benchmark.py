"""`benchmarks/playout.py --smoke` runs (< 60 s): its three arms place, play and report every figure."""

from __future__ import annotations

import math

from tests.benchmark_smoke import smoke_run

ARMS = ("fifo", "deadline", "deadline+bound")


def test_the_playout_benchmark_smoke_run_reports_its_three_arms() -> None:
    lines = smoke_run("playout.py", timeout=120)
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
