"""Disruption budgets over worker Pods, computed as the disruption controller and the eviction API compute
them (`ardiff.devcluster.disruption`, ported from pkg/controller/disruption and the eviction registry), for
the operator's design (operator/disruption.py, docs/contracts.md §5): empty workers evictable at once, busy
ones protected, whatever the pool's Scale says."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import httpx
import pytest

from ardiff.devcluster.disruption import ScaleError, evict, pdb_status, selector_matches
from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.kv.records import PodRecord
from ardiff.operator.disruption import (
    BUSY_LABEL,
    build_busy_pdb,
    busy_pdb_name,
    pool_selector,
    sync_busy_pods,
)
from ardiff.operator.pods import pool_labels
from ardiff.operator.views import PodView

NS = "team-a"
POOL_UID = "uid-pool"


def pod(name: str, *, busy: bool = False, ready: bool = True, deleting: bool = False, owner: str = POOL_UID):
    labels = {**pool_labels("gpus"), **({BUSY_LABEL: "true"} if busy else {})}
    metadata: dict[str, Any] = {"name": name, "namespace": NS, "labels": labels}
    if owner:
        ref = {"apiVersion": "ardiffusion.dev/v1alpha1", "kind": "ARDiffusionWorkerPool", "name": "gpus"}
        metadata["ownerReferences"] = [{**ref, "uid": owner, "controller": True}]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": metadata, "status": {"phase": "Running", "conditions": [condition]}}


def pdb(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "generation": 1}, "spec": spec}


def scales(replicas: int):
    """The pool's Scale as the apiserver serves it (spec.replicas = spec.replicas.min)."""

    def lookup(ref: dict[str, Any], namespace: str) -> dict[str, Any] | None:
        assert (ref["kind"], ref["name"], namespace) == ("ARDiffusionWorkerPool", "gpus", NS)
        return {"metadata": {"uid": POOL_UID}, "spec": {"replicas": replicas}}

    return lookup


def no_scale_subresource(ref: dict[str, Any], namespace: str) -> dict[str, Any] | None:
    raise ScaleError("ardiffusionworkerpools.ardiffusion.dev does not implement the scale subresource")


def with_status(budget: dict[str, Any], pods: list[dict[str, Any]], lookup) -> dict[str, Any]:
    return {**budget, "status": pdb_status(budget, pods, lookup).as_status(1)}


WORKERS = {"matchLabels": pool_labels("gpus")}
BUSY = {"matchLabels": {**pool_labels("gpus"), BUSY_LABEL: "true"}}


def test_todays_chart_budget_blocks_every_drain_without_a_scale_subresource():
    """maxUnavailable needs the controller's scale: without the subresource the sync fails (failSafe)."""
    pods = [pod("gpus-a"), pod("gpus-b", busy=True)]
    status = pdb_status(pdb("w", {"maxUnavailable": 1, "selector": WORKERS}), pods, no_scale_subresource)
    assert (status.disruptions_allowed, status.error) == (
        0,
        "ardiffusionworkerpools.ardiffusion.dev does not implement the scale subresource",
    )


@pytest.mark.parametrize(
    ("spec", "scale", "expected", "desired", "allowed"),
    [
        ({"maxUnavailable": 1}, 2, 2, 1, 2),  # sized from the Scale (min = 2), not from the 3 pods
        ({"maxUnavailable": "50%"}, 3, 3, 1, 2),  # ceil(1.5) = 2 unavailable
        ({"minAvailable": "100%"}, 2, 2, 2, 1),
        ({"minAvailable": "50%"}, 3, 3, 2, 1),  # ceil(1.5)
        ({"minAvailable": 3}, 1, 5, 3, 0),  # an integer: the selected pods count, no controller involved
        ({"maxUnavailable": 0}, 0, 0, 0, 0),  # nothing expected: nothing allowed
    ],
)
def test_disruption_arithmetic(spec, scale, expected, desired, allowed):
    pods = [pod("gpus-a"), pod("gpus-b"), pod("gpus-c"), pod("gpus-d", ready=False), pod("x", deleting=True)]
    status = pdb_status(pdb("w", {**spec, "selector": WORKERS}), pods, scales(scale))
    assert (status.expected_pods, status.desired_healthy, status.current_healthy) == (expected, desired, 3)
    assert status.disruptions_allowed == allowed


def test_an_owner_of_another_uid_is_no_controller():
    status = pdb_status(
        pdb("w", {"maxUnavailable": 1, "selector": WORKERS}), [pod("a", owner="old")], scales(1)
    )
    assert status.error == 'found no controllers for pod "a"'
    assert status.disruptions_allowed == 0


def test_selectors_follow_label_selector_semantics():
    labels = {"a": "1", "b": "2"}
    assert selector_matches({}, labels)
    assert not selector_matches(None, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["x"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["2"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "b", "operator": "Exists"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, labels)


def test_max_unavailable_zero_over_busy_pods_lets_busy_pods_go_when_more_are_busy_than_min():
    """Why the operator does not use `maxUnavailable: 0`: the budget expects the Scale's replicas (min = 1),
    so with two busy pods one may be evicted, sessions and all."""
    pods = [pod("gpus-a", busy=True), pod("gpus-b", busy=True), pod("gpus-c")]
    naive = with_status(pdb("naive", {"maxUnavailable": 0, "selector": BUSY}), pods, scales(1))
    assert naive["status"]["disruptionsAllowed"] == 1
    assert evict(pods[0], [naive]).code == 201


def test_the_operators_budget_lets_a_drain_take_empty_workers_and_wait_for_busy_ones():
    pods = [pod("gpus-a", busy=True), pod("gpus-b", busy=True), pod("gpus-c"), pod("gpus-d")]
    budget = build_busy_pdb(NS, "gpus", 2)
    assert budget["metadata"]["name"] == busy_pdb_name("gpus") == "gpus-workers-busy"
    stored = with_status(budget, pods, scales(1))
    assert stored["status"] == {
        "observedGeneration": 1,
        "expectedPods": 2,
        "desiredHealthy": 2,
        "currentHealthy": 2,
        "disruptionsAllowed": 0,
    }
    for empty in pods[2:]:
        assert evict(empty, [stored]).code == 201
    refused = evict(pods[0], [stored])
    assert refused.code == 429
    assert refused.message.endswith(
        "The disruption budget gpus-workers-busy needs 2 healthy pods and has 2 currently"
    )
    # Whatever the Scale (an HPA may have raised min): the integer minAvailable ignores it.
    assert pdb_status(budget, pods, scales(7)).disruptions_allowed == 0
    # A busy pod that is not Ready (its sessions are Lost already) does not block the drain.
    sick = pod("gpus-b", busy=True, ready=False)
    stored = with_status(budget, [pods[0], sick], scales(1))
    assert stored["status"]["disruptionsAllowed"] == 0
    assert evict(sick, [stored]).code == 201
    assert evict(pods[0], [stored]).code == 429


def test_a_worker_budget_beside_the_operators_makes_busy_pods_unevictable_by_any_means():
    pods = [pod("gpus-a", busy=True), pod("gpus-b")]
    chart_budget = with_status(pdb("w", {"maxUnavailable": 1, "selector": WORKERS}), pods, scales(1))
    busy_budget = with_status(build_busy_pdb(NS, "gpus", 1), pods, scales(1))
    assert evict(pods[0], [chart_budget, busy_budget]).code == 500


def test_a_budget_not_yet_observed_refuses():
    budget = {**build_busy_pdb(NS, "gpus", 1), "status": {"observedGeneration": 0, "disruptionsAllowed": 3}}
    budget["metadata"]["generation"] = 1
    assert evict(pod("gpus-a", busy=True), [budget]).code == 429


class RecordingKube:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.pdb: dict[str, Any] | None = None

    async def create_or_get(self, resource, body):
        self.calls.append(("create_or_get", body["spec"]["minAvailable"]))
        if self.pdb is None:
            self.pdb = body
        return self.pdb

    async def patch(self, resource, namespace, name, body, *, subresource=None):
        if resource.plural == "poddisruptionbudgets":
            self.calls.append(("budget", body["spec"]["minAvailable"]))
        else:
            self.calls.append(("label", name, body["metadata"]["labels"][BUSY_LABEL]))
        return True


def _record(name: str, used: int) -> PodRecord:
    return PodRecord(name, capacity=2, used=used, endpoint="", epoch=1, lease_expires_ms=0, draining=False)


def test_the_operator_raises_the_budget_before_labelling_and_lowers_it_after_unlabelling():
    kube = RecordingKube()
    ctx = types.SimpleNamespace(kube=kube, busy_budgets={})
    pool = types.SimpleNamespace(
        namespace=NS,
        name="gpus",
        reference={
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionWorkerPool",
            "metadata": {"name": "gpus", "namespace": NS, "uid": POOL_UID},
        },
    )
    views = [
        PodView("gpus-a", True, False),
        PodView("gpus-b", True, False, busy=True),
        PodView("gpus-c", True, False),
    ]
    live = {"gpus-a": _record("gpus-a", 1), "gpus-b": _record("gpus-b", 0), "gpus-c": _record("gpus-c", 0)}
    asyncio.run(sync_busy_pods(ctx, pool, views, live))
    assert kube.calls == [
        ("create_or_get", 2),  # one labelled (b) + one to label (a): raised first
        ("label", "gpus-a", "true"),
        ("label", "gpus-b", None),
        ("budget", 1),  # lowered after b lost its label
    ]
    assert kube.pdb is not None
    assert kube.pdb["metadata"]["ownerReferences"][0]["uid"] == POOL_UID
    assert kube.pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    kube.calls.clear()
    views = [
        PodView("gpus-a", True, False, busy=True),
        PodView("gpus-b", True, False),
        PodView("gpus-c", True, False),
    ]
    asyncio.run(sync_busy_pods(ctx, pool, views, live))
    assert kube.calls == []  # in line: no API call


def test_pool_selector_is_the_serialized_label_selector():
    assert pool_selector("gpus") == (
        "app.kubernetes.io/component=worker,app.kubernetes.io/name=ardiff,ardiffusion.dev/pool=gpus"
    )


def test_the_busy_budget_is_admitted_by_the_dev_clusters_core_validation(
    kube_api: KubeAPIThread, kube_namespace
):
    with httpx.Client(base_url=kube_api.url) as client:
        url = f"/apis/policy/v1/namespaces/{kube_namespace}/poddisruptionbudgets"
        body = build_busy_pdb(kube_namespace, "gpus", 3)
        created = client.post(url, json=body)
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["minAvailable"] == 3
