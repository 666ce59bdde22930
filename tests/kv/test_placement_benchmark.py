"""`benchmarks/placement.py --smoke` runs: the latency table (every operation against PING) and the throughput
mode (our clients, redis-benchmark on the same calls, the paced phase against PING)."""

from __future__ import annotations

import re

from tests.benchmark_smoke import number, rows_under, smoke_run

OPERATIONS = ("place", "touch", "place+evict", "evict_lru")


def test_the_placement_benchmark_smoke_run_reports_latency_and_throughput() -> None:
    lines = smoke_run("placement.py", timeout=120)
    text = "\n".join(lines)
    latency = {row[0]: row for row in rows_under(lines, "operation", cells=11)}
    assert set(latency) == set(OPERATIONS), text
    assert [int(latency[name][1]) for name in OPERATIONS] == [50, 50, 10, 10]
    for row in latency.values():
        assert all(number(cell) > 0 for cell in row[2:]), row
        assert 1 <= float(row[5]) < 3  # scripts per operation: one, a retried plan now and then
    assert re.search(r"^target place p99 <= 3x PING p99: (met|MISSED)$", text, re.MULTILINE)

    peak = {" ".join(row[:-3]): row[-3:] for row in rows_under(lines, "place/s", cells=5)}
    assert set(peak) == {"ardiff (peak)"}, text
    assert all(float(rate) > 0 for rate in peak["ardiff (peak)"])
    (benchmark,) = [line for line in lines if line.startswith("redis-benchmark (FCALL)")]
    assert all(float(rate) > 0 for rate in benchmark.split()[2:5])
    assert re.search(
        r"^ardiff / redis-benchmark: [\d.]+ \(target >= 0.80: (met|MISSED)\)$", text, re.MULTILINE
    )
    paced = {row[0]: row for row in rows_under(lines, "p50 µs", cells=4)}
    assert set(paced) == {"place", "touch", "PING"}, text
    assert float(paced["PING"][3]) == 1.0  # the baseline against itself
    assert all(float(cell) > 0 for row in paced.values() for cell in row[1:])
