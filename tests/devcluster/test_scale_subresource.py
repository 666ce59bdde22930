"""The scale subresource of the pool CRD as the session's real kube-apiserver serves it (issue 11 item 1):
`autoscaling/v1` Scale on GET/PUT/PATCH `.../ardiffusionworkerpools/<name>/scale`, discovery naming it, the
real `kubectl scale`, and the server refusing a CRD whose scale paths lie outside `.spec`/`.status`
(server-side dry-run of the changed CRD)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from ardiff.devcluster.cluster import CRD_DIR, DevCluster, load_manifests
from tests.conftest import Admission

GROUP = "/apis/ardiffusion.dev/v1alpha1"


def _pool(name: str = "scaled", **replicas: int) -> dict:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny-lingbot-world"},
            "image": "ghcr.io/ardiff/ardiff-worker:test",
            "replicas": replicas or {"min": 1, "max": 4},
        },
    }


@pytest.fixture
def client(dev_cluster: DevCluster) -> Iterator[httpx.Client]:
    with dev_cluster.admin.client() as http:
        yield http


@pytest.fixture
def pool_url(client: httpx.Client, kube_namespace: str) -> str:
    base = f"{GROUP}/namespaces/{kube_namespace}/ardiffusionworkerpools"
    assert client.post(base, json=_pool()).status_code == 201
    status = {"status": {"replicas": 3, "selector": "ardiffusion.dev/pool=scaled"}}
    patched = client.patch(
        f"{base}/scaled/status", json=status, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert patched.status_code == 200, patched.text
    return f"{base}/scaled"


def test_discovery_names_the_scale_subresource_as_autoscaling_v1(client: httpx.Client) -> None:
    resources = client.get(GROUP).json()["resources"]
    scale = next(r for r in resources if r["name"] == "ardiffusionworkerpools/scale")
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    assert sorted(scale["verbs"]) == ["get", "patch", "update"]
    assert not any(r["name"] == "ardiffusionsessions/scale" for r in resources)


def test_get_reads_the_pool_as_a_scale(client: httpx.Client, pool_url: str, kube_namespace: str) -> None:
    pool = client.get(pool_url).json()
    scale = client.get(f"{pool_url}/scale").json()
    assert scale == {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": "scaled",
            "namespace": kube_namespace,
            "uid": pool["metadata"]["uid"],
            "resourceVersion": pool["metadata"]["resourceVersion"],
            "creationTimestamp": pool["metadata"]["creationTimestamp"],
        },
        "spec": {"replicas": 1},
        "status": {"replicas": 3, "selector": "ardiffusion.dev/pool=scaled"},
    }


def test_put_and_patch_set_the_warm_floor_and_are_admitted_like_the_pool(
    client: httpx.Client, pool_url: str
) -> None:
    scale = client.get(f"{pool_url}/scale").json()
    scale["spec"]["replicas"] = 2
    put = client.put(f"{pool_url}/scale", json=scale)
    assert put.status_code == 200, put.text
    assert put.json()["spec"]["replicas"] == 2
    pool = client.get(pool_url).json()
    assert pool["spec"]["replicas"] == {"min": 2, "max": 4}
    assert pool["metadata"]["generation"] == 2  # a spec change
    assert pool["status"]["replicas"] == 3  # status untouched
    # The Scale's resourceVersion is a precondition: the one read before the PUT is stale now.
    assert client.put(f"{pool_url}/scale", json=scale).status_code == 409
    merge = {"Content-Type": "application/merge-patch+json"}
    patched = client.patch(f"{pool_url}/scale", json={"spec": {"replicas": 3}}, headers=merge)
    assert patched.status_code == 200, patched.text
    assert client.get(pool_url).json()["spec"]["replicas"]["min"] == 3
    # Above max: the pool's own CEL rule refuses it, naming the pool's field.
    refused = client.patch(f"{pool_url}/scale", json={"spec": {"replicas": 5}}, headers=merge)
    assert refused.status_code == 422
    assert refused.json()["details"]["causes"][0]["field"] == "spec.replicas.max"
    assert "max must be >= min" in refused.json()["message"]
    negative = client.patch(f"{pool_url}/scale", json={"spec": {"replicas": -1}}, headers=merge)
    assert negative.status_code == 422
    # Named at the pool's field (its schema's minimum), then at the scale path (a Scale's own rule).
    assert [(c["field"], c["message"]) for c in negative.json()["details"]["causes"]] == [
        (
            "spec.replicas.min",
            "Invalid value: -1: spec.replicas.min in body should be greater than or equal to 0",
        ),
        (".spec.replicas.min", "Invalid value: -1: should be a non-negative integer"),
    ]
    assert client.get(pool_url).json()["spec"]["replicas"]["min"] == 3


def test_a_resource_without_a_scale_subresource_has_none(client: httpx.Client, kube_namespace: str) -> None:
    url = f"{GROUP}/namespaces/{kube_namespace}/ardiffusionsessions/whatever/scale"
    assert client.get(url).status_code == 404


def test_kubectl_scale_sets_the_warm_floor(dev_cluster: DevCluster, pool_url: str, kube_namespace: str):
    def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return dev_cluster.kubectl("-n", kube_namespace, *args, check=check)

    scaled = kubectl("scale", "adpool/scaled", "--replicas=2")
    assert scaled.stdout.strip() == "ardiffusionworkerpool.ardiffusion.dev/scaled scaled"
    assert kubectl("get", "adpool", "scaled", "-o", "jsonpath={.spec.replicas.min}").stdout == "2"
    # --current-replicas is checked against the Scale's spec.replicas.
    refused = kubectl("scale", "adpool/scaled", "--current-replicas=1", "--replicas=3", check=False)
    assert refused.returncode != 0
    assert "Expected replicas to be 1, was 2" in refused.stderr
    too_many = kubectl("scale", "adpool/scaled", "--replicas=9", check=False)
    assert too_many.returncode != 0
    assert too_many.stderr == (
        'The ARDiffusionWorkerPool "scaled" is invalid: '
        "spec.replicas.max: Invalid value: max must be >= min\n"
    )


def _pool_crd() -> dict:
    (doc,) = [d for d in load_manifests(CRD_DIR) if d["metadata"]["name"].startswith("ardiffusionworker")]
    return doc


def test_the_pool_crd_declares_the_scale_subresource() -> None:
    (version,) = _pool_crd()["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas.min",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


@pytest.mark.parametrize(
    ("scale", "field", "message"),
    [
        ({"statusReplicasPath": ".status.replicas"}, "specReplicasPath", "Required value"),
        (
            {"specReplicasPath": ".status.replicas", "statusReplicasPath": ".status.replicas"},
            "specReplicasPath",
            'Invalid value: ".status.replicas": should be a json path under .spec',
        ),
        (
            {"specReplicasPath": ".spec.replicas.min", "statusReplicasPath": ".spec.replicas.max"},
            "statusReplicasPath",
            'Invalid value: ".spec.replicas.max": should be a json path under .status',
        ),
        (
            {
                "specReplicasPath": ".spec.replicas.min",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".metadata.labels",
            },
            "labelSelectorPath",
            'Invalid value: ".metadata.labels": should be a json path under either .spec or .status',
        ),
    ],
)
def test_crd_creation_refuses_scale_paths_like_the_apiserver(
    admission: Admission, scale: dict, field: str, message: str
) -> None:
    doc = copy.deepcopy(_pool_crd())
    doc["spec"]["versions"][0]["subresources"]["scale"] = scale
    refused = admission.create(doc)
    assert refused.code == 422, refused.body
    # A CRD whose one version has subresources: the server names them at spec.subresources.
    assert refused.errors == [f"spec.subresources.scale.{field}: {message}"]
