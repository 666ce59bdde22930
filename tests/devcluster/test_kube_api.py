"""The emulated Kubernetes API over real HTTP: apiserver semantics kopf, kubectl and the operator rely on."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ardiff.devcluster.kube_api import KubeAPI, KubeAPIThread, parse_api_path
from ardiff.devcluster.kube_store import ApiError, ObjectStore

WatchFactory = Callable[..., Any]

SESSIONS = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}/ardiffusionsessions"
POOLS = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}/ardiffusionworkerpools"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
def client(kube_api: KubeAPIThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kube_api.url, timeout=10) as http:
        yield http


def session_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": name},
        "spec": {"poolRef": "tiny-world", "prompt": "a forest", **spec},
    }


def create_session(client: httpx.Client, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    response = client.post(SESSIONS.format(ns=ns), json=session_body(name, **spec))
    assert response.status_code == 201, response.text
    return response.json()


def test_create_assigns_metadata_and_defaults(client: httpx.Client, kube_namespace: str) -> None:
    created = create_session(client, kube_namespace, "s1")
    meta = created["metadata"]
    assert meta["namespace"] == kube_namespace  # filled from the URL
    assert meta["generation"] == 1
    assert len(meta["uid"]) == 36
    assert int(meta["resourceVersion"]) > 0
    assert meta["creationTimestamp"].endswith("Z")
    assert created["spec"]["evictionPolicy"] == "LRU"  # CRD default applied on admission
    fetched = client.get(f"{SESSIONS.format(ns=kube_namespace)}/s1").json()
    assert fetched == created
    duplicate = client.post(SESSIONS.format(ns=kube_namespace), json=session_body("s1"))
    assert duplicate.status_code == 409
    assert duplicate.json()["reason"] == "AlreadyExists"


def test_seed_puts_objects_in_with_their_status_and_without_admission(
    client: httpx.Client, kube_namespace: str, watch: WatchFactory
) -> None:
    """`POST /devcluster/seed`: objects as an etcd restore gives them (simulations at scale seed 100k)."""
    watcher = watch(SESSIONS.format(ns=kube_namespace))
    items = [
        {**session_body(f"seeded-{i}"), "metadata": {"name": f"seeded-{i}", "namespace": kube_namespace}}
        | {"status": {"phase": "Ready", "pod": "w-1"}}
        for i in range(3)
    ]
    response = client.post("/devcluster/seed", json={"items": items})
    assert response.status_code == 201, response.text
    assert response.json() == {"seeded": 3}
    listed = client.get(SESSIONS.format(ns=kube_namespace)).json()["items"]
    assert [s["metadata"]["name"] for s in listed] == ["seeded-0", "seeded-1", "seeded-2"]
    assert [s["status"] for s in listed] == [{"phase": "Ready", "pod": "w-1"}] * 3
    assert len({s["metadata"]["uid"] for s in listed}) == 3
    assert listed[0]["metadata"]["generation"] == 1
    assert "evictionPolicy" not in listed[0]["spec"]  # not admitted: no CRD defaults
    assert watcher.wait(3) == [("ADDED", f"seeded-{i}") for i in range(3)]
    again = client.post("/devcluster/seed", json={"items": items[:1]})
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"
    missing = {**items[0], "metadata": {"name": "x", "namespace": "no-such-namespace"}}
    assert client.post("/devcluster/seed", json={"items": [missing]}).status_code == 404
    assert client.post("/devcluster/seed", json={"objects": []}).status_code == 400


def test_resource_versions_increase_and_generation_follows_spec_only(
    client: httpx.Client, kube_namespace: str
) -> None:
    url = f"{SESSIONS.format(ns=kube_namespace)}/s1"
    created = create_session(client, kube_namespace, "s1")
    spec_patch = client.patch(url, json={"spec": {"priority": 5}}, headers=MERGE).json()
    assert spec_patch["metadata"]["generation"] == 2
    assert int(spec_patch["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status_patch = client.patch(f"{url}/status", json={"status": {"phase": "Pending"}}, headers=MERGE).json()
    assert status_patch["metadata"]["generation"] == 2  # status does not bump the generation
    assert status_patch["status"] == {"phase": "Pending"}
    annotated = client.patch(url, json={"metadata": {"annotations": {"a": "b"}}}, headers=MERGE).json()
    assert annotated["metadata"]["generation"] == 2
    # A write that changes nothing is a no-op: same resourceVersion.
    again = client.patch(url, json={"metadata": {"annotations": {"a": "b"}}}, headers=MERGE).json()
    assert again["metadata"]["resourceVersion"] == annotated["metadata"]["resourceVersion"]


def test_status_subresource_is_isolated(client: httpx.Client, kube_namespace: str) -> None:
    url = f"{SESSIONS.format(ns=kube_namespace)}/s1"
    create_session(client, kube_namespace, "s1")
    # Create cannot set status; the main endpoint ignores status; /status ignores everything else.
    assert "status" not in client.get(url).json()
    client.patch(url, json={"status": {"phase": "Ready"}, "spec": {"seed": 9}}, headers=MERGE)
    current = client.get(url).json()
    assert "status" not in current
    assert current["spec"]["seed"] == 9
    client.patch(f"{url}/status", json={"status": {"phase": "Ready"}, "spec": {"seed": 1}}, headers=MERGE)
    current = client.get(url).json()
    assert current["status"] == {"phase": "Ready"}
    assert current["spec"]["seed"] == 9


def test_invalid_custom_resources_get_422_naming_the_field(client: httpx.Client, kube_namespace: str) -> None:
    bad = session_body("s1", evictionPolicy="Sometimes")
    del bad["spec"]["poolRef"]
    response = client.post(SESSIONS.format(ns=kube_namespace), json=bad)
    assert response.status_code == 422
    status = response.json()
    assert status["kind"] == "Status"
    assert status["reason"] == "Invalid"
    assert status["details"]["kind"] == "ARDiffusionSession"
    assert [c["field"] for c in status["details"]["causes"]] == ["spec.poolRef", "spec.evictionPolicy"]
    assert 'spec.evictionPolicy: Unsupported value: "Sometimes"' in status["message"]
    pool = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": "p1"},
        "spec": {"model": {"name": "tiny-lingbot-world"}, "image": "w:1", "replicas": {"min": 3, "max": 2}},
    }
    response = client.post(POOLS.format(ns=kube_namespace), json=pool)
    assert response.status_code == 422
    assert "spec.replicas.max: Invalid value: 2: max must be >= min" in response.json()["message"]
    # Nothing was stored, and a bad update leaves the stored object as it was.
    assert client.get(f"{POOLS.format(ns=kube_namespace)}/p1").status_code == 404
    create_session(client, kube_namespace, "s2")
    url = f"{SESSIONS.format(ns=kube_namespace)}/s2"
    assert client.patch(url, json={"spec": {"priority": 5000}}, headers=MERGE).status_code == 422
    assert client.patch(url, json={"spec": {"poolRef": "elsewhere"}}, headers=MERGE).status_code == 422
    assert client.get(url).json()["spec"]["priority"] == 0
    assert client.patch(f"{url}/status", json={"status": {"phase": "Nope"}}, headers=MERGE).status_code == 422


def test_unknown_fields_are_pruned_with_a_warning_or_rejected_when_strict(
    client: httpx.Client, kube_namespace: str
) -> None:
    body = session_body("s1", colour="blue")
    response = client.post(SESSIONS.format(ns=kube_namespace), json=body)
    assert response.status_code == 201
    assert "colour" not in response.json()["spec"]
    assert response.headers["Warning"] == '299 - "unknown field \\"spec.colour\\""'
    strict = client.post(
        f"{SESSIONS.format(ns=kube_namespace)}?fieldValidation=Strict", json=session_body("s2", colour="x")
    )
    assert strict.status_code == 400
    assert 'unknown field "spec.colour"' in strict.json()["message"]
    # kopf's bookkeeping in status is kept (preserve-unknown-fields there).
    url = f"{SESSIONS.format(ns=kube_namespace)}/s1/status"
    kept = client.patch(
        url, json={"status": {"kopf": {"progress": {"h": {"retries": 1}}}, "h": {"r": 1}}}, headers=MERGE
    )
    assert kept.json()["status"] == {"kopf": {"progress": {"h": {"retries": 1}}}, "h": {"r": 1}}


def test_stale_resource_versions_are_rejected(client: httpx.Client, kube_namespace: str) -> None:
    url = f"{SESSIONS.format(ns=kube_namespace)}/s1"
    created = create_session(client, kube_namespace, "s1")
    stale = created["metadata"]["resourceVersion"]
    client.patch(url, json={"spec": {"seed": 3}}, headers=MERGE)
    # kopf's finalizer patch: a JSON patch guarded by a `test` of the resourceVersion -> 422.
    kopf_patch = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
        {"op": "add", "path": "/metadata/finalizers", "value": ["ardiffusion.dev/finalizer"]},
    ]
    response = client.patch(url, json=kopf_patch, headers=JSON_PATCH)
    assert response.status_code == 422
    assert response.json()["reason"] == "Invalid"
    assert "finalizers" not in client.get(url).json()["metadata"]
    # With the current resourceVersion the same patch applies.
    kopf_patch[0]["value"] = client.get(url).json()["metadata"]["resourceVersion"]
    assert client.patch(url, json=kopf_patch, headers=JSON_PATCH).json()["metadata"]["finalizers"] == [
        "ardiffusion.dev/finalizer"
    ]
    # A merge patch or an update naming a stale resourceVersion -> 409 Conflict.
    conflict = client.patch(
        url, json={"metadata": {"resourceVersion": stale}, "spec": {"seed": 4}}, headers=MERGE
    )
    assert conflict.status_code == 409
    assert conflict.json()["reason"] == "Conflict"
    body = client.get(url).json()
    body["metadata"]["resourceVersion"] = stale
    assert client.put(url, json=body).status_code == 409
    body["metadata"]["resourceVersion"] = client.get(url).json()["metadata"]["resourceVersion"]
    body["spec"]["seed"] = 11
    assert client.put(url, json=body).json()["spec"]["seed"] == 11


def test_finalizers_hold_deletion_until_removed(client: httpx.Client, kube_namespace: str) -> None:
    url = f"{SESSIONS.format(ns=kube_namespace)}/s1"
    create_session(client, kube_namespace, "s1")
    client.patch(url, json={"metadata": {"finalizers": ["ardiffusion.dev/finalizer"]}}, headers=MERGE)
    deleting = client.delete(url).json()
    assert deleting["metadata"]["deletionTimestamp"]
    assert client.get(url).status_code == 200
    forbidden = client.patch(
        url, json={"metadata": {"finalizers": ["a", "ardiffusion.dev/finalizer"]}}, headers=MERGE
    )
    assert forbidden.status_code == 422
    client.patch(url, json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert client.get(url).status_code == 404


def test_owner_references_cascade_and_orphan(client: httpx.Client, kube_namespace: str) -> None:
    ns = kube_namespace
    owner = create_session(client, ns, "s1")
    ref = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "name": "s1",
        "uid": owner["metadata"]["uid"],
    }
    pod = {
        "metadata": {"name": "w1", "ownerReferences": [ref]},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    assert client.post(f"/api/v1/namespaces/{ns}/pods", json=pod).status_code == 201
    secret = {"metadata": {"name": "s1-token", "ownerReferences": [ref]}, "stringData": {"token": "abc"}}
    stored = client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).json()
    assert stored["data"] == {"token": base64.b64encode(b"abc").decode()}  # stringData folded into data
    assert "stringData" not in stored
    service = {"metadata": {"name": "svc", "ownerReferences": [ref]}, "spec": {"clusterIP": "None"}}
    assert client.post(f"/api/v1/namespaces/{ns}/services", json=service).status_code == 201
    client.delete(f"{SESSIONS.format(ns=ns)}/s1")
    for path in ("pods/w1", "secrets/s1-token", "services/svc"):
        assert client.get(f"/api/v1/namespaces/{ns}/{path}").status_code == 404, path

    owner = create_session(client, ns, "s2")
    ref["uid"], ref["name"] = owner["metadata"]["uid"], "s2"
    pod["metadata"] = {"name": "w2", "ownerReferences": [ref]}
    client.post(f"/api/v1/namespaces/{ns}/pods", json=pod)
    client.request("DELETE", f"{SESSIONS.format(ns=ns)}/s2", json={"propagationPolicy": "Orphan"})
    orphan = client.get(f"/api/v1/namespaces/{ns}/pods/w2").json()
    assert "ownerReferences" not in orphan["metadata"]

    # Written with an owner that is already gone (kube-controller-manager's attemptToDeleteItem): collected
    # at once; with one owner gone and one there, only the reference to the absent one is removed.
    secret["metadata"] = {"name": "late", "ownerReferences": [ref]}
    assert client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).status_code == 201
    assert client.get(f"/api/v1/namespaces/{ns}/secrets/late").status_code == 404
    owner = create_session(client, ns, "s3")
    solid = {**ref, "name": "s3", "uid": owner["metadata"]["uid"]}
    secret["metadata"] = {"name": "shared", "ownerReferences": [ref, solid]}
    assert client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).status_code == 201
    shared = client.get(f"/api/v1/namespaces/{ns}/secrets/shared").json()
    assert shared["metadata"]["ownerReferences"] == [solid]
    # An owner in another namespace is no owner: a namespaced dependent's owners share its namespace.
    other = f"{ns[:50]}-other"
    assert client.post("/api/v1/namespaces", json={"metadata": {"name": other}}).status_code == 201
    try:
        secret["metadata"] = {"name": "elsewhere", "ownerReferences": [solid]}
        assert client.post(f"/api/v1/namespaces/{other}/secrets", json=secret).status_code == 201
        assert client.get(f"/api/v1/namespaces/{other}/secrets/elsewhere").status_code == 404
    finally:
        client.delete(f"/api/v1/namespaces/{other}")


def test_bound_pods_terminate_gracefully(client: httpx.Client, kube_namespace: str) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    pod = {"metadata": {"name": "w1"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    created = client.post(pods, json=pod).json()
    assert created["status"]["phase"] == "Pending"
    assert created["spec"]["restartPolicy"] == "Always"
    binding = {"target": {"kind": "Node", "name": "node-a"}}
    assert client.post(f"{pods}/w1/binding", json=binding).status_code == 201
    assert client.post(f"{pods}/w1/binding", json=binding).status_code == 409  # already bound
    deleting = client.delete(f"{pods}/w1").json()
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30
    assert client.get(f"{pods}/w1").status_code == 200  # the kubelet has not confirmed yet
    client.request("DELETE", f"{pods}/w1", json={"gracePeriodSeconds": 0})
    assert client.get(f"{pods}/w1").status_code == 404
    # An unbound Pod has no kubelet to wait for.
    client.post(pods, json={**pod, "metadata": {"name": "w2"}})
    client.delete(f"{pods}/w2")
    assert client.get(f"{pods}/w2").status_code == 404


def test_generate_name_namespaces_and_dry_run(client: httpx.Client, kube_namespace: str) -> None:
    generated = client.post(
        f"/api/v1/namespaces/{kube_namespace}/pods",
        json={"metadata": {"generateName": "pool-"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    ).json()
    assert generated["metadata"]["name"].startswith("pool-")
    assert len(generated["metadata"]["name"]) == len("pool-") + 5
    missing = client.post(SESSIONS.format(ns="no-such-namespace"), json=session_body("s1"))
    assert missing.status_code == 404
    assert missing.json()["message"] == 'namespaces "no-such-namespace" not found'
    dry = client.post(f"{SESSIONS.format(ns=kube_namespace)}?dryRun=All", json=session_body("s1"))
    assert dry.status_code == 201
    assert client.get(f"{SESSIONS.format(ns=kube_namespace)}/s1").status_code == 404


def test_namespace_deletion_removes_its_objects(client: httpx.Client) -> None:
    client.post("/api/v1/namespaces", json={"metadata": {"name": "doomed"}}).raise_for_status()
    create_session(client, "doomed", "s1")
    client.post("/api/v1/namespaces/doomed/configmaps", json={"metadata": {"name": "c"}, "data": {"a": "b"}})
    client.delete("/api/v1/namespaces/doomed")
    assert client.get("/api/v1/namespaces/doomed").status_code == 404
    assert client.get(f"{SESSIONS.format(ns='doomed')}/s1").status_code == 404
    assert client.get("/api/v1/namespaces/doomed/configmaps/c").status_code == 404


def test_label_and_field_selectors(client: httpx.Client, kube_namespace: str) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    for name, component in (("a", "worker"), ("b", "worker"), ("c", "router")):
        labels = {"app.kubernetes.io/component": component, "ardiffusion.dev/pool": "p"}
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        client.post(pods, json=body).raise_for_status()

    def names(**params: str) -> list[str]:
        listing = client.get(pods, params=params).json()
        assert listing["kind"] == "PodList"
        return [item["metadata"]["name"] for item in listing["items"]]

    assert names(labelSelector="app.kubernetes.io/component=worker") == ["a", "b"]
    assert names(labelSelector="app.kubernetes.io/component!=worker") == ["c"]
    assert names(labelSelector="app.kubernetes.io/component in (router),ardiffusion.dev/pool") == ["c"]
    assert names(fieldSelector="metadata.name=b") == ["b"]
    bad = client.get(pods, params={"labelSelector": "=worker"})
    assert bad.status_code == 400
    assert "has no key" in bad.json()["message"]


def test_watch_resumes_from_a_resource_version(
    client: httpx.Client, kube_namespace: str, watch: WatchFactory
) -> None:
    url = SESSIONS.format(ns=kube_namespace)
    create_session(client, kube_namespace, "s1")
    listing = client.get(url).json()
    since = listing["metadata"]["resourceVersion"]
    create_session(client, kube_namespace, "s2")
    client.patch(f"{url}/s1", json={"spec": {"seed": 2}}, headers=MERGE)
    client.delete(f"{url}/s2")
    # Resuming replays exactly what happened after the list, with increasing resourceVersions.
    watcher = watch(url, resourceVersion=since)
    events = watcher.wait(3)
    assert events == [("ADDED", "s2"), ("MODIFIED", "s1"), ("DELETED", "s2")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in watcher.events]
    assert versions == sorted(versions)
    assert versions[0] > int(since)


def test_watch_without_version_starts_with_current_state_then_follows(
    client: httpx.Client, kube_namespace: str, watch: WatchFactory
) -> None:
    url = SESSIONS.format(ns=kube_namespace)
    create_session(client, kube_namespace, "s1")
    watcher = watch(url)
    create_session(client, kube_namespace, "s2")
    assert watcher.wait(2) == [("ADDED", "s1"), ("ADDED", "s2")]


def test_watch_initial_events_end_with_a_bookmark(
    client: httpx.Client, kube_namespace: str, watch: WatchFactory
) -> None:
    create_session(client, kube_namespace, "s1")
    watcher = watch(
        SESSIONS.format(ns=kube_namespace),
        sendInitialEvents="true",
        allowWatchBookmarks="true",
    )
    events = watcher.wait(2)
    assert events[0] == ("ADDED", "s1")
    assert events[1][0] == "BOOKMARK"
    assert watcher.events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_label_selector_watch_sees_objects_enter_and_leave(
    client: httpx.Client, kube_namespace: str, watch: WatchFactory
) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    body = {
        "metadata": {"name": "w1", "labels": {"role": "idle"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    client.post(pods, json=body).raise_for_status()
    watcher = watch(pods, labelSelector="role=worker")
    client.patch(f"{pods}/w1", json={"metadata": {"labels": {"role": "worker"}}}, headers=MERGE)
    client.patch(f"{pods}/w1", json={"metadata": {"labels": {"role": "idle"}}}, headers=MERGE)
    assert watcher.wait(2) == [("ADDED", "w1"), ("DELETED", "w1")]


def test_an_expired_resource_version_is_410_gone() -> None:
    store = ObjectStore(event_log_size=3)
    api = KubeAPI(store)
    rtype = store.resource("", "v1", "configmaps")
    first = store.resource_version
    for index in range(5):
        store.create(rtype, "default", {"metadata": {"name": f"c{index}"}})
    with pytest.raises(ApiError, match="too old resource version") as info:
        store.watch(rtype, "default", since=first)
    assert info.value.status == 410
    assert api.store is store


def test_tables_use_printer_columns(client: httpx.Client, kube_namespace: str) -> None:
    url = SESSIONS.format(ns=kube_namespace)
    create_session(client, kube_namespace, "s1")
    status = {"phase": "Ready", "pod": "tiny-world-abcde", "chunkIndex": 7}
    client.patch(f"{url}/s1/status", json={"status": status}, headers=MERGE)
    table = client.get(
        url, headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    ).json()
    assert table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Phase", "Pool", "Pod", "Chunk", "Reason", "Endpoint", "Tier", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:8] == ["s1", "Ready", "tiny-world", "tiny-world-abcde", 7, None, None, None]
    assert cells[-1].endswith("s")  # a human duration
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_discovery_serves_custom_resources_once_their_crd_exists(client: httpx.Client) -> None:
    groups = {g["name"]: g for g in client.get("/apis").json()["groups"]}
    assert groups["ardiffusion.dev"]["preferredVersion"]["version"] == "v1alpha1"
    resources = client.get("/apis/ardiffusion.dev/v1alpha1").json()["resources"]
    by_name = {r["name"]: r for r in resources}
    assert by_name["ardiffusionsessions"]["shortNames"] == ["adsession"]
    assert by_name["ardiffusionsessions"]["categories"] == ["ardiff"]
    assert "ardiffusionsessions/status" in by_name
    core = client.get("/api/v1").json()
    assert core["groupVersion"] == "v1"
    assert "pods" in {r["name"] for r in core["resources"]}

    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    assert client.get("/apis/example.com/v1").status_code == 404
    created = client.post(crds, json=crd).json()
    assert {c["type"]: c["status"] for c in created["status"]["conditions"]}["Established"] == "True"
    gadgets = "/apis/example.com/v1/namespaces/default/gadgets"
    assert client.post(gadgets, json={"metadata": {"name": "g1"}, "anything": 1}).status_code == 201
    client.delete(f"{crds}/gadgets.example.com")
    assert client.get("/apis/example.com/v1").status_code == 404
    assert client.get(f"{gadgets}/g1").status_code == 404
    broken = {**crd, "metadata": {"name": "wrong.example.com"}}
    response = client.post(crds, json=broken)
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "metadata.name"


def test_paths_parse_like_the_apiserver_routes() -> None:
    assert parse_api_path("/api/v1/namespaces") == parse_api_path("/api/v1/namespaces/")
    ns = parse_api_path("/api/v1/namespaces/default")
    assert (ns.plural, ns.name, ns.namespace) == ("namespaces", "default", None)  # type: ignore[union-attr]
    status = parse_api_path("/api/v1/namespaces/default/status")
    assert (status.plural, status.name, status.subresource) == ("namespaces", "default", "status")  # type: ignore[union-attr]
    pod = parse_api_path("/api/v1/namespaces/ns/pods/w1/status")
    assert (pod.namespace, pod.plural, pod.name, pod.subresource) == ("ns", "pods", "w1", "status")  # type: ignore[union-attr]
    custom = parse_api_path("/apis/ardiffusion.dev/v1alpha1/namespaces/ns/ardiffusionsessions")
    assert (custom.group, custom.version, custom.plural, custom.name) == (  # type: ignore[union-attr]
        "ardiffusion.dev",
        "v1alpha1",
        "ardiffusionsessions",
        None,
    )
    assert parse_api_path("/apis/ardiffusion.dev") is None
    assert parse_api_path("/version") is None


def test_stopping_the_api_ends_open_watches_at_once() -> None:
    with KubeAPIThread() as api:
        with httpx.Client(base_url=api.url, timeout=None) as http:
            stream = http.stream("GET", "/api/v1/namespaces/default/pods", params={"watch": "true"})
            response = stream.__enter__()
            assert response.status_code == 200
            started = time.monotonic()
            api.stop()
            assert list(response.iter_lines()) == []  # the stream ended cleanly, with no event
            stream.__exit__(None, None, None)
        assert time.monotonic() - started < 5
