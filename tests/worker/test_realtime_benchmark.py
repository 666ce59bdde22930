"""`benchmarks/realtime.py --smoke` runs (~1 min): both encoding tables' rows and the three pacing arms, the
paced stream within played + bufferChunks and far below the greedy client's generation."""

from __future__ import annotations

from tests.benchmark_smoke import smoke_run


def rows_after(lines: list[str], header_start: str) -> dict[str, dict[str, str]]:
    """The table whose header line starts with `header_start`, its rows keyed by their first cells."""
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = lines[at].split()
    rows = {}
    for line in lines[at + 1 :]:
        cells = line.split()
        if len(cells) != len(header):
            break
        row = dict(zip(header, cells, strict=True))
        rows[" ".join(cells[:3]) if "format" in header else cells[0]] = row
    return rows


def test_the_realtime_benchmark_smoke_run_reports_encoding_and_pacing() -> None:
    lines = smoke_run("realtime.py", timeout=300)
    encoding = rows_after(lines, "source ")
    assert set(encoding) == {
        f"fake {size} {fmt}" for size in ("64x64", "480x832") for fmt in ("m4s", "jpeg", "webp")
    }
    for name, row in encoding.items():
        assert float(row["encode_ms_p50"]) > 0, name
        assert abs(float(row["bytes_per_s"]) - float(row["bytes_per_chunk"]) * 16 / 12) <= 1, name
        assert float(row["vs_jpeg"]) == 1.0 if name.endswith("jpeg") else float(row["vs_jpeg"]) > 0, name
    pacing = rows_after(lines, "arm ")
    assert set(pacing) == {"greedy", "buffered", "paced"}
    paced, greedy = pacing["paced"], pacing["greedy"]
    assert paced["within"] == "yes"
    assert int(paced["generated"]) <= int(paced["played+buffer"])
    assert int(greedy["generated"]) > 3 * int(paced["generated"])  # unpaced: as fast as the forward goes
    assert float(paced["vs_greedy"]) < 0.5
    assert float(greedy["vs_greedy"]) == 1.0
