"""`benchmarks/transfer.py --smoke` runs: the pod-to-pod transfer code alone on loopback, per side, against
the puller before issue 42, into the staging memory and over TLS, with the checksums' cost (the transfer
code's benchmark once died at its call of `transfer.download`, unnoticed)."""

from __future__ import annotations

from tests.benchmark_smoke import smoke_run

PATHS = (
    "download into one buffer (now)",
    "the same, into staging memory",
    "httpx streamed pieces (before)",
    "download into one buffer, TLS",
)


def test_the_transfer_benchmark_smoke_run_reports_each_path_per_side() -> None:
    lines = smoke_run("transfer.py", timeout=120)
    assert lines[0].startswith("pod-to-pod transfer on loopback: a synthetic 0.03 GiB export, median of 1")
    assert " ".join(lines[1].split()) == "path GB/s puller CPU s/GB of it the pull holder CPU s/GB"
    for path in PATHS:
        (row,) = [line for line in lines if line.startswith(path)]
        rate, puller, pull, holder = (float(value) for value in row.removeprefix(path).split())
        assert min(rate, pull, holder) > 0
        assert puller >= pull
    (memory,) = [line for line in lines if line.startswith("filling fresh memory: ")]
    assert float(memory.split("once touched")[0].split("; ")[1]) > 0
    (ratio,) = [line for line in lines if line.startswith("now against before: ")]
    assert float(ratio.split("now against before: ")[1].split("x")[0]) > 0
    assert float(ratio.split("staging memory against fresh: ")[1].split("x")[0]) > 0
    assert float(ratio.split("its first pull filled it: ")[1].split(" CPU")[0]) > 0
    (checksum,) = [line for line in lines if line.startswith("the checksum alone: XXH3-128 (version 2) ")]
    assert float(checksum.split("SHA-256 (version 1) ")[1].split(":")[0]) > 0
