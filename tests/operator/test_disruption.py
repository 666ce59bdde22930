"""A drain over a pool run by the real operator (issue 11 item 1): the pool's Scale and `status.selector`,
the busy label on the pod that holds a session, the pool's `<pool>-workers-busy` budget, and what the real
disruption controller (the budget's status) and the eviction API (dry-run evictions: the budget is checked,
nothing is deleted) let a drain do."""

from __future__ import annotations

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.operator.disruption import BUSY_LABEL
from tests.operator.conftest import GROUP_PATH, Cluster

pytestmark = pytest.mark.slow


def test_a_drain_evicts_the_empty_worker_and_waits_for_the_busy_one(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_pool(replicas={"min": 2, "max": 2})
    cluster.wait_pods(2)
    cluster.create_session("walk")
    busy_pod = cluster.wait_phase("walk", "Ready")["pod"]
    budget_path = f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets"

    def labelled() -> dict | None:
        pods = {p["metadata"]["name"]: p for p in cluster.pods()}
        budget = cluster.http.get(f"{budget_path}/pool-workers-busy")
        if budget.status_code != 200 or budget.json()["spec"]["minAvailable"] != 1:
            return None
        busy = {n for n, p in pods.items() if p["metadata"]["labels"].get(BUSY_LABEL) == "true"}
        return {"pods": list(pods.values()), "budget": budget.json()} if busy == {busy_pod} else None

    seen = wait_until(labelled, what="the busy label and the pool's budget")
    scale_url = f"{GROUP_PATH.format(ns=cluster.namespace)}/ardiffusionworkerpools/pool/scale"
    scale = cluster.http.get(scale_url).json()
    assert scale["spec"]["replicas"] == 2
    selector = "app.kubernetes.io/component=worker,app.kubernetes.io/name=ardiff,ardiffusion.dev/pool=pool"
    assert scale["status"] == {"replicas": 2, "selector": selector}

    budget = seen["budget"]
    assert budget["spec"]["selector"]["matchLabels"][BUSY_LABEL] == "true"
    assert budget["metadata"]["ownerReferences"][0]["kind"] == "ARDiffusionWorkerPool"

    # The disruption controller's verdict on the budget: one busy pod, which must stay.
    def observed() -> dict | None:
        found = cluster.http.get(f"{budget_path}/pool-workers-busy").json()
        status = found.get("status") or {}
        current = status.get("observedGeneration") == found["metadata"]["generation"]
        return status if current and status.get("expectedPods") == 1 else None

    status = wait_until(observed, what="the disruption controller to observe the budget")
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (1, 1, 0)

    def evict(pod: str) -> int:
        """A dry-run eviction, as `kubectl drain --dry-run=server` asks: the answer, nothing deleted."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": cluster.namespace},
            "deleteOptions": {"dryRun": ["All"]},
        }
        reply = cluster.http.post(f"/api/v1/namespaces/{cluster.namespace}/pods/{pod}/eviction", json=body)
        if reply.status_code == 429:
            assert "would violate the pod's disruption budget" in reply.json()["message"]
        return reply.status_code

    verdicts = {name: evict(name) for name in cluster.pod_names()}
    assert verdicts == {name: 429 if name == busy_pod else 201 for name in verdicts}
    assert len(verdicts) == 2
    assert cluster.pod_names() == set(verdicts)  # dry run: both still there

    # The session ends: the pod is empty again, loses its label, and the budget protects nothing.
    cluster.delete("ardiffusionsessions", "walk")

    def released() -> bool:
        budget = cluster.http.get(f"{budget_path}/pool-workers-busy").json()
        labels = [p["metadata"]["labels"].get(BUSY_LABEL) for p in cluster.pods()]
        return budget["spec"]["minAvailable"] == 0 and labels == [None, None]

    wait_until(released, what="the busy label and budget released")
