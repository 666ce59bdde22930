"""The soak (issue 40 item 5, `benchmarks/soak.py`) on the test session's cluster: a fixed seed for two
minutes, every kind of fault of the menu injected at least once, and no violation of the history, the end
states, the store's invariants or the clean-up; and its schedule, a pure function of the seed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import SHARED_TIER_CLAIM
from tests.benchmark_smoke import benchmark_module
from tests.e2e.conftest import Stack, running_stack

soak = benchmark_module("soak")
SEED = 3
SECONDS = 120.0
EVERY = 6.0


def test_the_schedule_is_the_seeds_and_each_round_has_every_kind_of_the_menu() -> None:
    first = soak.schedule(SEED, 600.0, EVERY)
    assert first == soak.schedule(SEED, 600.0, EVERY)
    assert first != soak.schedule(SEED + 1, 600.0, EVERY)
    menu = len(soak.FAULT_MENU)
    rounds = [first[i : i + menu] for i in range(0, len(first) - menu + 1, menu)]
    assert len(rounds) >= 3
    assert all(sorted(f.kind for f in one) == sorted(soak.FAULT_MENU) for one in rounds)
    gaps = [b.at - (a.at + a.seconds) for a, b in itertools.pairwise(first)]
    assert min(gaps) >= EVERY * 0.5 - 0.1
    assert max(gaps) <= EVERY * 1.5 + 0.1
    lasting = [f for f in first if f.kind.startswith("worker-") and f.kind != "worker-kill"]
    assert {f.ends_incarnation for f in lasting} == {True, False}  # short ones and ones past the lease
    assert all(
        f.seconds <= soak.SHORT_FAULT_SECONDS[1] for f in first if f.kind.startswith(("operator", "redis"))
    )
    assert all(f.seconds == 0 for f in first if f.kind.endswith(("kill", "restart")))


def target(stack: Stack):  # the benchmark's SoakTarget
    return soak.SoakTarget(
        stack.kube, stack.namespace, stack.pool, stack.redis, stack.operator, stack.sessions
    )


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e-soak")
    with running_stack(dev_cluster, "e2e-soak", workdir, soak.POOL, claims=[SHARED_TIER_CLAIM]) as running:
        soak.wait_ready_workers(target(running))
        yield running


def test_a_seeded_soak_finds_no_violation(stack: Stack, tmp_path: Path) -> None:
    runner = soak.Soak(target(stack), SEED, SECONDS, EVERY, sessions=3, workdir=tmp_path)
    report = runner.run()
    soak.print_report(report, SEED)
    assert report.violations == []
    scheduled = {f.kind for f in soak.schedule(SEED, SECONDS, EVERY)}
    assert scheduled == set(soak.FAULT_MENU)
    assert {kind for kind, n in report.faults.items() if n} == scheduled  # none skipped for want of a worker
    assert len(runner.injector.faults) == sum(report.faults.values())  # each logged with its start and end
    assert all(chunks >= 20 for chunks in report.chunks.values()), report.chunks
    # The faults were felt: incarnations ended, sessions served by more than one, answers refused meanwhile.
    assert report.ended >= 1
    assert max(report.incarnations.values()) >= 2
    assert report.refused
