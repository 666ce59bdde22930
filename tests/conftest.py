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

import contextlib
import copy
import itertools
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ardiff.devcluster.cluster import DevCluster, default_nodes
from ardiff.devcluster.network import ClusterNetwork, claimed_network
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import wait_until
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
        nodes=default_nodes(simulated=True, real=True),
    )
    with cluster:
        cluster.admin.write_kubeconfig(Path(os.environ["KUBECONFIG"]))
        yield cluster


_namespace_counter = itertools.count()


def namespace_name(request: pytest.FixtureRequest) -> str:
    name = f"t{next(_namespace_counter)}-{request.node.name[:40].lower().replace('_', '-')}"
    return "".join(ch for ch in name if ch.isalnum() or ch == "-").strip("-")[:63]


@contextlib.contextmanager
def fresh_namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the cluster named after the requesting test (or module), deleted with everything
    in it afterwards (not waited for)."""
    name = namespace_name(request)
    with dev_cluster.admin.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
        yield name
        client.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def kube_namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the cluster, deleted (with everything in it) after the test (not waited for)."""
    with fresh_namespace(dev_cluster, request) as name:
        yield name


# ------------------------------------------------------------------ judging objects on the real API server

DRY_RUN_NAMESPACE = "dry-run"
_WARNING = re.compile(r'^\d{3} \S+ "(?P<text>(?:[^"\\]|\\.)*)"')
_UNKNOWN_FIELD = re.compile(r'^unknown field "(?P<path>.+)"$')


@dataclass(frozen=True)
class Verdict:
    """The API server's answer to a write: the object as it would be stored (defaults applied, unknown fields
    pruned), or its refusal (a `Status`: `message`, `details.causes`), and the warnings it sent either way."""

    code: int
    body: dict[str, Any]
    warnings: tuple[str, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.code in (200, 201)

    @property
    def obj(self) -> dict[str, Any]:
        """The admitted object; fails with the server's message if it was refused."""
        assert self.admitted, f"{self.code}: {self.body.get('message', self.body)}"
        return self.body

    @property
    def message(self) -> str:
        """The refusal's message; fails if the object was admitted."""
        assert not self.admitted, f"admitted: {self.body}"
        return str(self.body["message"])

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", ""))

    @property
    def causes(self) -> list[dict[str, str]]:
        return list(self.body.get("details", {}).get("causes", []))

    @property
    def errors(self) -> list[str]:
        """Each cause as the server's message lists it: `<field>: <message>`."""
        return [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in self.causes]

    @property
    def pruned(self) -> list[str]:
        """The fields the server dropped as unknown, from its `unknown field "<path>"` warnings."""
        found = (_UNKNOWN_FIELD.match(warning) for warning in self.warnings)
        return [match["path"] for match in found if match]


def _warning_text(header: str) -> str:
    """The text of one `Warning` header (`299 - "<text>"`, quotes escaped)."""
    match = _WARNING.match(header)
    return re.sub(r"\\(.)", r"\1", match["text"]) if match else header


class Admission:
    """Judges objects on the session's real API server with server-side dry-run (`?dryRun=All`: the whole
    admission chain, defaulting, pruning, OpenAPI and CEL validation; nothing is stored). Unknown fields are
    pruned and warned about (`fieldValidation=Warn`, `Verdict.pruned`), as a client that does not ask for
    strict decoding sees it.

    `create(obj)` judges a new object, namespaced ones in `namespace` (this helper's empty namespace unless
    given; the object's own `metadata.namespace` is replaced). `update(old, new, namespace=)` creates `old`
    for real in `namespace` (a test's `kube_namespace`), then judges `new` as a dry-run PUT over it, so CEL
    transition rules see both; `subresource="status"` judges a status write (a create drops `status`)."""

    def __init__(self, client: httpx.Client, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}

    def collection(self, obj: dict[str, Any], namespace: str | None = None) -> str:
        """The URL of `obj`'s collection (its resource found through discovery)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if (api_version, kind) not in self._resources:
            listed = self.client.get(prefix)
            listed.raise_for_status()
            for resource in listed.json()["resources"]:
                if "/" not in resource["name"]:
                    self._resources[api_version, resource["kind"]] = (
                        resource["name"],
                        resource["namespaced"],
                    )
        plural, namespaced = self._resources[api_version, kind]
        return (
            f"{prefix}/namespaces/{namespace or self.namespace}/{plural}"
            if namespaced
            else f"{prefix}/{plural}"
        )

    def _placed(self, obj: dict[str, Any], namespace: str | None) -> tuple[str, dict[str, Any]]:
        url = self.collection(obj, namespace)
        placed = copy.deepcopy(obj)
        metadata = placed.setdefault("metadata", {})
        if "/namespaces/" in url:
            metadata["namespace"] = namespace or self.namespace
        else:
            metadata.pop("namespace", None)
        return url, placed

    @staticmethod
    def _verdict(response: httpx.Response) -> Verdict:
        warnings = tuple(_warning_text(w) for w in response.headers.get_list("warning"))
        return Verdict(response.status_code, response.json(), warnings)

    def create(self, obj: dict[str, Any], *, namespace: str | None = None) -> Verdict:
        url, placed = self._placed(obj, namespace)
        return self._verdict(
            self.client.post(url, params={"dryRun": "All", "fieldValidation": "Warn"}, json=placed)
        )

    def store(self, obj: dict[str, Any], *, namespace: str) -> dict[str, Any]:
        """Creates `obj` for real in `namespace`; the stored object."""
        url, placed = self._placed(obj, namespace)
        response = self.client.post(url, json=placed)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def update(
        self, old: dict[str, Any], new: dict[str, Any], *, namespace: str, subresource: str | None = None
    ) -> Verdict:
        stored = self.store(old, namespace=namespace)
        url, placed = self._placed(new, namespace)
        placed["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
        name = stored["metadata"]["name"]
        path = f"{url}/{name}" + (f"/{subresource}" if subresource else "")
        return self._verdict(
            self.client.put(path, params={"dryRun": "All", "fieldValidation": "Warn"}, json=placed)
        )


@pytest.fixture(scope="session")
def admission(dev_cluster: DevCluster) -> Iterator[Admission]:
    """Judges objects on the session's API server (server-side dry-run; see `Admission`)."""
    with dev_cluster.admin.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": DRY_RUN_NAMESPACE}}).raise_for_status()

        def default_account() -> bool:
            url = f"/api/v1/namespaces/{DRY_RUN_NAMESPACE}/serviceaccounts/default"
            return client.get(url).status_code == 200

        # Pods name a ServiceAccount, which the ServiceAccount admission plugin looks up.
        wait_until(default_account, timeout=30, what=f"the default ServiceAccount of {DRY_RUN_NAMESPACE}")
        yield Admission(client, DRY_RUN_NAMESPACE)
        client.delete(f"/api/v1/namespaces/{DRY_RUN_NAMESPACE}")
