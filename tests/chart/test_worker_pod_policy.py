"""The chart's ValidatingAdmissionPolicy on the real API server (issue 23 item 7): a pool in a served
namespace that asks for a hostPath, another ServiceAccount or root is refused at admission, with the field
named; one within the allowlists is admitted; a namespace the release does not serve is left to the
operator's check."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.waiting import wait_until
from tests.chart.conftest import Chart
from tests.conftest import DRY_RUN_NAMESPACE, Admission

pytestmark = pytest.mark.slow
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
VALUES = {
    "operator": {"watchNamespaces": [DRY_RUN_NAMESPACE]},
    "workerPods": {"allowedServiceAccounts": ["viewer"]},
}


def pool(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": "worlds"},
        "spec": {
            "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
            "model": {"name": "tiny-lingbot-world"},
            "replicas": {"min": 0, "max": 1},
            **spec,
        },
    }


@pytest.fixture(scope="module")
def policy(dev_cluster: DevCluster, admission: Admission) -> Iterator[Admission]:
    """The chart's policy and binding (release `policy`, serving the dry-run namespace), installed."""
    chart = Chart(release="policy", namespace=DRY_RUN_NAMESPACE)
    objects = chart.render(VALUES, "--show-only", "templates/worker-pod-policy.yaml")
    assert [o["kind"] for o in objects] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    with dev_cluster.admin.client() as client:
        for path, obj in zip((POLICIES, BINDINGS), objects, strict=True):
            reply = client.post(path, json=obj)
            assert reply.status_code == 201, reply.text
        hostile = pool(volumes=[{"name": "host", "hostPath": {"path": "/etc"}}])
        # A new binding takes effect once the API server has compiled its policy (within a second or so).
        wait_until(lambda: not admission.create(hostile).admitted, timeout=30, what="the policy in effect")
        yield admission
        for path, obj in zip((BINDINGS, POLICIES), reversed(objects), strict=True):
            client.delete(f"{path}/{obj['metadata']['name']}")


def test_the_policy_compiles_and_names_what_it_refuses(policy: Admission, dev_cluster: DevCluster) -> None:
    with dev_cluster.admin.client() as client:
        status = client.get(f"{POLICIES}/policy-ardiff-worker-pods").json().get("status") or {}
    assert (status.get("typeChecking") or {}).get("expressionWarnings") in (None, [])

    verdict = policy.create(
        pool(
            volumes=[
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/etc"}},
                {"name": "share", "nfs": {"server": "10.0.0.1", "path": "/"}},
            ]
        )
    )
    assert verdict.code == 403
    assert verdict.message.endswith(
        "spec.volumes: host (hostPath); share (nfs): volume type not allowed (allowed: configMap, csi, "
        "downwardAPI, emptyDir, ephemeral, image, persistentVolumeClaim, projected, secret)"
    )
    assert "policy-ardiff-worker-pods" in verdict.message
    verdict = policy.create(pool(serviceAccountName="deployer"))
    assert verdict.code == 403
    assert verdict.message.endswith(
        "spec.serviceAccountName deployer is not allowed (allowed: default, viewer)"
    )
    verdict = policy.create(pool(securityContext={"runAsUser": 0}))
    assert verdict.code == 403
    assert verdict.message.endswith("spec.securityContext.runAsUser 0 (root) is not allowed")


def test_a_pool_within_the_allowlists_is_admitted_and_an_update_is_checked_too(policy: Admission) -> None:
    allowed = pool(
        volumes=[{"name": "worlds", "persistentVolumeClaim": {"claimName": "worlds"}}],
        serviceAccountName="viewer",
        securityContext={"runAsUser": 1000},
    )
    assert policy.create(allowed).admitted
    assert policy.create(pool()).admitted
    stored = {**allowed, "metadata": {"name": "escalating"}}
    escalated = {
        **pool(volumes=[{"name": "host", "hostPath": {"path": "/"}}]),
        "metadata": {"name": "escalating"},
    }
    try:
        verdict = policy.update(stored, escalated, namespace=DRY_RUN_NAMESPACE)
    finally:
        policy.client.delete(f"{policy.collection(stored, DRY_RUN_NAMESPACE)}/escalating")
    assert verdict.code == 403
    assert "host (hostPath): volume type not allowed" in verdict.message


def test_a_namespace_the_release_does_not_serve_is_not_bound(policy: Admission, kube_namespace: str) -> None:
    hostile = pool(securityContext={"runAsUser": 0})
    assert policy.create(
        hostile, namespace=kube_namespace
    ).admitted  # the operator serving it refuses it then
