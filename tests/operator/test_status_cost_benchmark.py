"""`benchmarks/status_cost.py --smoke` runs on the test session's API server: every arm's sessions created and
their statuses patched, each arm's API server + etcd CPU per patch reported beside the baseline's."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from ardiff.devcluster.cluster import DevCluster
from tests.benchmark_smoke import benchmark_module, number

PREFIX = "bench-status"


@pytest.fixture
def status_cost(dev_cluster: DevCluster) -> Iterator[ModuleType]:
    """The benchmark's module; its namespaces and its copy of the session CRD deleted afterwards."""
    module = benchmark_module("status_cost")
    yield module
    with dev_cluster.admin.client() as client:
        for r in range(module.SMOKE.rounds):
            for i in range(len(module.ARMS)):
                client.delete(f"/api/v1/namespaces/{PREFIX}-{r}-{i}")
        crd = module.granular_session_crd()["metadata"]["name"]
        client.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")


def test_the_status_cost_benchmark_smoke_run_costs_every_arm(
    dev_cluster: DevCluster, status_cost: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    smoke = status_cost.SMOKE
    status_cost.report(status_cost.measure(dev_cluster, smoke, prefix=PREFIX), smoke)
    lines = capsys.readouterr().out.splitlines()
    assert f"{smoke.sessions} status patches per arm and round, 2 clients, 2 rounds" in lines
    rows = {}
    for arm in status_cost.ARMS:
        (line,) = [line for line in lines if line.startswith(f"{arm:<26}")]
        json_bytes, *rounds, median, ratio = line[26:].replace(",", " ").split()
        rows[arm] = (int(json_bytes), [float(value) for value in rounds], float(median), number(ratio))
    for _, rounds, median, ratio in rows.values():
        assert len(rounds) == 2
        assert all(value > 0 for value in rounds)  # the API server and etcd spent CPU on the patches
        assert min(rounds) <= median <= max(rounds)
        assert ratio > 0
    assert rows["phase only (baseline)"][3] == 1.0
    # the admission status is many times the phase alone; without its conditions, smaller
    assert rows["admission"][0] > rows["admission, no conditions"][0] > 5 * rows["phase only (baseline)"][0]
    assert rows["admission, field by field"][0] == rows["admission"][0]
