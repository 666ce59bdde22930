"""`benchmarks/scale_operator.py --smoke` runs on a dev cluster of its own with simulated pods: one tiny size
seeded, idle rounds sampled, a burst applied, the operator restarted (patched and not) and taken over, every
figure reported and the ratio table printed."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import rows_under, smoke_run

pytestmark = pytest.mark.slow  # a dev cluster of its own and five operator starts (~45 s)


def test_the_scale_operator_benchmark_smoke_run_reports_every_figure_of_its_size() -> None:
    lines = smoke_run("scale_operator.py", timeout=540)
    # pods, sessions, seed "redis / API" s, B/session, caught up s, round "p50 / p99" s, writes/round,
    # op "RSS / peak" MiB, "API / etcd" MiB, etcd DB MiB, burst "p50 / p99" s, all Ready s,
    # rounds in burst "N (max s)", restart "serving / 1st round" s, unpatched "serving / 1st round" s,
    # takeover s
    (row,) = rows_under(lines, "pods sessions seed", cells=31)
    assert row[:2] == ["2", "20"]
    assert row[3] == row[8] == row[12] == row[15] == row[19] == row[25] == row[28] == "/"
    seed_redis, seed_api, per_session, caught_up = float(row[2]), float(row[4]), float(row[5]), float(row[6])
    assert seed_redis >= 0
    assert seed_api >= 0
    assert 1_000 < per_session < 1e6  # Redis bytes per session
    assert caught_up > 0
    assert 0 < float(row[7]) <= float(row[9])  # an idle round's p50 <= p99
    assert float(row[10]) >= 0  # API writes per idle round
    assert 50 < float(row[11]) <= float(row[13])  # the operator's RSS, then its peak
    assert float(row[14]) > 0
    assert float(row[16]) > 0
    assert float(row[17]) > 0  # etcd's database
    assert 0 < float(row[18]) <= float(row[20])  # the burst's p50 <= p99
    assert float(row[21]) >= float(row[20])  # first apply → last Ready spans every session's latency
    assert int(row[22]) >= 0
    for serving, first_round in ((row[24], row[26]), (row[27], row[29])):  # restart, kopf unpatched
        assert 0 < float(serving) <= float(first_round)
    assert float(row[30]) > 0  # the standby's first round after the active operator's kill
    (ratios,) = rows_under(lines, "pods sessions   round p50 s", cells=10)
    assert ratios == ["2", "20", *["1.0x"] * 8]  # the only size is its own baseline
