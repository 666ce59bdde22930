"""`benchmarks/cold_start.py`'s smoke run (issue 42: every benchmark has one, so that none rots): one run of
scale from zero and back on the test session's cluster, in a namespace of its own with the real operator
serving its metrics and real tiny workers; the table's events in the order they happen and the operator's
placement histogram counting both sessions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ardiff.devcluster.bench_target import BenchTarget
from ardiff.devcluster.cluster import DevCluster
from tests.benchmark_smoke import benchmark_module
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.slow
cold_start = benchmark_module("cold_start")
EVENTS = [
    "pod created",
    "pending PodStarting",
    "pod Ready",
    "session Ready",
    "first chunk",
    "warm session Ready",
    "back to zero pods",
]


@pytest.fixture(scope="module")
def target(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchTarget]:
    workdir = tmp_path_factory.mktemp("e2e-cold-start")
    with running_stack(dev_cluster, "e2e-cold", workdir, cold_start.POOL, metrics=True) as stack:
        yield stack.bench_target()


def test_the_cold_start_benchmark_smoke_run_times_each_step_from_zero_pods_and_back(
    target: BenchTarget, capsys: pytest.CaptureFixture[str]
) -> None:
    result = cold_start.one_run(target, 0)
    assert target.metrics_url is not None
    count, total = cold_start.placement_histogram(target.metrics_url)
    cold_start.print_report([result], count, total)
    lines = capsys.readouterr().out.splitlines()
    times = result["times"]
    assert sorted(times) == sorted(EVENTS)
    header = next(i for i, line in enumerate(lines) if line.startswith("event"))
    for line, event in zip(lines[header + 2 :], times, strict=False):  # one run: min = median = max
        assert line.split()[-3:] == [f"{times[event]:.2f}"] * 3, line
        assert line.startswith(event), line
    # The cold path in the order it happens (each stamped when first seen, polling every 50 ms; the Pod may be
    # seen before or after the session's status says it starts).
    cold = [times[event] for event in ("pod created", "pod Ready", "session Ready", "first chunk")]
    assert cold == sorted(cold), times
    assert times["pending PodStarting"] <= times["session Ready"], times
    assert all(t > 0 for t in times.values()), times
    assert "pod" in result["message"], result["message"]  # the Pending session says a pod is starting
    assert float(result["startup"]) > 0  # status.lastPodStartupSeconds, what the next cold message quotes
    assert count == 2  # both sessions placed, each observed once by the operator's histogram
    assert total > 0
