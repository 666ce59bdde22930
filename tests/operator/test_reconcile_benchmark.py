"""`benchmarks/reconcile.py --smoke` runs on a dev cluster of its own: a burst and paced sessions applied
under the bare kopf baseline and under the ardiff operator with a fake-runtime pod, every figure of both
phases reported and the ratios and targets judged."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = pytest.mark.slow  # a dev cluster of its own, a worker Pod and two operators (~1 min)

OPERATORS = ("bare kopf (baseline)", "ardiff operator")


def test_the_reconcile_benchmark_smoke_run_reports_both_operators_phases() -> None:
    lines = smoke_run("reconcile.py", timeout=540)
    text = "\n".join(lines)
    rows = {}
    for operator in OPERATORS:
        for line in [line for line in lines if line.startswith(f"{operator:<22} ")]:
            cells = line[22:].split()
            rows[operator, cells[1]] = cells
    assert set(rows) == {(operator, phase) for operator in OPERATORS for phase in ("burst", "paced")}, text
    for cells in rows.values():
        # round, phase, p50, p99, max, all Ready, sessions/s, RSS "start / peak / idle", idle CPU "op / API",
        # then per session: operator, API + etcd, Redis + workers, all CPU ms; writes
        assert len(cells) == 20, cells
        p50, p99, most, all_ready, rate = (float(cell) for cell in cells[2:7])
        assert 0 < p50 <= p99 <= most
        assert all_ready > 0
        assert rate > 0
        assert 50 < float(cells[7]) <= float(cells[9])  # MiB: the operator's RSS at start, then its peak
        op_ms, api_ms, store_ms, all_ms, writes = (float(cell) for cell in cells[15:])
        assert api_ms > 0  # every session was created and its status written
        assert all_ms >= op_ms + api_ms + store_ms
        assert writes >= 2  # beyond its create, each session's status patch and token Secret
    assert "a Ready session as the API returns it: " in text
    for ratio in ("burst sessions/s, ardiff / baseline", "paced p50, ardiff / baseline"):
        assert re.search(
            rf"^{re.escape(ratio)}(, median of the rounds)?: [\d.]+x \(rounds: [\d.]+\)$", text, re.M
        )
    assert re.search(
        r"^targets: burst sessions/s >= 0.8x the baseline's \(median\): (met|MISSED);", text, re.M
    )
