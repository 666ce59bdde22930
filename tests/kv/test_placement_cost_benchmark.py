"""`benchmarks/placement.py --cost` (issue 27 item 3) runs in a few seconds: the store's client cost per
operation against bare FCALL, the place's Redis time as one EVALSHA script (before) and as FCALL of the
library's function (issue 42 item 4), and both part by part, each marked copy having taken the free-slot path
(every mark passed, or the run fails) and each marked part taking time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST = {
    "EVALSHA": "the shared helpers defined (kv/lua/_lib.lua)",  # what runs before the first mark
    "FCALL": "the function's callback",
}
PARTS = (
    "any script call with these keys and arguments",
    "plan and arguments read",
    "session record read",
    "pod choice (open index, lease, compute)",
    "record, residents and LRU written (bind)",
    "resume_from written, slot charged",
    "open index refreshed",
    "hints for the next call",
)
WHOLE = "whole script, its marks' cost taken off"


def test_the_cost_run_reports_the_place_script_part_by_part() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/placement.py", "--cost", "--calls", "200", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    tables = out.stdout.split("part by part (means), ")[1:]
    assert [table.split(":", 1)[0] for table in tables] == [
        "EVALSHA of the whole script (before)",
        "FCALL (the library)",
    ], out.stdout
    for command, table in zip(("EVALSHA", "FCALL"), tables, strict=True):
        figures = {
            match[1].strip(): float(match[2])
            for match in re.finditer(r"^  (.+?)\s+(-?[\d.]+) µs\s+-?\d+%$", table, re.MULTILINE)
        }
        assert set(figures) == {*PARTS, FIRST[command], WHOLE}, out.stdout
        assert all(figures[name] > 0 for name in PARTS[1:]), figures  # each marked part takes some time
    assert re.search(
        r"EVALSHA of the whole script \(before\) [\d.]+ µs, FCALL of the library's function [\d.]+ µs: "
        r"[+-]\d+% \(target -15%: (met|MISSED)\)",
        out.stdout,
    ), out.stdout
    assert "target: the store's client CPU within 1.5x the bare FCALL" in out.stdout
