"""`benchmarks/cold_start.py --smoke` runs on a dev cluster of its own: a session of an empty pool waits for a
real worker Pod started for it, ticks its first chunk, a second one lands warm, and the pool goes back to
zero; every event timed in order and the operator's placement histogram read."""

from __future__ import annotations

import re

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = pytest.mark.slow  # a dev cluster of its own and a real worker Pod (~1 min)

EVENTS = (
    "pod created",
    "pending PodStarting",
    "pod Ready",
    "session Ready",
    "first chunk",
    "warm session Ready",
    "back to zero pods",
)


def test_the_cold_start_benchmark_smoke_run_times_a_start_from_zero() -> None:
    lines = smoke_run("cold_start.py", timeout=540)
    text = "\n".join(lines)
    rows = {}
    for event in EVENTS:  # then min, median, max
        (row,) = [line for line in lines if line.startswith(f"{event:<24} ")]
        rows[event] = [float(cell) for cell in row[24:].split()]
    assert set(rows) == set(EVENTS), text
    assert all(low == median == high > 0 for low, median, high in rows.values())  # one run
    cold = [rows[event][0] for event in EVENTS[:5]]
    assert cold == sorted(cold)  # the cold session's events in order
    assert rows["warm session Ready"][0] < rows["session Ready"][0]
    assert re.search(r"status\.lastPodStartupSeconds [\d.]+$", text, re.MULTILINE)
    assert "  the cold session's message: '" in text
    count, mean = re.search(
        r"^operator placement histogram: (\d+) sessions, mean ([\d.]+)s$", text, re.M
    ).groups()
    assert int(count) == 2  # the cold session and the warm one
    assert float(mean) > 0
