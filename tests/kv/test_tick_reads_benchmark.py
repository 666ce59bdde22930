"""`benchmarks/tick_reads.py --smoke` runs: a tick's read of its session's record, the whole record (before
issue 41) against all but the image (now), in bytes Redis sent."""

from __future__ import annotations

from tests.benchmark_smoke import number, rows_under, smoke_run


def test_the_tick_reads_benchmark_smoke_run_reports_bytes_per_read() -> None:
    lines = smoke_run("tick_reads.py", timeout=120)
    rows = rows_under(lines, "image bytes", cells=6)
    figures = {(int(number(row[0])), row[1]): number(row[3]) for row in rows}
    assert set(figures) == {(size, way) for size in (0, 65536) for way in ("HGETALL", "HMGET")}, lines
    for size in (0, 65536):
        assert 0 < figures[size, "HMGET"] < 2048  # the record's fields but the image: a few hundred bytes
        assert figures[size, "HGETALL"] > size  # the whole record: the image and more
    assert figures[65536, "HMGET"] < figures[65536, "HGETALL"] / 100
