"""`benchmarks/kube_client.py --smoke` runs on a dev cluster of its own: each installed client's three calls
at both concurrencies, timed and costed against the operator's own client."""

from __future__ import annotations

import importlib.util

import pytest

from tests.benchmark_smoke import markdown_rows, number, smoke_run

pytestmark = pytest.mark.slow  # a control plane of its own (~20 s to start)

OURS = "operator/kube.py (kubernetes_asyncio ApiClient, dicts)"


def test_the_kube_client_benchmark_smoke_run_costs_every_call_of_every_client() -> None:
    rows = markdown_rows(smoke_run("kube_client.py", timeout=300), "call")
    clients = {OURS, "kubernetes_asyncio 36 typed APIs, bare (aiohttp)"}
    if importlib.util.find_spec("kr8s") is not None:
        clients.add("kr8s 0.20 (httpx)")
    seen = {(row["call"], row["concurrency"], row["client"]) for row in rows}
    calls = ("patch status", "get secret", "create secret")
    assert seen == {(call, width, client) for call in calls for width in ("1", "4") for client in clients}
    for row in rows:
        assert number(row["wall µs/call"]) > 0
        assert number(row["CPU µs/call"]) > 0
        assert number(row["wall ÷ ours"]) > 0
        if row["client"] == OURS:
            assert (row["wall ÷ ours"], row["CPU ÷ ours"]) == ("1.00", "1.00")  # the baseline against itself
