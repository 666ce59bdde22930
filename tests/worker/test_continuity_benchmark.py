"""`benchmarks/continuity.py --smoke` runs: the tiny model's export, import and tiers at 64x64 (the transfer
code alone: tests/worker/test_transfer_benchmark.py)."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = pytest.mark.slow  # a child process loads the tiny model


def test_the_continuity_benchmark_smoke_run_reports_the_tiers() -> None:
    lines = smoke_run("continuity.py", timeout=540)
    (sizes,) = [line.split() for line in lines if line.startswith("  64^2") and len(line.split()) == 9]
    assert int(sizes[1]) > 1e6  # the export of a full KV window: ~4 MB at 64x64
    assert all(float(value) > 0 for value in sizes[2:4])
    assert any(line.startswith("LingBot-World 480x832 bf16:") for line in lines)
