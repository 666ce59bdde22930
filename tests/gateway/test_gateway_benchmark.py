"""`benchmarks/gateway.py --smoke` runs (issue 37 item 6): real Envoy and the picker before fake workers,
every part tiny, and each figure it reports is of the right kind: the front door's arms ticked and timed
against direct ticks, the picker's decisions and Redis' route script counted, every stream given its chunk
and held open in Envoy, the picker's answers all forwards, the bytes exactly whole chunks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three real worker processes, Envoy and the picker

ROOT = Path(__file__).resolve().parents[2]
CHUNK_BYTES = 12 * 480 * 832 * 3  # a 12-frame 480x832 raw chunk (the bytes part's)
STREAMS = 6  # the smoke run's


def table(lines: list[str], column: str) -> dict[str, dict[str, str]]:
    """The rows (by their first cell) under the first header line naming `column`, up to the first line that
    is not one (another number of cells, or a label: `answers: ...`)."""
    start = next(i for i, line in enumerate(lines) if column in line.split())
    header = lines[start].split()
    rows = {}
    for line in lines[start + 2 :]:
        if len(line.split()) != len(header) or line.split()[0].endswith(":"):
            break
        row = dict(zip(header, line.split(), strict=True))
        rows[row[header[0]]] = row
    return rows


def test_the_gateway_benchmark_smoke_run_reports_every_part() -> None:
    command = [sys.executable, "benchmarks/gateway.py", "--smoke"]  # ~20 s, once the gateway venv is built
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()

    ticks = table(lines, "added_p50_ms")
    assert set(ticks) == {"direct", "envoy/c1", "door/c1", "responses/c1"}, out.stdout
    assert all(float(row["p50_ms"]) > 0 for row in ticks.values())
    assert float(ticks["direct"]["added_p50_ms"]) == 0.0  # the baseline against itself
    # the door asks the picker (a gRPC round trip and a Redis read) on top of Envoy's proxying
    assert float(ticks["door/c1"]["added_p50_ms"]) > 0, ticks
    (where,) = table(lines, "decision_mean_ms").values()
    assert where["door"] == "door/c1"
    assert float(where["decision_mean_ms"]) > 0
    assert float(where["redis_route_us"]) > 0  # the picker's route script ran in Redis
    assert re.search(r"^asking the picker about every response too .*: p50 [-+][\d.]+ ms", out.stdout, re.M)
    assert re.search(r"^target \(door/c1\): .*: (met|NOT met)$", out.stdout, re.MULTILINE), out.stdout

    memory = table(lines, "per_stream_KB")
    assert set(memory) == {"envoy_rss", "envoy_allocated", "workers_rss"}
    assert all(float(row["held_MB"]) > 0 for row in memory.values())
    # the streams hold connections and buffers in Envoy: what its allocator holds grows
    assert float(memory["envoy_allocated"]["per_stream_KB"]) > 0, memory
    assert f"streams with their chunk: {STREAMS}/{STREAMS};" in out.stdout, out.stdout
    active = re.search(r"Envoy's active downstream connections: (\d+)", out.stdout)
    assert active is not None
    assert int(active[1]) >= STREAMS

    picker = table(lines, "per_picker_cpu_s")
    assert set(picker) == {"health", "refuse", "decide"}
    for row in picker.values():
        assert int(row["calls"]) > 0
        assert float(row["per_picker_cpu_s"]) > 0
    assert float(picker["decide"]["redis_cpu_us_per_call"]) > 0  # every decision read Redis
    # every decision a forward, every other path under the pool a 404, every health check serving
    answers = re.search(r"^answers: (.*)$", out.stdout, re.MULTILINE)
    assert answers is not None, out.stdout
    assert answers[1] == "; ".join(
        f'{arm}: {{"{kind}": {picker[arm]["calls"]}}}'
        for arm, kind in (("health", "SERVING"), ("refuse", "404"), ("decide", "forward"))
    ), answers[1]

    sent = table(lines, "envoy_cpu_s_per_GB")
    assert set(sent) == {"direct", "door/c1"}
    for row in sent.values():
        assert int(row["ticks"]) > 0
        assert int(row["bytes"]) == int(row["ticks"]) * CHUNK_BYTES  # whole chunks, nothing lost
        assert float(row["MB_per_s"]) > 0
    assert float(sent["door/c1"]["vs_direct"]) > 0
