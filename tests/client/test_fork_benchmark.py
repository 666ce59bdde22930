"""`benchmarks/fork.py --smoke` runs: two real workers, a parent keeping its chunks, and each arm (a fresh
session, a fork on the parent's pod, a fork pulled to the other pod) placed and ticked, every figure reported
and the forks' first chunks bit-identical to the parent's."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import smoke_run

pytestmark = pytest.mark.slow  # two real worker processes (~1 min to start each on an idle machine)

ARMS = ("fresh", "fork-same-pod", "fork-other-pod")


def table(lines: list[str], first: str) -> list[dict[str, str]]:
    """The rows under the header line starting with `first` (up to the first line that is not one)."""
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    header = lines[start].split()
    rows = []
    for line in lines[start + 2 :]:
        if len(line.split()) != len(header):
            break
        rows.append(dict(zip(header, line.split(), strict=True)))
    return rows


def test_the_fork_benchmark_smoke_run_reports_its_three_arms_and_the_bytes() -> None:
    lines = smoke_run("fork.py", timeout=540)  # within pytest's 600 s, with a clear failure
    arms = {row["arm"]: row for row in table(lines, "arm")}
    assert set(arms) == set(ARMS)
    assert [int(arms[arm]["chunk"]) for arm in ARMS] == [0, 2, 2]  # the forks start at the kept chunk 2
    assert all(float(row["first_chunk_ms"]) > 0 for row in arms.values())
    assert float(arms["fresh"]["vs_fresh"]) == 1.0
    # the fork on the parent's pod holds the parent's blocks: it took fewer than the full copy on the other
    # pod, which shares none
    assert int(arms["fork-same-pod"]["shared_blocks"]) > 0
    assert int(arms["fork-other-pod"]["shared_blocks"]) == 0
    assert int(arms["fork-same-pod"]["kv_blocks"]) < int(arms["fork-other-pod"]["kv_blocks"])
    (sizes,) = table(lines, "size")
    assert (sizes["size"], sizes["kept"], sizes["forks_identical"]) == ("64", "2", "yes")
    # A kept 64x64 chunk is a whole export (~4 MB: KV, decoder, book); the other pod pulls one per fork.
    assert 1e6 < float(sizes["bytes_per_kept_chunk"]) < 2e7
    assert 1e6 < float(sizes["bytes_per_other_pod_fork"]) < 2e7
    assert float(sizes["parent_tick_ms"]) > 0
