"""`benchmarks/fuzz_decoders.py --smoke` runs without atheris: both targets' seeds and their fixed mutations
go through the fuzzed readers, each answered as allowed (a 4xx `WorkerError`, a `SessionExportError`)."""

from __future__ import annotations

from tests.benchmark_smoke import rows_under, smoke_run


def test_the_fuzz_decoders_benchmark_smoke_run_feeds_both_targets() -> None:
    rows = {row[0]: row for row in rows_under(smoke_run("fuzz_decoders.py", timeout=60), "target", cells=4)}
    assert set(rows) == {"openpi", "export"}, rows
    for _, inputs, seed_bytes, ms in rows.values():
        assert int(inputs) == 1 + 3 * 64  # the seed and its mutations
        assert int(seed_bytes) > 1_000  # a valid message (three cameras) and a valid export
        assert float(ms) > 0
