"""`benchmarks/dreamzero_export.py --smoke` runs: the tiny DreamZero ticked twice, its session exported and
imported after each chunk, the export's bytes split by part and the cost set against the tick."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import rows_under, smoke_run

pytestmark = pytest.mark.slow  # the tiny DreamZero: ~10 s a tick on a 2-core CPU

PREFIX = ") "  # vllm-omni's runner prefixes this process's lines with its name: "(DiffusionWorker pid=N) "


def test_the_dreamzero_export_benchmark_smoke_run_splits_each_chunks_export() -> None:
    lines = [
        line.split(PREFIX, 1)[1] if line.startswith("(") else line
        for line in smoke_run("dreamzero_export.py", timeout=540)
    ]
    rows = rows_under(lines, "chunk", cells=13)
    assert [row[0] for row in rows] == ["0", "1"], lines
    for _, total, *parts, tick_ms, export_ms, import_ms, ratio in rows:
        assert int(total) > 1_000_000  # bytes: the VAE's cache alone is ~50 MiB
        assert all(float(kib) >= 0 for kib in parts)
        assert float(tick_ms) > 0
        assert float(export_ms) > 0
        assert float(import_ms) > 0
        assert 0 < float(ratio) < 1  # (export + import) / tick
    assert int(rows[1][2]) > int(rows[0][2])  # the positive branch's KV grew with the second chunk
    (latents,) = [line for line in lines if line.startswith("predicted latents kept by vllm-omni: +")]
    assert int(latents.split("+")[1].split()[0]) > 0
