"""The dev cluster's emulated Kubernetes API: request latency against a bare HTTP round trip in the same run.

The API runs as its own process (as in `DevCluster`); one `httpx` client calls it sequentially. Every timed
request is preceded by a timed `GET /healthz` (the HTTP floor: routing and a tiny response, nothing else),
so the baseline sees the same load. Operations: create a session (admission: prune, default, OpenAPI,
CEL), patch its status (admission again), get it, list all sessions as JSON and as a kubectl Table, and
the delay from a status patch's response to the watch event reaching a watcher. Also `admit()` alone
(in-process, no HTTP) to show what admission costs.

    .venv/bin/python benchmarks/kube_api.py [--sessions 1000] [--lists 20] [--watch-events 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ardiff.devcluster.cluster import KubeAPIProcess
from ardiff.devcluster.crd import load_crds

SESSIONS = "/apis/ardiffusion.dev/v1alpha1/namespaces/default/ardiffusionsessions"
MERGE = {"Content-Type": "application/merge-patch+json"}
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


def session(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": name, "labels": {"ardiffusion.dev/pool": "bench"}},
        "spec": {
            "poolRef": "bench",
            "prompt": "a slow walk through a misty forest",
            "seed": 7,
            "priority": 3,
        },
    }


def status(index: int) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Ready",
            "pod": "bench-abcde",
            "endpoint": "http://127.0.0.1:8000",
            "chunkIndex": index,
            "resetRequired": False,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Placed"}],
        }
    }


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


@dataclass(frozen=True)
class Measured:
    name: str
    latencies_s: list[float]
    baseline_s: list[float]

    def row(self) -> str:
        p50, p99 = percentile(self.latencies_s, 50) * 1e3, percentile(self.latencies_s, 99) * 1e3
        ops = len(self.latencies_s) / sum(self.latencies_s)
        measured = f"{self.name:<16}{len(self.latencies_s):>6}{p50:>9.3f}{p99:>9.3f}{ops:>9.0f}"
        if not self.baseline_s:
            return f"{measured}{'-':>10}{'-':>10}{'-':>9}"
        base50, base99 = percentile(self.baseline_s, 50) * 1e3, percentile(self.baseline_s, 99) * 1e3
        return f"{measured}{base50:>10.3f}{base99:>10.3f}{p50 / base50:>9.1f}"


async def timed(
    client: httpx.AsyncClient, name: str, count: int, request: Callable[[int], Awaitable[httpx.Response]]
) -> Measured:
    latencies, baseline = [], []
    for index in range(count):
        start = time.perf_counter()
        (await client.get("/healthz")).raise_for_status()
        middle = time.perf_counter()
        (await request(index)).raise_for_status()
        end = time.perf_counter()
        baseline.append(middle - start)
        latencies.append(end - middle)
    return Measured(name, latencies, baseline)


async def watch_delay(client: httpx.AsyncClient, url: str, count: int) -> Measured:
    """From a patch's response to the MODIFIED event arriving on an open watch."""
    listing = (await client.get(SESSIONS)).json()
    received: asyncio.Queue[float] = asyncio.Queue()

    async def read() -> None:
        params = {"watch": "true", "resourceVersion": listing["metadata"]["resourceVersion"]}
        async with (
            httpx.AsyncClient(base_url=url, timeout=None) as watcher,
            watcher.stream("GET", SESSIONS, params=params) as r,
        ):
            async for line in r.aiter_lines():
                if line and json.loads(line)["type"] == "MODIFIED":
                    received.put_nowait(time.perf_counter())

    reader = asyncio.create_task(read())
    delays = []
    for index in range(count):
        await client.patch(f"{SESSIONS}/s0/status", json=status(100_000 + index), headers=MERGE)
        sent = time.perf_counter()
        delays.append(await asyncio.wait_for(received.get(), 10) - sent)
    reader.cancel()
    return Measured("watch delay", delays, [])


def admit_in_process(count: int) -> Measured:
    version = load_crds()["ardiffusionsessions.ardiffusion.dev"].version("v1alpha1")
    latencies = []
    for index in range(count):
        start = time.perf_counter()
        version.admit(session(f"s{index}"))
        latencies.append(time.perf_counter() - start)
    return Measured("admit() alone", latencies, [])


async def run(sessions: int, lists: int, watch_events: int) -> list[Measured]:
    with tempfile.TemporaryDirectory() as tmp:
        api = KubeAPIProcess(Path(tmp) / "kubeconfig", Path(tmp) / "api.log").start()
        try:
            async with httpx.AsyncClient(base_url=api.url, timeout=30) as client:
                results = [
                    await timed(
                        client, "create", sessions, lambda i: client.post(SESSIONS, json=session(f"s{i}"))
                    ),
                    await timed(
                        client,
                        "patch status",
                        sessions,
                        lambda i: client.patch(f"{SESSIONS}/s{i}/status", json=status(i), headers=MERGE),
                    ),
                    await timed(client, "get", sessions, lambda i: client.get(f"{SESSIONS}/s{i}")),
                    await timed(client, f"list {sessions}", lists, lambda i: client.get(SESSIONS)),
                    await timed(
                        client, f"table {sessions}", lists, lambda i: client.get(SESSIONS, headers=TABLE)
                    ),
                    await watch_delay(client, api.url, watch_events),
                ]
        finally:
            api.stop()
    return [*results, admit_in_process(sessions)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--lists", type=int, default=20)
    parser.add_argument("--watch-events", type=int, default=200)
    args = parser.parse_args()
    results = asyncio.run(run(args.sessions, args.lists, args.watch_events))
    header = (
        f"{'operation':<16}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'ops/s':>9}"
        f"{'HTTP p50':>10}{'HTTP p99':>10}{'p50/HTTP':>9}"
    )
    print(header)
    print("-" * len(header))
    for measured in results:
        print(measured.row())


if __name__ == "__main__":
    main()
