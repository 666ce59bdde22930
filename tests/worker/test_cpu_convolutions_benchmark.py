"""`benchmarks/cpu_convolutions.py --smoke` runs: the four convolutions, each timed in bfloat16 and after
`run_in_float32`, their outputs agreeing."""

from __future__ import annotations

from tests.benchmark_smoke import number, rows_under, smoke_run


def test_the_cpu_convolutions_benchmark_smoke_run_times_both_dtypes_of_every_shape() -> None:
    lines = smoke_run("cpu_convolutions.py", timeout=120)
    rows = rows_under(lines, "input", cells=5)
    assert [row[0] for row in rows] == ["8x1x45x80", "16x1x22x40", "32x1x11x20", "96x1x11x20"], lines
    for _, bfloat16_ms, float32_ms, ratio, max_diff in rows:
        assert number(bfloat16_ms) > 0
        assert number(float32_ms) > 0
        assert number(ratio) >= 0  # printed rounded: a fast bfloat16 path shows 0x or 1x
        assert 0 <= float(max_diff) < 0.05  # the float32 copy computes the same convolution
