"""Scale to zero and back on the dev cluster (issue 14 item 2): the cold start a session of an empty pool
waits for, with real workers.

One dev cluster (the real control plane, the process kubelet's two nodes running worker Pods from the worker
image, real Redis, the real operator with its Prometheus metrics) and a pool with `replicas.min: 0`, `max: 1`:
the tiny LingBot-World at 64x64 on CPU (vllm-omni's paged-KV runner, one torch thread), two slots per pod,
`scaleDownDelaySeconds` 3. Each run starts from zero pods; a new Pod makes the tiny model in its own cache
(per Pod, as on a cluster without a shared model volume):

1. a session is created (`KubeSessions.create`); timed from there: its status `Pending` with reason
   `PodStarting` (the message the user sees), the worker Pod created, the Pod Ready, the session `Ready` (the
   client does nothing but wait), its first tick (reset, chunk 0) returning frames;
2. with that pod up, a second session: created → `Ready` (the warm path, the same pool);
3. both deleted: timed from their deletion's end (finalized) until the pool has no pod again (the delay,
   then the worker's graceful exit and the Pod's final delete).

The pool's `status.lastPodStartupSeconds` (creation → registration, what the next cold session's message
quotes) and the operator's `ardiff_session_placement_seconds` histogram are printed beside them.

    .venv/bin/python benchmarks/cold_start.py [--runs 2] [--smoke]

`--smoke`: one run. The suite runs one on the test session's cluster
(`tests/e2e/test_cold_start_benchmark.py`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ardiff.client import CAMERA_TOUR
from ardiff.devcluster.bench_target import BenchTarget
from ardiff.devcluster.cluster import BENCHMARK_OPERATOR_ENV, OPERATOR_COMMAND, DevCluster
from ardiff.devcluster.pools import tiny_pool
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.worker.net import free_port

T = TypeVar("T")
NAMESPACE = "bench"
SCALE_DOWN_DELAY = 3
POOL = tiny_pool("world", min_replicas=0, max_replicas=1, scale_down_delay_seconds=SCALE_DOWN_DELAY)
TIMEOUT = 600.0


def all_pods(target: BenchTarget) -> list[dict[str, Any]]:
    with target.kube.admin.client(timeout=10) as client:
        reply = client.get(f"/api/v1/namespaces/{target.namespace}/pods")
    reply.raise_for_status()
    return reply.json()["items"]


def any_pod(target: BenchTarget) -> bool:
    return bool(all_pods(target))


def pool_status(target: BenchTarget) -> dict[str, Any]:
    path = (
        f"/apis/ardiffusion.dev/v1alpha1/namespaces/{target.namespace}/ardiffusionworkerpools/{target.pool}"
    )
    with target.kube.admin.client(timeout=10) as client:
        return client.get(path).json().get("status") or {}


def placement_histogram(metrics_url: str) -> tuple[float, float]:
    """(count, sum) of the operator's placement histogram for the pool."""
    found = {}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=5).text):
        for s in family.samples:
            if s.labels.get("pool") == "world" and s.name.startswith("ardiff_session_placement_seconds_"):
                found[s.name.rsplit("_", 1)[1]] = s.value
    return found.get("count", 0.0), found.get("sum", 0.0)


def one_run(target: BenchTarget, run: int) -> dict[str, Any]:
    sessions = target.sessions
    wait_until(lambda: not any_pod(target), timeout=TIMEOUT, what="an empty pool", poll=0.05)
    cold, warm = f"cold-{run}", f"warm-{run}"
    times: dict[str, float] = {}
    message = ""
    started = time.monotonic()
    sessions.create(cold, pool="world", prompt="a walk through a quiet village")

    def progress() -> bool:
        nonlocal message
        status = sessions.status(cold)
        listed = list(target.worker_pods().values())
        now = time.monotonic() - started  # stamped after both reads: an upper bound within ~50 ms
        if status.get("reason") == "PodStarting" and "pending PodStarting" not in times:
            times["pending PodStarting"] = now
            message = status.get("message", "")
        if listed and "pod created" not in times:
            times["pod created"] = now
        if listed and condition_true(listed[0], "Ready") and "pod Ready" not in times:
            times["pod Ready"] = now
        if status.get("phase") == "Ready":
            times["session Ready"] = now
            return True
        return False

    wait_until(progress, timeout=TIMEOUT, what=f"session {cold} Ready", poll=0.05)
    with sessions.connect(cold, timeout=TIMEOUT) as client:
        client.reset()
        chunk = client.tick([CAMERA_TOUR[0]])
        times["first chunk"] = time.monotonic() - started
        assert chunk.frames.shape[0] > 0
    warm_started = time.monotonic()
    sessions.create(warm, pool="world", prompt="a walk along a river")
    sessions.wait_for(warm, lambda s: s.get("phase") == "Ready", timeout=TIMEOUT, poll=0.05)
    times["warm session Ready"] = time.monotonic() - warm_started
    startup = pool_status(target).get("lastPodStartupSeconds")
    sessions.delete(cold, wait=True)
    sessions.delete(warm, wait=True)
    deleted = time.monotonic()
    wait_until(lambda: not any_pod(target), timeout=TIMEOUT, what="the pool back at zero pods")
    times["back to zero pods"] = time.monotonic() - deleted
    return {"times": times, "startup": startup, "message": message}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one run")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = Path(tempfile.mkdtemp(prefix="ardiff-bench-cold-"))
    metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    cluster = DevCluster(
        workdir,
        operator_command=(*OPERATOR_COMMAND, "--metrics", metrics_url),
        namespace=NAMESPACE,
        operator_env=BENCHMARK_OPERATOR_ENV,
    )
    print(f"dev cluster in {workdir}; loadavg at start {os.getloadavg()[0]:.1f}", flush=True)
    with cluster:
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(POOL))
        target = BenchTarget.of_cluster(cluster, POOL["metadata"]["name"], metrics_url)
        results = [one_run(target, run) for run in range(args.runs)]
        count, total = placement_histogram(metrics_url)
    print_report(results, count, total)
    print(f"loadavg at end {os.getloadavg()[0]:.1f}")


def print_report(results: list[dict[str, Any]], count: float, total: float) -> None:
    """Each run's line, then each event's min / median / max over the runs and the placement histogram."""
    for run, result in enumerate(results):
        line = ", ".join(f"{k} {v:.2f}s" for k, v in result["times"].items())
        print(f"run {run}: {line}; status.lastPodStartupSeconds {result['startup']}")
        print(f"  the cold session's message: {result['message']!r}")
    print(f"\nscale from zero, {len(results)} runs (seconds after the session was created)")
    header = f"{'event':<24} {'min':>6} {'median':>7} {'max':>6}"
    print(header)
    print("-" * len(header))
    for event in results[0]["times"]:
        values = [r["times"][event] for r in results]
        print(f"{event:<24} {min(values):6.2f} {statistics.median(values):7.2f} {max(values):6.2f}")
    print(f"operator placement histogram: {count:.0f} sessions, mean {total / max(count, 1):.2f}s")


if __name__ == "__main__":
    sys.exit(main())
