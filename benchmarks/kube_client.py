"""The operator's Kubernetes client beside the well-kept async ones, on the real API server (issue 24 item 6).

`operator/kube.py` is the operator's client: JSON dicts through kubernetes_asyncio's generic `ApiClient` (it
was a hand-written httpx client until this benchmark chose kubernetes_asyncio). This measures it beside kr8s
(what dask-kubernetes' operator uses; httpx) and bare kubernetes_asyncio (the official client's generated
async twin, aiohttp, through its typed APIs: the baseline under ours) doing the operator's hot calls on one
dev cluster's kube-apiserver + etcd:
- `patch status`: a merge-patch of an ARDiffusionSession's `status` subresource (every session status write);
- `get secret`: a GET of a Secret (admission reads the session's token Secret);
- `create secret`: a POST of a Secret (admission makes one per session).

Each arm does `--ops` calls of each kind at concurrency 1 (latency) and `--concurrency` (throughput); the arms
run interleaved, `--rounds` times, and the table reports the median round: wall µs per call and this process's
CPU µs per call (the client's own cost; the API server's is the same for all three), and each as a ratio of
ours. kr8s is not a dependency of ardiff: `pip install kr8s` first.

    .venv/bin/python benchmarks/kube_client.py [--ops 300] [--concurrency 16] [--rounds 3] [--smoke]

`--smoke`: 20 calls of each kind, concurrency 4, one round; the kr8s arm left out where kr8s is not installed
(the test's run, tests/operator/test_kube_client_benchmark.py).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import kopf
import kubernetes_asyncio.client
import kubernetes_asyncio.config

from ardiff.devcluster.cluster import SIMULATED_NODE, SIMULATED_TAINT, DevCluster, NodeSpec
from ardiff.operator.kube import SECRETS, SESSIONS, KubeApi
from ardiff.wire import API_VERSION, GROUP, SESSION_PLURAL, VERSION

NAMESPACE = "default"
KINDS = ("patch status", "get secret", "create secret")
# Nothing runs on it: the cluster's API server and etcd are what is measured.
ONE_SIMULATED_NODE = NodeSpec(SIMULATED_NODE, simulated=True, taints=(SIMULATED_TAINT,))


class Client(Protocol):
    """One arm: the three calls, as the operator would make them."""

    name: str

    async def patch_status(self, session: str, chunk: int) -> None: ...
    async def get_secret(self, name: str) -> None: ...
    async def create_secret(self, name: str) -> None: ...
    async def close(self) -> None: ...


def secret_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "stringData": {"token": "t" * 43},
    }


class Ours:
    name = "operator/kube.py (kubernetes_asyncio ApiClient, dicts)"

    def __init__(self, cluster: DevCluster) -> None:
        admin = cluster.admin
        assert admin.certificate is not None
        info = kopf.ConnectionInfo(
            server=admin.server,
            ca_path=str(admin.ca),
            certificate_path=str(admin.certificate.cert),
            private_key_path=str(admin.certificate.key),
        )
        self.api = KubeApi(lambda: info)

    async def patch_status(self, session: str, chunk: int) -> None:
        assert await self.api.patch_status(SESSIONS, NAMESPACE, session, {"chunkIndex": chunk})

    async def get_secret(self, name: str) -> None:
        assert await self.api.get(SECRETS, NAMESPACE, name) is not None

    async def create_secret(self, name: str) -> None:
        assert await self.api.create(SECRETS, secret_body(name)) is not None

    async def close(self) -> None:
        await self.api.close()


class Kr8s:
    name = "kr8s 0.20 (httpx)"

    def __init__(self, api: Any) -> None:
        from kr8s.asyncio.objects import new_class

        self.api = api
        self.session_class = new_class(
            kind="ARDiffusionSession", version=API_VERSION, namespaced=True, plural=SESSION_PLURAL
        )

    @classmethod
    async def connect(cls, kubeconfig: Path) -> Kr8s:
        import kr8s.asyncio

        return cls(await kr8s.asyncio.api(kubeconfig=str(kubeconfig), namespace=NAMESPACE))

    async def patch_status(self, session: str, chunk: int) -> None:
        obj = self.session_class({"metadata": {"name": session, "namespace": NAMESPACE}}, api=self.api)
        await obj.patch({"status": {"chunkIndex": chunk}}, subresource="status")

    async def get_secret(self, name: str) -> None:
        from kr8s.asyncio.objects import Secret

        await Secret.get(name, namespace=NAMESPACE, api=self.api)

    async def create_secret(self, name: str) -> None:
        from kr8s.asyncio.objects import Secret

        await Secret(secret_body(name), api=self.api).create()

    async def close(self) -> None:
        pass  # kr8s keeps its client for the process


class KubernetesAsyncio:
    name = "kubernetes_asyncio 36 typed APIs, bare (aiohttp)"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.custom = kubernetes_asyncio.client.CustomObjectsApi(client)
        self.core = kubernetes_asyncio.client.CoreV1Api(client)

    @classmethod
    async def connect(cls, kubeconfig: Path) -> KubernetesAsyncio:
        configuration = kubernetes_asyncio.client.Configuration()
        await kubernetes_asyncio.config.load_kube_config(str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        return cls(kubernetes_asyncio.client.ApiClient(configuration))

    async def patch_status(self, session: str, chunk: int) -> None:
        await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            NAMESPACE,
            SESSION_PLURAL,
            session,
            {"status": {"chunkIndex": chunk}},
            _content_type="application/merge-patch+json",
        )

    async def get_secret(self, name: str) -> None:
        await self.core.read_namespaced_secret(name, NAMESPACE)

    async def create_secret(self, name: str) -> None:
        await self.core.create_namespaced_secret(NAMESPACE, secret_body(name))

    async def close(self) -> None:
        await self.client.close()


@dataclass(frozen=True)
class Cost:
    wall_us: float  # per call
    cpu_us: float  # this process's CPU per call


async def timed(calls: list[Callable[[], Awaitable[None]]], concurrency: int) -> Cost:
    queue = list(reversed(calls))

    async def drain() -> None:
        while queue:
            await queue.pop()()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(drain() for _ in range(concurrency)))
    return Cost(
        (time.perf_counter() - wall) / len(calls) * 1e6, (time.process_time() - cpu) / len(calls) * 1e6
    )


async def one_round(client: Client, ops: int, concurrency: int, tag: str) -> dict[tuple[str, int], Cost]:
    costs: dict[tuple[str, int], Cost] = {}
    for width in (1, concurrency):
        secrets = [f"bench-{tag}-{width}-{i}" for i in range(ops)]
        costs["create secret", width] = await timed(
            [lambda s=s: client.create_secret(s) for s in secrets], width
        )
        costs["get secret", width] = await timed([lambda s=s: client.get_secret(s) for s in secrets], width)
        costs["patch status", width] = await timed(
            [lambda i=i: client.patch_status(f"bench-{i % 50}", i) for i in range(ops)], width
        )
    return costs


def make_sessions(cluster: DevCluster) -> None:
    with cluster.admin.client() as http:
        for i in range(50):
            body = {
                "apiVersion": API_VERSION,
                "kind": "ARDiffusionSession",
                "metadata": {"name": f"bench-{i}"},
                "spec": {"poolRef": "pool", "prompt": "a slow walk", "seed": 7},
            }
            reply = http.post(f"/apis/{API_VERSION}/namespaces/{NAMESPACE}/{SESSION_PLURAL}", json=body)
            assert reply.status_code == 201, reply.text


async def measure(
    cluster: DevCluster, ops: int, concurrency: int, rounds: int, with_kr8s: bool = True
) -> None:
    clients: list[Client] = [
        Ours(cluster),
        *([await Kr8s.connect(cluster.kubeconfig)] if with_kr8s else []),
        await KubernetesAsyncio.connect(cluster.kubeconfig),
    ]
    for client in clients:  # warm: connections made, imports done
        await one_round(client, 20, concurrency, f"warm-{clients.index(client)}")
    results: dict[str, list[dict[tuple[str, int], Cost]]] = {c.name: [] for c in clients}
    for number in range(rounds):
        for index, client in enumerate(clients):
            results[client.name].append(await one_round(client, ops, concurrency, f"r{number}-{index}"))
    for client in clients:
        await client.close()
    report(results, concurrency)


def median_cost(runs: list[dict[tuple[str, int], Cost]], key: tuple[str, int]) -> Cost:
    return Cost(
        statistics.median(r[key].wall_us for r in runs), statistics.median(r[key].cpu_us for r in runs)
    )


def report(results: dict[str, list[dict[tuple[str, int], Cost]]], concurrency: int) -> None:
    names = list(results)
    ours = names[0]
    print("| call | concurrency | client | wall µs/call | CPU µs/call | wall ÷ ours | CPU ÷ ours |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for kind in KINDS:
        for width in (1, concurrency):
            base = median_cost(results[ours], (kind, width))
            for name in names:
                cost = median_cost(results[name], (kind, width))
                print(
                    f"| {kind} | {width} | {name} | {cost.wall_us:,.0f} | {cost.cpu_us:,.0f} "
                    f"| {cost.wall_us / base.wall_us:.2f} | {cost.cpu_us / base.cpu_us:.2f} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="calls of each kind per round and arm")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="20 ops, concurrency 4, one round (the test's)")
    args = parser.parse_args()
    with_kr8s = True
    if args.smoke:
        args.ops, args.concurrency, args.rounds = 20, 4, 1
        with_kr8s = importlib.util.find_spec("kr8s") is not None
        if not with_kr8s:
            print("kr8s is not installed: its arm is left out")
    with (
        tempfile.TemporaryDirectory(prefix="ardiff-kube-client-") as tmp,
        DevCluster(Path(tmp), nodes=[ONE_SIMULATED_NODE], worker_image=False) as cluster,
    ):
        make_sessions(cluster)
        asyncio.run(measure(cluster, args.ops, args.concurrency, args.rounds, with_kr8s))


if __name__ == "__main__":
    main()
