"""End to end on the dev cluster: tick latency through the Python client against the worker alone, and the
time from a fault of a worker's pod (`kill -9`, a pause, a partition from Redis) to its session's status
changing and to the session Ready again elsewhere.

One dev cluster (the real control plane, the process kubelet's two nodes, real Redis, the real operator) with
a pool of two real workers (worker Pods from the worker image: tiny LingBot-World, 64x64, CPU, one torch
thread each, two slots per pod, the worker's default 10 s lease).

Tick latency, one session, one run: ticks alternate between the client (`SessionClient.tick`: JSON body,
loopback HTTP, the worker's checks, forward and Redis touch, the raw body decoded to numpy) and a bare `httpx`
POST of the same kind of tick (no decoding). The baseline, "worker alone", is the worker's own time for the
same ticks, from its `server-timing` header (queue + forward + decode + encode); the overhead of a path is,
tick by tick, its round trip minus that. Ratio: a path's p50 round trip / its p50 time inside the worker.

Store recovery, repeated `--store-crashes` times per variant: two sessions, one per pod, ticked back to
back by `TickRecorder`s (raw HTTP, every answer kept); `redis-server` killed with SIGKILL and started again
empty on the same port (alone, then together with the operator, which is started again at once). Timed: the
window from the restart to each session's first 200 (request sent after the restart), in seconds and in ticks
(the window over the median tick period of the same session before the crash, the baseline of the same run);
every answer in the window must be a retryable 503 (`placement_recovering`, `not_ready`): any other aborts
the run.

Recovery (issue 40: the window under each fault), `--faults` rounds of each kind in turn: two sessions, one
per pod, each ticked; then one pod's worker (its pid from the Pod's `containerID`, as on its node) is killed
(`kill -9`), paused (SIGSTOP until the session is bound again) or cut from Redis (iptables in its network
namespace, until then too) — `ardiff.devcluster.faults`. Timed from the fault, the session's status polled
every 20 ms from outside: (1) its first change (phase no longer Ready, or its binding moved), (2) Ready again
with `resetRequired` on a live pod (the operator marks it Lost and places it again: at once for a dead
container, once the lease lapsed for a pause or a partition), (3) its first tick after `reset()` returned
frames, (4) the faulted pod's worker Ready again (restarted; a woken or healed worker is fenced and restarts).
Every wait is bounded; the Lost and Replaced Events are checked after each fault.

    .venv/bin/python benchmarks/e2e.py [--ticks 40] [--warmup 3] [--faults 3] [--store-crashes 3] [--smoke]

`--smoke`: 3 measured ticks per path after one warm-up, one fault of each kind, one Redis crash per variant.
The suite runs the same on the test session's cluster (`tests/e2e/test_e2e_benchmark.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from ardiff.client import CAMERA_TOUR, ResetRequired, hold, parse_server_timing
from ardiff.devcluster.bench_target import BenchTarget
from ardiff.devcluster.cluster import BENCHMARK_OPERATOR_ENV, OPERATOR_COMMAND, DevCluster, pod_pid
from ardiff.devcluster.faults import FaultInjector
from ardiff.devcluster.network import short_pod_id
from ardiff.devcluster.pools import tiny_pool
from ardiff.devcluster.tick_recorder import TickRecorder
from ardiff.devcluster.waiting import condition_true, wait_until

T = TypeVar("T")
NAMESPACE = "bench"
POOL = tiny_pool("world", min_replicas=2, max_replicas=2, scale_down_delay_seconds=3600)
START_TIMEOUT = 600.0  # the first two workers: imports and model load on a loaded machine
RESTART_TIMEOUT = 180.0  # one worker process started again
RECOVERY_TIMEOUT = 30.0  # the operator notices a dead pod within a reconcile round or two
FAULT_TIMEOUT = 60.0  # a pause or a partition is noticed when the worker's lease (10 s) lapses
FAULT_KINDS = ("kill", "pause", "partition")
RETRYABLE = {(503, "placement_recovering"), (503, "not_ready")}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ready_pods(target: BenchTarget) -> set[str]:
    return {name for name, p in target.worker_pods().items() if condition_true(p, "Ready")}


def measure_ticks(target: BenchTarget, ticks: int, warmup: int) -> dict[str, list[tuple[float, float]]]:
    """(round trip, time inside the worker) in seconds of each measured tick, per path."""
    sessions = target.sessions
    sessions.create("latency", pool=target.pool, prompt="a walk through a quiet village")
    paths: dict[str, list[tuple[float, float]]] = {"bare HTTP POST": [], "Python client tick": []}
    try:
        with sessions.connect("latency", timeout=START_TIMEOUT) as session, httpx.Client(timeout=120) as http:
            for i in range(warmup):
                session.tick([CAMERA_TOUR[i % len(CAMERA_TOUR)]])
            headers = {"Authorization": f"Bearer {session.token}", "Accept": "application/octet-stream"}
            for i in range(ticks):
                controls = [CAMERA_TOUR[i % len(CAMERA_TOUR)]]
                chunk = session.tick(controls)
                paths["Python client tick"].append((chunk.latency_s, chunk.server_ms / 1000))
                body = {
                    "request_id": f"raw-{i}",
                    "chunk_index": session.next_chunk_index,
                    "controls": controls,
                }
                url = f"{session.endpoint}/v1/sessions/latency/ticks"
                started = time.perf_counter()
                response = http.post(url, json=body, headers=headers)
                elapsed = time.perf_counter() - started
                response.raise_for_status()
                server = sum(parse_server_timing(response.headers["server-timing"]).values()) / 1000
                paths["bare HTTP POST"].append((elapsed, server))
                session.next_chunk_index += 1
    finally:
        sessions.delete("latency", wait=True)
    return paths


@contextlib.contextmanager
def injected(target: BenchTarget, faults: FaultInjector, kind: str, pod: str) -> Iterator[None]:
    """Fault `kind` on a worker Pod while the block runs: `kill` (-9 of its process, as on its node; nothing
    to end), `pause` (SIGSTOP, SIGCONT after) or `partition` (its network namespace loses Redis)."""
    found = target.worker_pods()[pod]
    pid = pod_pid(found)
    if pid is None:
        raise RuntimeError(f"pod {pod} has no running container")
    if kind == "kill":
        faults.kill(pid, f"pod {pod}")
        yield
    elif kind == "pause":
        with faults.paused(pid, f"pod {pod}"):
            yield
    else:
        network, redis = target.kube.network, target.redis
        assert network is not None
        assert redis is not None
        namespace = network.pod_namespace(short_pod_id(found["metadata"]["uid"]))
        with faults.partition(namespace, network.host_ip, redis.port):
            yield


def measure_fault(target: BenchTarget, faults: FaultInjector, kind: str, round_: int) -> dict[str, float]:
    """One fault on the pod of a session that has just ticked: seconds from the fault to the session's first
    status change (its phase no longer Ready, or its binding moved: polled every 20 ms from outside), to Ready
    again on a live pod with `resetRequired` (the operator marks it Lost and places it again: at once for a
    dead container, after the lease for a pause or a partition), to its first tick after `reset()`, and to the
    faulted pod's worker Ready again (restarted, or woken or healed, then fenced and restarted). A pause or a
    partition ends as soon as the session is bound again (past ~25 s the kubelet's liveness probe would
    restart a paused worker). Lost may show for a few ms only: it is checked in the session's Events."""
    sessions = target.sessions
    wait_until(lambda: len(ready_pods(target)) == 2, timeout=RESTART_TIMEOUT, what="two ready pods", poll=0.5)
    victim, survivor = f"{kind}-victim-{round_}", f"{kind}-survivor-{round_}"
    for name in (victim, survivor):
        sessions.create(name, pool=target.pool, prompt="recovery")
    before = sessions.wait_ready(victim, timeout=RESTART_TIMEOUT)
    faulted = before["pod"]
    if sessions.wait_ready(survivor, timeout=RESTART_TIMEOUT)["pod"] == faulted:
        raise RuntimeError("least-loaded placement put both sessions on one pod")
    for name in (victim, survivor):
        with sessions.connect(name) as session:
            session.tick([hold("w")])
    binding = (faulted, before["podEpoch"])
    restarts = target.worker_pods()[faulted]["status"]["containerStatuses"][0]["restartCount"]

    def changed(status: dict[str, Any]) -> bool:
        return status.get("phase") != "Ready" or (status.get("pod"), status.get("podEpoch")) != binding

    def bound_again(status: dict[str, Any]) -> bool:
        moved = (status.get("pod"), status.get("podEpoch")) != binding
        return status.get("phase") == "Ready" and bool(status.get("resetRequired")) and moved

    with injected(target, faults, kind, faulted):
        started = time.monotonic()
        sessions.wait_for(victim, changed, timeout=FAULT_TIMEOUT, what="its status changed", poll=0.02)
        status_changed = time.monotonic() - started
        sessions.wait_for(
            victim, bound_again, timeout=FAULT_TIMEOUT, what="Ready again, reset required", poll=0.02
        )
        ready_again = time.monotonic() - started
    with sessions.connect(victim, timeout=RECOVERY_TIMEOUT) as session:
        try:
            session.tick([hold("w")])
        except ResetRequired:
            pass
        else:
            raise RuntimeError(f"{victim} ticked on after losing its pod, without a reset")
        session.reset()
        session.tick([hold("w")])
    ticked = time.monotonic() - started

    def back() -> bool:
        pod = target.worker_pods().get(faulted)
        restarted = pod is not None and pod["status"]["containerStatuses"][0]["restartCount"] > restarts
        return restarted and faulted in ready_pods(target)

    wait_until(back, timeout=RESTART_TIMEOUT, what="the faulted worker Ready again", poll=0.2)
    restarted = time.monotonic() - started
    reasons = {event.reason for event in sessions.events(victim)}
    if not {"Lost", "Replaced"} <= reasons:
        raise RuntimeError(f"{victim}'s Lost/Replaced events are missing (it has {sorted(reasons)})")
    for name in (victim, survivor):
        sessions.delete(name, wait=True)
    return {
        "status changed": status_changed,
        "Ready again, reset required": ready_again,
        "first tick after reset()": ticked,
        "faulted worker Ready again": restarted,
    }


def measure_recovery(target: BenchTarget, rounds: int, workdir: Path) -> dict[str, list[dict[str, float]]]:
    faults = FaultInjector(workdir / "faults.jsonl")
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in FAULT_KINDS}
    for round_ in range(rounds):
        for kind in FAULT_KINDS:
            results[kind].append(measure_fault(target, faults, kind, round_))
            measured = ", ".join(f"{k} {v:.2f}s" for k, v in results[kind][-1].items())
            print(f"  {kind} {round_ + 1}: {measured}", flush=True)
    return results


def measure_store_crash(target: BenchTarget, round_: int, *, with_operator: bool) -> list[dict[str, float]]:
    """One crash of Redis (and of the operator): per session, the window to its first 200 in seconds and in
    ticks, and how many retryable answers it got meanwhile."""
    sessions = target.sessions
    names = [f"store-{round_}-{int(with_operator)}-{side}" for side in "ab"]
    for name in names:
        sessions.create(name, pool=target.pool, prompt="store recovery")
    if len({sessions.wait_ready(name, timeout=RESTART_TIMEOUT)["pod"] for name in names}) != 2:
        raise RuntimeError("least-loaded placement put both sessions on one pod")
    recorders = []
    for name in names:
        with sessions.connect(name) as session:
            session.tick([hold("w")])
            recorders.append(TickRecorder(session))
    for recorder in recorders:
        recorder.start()
    # A few ticks each: the tick period before the crash (a fixed 2 s saw fewer than two at load 5).
    wait_until(
        lambda: all(sum(a.status == 200 for a in r.answers) >= 3 for r in recorders),
        timeout=RECOVERY_TIMEOUT,
        what="three ticks of each session before the crash",
        poll=0.05,
    )
    if with_operator:
        target.operator.stop(signal.SIGKILL)
    target.redis.restart(signal.SIGKILL)
    crashed = time.monotonic()  # Redis is back, empty: the window runs from here to each first 200
    if with_operator:
        target.operator.start().wait_ready()
    for recorder in recorders:
        wait_until(
            lambda r=recorder: r.first_success_since(crashed),
            timeout=RECOVERY_TIMEOUT,
            what="a 200 after the crash",
            poll=0.05,
        )
    for recorder in recorders:
        recorder.stop()
    results = []
    for name, recorder in zip(names, recorders, strict=True):
        before = [a.sent for a in recorder.answers if a.status == 200 and a.sent < crashed]
        period = statistics.median(b - a for a, b in itertools.pairwise(before))
        recovered = recorder.first_success_since(crashed)
        assert recovered is not None
        window = [a for a in recorder.since(crashed) if a.sent < recovered.sent]
        refused = {(a.status, a.code) for a in window}
        if not refused <= RETRYABLE:
            raise RuntimeError(f"{name}: non-retryable answers while the store recovered: {sorted(refused)}")
        seconds = recovered.sent - crashed
        results.append({"seconds": seconds, "ticks": seconds / period, "retryable answers": len(window)})
    for name in names:
        sessions.delete(name, wait=True)
    return results


def measure_store_recovery(target: BenchTarget, crashes: int) -> dict[str, list[dict[str, float]]]:
    variants: dict[str, list[dict[str, float]]] = {}
    for with_operator, variant in ((False, "Redis killed"), (True, "Redis + operator killed")):
        samples = variants.setdefault(variant, [])
        for round_ in range(crashes):
            measured = measure_store_crash(target, round_, with_operator=with_operator)
            samples.extend(measured)
            print(f"  {variant}, crash {round_ + 1}: " + ", ".join(f"{m['seconds']:.2f}s" for m in measured))
    return variants


def print_store_recovery(variants: dict[str, list[dict[str, float]]]) -> None:
    print("\nRedis restarted empty (kill -9) under ticking sessions -> each session's first 200")
    header = (
        f"{'variant':<26} {'sessions':>8} {'window s min':>12} {'median':>7} {'max':>6} "
        f"{'in ticks median':>16} {'retryable answers':>18}"
    )
    print(header)
    print("-" * len(header))
    for variant, samples in variants.items():
        seconds = [s["seconds"] for s in samples]
        print(
            f"{variant:<26} {len(samples):8d} {min(seconds):12.2f} {statistics.median(seconds):7.2f} "
            f"{max(seconds):6.2f} {statistics.median(s['ticks'] for s in samples):16.1f} "
            f"{sum(int(s['retryable answers']) for s in samples):18d}"
        )


def print_ticks(paths: dict[str, list[tuple[float, float]]]) -> None:
    """Per path: round trip, time inside the worker and their difference (paired per tick), in ms."""
    client_ticks = paths["Python client tick"]
    worker_p50 = statistics.median(server for _, server in client_ticks)
    print(f"\ntick latency, 64x64, {len(client_ticks)} ticks per path, alternating (ms)")
    header = (
        f"{'path':<20} {'p50':>7} {'mean':>7} {'p99':>7} {'in worker p50':>14} {'overhead p50':>13} "
        f"{'overhead p99':>13} {'p50 / in worker':>16}"
    )
    print(header)
    print("-" * len(header))
    for name, ticks in paths.items():
        total = [t for t, _ in ticks]
        overhead = [t - server for t, server in ticks]
        print(
            f"{name:<20} {percentile(total, 0.5) * 1000:7.1f} {statistics.mean(total) * 1000:7.1f} "
            f"{percentile(total, 0.99) * 1000:7.1f} {statistics.median(s for _, s in ticks) * 1000:14.1f} "
            f"{percentile(overhead, 0.5) * 1000:13.1f} {percentile(overhead, 0.99) * 1000:13.1f} "
            f"{statistics.median(total) / statistics.median(s for _, s in ticks):16.3f}"
        )
    client_overhead = statistics.median(t - server for t, server in client_ticks)
    print(
        f"worker alone (server-timing of the client's ticks) p50 {worker_p50 * 1000:.1f} ms; the client adds "
        f"{client_overhead * 1000:.1f} ms per tick ({client_overhead / worker_p50:.1%})"
    )


def print_recovery(results: dict[str, list[dict[str, float]]]) -> None:
    rounds = len(next(iter(results.values())))
    print(f"\na fault on a worker's pod -> recovery, {rounds} of each kind (seconds after the fault)")
    header = f"{'fault':<10} {'event':<30} {'min':>6} {'median':>7} {'p99':>6} {'max':>6}"
    print(header)
    print("-" * len(header))
    for kind, samples in results.items():
        for event in samples[0]:
            values = [sample[event] for sample in samples]
            print(
                f"{kind:<10} {event:<30} {min(values):6.2f} {statistics.median(values):7.2f} "
                f"{percentile(values, 0.99):6.2f} {max(values):6.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=40, help="measured ticks per path")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--faults", type=int, default=3, help="rounds of each fault: kill, pause, partition")
    parser.add_argument("--store-crashes", type=int, default=3, help="Redis crashes per variant")
    parser.add_argument("--smoke", action="store_true", help="3 ticks, one fault of each kind, one crash")
    args = parser.parse_args()
    if args.smoke:
        args.ticks, args.warmup, args.faults, args.store_crashes = 3, 1, 1, 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = Path(tempfile.mkdtemp(prefix="ardiff-bench-e2e-"))
    cluster = DevCluster(
        workdir,
        operator_command=OPERATOR_COMMAND,
        namespace=NAMESPACE,
        operator_env=BENCHMARK_OPERATOR_ENV,
    )
    print(f"dev cluster in {workdir}; loadavg at start {os.getloadavg()[0]:.1f}", flush=True)
    with cluster:
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(POOL))
        target = BenchTarget.of_cluster(cluster, POOL["metadata"]["name"])
        wait_until(
            lambda: len(ready_pods(target)) == 2, timeout=START_TIMEOUT, what="two ready pods", poll=0.5
        )
        print_ticks(measure_ticks(target, args.ticks, args.warmup))
        print_recovery(measure_recovery(target, args.faults, workdir))
        print_store_recovery(measure_store_recovery(target, args.store_crashes))
    print(f"loadavg at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
