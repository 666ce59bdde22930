"""Session lifecycle through the real operator: admission, Ready, ticks, delete, expiry, failures."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
from pathlib import Path

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import MERGE, Cluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


async def test_session_becomes_ready_with_its_pod_endpoint_and_token(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    cluster.create_pool()
    cluster.create_session("forest", seed=7)
    status = cluster.wait_phase("forest", "Ready")

    (pod,) = cluster.wait_pods(1)
    assert status["pod"] == pod
    pod_ip = cluster.get("pods", pod, core=True)["status"]["podIP"]
    assert status["endpoint"] == f"http://{pod_ip}:8000"
    assert status["resetRequired"] is False
    assert status["tokenSecretRef"] == {"name": "forest-token", "key": "token"}
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "True", "Placed")
    ]
    # Admitted with its token Secret and its status only: kopf wrote nothing on the object (no diff-base or
    # marker annotation: operator/kopf_settings.py).
    annotations = cluster.session("forest")["metadata"].get("annotations") or {}
    assert [k for k in annotations if k.startswith("ardiffusion.dev/")] == []
    # The token lives in a Secret owned by the session; Redis keeps only its SHA-256.
    secret = cluster.get("secrets", "forest-token", core=True)
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == cluster.session("forest")["metadata"]["uid"]
    record = await store.get_session(PoolId(cluster.namespace, "pool"), "forest")
    assert record is not None
    assert (record.state, record.pod, record.pod_epoch, record.seed) == (
        SessionState.PLACED,
        pod,
        status["podEpoch"],
        7,
    )
    assert record.token_sha256 == hashlib.sha256(cluster.token("forest").encode()).hexdigest()
    # The worker serves it with that token (and only with it).
    assert cluster.tick("forest", 0).status_code == 200
    denied = cluster.http.post(
        f"{status['endpoint']}/v1/sessions/forest/ticks",
        json={"request_id": "x", "chunk_index": 1},
        headers={"Authorization": "Bearer wrong"},
    )
    assert denied.status_code == 401
    # chunkIndex is mirrored (on a throttle) once the session ticked.
    wait_until(lambda: cluster.status("forest").get("chunkIndex") == 1, what="chunkIndex mirrored")
    pool = wait_until(lambda: (s := cluster.pool_status()).get("sessions") == 1 and s, what="pool status")
    assert (pool["replicas"], pool["readyReplicas"], pool["capacity"], pool["pending"]) == (1, 1, 2, 0)


async def test_delete_releases_the_slot_and_the_worker_gets_close(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    status = cluster.ticked_session("forest")
    assert cluster.worker_session("forest", status["endpoint"]).status_code == 200
    token = cluster.token("forest")

    cluster.delete("ardiffusionsessions", "forest")
    cluster.wait_gone("ardiffusionsessions", "forest")  # at once: no finalizer

    # Its DELETED event releases it.
    for _ in range(50):
        record = await store.get_session(pool, "forest")
        if record is not None and record.state is SessionState.CLOSED:
            break
        await asyncio.sleep(0.1)
    assert record is not None
    assert record.state is SessionState.CLOSED
    (pod,) = await store.list_pods(pool)
    assert pod.used == 0
    # The worker consumed the `close` from its pod's stream and closed the session in its runner.
    closed = wait_until(
        lambda: (
            (
                response := cluster.http.get(
                    f"{status['endpoint']}/v1/sessions/forest", headers={"Authorization": f"Bearer {token}"}
                )
            ).status_code
            == 410
            and response
        ),
        what="the worker to close the session",
    )
    assert closed.json()["error"]["code"] == "session_closed"
    # ... and it came through the pod's stream: a `close` entry, delivered and acknowledged.
    stream = PoolKeys(pool).events(status["pod"])
    entries = [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in await store.client.xrange(stream)
    ]
    assert [(e["kind"], e["session"]) for e in entries] == [("close", "forest")]
    pending = await wait_for_ack(store, stream)
    assert pending == 0
    assert await store.check_invariants(pool) == []
    cluster.wait_gone("secrets", "forest-token", core=True)  # owned by the session


async def test_a_session_another_finalizer_holds_is_released_once(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    """Deleted while someone else's finalizer keeps it: its slot is freed at once, and the events that follow
    (the holder patching it, the final DELETED) release nothing again."""
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool()
    body = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
        "spec": {"poolRef": "pool", "prompt": "a held world"},
    }
    path = f"/apis/ardiffusion.dev/v1alpha1/namespaces/{cluster.namespace}/ardiffusionsessions"
    assert cluster.http.post(path, json=body).status_code == 201
    cluster.wait_phase("held", "Ready")
    cluster.delete("ardiffusionsessions", "held")

    async def closed() -> bool:
        record = await store.get_session(pool, "held")
        return record is not None and record.state is SessionState.CLOSED

    for _ in range(100):
        if await closed():
            break
        await asyncio.sleep(0.1)
    assert await closed()
    assert cluster.get("ardiffusionsessions", "held") is not None  # the finalizer still holds it
    for i in range(3):  # the holder's own updates: events of an object being deleted
        patch = {"metadata": {"labels": {"step": str(i)}}}
        assert cluster.http.patch(f"{path}/held", json=patch, headers=MERGE).status_code == 200
    last = {"metadata": {"finalizers": []}}
    assert cluster.http.patch(f"{path}/held", json=last, headers=MERGE).status_code == 200
    cluster.wait_gone("ardiffusionsessions", "held")
    await asyncio.sleep(1.0)  # the DELETED event reaches the operator
    assert operator_process.log().count("session held released") == 1
    assert await store.check_invariants(pool) == []


def test_a_token_secret_owned_by_another_object_is_not_adopted(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    """A session made again under a deleted one's name must not take over the deleted one's token Secret
    (garbage collection would delete it from under the new session): admission waits until it is gone."""
    cluster.create_pool()
    owner = cluster.create_session("owner")
    leftover = {
        "metadata": {
            "name": "again-token",
            "ownerReferences": [
                {
                    "apiVersion": "ardiffusion.dev/v1alpha1",
                    "kind": "ARDiffusionSession",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "stringData": {"token": "not-yours"},
    }
    secrets = f"/api/v1/namespaces/{cluster.namespace}/secrets"
    assert cluster.http.post(secrets, json=leftover).status_code == 201
    again = cluster.create_session("again")
    cluster.wait_phase("owner", "Ready")
    assert cluster.status("again").get("phase") != "Ready"  # admission retries; nothing placed
    cluster.http.delete(f"{secrets}/again-token").raise_for_status()
    cluster.wait_phase("again", "Ready")
    secret = cluster.get("secrets", "again-token", core=True)
    assert secret is not None
    assert [ref["uid"] for ref in secret["metadata"]["ownerReferences"]] == [again["metadata"]["uid"]]
    assert cluster.token("again") != "not-yours"


async def wait_for_ack(store: PlacementStore, stream: str) -> int:
    for _ in range(50):
        summary = await store.client.xpending(stream, "worker")
        if summary["pending"] == 0:
            return 0
        await asyncio.sleep(0.1)
    return summary["pending"]


async def test_unknown_pool_fails_and_is_admitted_once_the_pool_exists(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_session("early", pool="later")
    status = cluster.wait_phase("early", "Failed", reason="UnknownPool")
    assert "later" in status["message"]
    assert (
        wait_until(lambda: cluster.events("Failed"), what="a Failed event")[0]["involvedObject"]["name"]
        == "early"
    )

    cluster.create_pool("later")
    status = cluster.wait_phase("early", "Ready")
    assert status["pod"] in cluster.pod_names("later")


def test_bad_custom_resources_are_rejected_with_422(cluster: Cluster, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: ardiffusion.dev/v1alpha1\nkind: ARDiffusionSession\nmetadata:\n  name: bad\n"
        "spec:\n  poolRef: pool\n  prompt: x\n  evictionPolicy: Sometimes\n"
    )
    applied = subprocess.run(
        [
            str(ROOT / ".venv/bin/kubectl"),
            "apply",
            "--validate=false",
            "-n",
            cluster.namespace,
            "-f",
            str(bad),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode != 0
    assert "evictionPolicy" in applied.stderr
    assert "Unsupported value" in applied.stderr
    pool = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": "p"},
        "spec": {"model": {"name": "m"}, "image": "w", "replicas": {"min": 3, "max": 1}},
    }
    response = cluster.http.post(
        f"/apis/ardiffusion.dev/v1alpha1/namespaces/{cluster.namespace}/ardiffusionworkerpools", json=pool
    )
    assert response.status_code == 422
    assert "max must be >= min" in response.json()["message"]
    assert cluster.items("ardiffusionsessions") == []
    assert cluster.items("ardiffusionworkerpools") == []


async def test_idle_session_expires_and_releases_its_slot(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    cluster.create_pool()
    # Idle time counts from the placement, which comes when the worker registers; its Pod is Ready (and the
    # session with it) only at the first startup probe that passes, up to a probe period (5 s) later. On a
    # Pod still starting, a 2 s session would expire before it was ever Ready: wait for a Ready one.
    cluster.wait_pods(1)
    cluster.create_session("sleepy", idleTimeoutSeconds=2)
    cluster.create_session("busy", idleTimeoutSeconds=600)
    cluster.wait_phase("sleepy", "Ready")
    status = cluster.wait_phase("sleepy", "Expired", timeout=15, reason="IdleTimeout")
    assert "pod" not in status  # the binding is gone from the status
    assert "endpoint" not in status
    assert cluster.status("busy")["phase"] == "Ready"
    record = await store.get_session(PoolId(cluster.namespace, "pool"), "sleepy")
    assert record is not None
    assert record.state is SessionState.CLOSED
    (pod,) = await store.list_pods(PoolId(cluster.namespace, "pool"))
    assert pod.used == 1
    assert [e["involvedObject"]["name"] for e in cluster.events("Expired")] == ["sleepy"]


async def test_conditioning_image_comes_from_a_configmap_key(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    picture = bytes(range(256)) * 4
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "pictures"},
        "binaryData": {"forest.png": base64.b64encode(picture).decode()},
    }
    response = cluster.http.post(f"/api/v1/namespaces/{cluster.namespace}/configmaps", json=configmap)
    assert response.status_code == 201, response.text
    cluster.create_pool()
    cluster.create_session("pictured", image={"configMapKeyRef": {"name": "pictures", "key": "forest.png"}})
    cluster.create_session("missing", image={"secretKeyRef": {"name": "nothing", "key": "x"}})

    cluster.wait_phase("pictured", "Ready")
    record = await store.get_session(PoolId(cluster.namespace, "pool"), "pictured")
    assert record is not None
    assert record.image == picture
    status = cluster.wait_phase("missing", "Failed", reason="ImageNotFound")
    assert "nothing" in status["message"]
