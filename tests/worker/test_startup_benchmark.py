"""`benchmarks/startup.py --smoke` runs: one real worker started per variant (humming's background builds on
and off), each timed to `/healthz`, `/readyz` and its exit after SIGTERM, its humming children counted."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import number, smoke_run

pytestmark = pytest.mark.slow  # two real worker processes, one after the other (~45 s each on 2 cores)


def test_the_startup_benchmark_smoke_run_times_both_variants() -> None:
    lines = smoke_run("startup.py", timeout=540)
    # each variant's row: runs, /healthz p50, /readyz p50, min, max, exit p50, humming children
    rows = {}
    for variant in ("builds on (baseline)", "builds off"):
        (row,) = [line for line in lines if line.startswith(f"{variant:<22} ")]
        rows[variant] = row[22:].split()
    for runs, healthz, readyz, low, high, exit_s, _ in rows.values():
        assert runs == "1"
        assert 0 < number(healthz) <= number(readyz) == number(low) == number(high)
        assert 0 < number(exit_s) < 60
    assert rows["builds off"][6] == "0"  # the switch keeps humming from spawning its builds
    (ratio,) = [line for line in lines if line.startswith("/readyz p50 without the builds / with them: ")]
    assert float(ratio.split(": ")[1].split()[0]) > 0
