"""Fixtures shared by every test tier: one real redis-server and one real Kubernetes cluster per session.

The cluster (`dev_cluster`: etcd, kube-apiserver, kube-controller-manager, kube-scheduler built from their Go
modules, two process kubelets, kube-proxy, CoreDNS; `ardiff.devcluster.cluster`) starts on first use; the
session's Redis binds loopback and the cluster network's root address, where the cluster's Pods reach it.

Rules for sharing them (worker processes started per module register in Redis):
- never FLUSHALL/FLUSHDB the shared server; give every test its own pool name (`unique_pool`);
- a test that must lose Redis data starts its own `RedisServer`;
- on the cluster give every test (or module) its own namespace (`kube_namespace`); the kubelets run the Pods
  of every namespace.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from ardiff.devcluster.cluster import DevCluster, default_nodes
from ardiff.devcluster.network import ClusterNetwork, claimed_network
from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore

# The tests run torch on CPU next to other processes: one thread each keeps 2-core machines usable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests talk to the session's cluster only, never to a cluster of the developer's: `kubernetes` reads
# KUBECONFIG when it is imported, so it is set here, before any test module imports it (the file appears with
# `dev_cluster`). kubectl's discovery cache goes with it.
_KUBE_DIR = Path(tempfile.mkdtemp(prefix="ardiff-tests-kube-"))
os.environ["KUBECONFIG"] = str(_KUBE_DIR / "kubeconfig")
os.environ["KUBECACHEDIR"] = str(_KUBE_DIR / "kubectl-cache")

_pool_counter = itertools.count()


@pytest.fixture(scope="session")
def cluster_network() -> Iterator[ClusterNetwork]:
    """The session's slot of the cluster network (namespaces, bridges, addresses; see `network`)."""
    with claimed_network() as (network, _lock):
        yield network


@pytest.fixture(scope="session")
def redis_server(cluster_network: ClusterNetwork) -> Iterator[RedisServer]:
    with RedisServer(bind=("127.0.0.1", cluster_network.host_ip)) as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def cluster_redis_url(redis_server: RedisServer, cluster_network: ClusterNetwork) -> str:
    """The session's Redis as the cluster's Pods reach it."""
    return redis_server.url_at(cluster_network.host_ip)


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
def dev_cluster(
    cluster_network: ClusterNetwork, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    """The session's Kubernetes cluster with crds/ installed; KUBECONFIG names its admin (`system:masters`),
    so kubectl, `kubernetes.config.load_kube_config()` and kopf use it. `.admin.client()`: an httpx client."""
    cluster = DevCluster(
        tmp_path_factory.mktemp("cluster"),
        network=cluster_network,
        redis=redis_server,
        nodes=default_nodes(simulated=True),
    )
    with cluster:
        cluster.admin.write_kubeconfig(Path(os.environ["KUBECONFIG"]))
        yield cluster


_namespace_counter = itertools.count()


def namespace_name(request: pytest.FixtureRequest) -> str:
    name = f"t{next(_namespace_counter)}-{request.node.name[:40].lower().replace('_', '-')}"
    return "".join(ch for ch in name if ch.isalnum() or ch == "-").strip("-")[:63]


@pytest.fixture
def kube_namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the cluster, deleted (with everything in it) after the test (not waited for)."""
    name = namespace_name(request)
    with dev_cluster.admin.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
        yield name
        client.delete(f"/api/v1/namespaces/{name}")
