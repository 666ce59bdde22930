"""`kubectl drain` of the node that holds a live session: the operator (with --follow-drains) notices the
cordon, starts a Pod on the other node, moves the session there through the shared tier, and the drain —
held by the pool's busy-Pod budget until then — completes within its timeout; the session continues at its
next chunk.

Everything is the real thing: the cordon and the evictions are kubectl's, the budget's arithmetic is the
disruption controller's, the replacement's node is the scheduler's choice. The worker Pods run the fake
runtime (its export is small; tests/e2e/test_real_cluster.py moves the real model's sessions).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ardiff import client
from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import SHARED_TIER_CLAIM, build_pool, with_shared_tier
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

POOL = with_shared_tier(build_pool("drained", capacity=2, min_replicas=1, max_replicas=2, fake=True))
DRAIN_TIMEOUT_SECONDS = 150


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(
        dev_cluster,
        "e2e-drain",
        tmp_path_factory.mktemp("e2e-drain"),
        POOL,
        claims=[SHARED_TIER_CLAIM],
        operator_env={"ARDIFF_OPERATOR_FOLLOW_DRAINS": "1"},
    ) as running:
        wait_until(lambda: len(running.ready_pods()) == 1, timeout=120, what="the pool's first pod")
        yield running


def test_a_drain_moves_the_live_session_to_the_other_node_and_completes(stack: Stack) -> None:
    name = stack.session("walker", seed=5)
    status = stack.sessions.wait_ready(name, timeout=120)
    first_pod = status["pod"]
    node = stack.pods()[first_pod]["spec"]["nodeName"]
    with stack.connect(name) as walker:
        for _ in range(3):
            walker.tick([client.hold("w")])
        assert walker.next_chunk_index == 3
        started = time.monotonic()
        try:
            drained = stack.kubectl(
                "drain",
                node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                f"--timeout={DRAIN_TIMEOUT_SECONDS}s",
                check=False,
            )
        finally:
            took = time.monotonic() - started
            stack.kubectl("uncordon", node)
        assert drained.returncode == 0, drained.stdout + drained.stderr + stack.operator.log()[-4000:]
        print(f"drain of {node} completed in {took:.1f} s")
        assert f"node/{node} drained" in drained.stdout
        # The session lives on the pool's new Pod, on the other node, and continues where it was.
        moved = stack.sessions.wait_ready(name, timeout=60)
        assert moved["pod"] != first_pod
        assert stack.pods()[moved["pod"]]["spec"]["nodeName"] != node
        assert moved["resetRequired"] is False
        # The old Pod is gone (evicted): its address answers nothing, which sends a client back to the
        # session's status for the new endpoint (docs/contracts.md §4).
        with pytest.raises(client.WorkerUnreachable):
            walker.tick([client.hold("w")])
    with stack.connect(name) as walker:
        assert (walker.endpoint, walker.next_chunk_index) == (moved["endpoint"], 3)
        chunk = walker.tick([client.hold("w")])
        assert chunk.metadata.chunk_index == 3
    reasons = {event.reason for event in stack.sessions.events(name)}
    assert "Transferred" in reasons, reasons
    assert first_pod not in stack.pods()
    assert stack.invariants() == []
