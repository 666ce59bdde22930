"""`benchmarks/scale_store.py --smoke` runs: two sizes seeded through the store, each with its memory, round
reads, invariant check, touches and the burst of 1,000 placements reported."""

from __future__ import annotations

from tests.benchmark_smoke import rows_under, smoke_run


def test_the_scale_store_benchmark_smoke_run_reports_every_size() -> None:
    lines = smoke_run("scale_store.py", timeout=120)
    # pods, sessions, seed s, B/session, B/pod, round reads ms, (bindings), invariants ms,
    # touch "p50 / p99" µs, burst s, burst "p50 / p99" ms
    rows = rows_under(lines, "pods sessions", cells=15)
    assert [(row[0], row[1]) for row in rows] == [("2", "20"), ("4", "40")], lines
    for row in rows:
        assert 1_000 < float(row[3]) < 1e6  # Redis bytes per session: its record, binding and indexes
        assert all(float(row[i]) > 0 for i in (4, 5, 6, 7, 8, 10, 11, 12, 14))
        assert float(row[8]) <= float(row[10])  # touch p50 <= p99
        assert row[9] == row[13] == "/"
    assert lines[-1].startswith("load average after:")
