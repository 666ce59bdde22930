"""`benchmarks/failover.py --smoke` runs: the write latency with and without waiting for the replica, and one
kill -9 of the master under load per variant, no acknowledged write lost when the replica was waited for."""

from __future__ import annotations

from tests.benchmark_smoke import rows_under, smoke_run


def test_the_failover_benchmark_smoke_run_reports_latency_and_a_failover_per_variant() -> None:
    lines = smoke_run("failover.py", timeout=180)
    latency = rows_under(lines, "wait", cells=13)  # wait, then four "p50 / p99" cells
    assert [row[0] for row in latency] == ["0", "1"], lines
    for row in latency:
        p50s, p99s = row[1::3], row[3::3]
        assert all(0 < float(p50) <= float(p99) for p50, p99 in zip(p50s, p99s, strict=True)), row
    header = next(i for i, line in enumerate(lines) if line.startswith("wait placed"))
    failovers = rows_under(lines[header:], "wait placed", cells=11)
    assert [row[0] for row in failovers] == ["0", "1"], lines
    for _, placed, _, _, _, _, _, window_s, p50, p99, violations in failovers:
        assert int(placed) > 0
        assert 0 < float(p50) <= float(p99)
        assert 0.5 <= float(window_s) < 10  # no failover before down-after-milliseconds; one well within 10 s
        assert int(violations) == 0
    waited = failovers[1]
    assert waited[4] == "0"  # waiting for the replica: no acknowledged write lost
