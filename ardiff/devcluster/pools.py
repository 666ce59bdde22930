"""The worker pools the tests and benchmarks run on the dev cluster: the tiny LingBot-World at 64x64 (or the
fake runtime) with short worker leases, and a shared tier (a ReadWriteMany claim every worker mounts as its
suspend directory) for pools whose sessions move between Pods from exports and snapshots; and how a test
looks at a pool's workers (its Pods, what each worker holds)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ardiff.devcluster.kubeconfig import Credentials
from ardiff.operator.pods import TRANSFER_TOKEN_KEY, worker_redis_secret_name


def tiny_pool(
    name: str,
    *,
    min_replicas: int,
    max_replicas: int,
    scale_down_delay_seconds: int,
    capacity: int = 2,
    env: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A pool of workers on the embedded tiny LingBot-World at 64x64, `capacity` sessions per pod, evicting
    idle sessions at once (the benchmarks' and the e2e tests' pool; `env` may make its workers fake)."""
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
            "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
            # 1 GiB of "free device memory" on CPU keeps each worker's KV pool small.
            "kv": {"sessionCapacity": capacity, "cpuFreeMemoryBytes": 1 << 30},
            **({"env": [dict(item) for item in env]} if env else {}),
            "replicas": {"min": min_replicas, "max": max_replicas},
            "scaleDownDelaySeconds": scale_down_delay_seconds,
            "eviction": {"minIdleSeconds": 0},
        },
    }


SHARED_TIER_CLAIM = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "shared-tier"},
    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
}
SHARED_TIER_PATH = "/var/lib/ardiff/tier"
# Short leases: a worker cut off or paused is noticed within seconds.
WORKER_LEASE_SECONDS = 5
WORKER_HEARTBEAT_SECONDS = 1
WORKER_LEASE_ENV = [
    {"name": "ARDIFF_LEASE_SECONDS", "value": str(WORKER_LEASE_SECONDS)},
    {"name": "ARDIFF_HEARTBEAT_SECONDS", "value": str(WORKER_HEARTBEAT_SECONDS)},
]


def build_pool(
    name: str, *, capacity: int, min_replicas: int, max_replicas: int, fake: bool
) -> dict[str, Any]:
    """A pool of the tiny model at 64x64 (or of the fake runtime) with short worker leases."""
    env = [*WORKER_LEASE_ENV]
    if fake:
        env += [
            {"name": "ARDIFF_RUNTIME", "value": "fake"},
            {"name": "ARDIFF_FAKE_CAPACITY", "value": str(capacity)},
            {"name": "ARDIFF_TEST_FAULTS", "value": "1"},
        ]
    return tiny_pool(
        name,
        capacity=capacity,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        scale_down_delay_seconds=3600,  # pods stay for the whole run
        env=env,
    )


def with_shared_tier(pool: dict[str, Any], *, snapshot_every_chunks: int = 0) -> dict[str, Any]:
    """`pool` with every worker mounting the shared tier claim (`SHARED_TIER_CLAIM`) as its suspend dir."""
    spec = dict(pool["spec"])
    env = [*spec.get("env", []), {"name": "ARDIFF_SUSPEND_DIR", "value": SHARED_TIER_PATH}]
    if snapshot_every_chunks:
        env.append({"name": "ARDIFF_SNAPSHOT_EVERY_CHUNKS", "value": str(snapshot_every_chunks)})
    spec["env"] = env
    spec["volumes"] = [
        {"name": "tier", "persistentVolumeClaim": {"claimName": SHARED_TIER_CLAIM["metadata"]["name"]}}
    ]
    spec["volumeMounts"] = [{"name": "tier", "mountPath": SHARED_TIER_PATH}]
    return {**pool, "spec": spec}


def pool_pods(admin: Credentials, namespace: str, pool: str) -> dict[str, dict[str, Any]]:
    """The pool's worker Pods that are not being deleted, by name."""
    with admin.client(timeout=10) as client:
        reply = client.get(f"/api/v1/namespaces/{namespace}/pods")
    reply.raise_for_status()
    return {
        p["metadata"]["name"]: p
        for p in reply.json()["items"]
        if p["metadata"].get("labels", {}).get("ardiffusion.dev/pool") == pool
        and not p["metadata"].get("deletionTimestamp")
    }


def transfer_token(admin: Credentials, namespace: str, pool: str) -> str:
    """The pool's transfer token (its workers' Secret), to which a worker names the sessions it holds."""
    with admin.client(timeout=10) as client:
        reply = client.get(f"/api/v1/namespaces/{namespace}/secrets/{worker_redis_secret_name(pool)}")
    reply.raise_for_status()
    return base64.b64decode(reply.json()["data"][TRANSFER_TOKEN_KEY]).decode()


def worker_sessions(pod: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The worker's `GET /v1/sessions` (capacity, admitted sessions, KV blocks) at the Pod's address, with the
    pool's transfer token."""
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"http://{pod['status']['podIP']}:8000/v1/sessions", headers=headers, timeout=10).json()
