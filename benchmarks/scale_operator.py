"""The operator at scale with simulated pods (issue 14 item 7): P pods x S sessions in a pool, three sizes.

Per size, a fresh dev cluster (real etcd, kube-apiserver, controller-manager and scheduler; no process nodes,
only simulated ones: `NodeSpec(simulated=True)`, tainted and labelled, one per `NODE_PODS` pods, whose
kubelet gives each Pod an address but no process: it registers and heartbeats in Redis through the worker's
`PodLink`; a real `redis-server`) and the real operator (`ardiff operator run`, real kopf, the cluster's
admin) serving its Prometheus metrics:
1. the pool (replicas min = max = P; fake-runtime capacity ceil((S + 2 x burst) / P); lease 600 s, heartbeat
   60 s; pinned to the simulated nodes by a nodeSelector and a toleration) comes up: the operator creates its
   P Pods, the scheduler binds them, the simulated nodes' kubelets register them;
2. one session is applied and admitted by the operator: the template of the seeded ones (spec, kopf's
   annotations);
3. S sessions are seeded while the operator runs, `--seed-chunk` at a time, each chunk first into Redis
   through the store (32 placers, then one tick each) and then into the API as CRs (the template renamed, with
   the status the operator's own `build_session_status` derives from each record) through the API server as
   any client makes them (`scale_seed.seed_objects`: a create and a status write each, admission included,
   16 in flight). Seeded while it runs because kopf's start over listed objects was quadratic (6, below);
   timed: until the operator's index has them all Ready;
4. idle rounds (nothing changes) for `--rounds` rounds: each round's time (the increase of
   `ardiff_pool_reconcile_seconds_sum` per new round, sampled every 0.5 s), the API writes made meanwhile
   (`apiserver_request_total`, the kubelets' Lease and Node heartbeats left out), the operator's RSS;
5. a burst of `--burst` new sessions created by 8 clients (benchmarks/reconcile.py's `apply_sessions`):
   apply -> Ready p50 / p99 on a watch, and the rounds during it;
6. up to `--restart-up-to` sessions: the operator restarted over them, until it serves and until its first
   round (kopf gates handlers on its indexes being filled, one toggle per listed object; upstream kopf 1.45.2
   wakes every waiting worker at each toggle, quadratic in the objects listed; operator/kopf_compat.py makes
   it linear); with `--kopf-unpatched`, then restarted once more without that patch (ARDIFF_KOPF_UNPATCHED=1),
   its first round awaited for at most `--unpatched-timeout` seconds;
7. up to `--takeover-up-to` sessions: an active operator (priority 10) and a standby (priority 0) in a
   namespaced KopfPeering with the operator's default peering lifetime, both serving; the active one killed
   (SIGKILL, a crash): seconds until the standby's first round of the pool (it notices the active peer gone,
   resumes, lists and indexes every object as at a start).
Also Redis `used_memory` per session (before and after 3), the operator's peak RSS (VmHWM), kube-apiserver's
and etcd's RSS and etcd's database size (`apiserver_storage_size_bytes`). The baseline is the first (smallest)
size of the same run; every figure is also printed as a ratio of it.

    nice -n 10 .venv/bin/python benchmarks/scale_operator.py [--sizes 10x1000,100x10000,1000x100000]
        [--burst 1000] [--rounds 5] [--restart-up-to 10000] [--kopf-unpatched] [--unpatched-timeout 300]
        [--takeover-up-to 10000] [--seed-chunk 10000] [--profile DIR] [--smoke]

`--smoke`: one size, 2 pods x 20 sessions seeded in chunks of 10, a burst of 5, 2 idle rounds, the restart
(patched and `--kopf-unpatched`) and the takeover (the test's run,
tests/operator/test_scale_operator_benchmark.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from ardiff.devcluster.cluster import OPERATOR_COMMAND, SIMULATED_TAINT, DevCluster, NodeSpec
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.scale_seed import (
    PROMPT,
    SEED,
    percentile,
    place_sessions,
    seed_objects,
    seeded_session,
    used_memory,
)
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRecord, PoolId, SessionBinding
from ardiff.operator.kopf_compat import UNPATCHED_ENV
from ardiff.worker.net import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The burst is applied and watched as benchmarks/reconcile.py does it.
from reconcile import Phase, api_writes, apply_sessions, component_pids

NAMESPACE = "scale"
POOL = PoolId(NAMESPACE, "gpu")
GROUP = f"/apis/ardiffusion.dev/v1alpha1/namespaces/{NAMESPACE}"
OPERATOR_ENV = {
    "ARDIFF_OPERATOR_RECONCILE_SECONDS": "2",
    "ARDIFF_OPERATOR_MIRROR_SECONDS": "5",
    # The seeding puts a chunk into Redis before its CRs exist; the sweep (operator/sweep.py) would release
    # records whose CR it does not list yet. It still runs once, at the pool's first round.
    "ARDIFF_OPERATOR_SWEEP_SECONDS": "86400",
}
SEED_PLACERS = 32
BURST_CLIENTS = 8
TIMEOUT = 1800.0
PEERING = "ardiff"  # the KopfPeering of the takeover (7)
ROUND_METRIC = "ardiff_pool_reconcile_seconds"
# Simulated nodes advertise 1,000 pods each (SIMULATED_NODE_CAPACITY) on a /22 pod CIDR: one node per this
# many of the pool's pods, so that no node is near full.
NODE_PODS = 800
SCALE_NODE_LABEL = "ardiff.dev/scale-node"
PLACEMENT = {
    "nodeSelector": {SCALE_NODE_LABEL: "true"},
    "tolerations": [{"key": SIMULATED_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
}
STORAGE_SIZE = re.compile(r"^apiserver_storage_size_bytes\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


def simulated_nodes(pods: int) -> list[NodeSpec]:
    """Enough simulated nodes for `pods`, tainted and labelled for the pool's placement."""
    return [
        NodeSpec(f"sim-{n}", simulated=True, labels={SCALE_NODE_LABEL: "true"}, taints=(SIMULATED_TAINT,))
        for n in range(1, max(1, -(-pods // NODE_PODS)) + 1)
    ]


def pool_body(pods: int, capacity: int) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": POOL.name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
            "image": "ghcr.io/ardiff/ardiff-worker:scale",
            "env": [
                {"name": "ARDIFF_RUNTIME", "value": "fake"},
                {"name": "ARDIFF_FAKE_CAPACITY", "value": str(capacity)},
                # 1,000 simulated pods heartbeat from one thread of this process, beside the seeding, on 2
                # shared cores: with a 30 s lease, starved heartbeats let leases lapse at 100,000 sessions
                # (16,299 sessions turned Pending: PodNotReady). The operator, not the heartbeat, is measured.
                {"name": "ARDIFF_LEASE_SECONDS", "value": "600"},
                {"name": "ARDIFF_HEARTBEAT_SECONDS", "value": "60"},
            ],
            "replicas": {"min": pods, "max": pods},
            "scaleDownDelaySeconds": 3600,
            **PLACEMENT,
        },
    }


@dataclass
class RoundSampler:
    """Polls the operator's round histogram on a thread: each new round's seconds (the `_sum` increase per
    `_count` increase; a poll that sees two rounds at once gives both their mean)."""

    url: str
    period: float = 0.5  # each scrape costs the operator GIL time: rounds are counted, not timed, by it
    rounds: list[tuple[float, float]] = field(default_factory=list)  # (monotonic time seen, seconds)
    ready: float = 0.0  # the pool's Ready sessions in the operator's index, at the last poll
    lost: float = 0.0  # and those neither Ready nor Pending (Expired, Lost, ...): the seeding went wrong
    _stop: threading.Event = field(default_factory=threading.Event)
    _http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5))
    _thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        """The pool's round histogram (`count`, `sum`) and its Ready sessions (`ready`, as the operator's
        index has them); zeros before the first round or while the endpoint is unreachable."""
        found = {"count": 0.0, "sum": 0.0, "ready": 0.0}
        try:
            text = self._http.get(self.url).text
        except httpx.HTTPError:
            return found
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("pool") != POOL.name:
                    continue
                if s.name in (f"{ROUND_METRIC}_count", f"{ROUND_METRIC}_sum"):
                    found[s.name.rsplit("_", 1)[1]] = s.value
                elif s.name == "ardiff_pool_sessions" and s.labels.get("phase") == "Ready":
                    found["ready"] = s.value
                elif s.name == "ardiff_pool_sessions" and s.labels.get("phase") != "Pending":
                    found["lost"] = found.get("lost", 0.0) + s.value
        return found

    def _run(self) -> None:
        last = self.read()
        while not self._stop.wait(self.period):
            now = self.read()
            self.ready, self.lost = now["ready"], now.get("lost", 0.0)
            if now["count"] > last["count"]:
                mean = (now["sum"] - last["sum"]) / (now["count"] - last["count"])
                self.rounds += [(time.monotonic(), mean)] * int(now["count"] - last["count"])
                last = now

    def start(self) -> RoundSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._http.close()

    def since(self, moment: float) -> list[float]:
        return [seconds for seen, seconds in self.rounds if seen >= moment]

    def wait_ready_sessions(self, count: int, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.ready < count:
            if self.lost:
                raise RuntimeError(f"{self.lost:.0f} seeded sessions are neither Ready nor Pending")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the operator's index had {self.ready} of {count} Ready sessions after {timeout} s"
                )
            time.sleep(0.2)

    def wait_rounds(self, count: int, after: float, timeout: float = TIMEOUT) -> list[float]:
        deadline = time.monotonic() + timeout
        while len(self.since(after)) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} reconcile rounds within {timeout} s")
            time.sleep(0.1)
        return self.since(after)


@dataclass(frozen=True)
class SizeResult:
    pods: int
    sessions: int
    seed_redis_s: float
    seed_api_s: float
    redis_bytes_per_session: float
    caught_up_s: float  # the last seeded object in the API -> all of them Ready in the operator's index
    restart_ready_s: float | None  # a restart at this size: start -> liveness (None: not measured)
    restart_round_s: float | None  # a restart at this size: start -> its first round of the pool done
    unpatched_ready_s: float | None  # the same without operator/kopf_compat.py (None: not measured)
    unpatched_round_s: float | None  # (inf: no first round within --unpatched-timeout)
    takeover_round_s: float | None  # the active peer killed -> the standby's first round (None: not measured)
    rounds: list[float]  # idle rounds, seconds
    writes_per_round: float  # API writes during the idle rounds, per round
    operator_rss: int  # after the idle rounds
    operator_peak_rss: int  # VmHWM at the end
    api_rss: int  # kube-apiserver
    etcd_rss: int
    etcd_bytes: int  # etcd's database, as the API server reports it
    burst: Phase
    burst_rounds: list[float]


def wait_for(predicate: Any, what: str, timeout: float = TIMEOUT, poll: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def peak_rss(pid: int) -> int:
    """The process' high-water mark of resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def etcd_size(http: httpx.Client) -> int:
    """etcd's database size in bytes, as the API server last read it (`apiserver_storage_size_bytes`)."""
    return int(max((float(v) for v in STORAGE_SIZE.findall(http.get("/metrics").text)), default=0.0))


def boot_pool(http: httpx.Client, pods: int, capacity: int) -> dict[str, Any]:
    """The pool with every Pod registered and Ready; then a template session admitted by the operator."""
    http.post(f"{GROUP}/ardiffusionworkerpools", json=pool_body(pods, capacity)).raise_for_status()
    wait_for(
        lambda: (
            (s := http.get(f"{GROUP}/ardiffusionworkerpools/{POOL.name}").json().get("status") or {}).get(
                "readyReplicas"
            )
            == pods
            and s.get("capacity") == pods * capacity
        ),
        f"{pods} ready pods",
    )
    template = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": "template"},
        "spec": {"poolRef": POOL.name, "prompt": PROMPT, "seed": SEED},
    }
    http.post(f"{GROUP}/ardiffusionsessions", json=template).raise_for_status()
    return wait_for(
        lambda: (
            (b := http.get(f"{GROUP}/ardiffusionsessions/template").json()).get("status", {}).get("phase")
            == "Ready"
            and b
        ),
        "the template session Ready",
        poll=0.1,
    )


async def seed_redis(
    url: str, names: list[str]
) -> tuple[dict[str, SessionBinding], dict[str, PodRecord], int, int]:
    """Place and tick the sessions; their bindings, the pods' records, Redis server time, bytes added."""
    async with PlacementStore.from_url(url) as store:
        before = await used_memory(store)
        bindings = await place_sessions(store, POOL, names, SEED_PLACERS)
        after = await used_memory(store)
        pods = {p.name: p for p in await store.list_pods(POOL)}
        return bindings, pods, await store.server_time_ms(), after - before


def seed(
    cluster: DevCluster, template: dict[str, Any], names: list[str], chunk: int
) -> tuple[float, float, int]:
    """Seed the sessions a chunk at a time, each chunk into Redis first and then into the API, so that the
    running operator never lists a session Redis does not hold; (Redis seconds, API seconds, Redis bytes)."""
    redis_s = api_s = 0.0
    redis_bytes = 0
    for start in range(0, len(names), chunk):
        part = names[start : start + chunk]
        started = time.monotonic()
        bindings, pods, now_ms, added = asyncio.run(seed_redis(cluster.redis_url, part))
        redis_s += time.monotonic() - started
        redis_bytes += added
        started = time.monotonic()
        seed_objects(
            cluster.admin,
            f"{GROUP}/ardiffusionsessions",
            [seeded_session(template, n, bindings[n], pods[bindings[n].pod], now_ms) for n in part],
        )
        api_s += time.monotonic() - started
        print(
            f"  seeded {start + len(part)} of {len(names)} (Redis {redis_s:.0f} s, API {api_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return redis_s, api_s, redis_bytes


def burst_of(cluster: DevCluster, count: int) -> Phase:
    names = [f"burst-{i:04d}" for i in range(count)]
    applied = apply_sessions(
        cluster.admin, NAMESPACE, POOL.name, names, clients=BURST_CLIENTS, rate=0, ready_within=TIMEOUT
    )
    return Phase.of(*asyncio.run(applied))


def seconds_to_first_round(metrics_url: str, since: float, timeout: float) -> float:
    """Seconds from `since` (monotonic) until the operator serving `metrics_url` is seen to finish a round of
    the pool (inf: none within `timeout`). Sampling starts now: call it before that round can end."""
    sampler = RoundSampler(metrics_url).start()
    try:
        sampler.wait_rounds(1, after=since, timeout=timeout)
    except TimeoutError:
        return float("inf")
    finally:
        sampler.stop()
    return next(seen for seen, _ in sampler.rounds if seen >= since) - since


def operator_process(
    cluster: DevCluster, command: tuple[str, ...], log_name: str, env: Mapping[str, str]
) -> OperatorProcess:
    """An operator on `cluster`, watching the benchmark's namespace, its output in `log_name`."""
    return OperatorProcess(
        command,
        kubeconfig=cluster.kubeconfig,
        redis_url=cluster.redis_url,
        namespace=NAMESPACE,
        log_path=cluster.logs_dir / log_name,
        env=env,
    )


def restart(operator: OperatorProcess, metrics_url: str, timeout: float = TIMEOUT) -> tuple[float, float]:
    """Stop and start the operator: seconds until it serves, and until its first round of the pool (inf: none
    within `timeout`)."""
    operator.stop()
    started = time.monotonic()
    operator.start().wait_ready(timeout=TIMEOUT)
    return time.monotonic() - started, seconds_to_first_round(metrics_url, started, timeout)


def restart_unpatched(operator: OperatorProcess, metrics_url: str, timeout: float) -> tuple[float, float]:
    """`restart` with kopf as upstream has it (ARDIFF_KOPF_UNPATCHED=1: operator/cli.py skips the patch)."""
    env = operator.env
    operator.env = {**env, UNPATCHED_ENV: "1"}
    try:
        return restart(operator, metrics_url, timeout)
    finally:
        operator.stop()
        operator.env = env


def takeover(
    cluster: DevCluster, http: httpx.Client, env: Mapping[str, str], timeout: float = TIMEOUT
) -> float:
    """An active and a standby operator in a KopfPeering; the active one killed: seconds until the standby's
    first round of the pool (inf: none within `timeout`)."""
    # Made first: a peer that starts before its peering exists waits for it.
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}}
    created = http.post(f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings", json=peering)
    assert created.status_code in (201, 409), created.text

    def peer(name: str, priority: int) -> tuple[OperatorProcess, str]:
        metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
        command = (
            *OPERATOR_COMMAND[:3],
            "--peering",
            PEERING,
            "--priority",
            str(priority),
            "--metrics",
            metrics_url,
        )
        return operator_process(cluster, command, f"operator-{name}.log", env), metrics_url

    (active, active_url), (standby, standby_url) = peer("active", 10), peer("standby", 0)
    try:
        started = time.monotonic()
        active.start().wait_ready(timeout=TIMEOUT)
        # Active once it has listed and indexed everything.
        if seconds_to_first_round(active_url, started, timeout) == float("inf"):
            raise TimeoutError(f"the active operator made no round within {timeout} s")
        standby.start().wait_ready(timeout=TIMEOUT)
        # Both peers in the peering: the standby stays paused (it starts so, silently) behind the active one.
        peering_path = f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings/{PEERING}"

        def peers() -> set[int]:
            status = http.get(peering_path).json().get("status") or {}
            return {peer["priority"] for peer in status.values()}

        wait_for(lambda: peers() == {10, 0}, "both peers in the peering", timeout=60)
        killed = time.monotonic()
        active.stop(signal.SIGKILL)
        return seconds_to_first_round(standby_url, killed, timeout)
    finally:
        active.stop()
        standby.stop()


def measure(workdir: Path, pods: int, sessions: int, args: argparse.Namespace) -> SizeResult:
    capacity = -(-(sessions + 2 * args.burst) // pods)
    metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    command: tuple[str, ...] = (*OPERATOR_COMMAND, "--metrics", metrics_url)
    if args.profile:
        profile = Path(args.profile) / f"operator-{pods}x{sessions}.prof"
        command = ("python", "-m", "cProfile", "-o", str(profile), "-m", "ardiff.cli", *command[1:])
    with (
        DevCluster(workdir, namespace=NAMESPACE, nodes=simulated_nodes(pods)) as cluster,
        cluster.admin.client(timeout=120) as http,
    ):
        operator = operator_process(
            cluster,
            command,
            "operator.log",
            {**OPERATOR_ENV, "ARDIFF_WORKER_REDIS_URL": cluster.cluster_redis_url},
        )
        operator.start().wait_ready()
        sampler = RoundSampler(metrics_url).start()
        try:
            template = boot_pool(http, pods, capacity)
            print(f"  {pods} pods up; seeding {sessions} sessions", file=sys.stderr, flush=True)
            names = [f"s-{i:06d}" for i in range(sessions)]
            seed_redis_s, seed_api_s, redis_bytes = seed(cluster, template, names, args.seed_chunk)
            seeded = time.monotonic()
            sampler.wait_ready_sessions(sessions + 1)  # and the template
            caught_up_s = time.monotonic() - seeded
            print(f"  operator caught up; sampling {args.rounds} idle rounds", file=sys.stderr, flush=True)
            idle_from, writes_from = time.monotonic(), api_writes(http)
            rounds = sampler.wait_rounds(args.rounds, after=idle_from)
            idle_writes = api_writes(http)
            idle_writes.subtract(writes_from)
            writes = sum(v for v in idle_writes.values() if v > 0)
            if writes:
                print(f"  writes during the idle rounds: {+idle_writes}", file=sys.stderr, flush=True)
            assert operator.pid is not None
            operator_rss = psutil.Process(operator.pid).memory_info().rss
            burst_from = time.monotonic()
            burst = burst_of(cluster, args.burst)
            burst_rounds = [s for seen, s in sampler.rounds if burst_from <= seen]
            operator_peak = peak_rss(operator.pid)
            (api_pid,), (etcd_pid,) = (
                component_pids(cluster, ["kube-apiserver"]),
                component_pids(cluster, ["etcd"]),
            )
            api_rss = psutil.Process(api_pid).memory_info().rss
            etcd_rss = psutil.Process(etcd_pid).memory_info().rss
            etcd_bytes = etcd_size(http)
        finally:
            sampler.stop()
        restarts = sessions <= args.restart_up_to
        restarted = restart(operator, metrics_url) if restarts else (None, None)
        unpatched = (
            restart_unpatched(operator, metrics_url, args.unpatched_timeout)
            if restarts and args.kopf_unpatched
            else (None, None)
        )
        operator.stop()
        takeover_s = takeover(cluster, http, operator.env) if sessions <= args.takeover_up_to else None
    return SizeResult(
        pods=pods,
        sessions=sessions,
        seed_redis_s=seed_redis_s,
        seed_api_s=seed_api_s,
        redis_bytes_per_session=redis_bytes / sessions,
        caught_up_s=caught_up_s,
        restart_ready_s=restarted[0],
        restart_round_s=restarted[1],
        unpatched_ready_s=unpatched[0],
        unpatched_round_s=unpatched[1],
        takeover_round_s=takeover_s,
        rounds=rounds,
        writes_per_round=writes / len(rounds),
        operator_rss=operator_rss,
        operator_peak_rss=operator_peak,
        api_rss=api_rss,
        etcd_rss=etcd_rss,
        etcd_bytes=etcd_bytes,
        burst=burst,
        burst_rounds=burst_rounds,
    )


def row(r: SizeResult) -> dict[str, float | None]:
    """The figures compared across sizes."""
    return {
        "round p50 s": percentile(r.rounds, 50),
        "round p99 s": percentile(r.rounds, 99),
        "op RSS MiB": r.operator_rss / 2**20,
        "op peak MiB": r.operator_peak_rss / 2**20,
        "burst p50 s": r.burst.quantile(0.5),
        "burst p99 s": r.burst.quantile(0.99),
        "restart s": r.restart_round_s,
        "takeover s": r.takeover_round_s,
    }


def pair(a: float | None, b: float | None, digits: int) -> str:
    def one(x: float | None) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    return f"{one(a)} / {one(b)}"


def print_table(results: list[SizeResult], burst: int) -> None:
    print(
        f"\noperator at scale, one pool, simulated pods; burst: {burst} new sessions, {BURST_CLIENTS} clients"
    )
    header = (
        f"{'pods':>5} {'sessions':>8} {'seed redis/API s':>16} {'B/session':>9} {'caught up s':>11} "
        f"{'round p50/p99 s':>15} {'writes/round':>12} {'op RSS/peak MiB':>15} {'API/etcd MiB':>12} "
        f"{'etcd DB MiB':>11} "
        f"{'burst p50/p99 s':>15} {'all Ready s':>11} {'rounds in burst (max s)':>23} "
        f"{'restart: serving/1st round s':>28} {'kopf unpatched: serving/1st round s':>35} "
        f"{'takeover: 1st round s':>21}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        f = row(r)
        in_burst = f"{len(r.burst_rounds)} ({max(r.burst_rounds, default=0):.2f})"
        print(
            f"{r.pods:>5} {r.sessions:>8} {pair(r.seed_redis_s, r.seed_api_s, 0):>16} "
            f"{r.redis_bytes_per_session:>9.0f} {r.caught_up_s:>11.1f} "
            f"{pair(f['round p50 s'], f['round p99 s'], 3):>15} {r.writes_per_round:>12.1f} "
            f"{pair(f['op RSS MiB'], f['op peak MiB'], 0):>15} "
            f"{pair(r.api_rss / 2**20, r.etcd_rss / 2**20, 0):>12} {r.etcd_bytes / 2**20:>11.0f} "
            f"{pair(f['burst p50 s'], f['burst p99 s'], 2):>15} {r.burst.all_ready_s:>11.2f} {in_burst:>23} "
            f"{pair(r.restart_ready_s, r.restart_round_s, 1):>28} "
            f"{pair(r.unpatched_ready_s, r.unpatched_round_s, 1):>35} "
            f"{'-' if r.takeover_round_s is None else f'{r.takeover_round_s:.1f}':>21}"
        )
    base = row(results[0])
    print(f"\nratio to the baseline ({results[0].pods} pods x {results[0].sessions} sessions, same run):")
    print(f"{'pods':>5} {'sessions':>8} " + " ".join(f"{k:>13}" for k in base))
    for r in results:
        ratios = [
            "-" if v is None or not base[k] else f"{v / base[k]:.1f}x"  # type: ignore[operator]
            for k, v in row(r).items()
        ]
        print(f"{r.pods:>5} {r.sessions:>8} " + " ".join(f"{x:>13}" for x in ratios))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10x1000,100x10000,1000x100000", help="PODSxSESSIONS,...")
    parser.add_argument("--burst", type=int, default=1000, help="new sessions applied at once at each size")
    parser.add_argument("--rounds", type=int, default=5, help="idle reconcile rounds sampled at each size")
    parser.add_argument(
        "--restart-up-to",
        type=int,
        default=10_000,
        help="restart the operator at sizes up to this many sessions",
    )
    parser.add_argument(
        "--kopf-unpatched",
        action="store_true",
        help="after the restart, restart it once more without operator/kopf_compat.py (before/after)",
    )
    parser.add_argument(
        "--unpatched-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the unpatched operator's first round (upstream kopf is quadratic)",
    )
    parser.add_argument(
        "--takeover-up-to",
        type=int,
        default=10_000,
        help="kill an active operator before a standby at sizes up to this many sessions",
    )
    parser.add_argument("--seed-chunk", type=int, default=10_000, help="sessions seeded per step")
    parser.add_argument("--profile", help="run the operator under cProfile; its stats go to this directory")
    parser.add_argument("--workdir", help="where the dev clusters keep their logs (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="one tiny size (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.seed_chunk, args.burst, args.rounds = "2x20", 10, 5, 2
        args.kopf_unpatched, args.unpatched_timeout = True, 120
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ardiff-bench-scale-"))
    load = os.getloadavg()
    print(f"dev clusters under {workdir}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    results = []
    for pods, sessions in sizes:
        print(f"size {pods} pods x {sessions} sessions", file=sys.stderr, flush=True)
        results.append(measure(workdir / f"{pods}x{sessions}", pods, sessions, args))
        print_table(results, args.burst)  # the sizes so far: a larger one may not finish
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
