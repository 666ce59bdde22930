"""Fixtures shared by every test tier: one real redis-server and one emulated Kubernetes API per session.

Rules for sharing them (worker processes started per module register in Redis):
- never FLUSHALL/FLUSHDB the shared server; give every test its own pool name (`unique_pool`);
- a test that must lose Redis data starts its own `RedisServer`;
- on the emulated API (`kube_api`, CRDs installed) give every test its own namespace (`kube_namespace`);
  the session's `pod_runner` runs the worker Pods of every namespace.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.pod_runner import PodRunner
from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore

# The tests run torch on CPU next to other processes: one thread each keeps 2-core machines usable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests talk to the emulated API only, never to a cluster of the developer's: `kubernetes` reads KUBECONFIG
# when it is imported, so it is set here, before any test module imports it (the file appears with
# `kube_api`). kubectl's discovery cache goes with it.
_KUBE_DIR = Path(tempfile.mkdtemp(prefix="ardiff-tests-kube-"))
os.environ["KUBECONFIG"] = str(_KUBE_DIR / "kubeconfig")
os.environ["KUBECACHEDIR"] = str(_KUBE_DIR / "kubectl-cache")

_pool_counter = itertools.count()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[PlacementStore]:
    """A placement store client on the shared redis-server."""
    async with PlacementStore.from_url(redis_url) as placement_store:
        yield placement_store


@pytest.fixture
def unique_pool(request: pytest.FixtureRequest) -> str:
    """A pool name no other test uses, so tests never see each other's keys."""
    return f"pool-{next(_pool_counter)}-{request.node.name[:20].lower().replace('_', '-').strip('-')}"


@pytest.fixture(scope="session")
def kube_api() -> Iterator[KubeAPIThread]:
    """The dev cluster's emulated Kubernetes API (a thread), with crds/ installed; `.url`, `.kubeconfig`.

    KUBECONFIG points at it, so kubectl, `kubernetes.config.load_kube_config()` and kopf use it.
    """
    with KubeAPIThread(kubeconfig=Path(os.environ["KUBECONFIG"]), install_crds=True) as api:
        yield api


@pytest.fixture(scope="session")
def pod_runner(kube_api: KubeAPIThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    """The session's kubelet: runs every worker Pod (label app.kubernetes.io/component=worker) as a local
    process with the container's command; `.info(pod, ns)`, `.kill(pod, signal, ns)`, `.logs_dir`."""
    with PodRunner(kube_api.url, logs_dir=tmp_path_factory.mktemp("pod-logs")) as runner:
        yield runner


_namespace_counter = itertools.count()


@pytest.fixture
def kube_namespace(kube_api: KubeAPIThread, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the emulated API, deleted (with everything in it) after the test."""
    name = f"t{next(_namespace_counter)}-{request.node.name[:40].lower().replace('_', '-')}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-").strip("-")[:63]
    with httpx.Client(base_url=kube_api.url) as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
        yield name
        client.delete(f"/api/v1/namespaces/{name}")
