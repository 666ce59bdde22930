"""`benchmarks/tick.py --smoke` runs: the tiny LingBot at 64x64 ticked in-process and over HTTP in lockstep,
both paths timed and the HTTP overhead judged against the target."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_smoke import number, rows_under, smoke_run

pytestmark = pytest.mark.slow  # a child process loads the tiny model


def test_the_tick_benchmark_smoke_run_times_both_paths() -> None:
    lines = smoke_run("tick.py", timeout=300)
    assert "measured ticks per path: 2" in lines[0]
    rows = {row[1]: row for row in rows_under(lines, "size path", cells=10)}
    assert set(rows) == {"in-process", "http"}, lines
    for size, _, p50, p99, mean, frames_per_s, outside, overhead, paired, rss in rows.values():
        assert size == "64^2"
        assert 0 < number(p50) <= number(p99)
        assert number(mean) > 0
        assert number(frames_per_s) > 0
        assert number(outside) >= 0
        assert number(rss) > 100  # MB: torch and the model
        assert -100 < number(overhead) < 100  # percent of the in-process tick
        assert -50 < number(paired) < 100
    assert rows["in-process"][7] == "+0.0%"  # the baseline against itself
    text = "\n".join(lines)
    assert re.search(
        r"^target: HTTP overhead <= 5% of the tick at 64x64: [-+][\d.]+% \(paired\), (met|NOT met)$",
        text,
        re.M,
    )
