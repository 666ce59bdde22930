"""`benchmarks/continuity.py --smoke` runs: the tiny model's export, import and tiers at 64x64, and the
transfer code on loopback (a run of `--wire-gib` once died at its call of `transfer.download`, unnoticed)."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = pytest.mark.slow  # a child process loads the tiny model


def test_the_continuity_benchmark_smoke_run_reports_the_tiers_and_the_transfer_code() -> None:
    lines = smoke_run("continuity.py", timeout=540)
    (sizes,) = [line.split() for line in lines if line.startswith("  64^2") and len(line.split()) == 9]
    assert int(sizes[1]) > 1e6  # the export of a full KV window: ~4 MB at 64x64
    assert all(float(value) > 0 for value in sizes[2:4])
    (transfer,) = [line for line in lines if line.startswith("transfer code on loopback")]
    assert "synthetic 0.03 GiB export" in transfer
    assert "(median of 3)" in transfer
    assert float(transfer.split("): ")[1].split()[0]) > 0
    assert float(transfer.split("), ")[-1].split()[0]) > 0  # CPU s/GB
    (checksum,) = [line for line in lines if line.startswith("the checksum alone: XXH3-128 ")]
    assert float(checksum.split("SHA-256 (version 1) ")[1].split(":")[0]) > 0
    assert any(line.startswith("LingBot-World 480x832 bf16:") for line in lines)
