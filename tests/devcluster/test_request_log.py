"""KubeAPI.request_log: the resource requests of a followed client as RBAC authorizes them."""

from __future__ import annotations

import httpx

from ardiff.devcluster.request_log import OWNER_REFERENCES_PERMISSION_ENFORCEMENT, ApiRequest, rbac_verb


def test_requests_of_a_followed_token_are_recorded_as_rbac_verbs(kube_api, kube_namespace):
    ns, log = kube_namespace, kube_api.api.request_log
    log.follow("recorded")
    headers = {"Authorization": "Bearer recorded"}
    pool_path = f"/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}/ardiffusionworkerpools"
    pool = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": "p"},
        "spec": {"model": {"name": "tiny-lingbot-world"}, "image": "w:1"},
    }
    with httpx.Client(base_url=kube_api.url, headers=headers, timeout=10) as client:
        client.get("/api/v1")  # discovery: not a resource request
        uid = client.post(pool_path, json=pool).json()["metadata"]["uid"]
        owner = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionWorkerPool",
            "name": "p",
            "uid": uid,
            "blockOwnerDeletion": True,
        }
        secret = {"metadata": {"name": "s", "ownerReferences": [owner]}, "stringData": {"k": "v"}}
        client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret)
        client.get(f"/api/v1/namespaces/{ns}/secrets/s")
        client.get(f"/api/v1/namespaces/{ns}/configmaps")
        client.patch(
            f"{pool_path}/p/status",
            json={"status": {}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        client.get(f"{pool_path}/p/scale")
        client.delete(f"/api/v1/namespaces/{ns}/secrets/s")
        client.delete(f"/api/v1/namespaces/{ns}/configmaps")
        # Another client (the default token) is not recorded.
        httpx.get(f"{kube_api.url}/api/v1/namespaces/{ns}/pods")
    recorded = log.forget("recorded")
    group = "ardiffusion.dev"
    assert recorded == [
        ApiRequest("create", group, "ardiffusionworkerpools", None, ns),
        ApiRequest("create", "", "secrets", None, ns),
        ApiRequest(
            "update",
            group,
            "ardiffusionworkerpools",
            "finalizers",
            ns,
            "p",
            implied_by=OWNER_REFERENCES_PERMISSION_ENFORCEMENT,
        ),
        ApiRequest("get", "", "secrets", None, ns, "s"),
        ApiRequest("list", "", "configmaps", None, ns),
        ApiRequest("patch", group, "ardiffusionworkerpools", "status", ns, "p"),
        ApiRequest("get", group, "ardiffusionworkerpools", "scale", ns, "p"),
        ApiRequest("delete", "", "secrets", None, ns, "s"),
        ApiRequest("deletecollection", "", "configmaps", None, ns),
    ]
    assert recorded[5].rbac_resource == "ardiffusionworkerpools/status"
    assert log.requests("recorded") == []  # forgotten: no longer recorded


def test_rbac_verbs_follow_the_apiservers_request_info():
    assert rbac_verb("GET", named=True, watch=False) == "get"
    assert rbac_verb("GET", named=False, watch=False) == "list"
    assert rbac_verb("GET", named=False, watch=True) == "watch"
    assert rbac_verb("PUT", named=True, watch=False) == "update"
    assert rbac_verb("PATCH", named=True, watch=False) == "patch"
