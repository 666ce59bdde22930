"""The soak (issue 40 item 5, `benchmarks/soak.py`) on the test session's cluster: a fixed seed for two
minutes, every kind of fault of the menu injected at least once, and no violation of the history, the end
states, the store's invariants or the clean-up; then each held fault until its alert fires on a real
Prometheus (the chart's rules, their `for`s a few seconds); and its schedule, a pure function of the seed."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import SHARED_TIER_CLAIM
from ardiff.devcluster.prometheus import Prometheus, rules_held_for
from tests.benchmark_smoke import benchmark_module, rows_under
from tests.chart.test_alerts import dashboard_queries
from tests.e2e.conftest import Stack, running_stack

soak = benchmark_module("soak")
soak_alerts = benchmark_module("soak_alerts")
SEED = 3
FAULT_ROWS = [[kind] for kind in soak.FAULT_MENU]
SECONDS = 120.0
EVERY = 6.0
ALERTS_HELD_FOR = 5  # seconds: the rules' `for` in the test's Prometheus


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


def test_the_report_tells_each_alert_after_the_fault_before_it_and_counts_the_quiet_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lost, store = "ArdiffSessionsLost{pool=p}", "ArdiffPlacementStoreUnreachable{pool=p}"
    report = soak.SoakReport(
        faults=collections.Counter({"worker-kill": 1, "redis-pause": 1}),
        skipped=collections.Counter(),
        outcomes={"s": collections.Counter({"connections": 2, "rewound": 1, "worker_unreachable": 1})},
        chunks={"s": 40},
        incarnations={"s": 2},
        refused=collections.Counter({"503 not_ready": 3}),
        ended=1,
        injected=[(100.0, "worker-kill"), (110.0, "redis-pause")],
        alerts=[
            soak_alerts.AlertEpisode(lost, 80.0, fired=False),  # in the quiet phase
            soak_alerts.AlertEpisode(lost, 105.0, fired=False),
            soak_alerts.AlertEpisode(store, 111.0, fired=True),
            soak_alerts.AlertEpisode(store, 400.0, fired=False),  # past the window: no fault's
            soak_alerts.AlertEpisode(lost, 160.0, fired=True),  # a held fault's, not the last scheduled one's
        ],
        held=[
            soak_alerts.SustainedFault("redis-pause", "ArdiffPlacementStoreUnreachable", 150.0, 71.25),
            soak_alerts.SustainedFault("worker-partition", "ArdiffSessionsLost", 300.0, None),
        ],
        quiet_until=90.0,
        answers=50,
        violations=[],
        wall_s=130.0,
    )
    soak.print_report(report, SEED)
    lines = capsys.readouterr().out.splitlines()
    assert rows_under(lines, "session", 7) == [["s", "40", "2", "2", "0", "1", "1"]]
    assert rows_under(lines, "alert ", 3) == [[store, "2", "1"], [lost, "3", "1"]]
    assert "(the chart's rules, a real Prometheus): 5 episodes, 1 quiet" in "\n".join(lines)
    table = next(i for i, line in enumerate(lines) if line.startswith("fault") and "alerts active" in line)
    rows = itertools.takewhile(bool, lines[table:])  # up to the blank line before the held faults' table
    after = {
        cells[0]: cells[2] for cells in (line.split(None, 2) for line in rows) if cells[:1] in FAULT_ROWS
    }
    assert after["worker-kill"] == "ArdiffSessionsLost 1"
    assert after["redis-pause"] == "ArdiffPlacementStoreUnreachable 1"
    assert after["etcd-restart"] == "none"
    assert rows_under(lines, "held fault", 3) == [
        ["redis-pause", "ArdiffPlacementStoreUnreachable", "71.2"],
        ["worker-partition", "ArdiffSessionsLost", "never"],
    ]
    assert "violations: 0" in lines


def test_the_alert_watch_gives_each_episode_once_in_order_of_alert_and_time() -> None:
    watch = soak_alerts.AlertWatch(prometheus=None)
    watch.episodes = {("b{}", 5.0): True, ("a{}", 9.0): False, ("a{}", 2.0): False}
    assert watch.stop() == [
        soak_alerts.AlertEpisode("a{}", 2.0, fired=False),
        soak_alerts.AlertEpisode("a{}", 9.0, fired=False),
        soak_alerts.AlertEpisode("b{}", 5.0, fired=True),
    ]
    assert soak_alerts.alert_time("2026-12-07T18:00:01.250000000Z") == 1796666401.25


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e-soak")
    with running_stack(
        dev_cluster, "e2e-soak", workdir, soak.POOL, claims=[SHARED_TIER_CLAIM], metrics=True
    ) as running:
        soak.wait_ready_workers(running.bench_target())
        yield running


def test_a_seeded_soak_finds_no_violation(stack: Stack, tmp_path: Path) -> None:
    target = stack.bench_target()
    assert target.metrics_url is not None
    workers = {
        f"http://{pod['status']['podIP']}:8000/metrics": {"namespace": stack.namespace, "pod": name}
        for name, pod in target.worker_pods().items()
    }
    rules = rules_held_for(ALERTS_HELD_FOR, tmp_path)
    prometheus = Prometheus([target.metrics_url, *workers], rule_files=(rules,), target_labels=workers)
    with prometheus:
        runner = soak.Soak(
            target,
            SEED,
            SECONDS,
            EVERY,
            sessions=3,
            workdir=tmp_path,
            prometheus=prometheus,
            hold_faults=True,
        )
        report = runner.run()
        # What whoever runs it looks at: every panel of the chart's dashboard shows the soak's series — but
        # the front door's (the soak has none) and the pod-to-pod transfers' (its sessions move through their
        # snapshots in the shared tier, never pulled from a live Pod).
        variables = {"$namespace": stack.namespace, "$pool": stack.pool}
        absent = ("ardiff_gateway_", "ardiff_session_transfer_bytes_total")
        empty = [
            query
            for query in dashboard_queries(variables)
            if not any(series in query for series in absent) and not prometheus.query(query)
        ]
    soak.print_report(report, SEED)
    assert empty == []
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
    # Each held fault fired its alert (the rules' expressions as shipped, their `for`s 5 s), and was logged: a
    # pause of Redis, a partition of each worker.
    assert [(h.kind, h.alert) for h in report.held] == list(soak_alerts.SUSTAINED_FAULTS)
    assert all(h.fired_after is not None and h.fired_after >= ALERTS_HELD_FOR for h in report.held)
    assert len(runner.held_injector.faults) == 1 + len(workers)
