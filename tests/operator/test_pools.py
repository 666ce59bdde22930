"""Pools through the real operator: owned Pods and Service, scaling both ways, deletion."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.connection import redact_url, with_user
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from tests.operator.conftest import FAKE_WORKER_ENV, POD_READY_SECONDS, POOL_FINALIZE_SECONDS, Cluster

pytestmark = pytest.mark.slow


def ready_sessions(cluster: Cluster, names: list[str]) -> dict[str, str] | None:
    """{session: pod} once every named session is Ready."""
    statuses = {name: cluster.status(name) for name in names}
    if all(s.get("phase") == "Ready" for s in statuses.values()):
        return {name: s["pod"] for name, s in statuses.items()}
    return None


async def test_pool_owns_labelled_pods_and_a_headless_service(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    pool = cluster.create_pool(replicas={"min": 2, "max": 2})
    pods = cluster.wait_pods(2)
    for pod in cluster.pods():
        assert pod["metadata"]["name"] in pods
        assert pod["metadata"]["name"].startswith("pool-")
        assert len(pod["metadata"]["name"]) == len("pool-") + 5
        assert pod["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
        assert pod["metadata"]["labels"] == {
            "app.kubernetes.io/name": "ardiff",
            "app.kubernetes.io/component": "worker",
            "ardiffusion.dev/pool": "pool",
        }
    service = wait_until(
        lambda: cluster.get("services", "pool-workers", core=True), what="the pool's Service"
    )
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"]["ardiffusion.dev/pool"] == "pool"
    status = wait_until(
        lambda: (s := cluster.pool_status()).get("readyReplicas") == 2 and s, what="pool status"
    )
    assert (status["replicas"], status["capacity"], status["sessions"], status["pending"]) == (2, 4, 0, 0)
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Ready", "True"),
        ("AtCapacity", "False"),
        ("Progressing", "True"),
    ]


async def test_scales_up_for_waiting_sessions_and_down_only_empty_pods(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(replicas={"min": 1, "max": 3}, scaleDownDelaySeconds=1)
    cluster.wait_pods(1)
    names = [f"s{i}" for i in range(5)]
    for name in names:
        cluster.create_session(name)
    # 5 sessions, 2 slots per pod: the pool grows to 3 pods (its max) and places all of them.
    placed = wait_until(lambda: ready_sessions(cluster, names), timeout=45, what="5 sessions Ready")
    assert len(set(placed.values())) == 3
    assert cluster.pod_names() == set(placed.values())
    status = wait_until(lambda: (s := cluster.pool_status()).get("sessions") == 5 and s, what="pool status")
    assert (status["replicas"], status["capacity"], status["pending"]) == (3, 6, 0)

    # Empty exactly one pod: it goes after scaleDownDelaySeconds; the pods that hold sessions stay.
    by_pod: dict[str, list[str]] = {}
    for name, pod in placed.items():
        by_pod.setdefault(pod, []).append(name)
    emptied = next(pod for pod, held in by_pod.items() if len(held) == 2)
    for name in by_pod[emptied]:
        cluster.delete("ardiffusionsessions", name)
    kept = set(placed.values()) - {emptied}
    wait_until(lambda: cluster.pod_names() == kept, timeout=20, what=f"pod {emptied} to be scaled down")
    survivors = [n for n in names if placed[n] != emptied]
    assert ready_sessions(cluster, survivors) == {n: placed[n] for n in survivors}
    assert all(cluster.status(n)["resetRequired"] is False for n in survivors)  # nobody lost their KV

    # Everyone leaves: back to min (1 pod), and Redis agrees with the Pods.
    for name in survivors:
        cluster.delete("ardiffusionsessions", name)
    wait_until(lambda: len(cluster.pod_names()) == 1, timeout=20, what="scale down to min")
    wait_until(
        lambda: (s := cluster.pool_status()).get("replicas") == 1 and s.get("sessions") == 0,
        what="pool status after scale-down",
    )
    # The retired pods' records (kept draining while they shut down) go once the Pods are gone.
    for _ in range(100):
        if [p.name for p in await store.list_pods(pool)] == sorted(cluster.pod_names()):
            break
        await asyncio.sleep(0.1)
    assert [p.name for p in await store.list_pods(pool)] == sorted(cluster.pod_names())
    assert await store.check_invariants(pool) == []


async def test_deleting_a_pool_fails_its_sessions_and_removes_its_pods_and_state(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool()
    cluster.create_session("orphaned")
    cluster.wait_phase("orphaned", "Ready")
    assert await store.list_pods(pool) != []

    cluster.delete("ardiffusionworkerpools", "pool")
    cluster.wait_gone("ardiffusionworkerpools", "pool", timeout=POOL_FINALIZE_SECONDS)
    status = cluster.wait_phase("orphaned", "Failed", reason="PoolDeleted")
    assert "pod" not in status
    wait_until(lambda: cluster.pods() == [], timeout=20, what="the pool's pods to be deleted")
    assert cluster.get("services", "pool-workers", core=True) is None
    # No finalizer held the pool: its daemon forgets its Redis state once the Pods are gone.
    for _ in range(100):
        if not [key async for key in store.client.scan_iter(match=PoolKeys(pool).pattern)]:
            break
        await asyncio.sleep(0.1)
    assert [key async for key in store.client.scan_iter(match=PoolKeys(pool).pattern)] == []
    # The failed session can still be deleted (nothing of it needs the pool).
    cluster.delete("ardiffusionsessions", "orphaned")
    cluster.wait_gone("ardiffusionsessions", "orphaned")


def secret_url(secret: dict) -> str:
    return base64.b64decode(secret["data"]["url"]).decode()


async def test_a_refused_service_is_retried_the_next_round_not_after_a_minute(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    """The pool's loop makes the pool's Service (and its workers' Secret) before its first round. An API
    server that refuses it for a while (here a ResourceQuota of no Services; on a fresh cluster, admission
    not resolving a new CRD's kind yet, a 403) fails a round, and the next round tries again: once the refusal
    ends the pool goes on within a Pod's start, not after kopf's daemon back-off of 60 s."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}},
    }
    response = cluster.http.post(f"/api/v1/namespaces/{cluster.namespace}/resourcequotas", json=quota)
    assert response.status_code == 201, response.text
    # Quota admission enforces what the quota controller has written to status.hard, not the spec: until the
    # controller-manager syncs a new quota, a Service goes through (CI's run 32 lost this race).
    wait_until(
        lambda: (cluster.get("resourcequotas", "no-services", core=True) or {}).get("status", {}).get("hard"),
        what="the quota synced by the controller-manager",
    )
    cluster.create_pool()
    cluster.create_session("s")
    refused = f"POST /api/v1/namespaces/{cluster.namespace}/services -> HTTP 403"
    wait_until(lambda: refused in operator_process.log(), what="the Service refused")
    assert cluster.pods() == []  # nothing of the round ran before the Service exists
    assert cluster.status("s").get("phase") in (None, "Pending")

    cluster.delete("resourcequotas", "no-services", core=True)
    cluster.wait_phase("s", "Ready", timeout=POD_READY_SECONDS)  # < 60 s
    assert f"reconcile failed: {refused}" in operator_process.log()  # a failed round, logged as one
    assert cluster.get("services", "pool-workers", core=True) is not None


def test_workers_read_the_redis_password_from_the_pools_secret_and_nothing_prints_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    password = "s3cret-redis-pw"
    with cluster.redis_server(password=password) as redis:
        operator = cluster.operator(redis.url, tmp_path / "operator.log").start()
        try:
            operator.wait_ready()
            pool = cluster.create_pool()
            cluster.create_session("forest")
            cluster.wait_phase("forest", "Ready")  # the worker registered: it found the password
            secret = cluster.get("secrets", "pool-workers-redis", core=True)
            assert secret is not None
            pods_url = cluster.kube.redis_url_for_pods(redis.url)  # the operator's URL as Pods reach it
            # ... with the pool's own Redis user in it (issue 23 item 1), not the operator's password
            user = [
                base64.b64decode(secret["data"][k]).decode() for k in ("redis-username", "redis-password")
            ]
            assert user[0] == f"ardiff-pool.{cluster.namespace}.pool"
            assert secret_url(secret) == with_user(pods_url, *user)
            assert password not in secret_url(secret)
            assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [pool["metadata"]["uid"]]
            [pod] = cluster.pods()
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            assert env["ARDIFF_REDIS_URL"] == {
                "name": "ARDIFF_REDIS_URL",
                "valueFrom": {"secretKeyRef": {"name": "pool-workers-redis", "key": "url"}},
            }
            assert password not in json.dumps(pod)
            assert user[1] not in json.dumps(pod)
            # The pool's worker-to-worker transfer token (issue 12) comes from the same Secret, made once.
            assert env["ARDIFF_TRANSFER_TOKEN"] == {
                "name": "ARDIFF_TRANSFER_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "pool-workers-redis", "key": "transfer-token"}},
            }
            transfer_token = base64.b64decode(secret["data"]["transfer-token"]).decode()
            assert len(transfer_token) >= 43
            assert transfer_token not in json.dumps(pod)
            pod_log = cluster.pod_log(pod["metadata"]["name"])  # `kubectl logs`
            assert "registered pod" in pod_log
            for secret_value in (password, transfer_token, user[1]):
                assert secret_value not in pod_log
            assert "redis=redis://:***@127.0.0.1" in operator.log()
            assert password not in operator.log()

            # A new workers' URL (an equivalent one) reaches the Secret when the operator restarts with it.
            moved = f"{pods_url}?health_check_interval=30"
            operator.stop()
            operator.env = {**operator.env, "ARDIFF_WORKER_REDIS_URL": moved}
            operator.start().wait_ready()
            wait_until(
                lambda: (
                    secret_url(cluster.get("secrets", "pool-workers-redis", core=True) or {"data": {}})
                    == with_user(moved, *user)
                ),
                what="the Secret to hold the new URL",
            )
            assert f"workers' redis={redact_url(moved)}" in operator.log()
            assert redact_url(moved).startswith("redis://:***@")
            kept = cluster.get("secrets", "pool-workers-redis", core=True)
            assert base64.b64decode(kept["data"]["transfer-token"]).decode() == transfer_token  # not remade
            for secret_value in (password, transfer_token, user[1]):
                assert secret_value not in operator.log()
        finally:
            try:
                cluster.delete_all()
            finally:
                operator.stop()


async def test_a_secret_the_pool_does_not_own_is_left_alone_and_no_pod_reads_it(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pool-workers-redis"},
        "data": {"url": base64.b64encode(b"redis://elsewhere:6379/0").decode()},
    }
    response = cluster.http.post(f"/api/v1/namespaces/{cluster.namespace}/secrets", json=foreign)
    assert response.status_code == 201, response.text
    cluster.create_pool()
    event = wait_until(lambda: cluster.events("SecretConflict"), what="a SecretConflict event")[0]
    assert (event["type"], event["involvedObject"]["name"]) == ("Warning", "pool")
    assert "pool-workers-redis" in event["message"]
    await asyncio.sleep(1.5)  # several rounds: none creates a Pod that would read someone else's URL
    assert cluster.pods() == []
    secret = cluster.get("secrets", "pool-workers-redis", core=True)
    assert secret is not None
    assert secret_url(secret) == "redis://elsewhere:6379/0"
    assert "ownerReferences" not in secret["metadata"]

    cluster.delete("secrets", "pool-workers-redis", core=True)  # the name is free: the pool takes it
    cluster.wait_pods(1)
    owned = cluster.get("secrets", "pool-workers-redis", core=True)
    assert owned is not None
    assert owned["metadata"]["ownerReferences"][0]["name"] == "pool"
    assert len(cluster.events("SecretConflict")) == 1  # reported once


async def test_a_pod_that_never_registers_is_reported_and_replaced(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # Its workers are told a Redis nobody listens on: they crash-loop and never register.
    unreachable = [*FAKE_WORKER_ENV, {"name": "ARDIFF_REDIS_URL", "value": "redis://127.0.0.1:1/0"}]
    cluster.create_pool(env=unreachable, startupTimeoutSeconds=3)
    (first,) = wait_until(lambda: cluster.pod_names() or None, what="the first pod")
    event = wait_until(lambda: cluster.events("StartupTimeout"), what="a StartupTimeout event")[0]
    assert (event["type"], event["involvedObject"]["name"]) == ("Warning", "pool")
    assert event["message"] == (
        f"worker pod {first} did not register within 3 s (spec.startupTimeoutSeconds): replaced it"
    )
    # Replaced: the stuck pod goes, a successor is created at once (min 1).
    wait_until(lambda: (names := cluster.pod_names()) and first not in names, what="a successor pod")
    progressing = wait_until(
        lambda: (c := cluster.pool_condition("Progressing")).get("status") == "False" and c,
        what="Progressing=False",
    )
    assert progressing["reason"] == "StartupTimeout"
    assert "did not register within 3 s" in progressing["message"]
    cluster.create_session("waiting")
    cluster.wait_phase("waiting", "Pending", reason="PodStarting")  # the successor is starting

    # Fixed (and a longer deadline, for a loaded machine): a pod made from the new spec registers, the
    # condition recovers and the session is placed.
    cluster.patch_pool_spec({"env": FAKE_WORKER_ENV, "startupTimeoutSeconds": 20})
    cluster.wait_phase("waiting", "Ready", timeout=60)
    wait_until(
        lambda: cluster.pool_condition("Progressing").get("reason") == "PodsRegistered",
        what="Progressing=True once every pod registered",
    )
    assert cluster.pool_condition("Progressing")["status"] == "True"


def template_hashes(cluster: Cluster) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["annotations"]["ardiffusion.dev/template-hash"]
        for p in cluster.pods()
        if not p["metadata"].get("deletionTimestamp")
    }


async def test_a_spec_change_replaces_empty_pods_at_once(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_pool(replicas={"min": 2, "max": 2})
    cluster.wait_pods(2)
    before = template_hashes(cluster)
    assert len(set(before.values())) == 1
    cluster.patch_pool_spec({"image": "ghcr.io/ardiff/ardiff-worker:next"})
    after = wait_until(
        lambda: (h := template_hashes(cluster)) and not set(h) & set(before) and len(h) == 2 and h,
        what="both pods replaced",
    )
    assert len(set(after.values())) == 1
    assert set(after.values()) != set(before.values())
    cluster.wait_pods(2)
    status = wait_until(
        lambda: (s := cluster.pool_status()).get("readyReplicas") == 2 and s.get("replicas") == 2 and s,
        what="the pool status after the roll",
    )
    assert status["updatedReplicas"] == 2
    images = [
        p["spec"]["containers"][0]["image"]
        for p in cluster.pods()
        if not p["metadata"].get("deletionTimestamp")  # the old ones may still be terminating
    ]
    assert images == ["ghcr.io/ardiff/ardiff-worker:next"] * 2


async def test_a_spec_change_never_cuts_a_session_short(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    cluster.create_pool(replicas={"min": 1, "max": 2})
    cluster.create_session("early")
    early = cluster.wait_phase("early", "Ready")
    assert cluster.tick("early", 0).status_code == 200
    old_pod = early["pod"]
    old_hash = template_hashes(cluster)[old_pod]

    cluster.patch_pool_spec({"env": [*FAKE_WORKER_ENV, {"name": "ARDIFF_FAKE_TICK_SECONDS", "value": "0"}]})
    # The old pod holds a session: it stays, takes no new one, and a current pod joins (max 2).
    rolling = wait_until(
        lambda: (c := cluster.pool_condition("Progressing")).get("reason") == "RollingUpdate" and c,
        what="Progressing=RollingUpdate",
    )
    assert rolling["message"].endswith("1 older ones take no new session and go once they hold none")
    cluster.create_session("late")
    late = cluster.wait_phase("late", "Ready")
    assert late["pod"] != old_pod
    assert template_hashes(cluster)[late["pod"]] != old_hash
    old_record = await store.get_pod(pool, old_pod)
    assert old_record is not None
    assert (old_record.draining, old_record.used) == (True, 1)
    status = wait_until(
        lambda: (s := cluster.pool_status()).get("replicas") == 2 and s.get("updatedReplicas") == 1 and s,
        what="2 replicas, 1 updated",
    )
    assert status["sessions"] == 2
    assert cluster.tick("early", 1).status_code == 200  # the old session ticks on, where it was
    assert cluster.status("early")["pod"] == old_pod

    # Once it holds no session, the old pod goes; nothing else moves.
    cluster.delete("ardiffusionsessions", "early")
    wait_until(lambda: cluster.pod_names() == {late["pod"]}, what=f"pod {old_pod} to be retired")
    status = wait_until(
        lambda: (s := cluster.pool_status()).get("replicas") == 1 and s.get("updatedReplicas") == 1 and s,
        what="1 replica, updated",
    )
    assert cluster.pool_condition("Progressing")["reason"] == "PodsRegistered"
    now = cluster.status("late")
    assert (now["phase"], now["pod"], now["resetRequired"]) == ("Ready", late["pod"], False)
    assert cluster.tick("late", 0).status_code == 200
    assert await store.check_invariants(pool) == []


async def test_a_template_the_api_refuses_is_reported_not_retried_in_a_storm(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    # Memory may be overcommitted, but never requested beyond its limit: the apiserver refuses the Pod (the
    # pool CRD cannot judge quantities, so the pool itself is admitted).
    invalid = {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}
    cluster.create_pool(resources=invalid)
    progressing = wait_until(
        lambda: (c := cluster.pool_condition("Progressing")).get("reason") == "InvalidPodTemplate" and c,
        what="Progressing=False InvalidPodTemplate",
    )
    assert progressing["status"] == "False"
    assert progressing["message"].startswith('Pod "pool-')
    assert progressing["message"].endswith(
        'is invalid: spec.containers[0].resources.requests: Invalid value: "2Gi": must be less than or '
        "equal to memory limit of 1Gi"
    )
    [event] = wait_until(lambda: cluster.events("InvalidPodTemplate"), what="an InvalidPodTemplate event")
    assert (event["type"], event["involvedObject"]["name"]) == ("Warning", "pool")
    assert event["message"] == progressing["message"]
    # No phantom pod starting, and no retry storm: rounds run every 0.5 s, the next try waits 10 s.
    await asyncio.sleep(3)
    assert cluster.pods() == []
    status = cluster.pool_status()
    assert (status["replicas"], status["readyReplicas"]) == (0, 0)
    assert operator_process.log().count("the API refused a worker pod of pool pool") == 1
    assert len(cluster.events("InvalidPodTemplate")) == 1

    # Fixed spec: a pod is made from the new template at once, and the condition recovers.
    cluster.patch_pool_spec({"resources": {"requests": None}})  # a merge patch: null removes
    cluster.wait_pods(1)
    wait_until(
        lambda: cluster.pool_condition("Progressing").get("reason") == "PodsRegistered",
        what="Progressing=True once the pod registered",
    )
