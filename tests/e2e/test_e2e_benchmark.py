"""`benchmarks/e2e.py --smoke` runs on a dev cluster of its own with two real workers: ticks through the
client and bare HTTP against the worker's own time, one `kill -9` of a worker recovered, and one Redis crash
per variant recovered with only retryable answers meanwhile."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = (
    pytest.mark.slow
)  # a dev cluster of its own, two real workers, a kill and two Redis crashes (~3 min)


def cells_after(lines: list[str], label: str, width: int) -> list[float]:
    """The figures of the one line that starts with `label` padded to `width`."""
    (line,) = [line for line in lines if line.startswith(f"{label:<{width}} ")]
    return [float(cell) for cell in line[width:].split()]


def test_the_e2e_benchmark_smoke_run_reports_ticks_and_both_recoveries() -> None:
    lines = smoke_run("e2e.py", timeout=580)
    text = "\n".join(lines)
    assert "tick latency, 64x64, 3 ticks per path, alternating (ms)" in lines
    for path in ("bare HTTP POST", "Python client tick"):
        p50, mean, p99, worker_p50, overhead_p50, overhead_p99, ratio = cells_after(lines, path, 20)
        assert 0 < p50 <= p99
        assert mean > 0
        assert 0 < worker_p50 <= p50  # the worker's own time is part of the round trip
        assert 0 <= overhead_p50 <= overhead_p99
        assert ratio >= 1
    assert re.search(
        r"^worker alone \(server-timing .*\) p50 [\d.]+ ms; the client adds [-\d.]+ ms", text, re.M
    )

    recovery = {
        event: cells_after(lines, event, 30)
        for event in ("Ready again, reset required", "first tick after reset()", "killed worker restarted")
    }
    assert all(low == median == high > 0 for low, median, high in recovery.values())  # one kill
    assert recovery["Ready again, reset required"][0] < recovery["first tick after reset()"][0]

    for variant in ("Redis killed", "Redis + operator killed"):
        sessions, low, median, high, in_ticks, retryable = cells_after(lines, variant, 26)
        assert sessions == 2
        assert 0 < low <= median <= high
        assert in_ticks > 0
        assert retryable >= 0
