"""The operator at scale: 1,000 sessions applied to one pool on the dev cluster, apply → Ready latency.

Both run on the same dev cluster (real etcd, kube-apiserver, controller-manager and scheduler, the process
kubelet's two nodes, real Redis), one after the other, in `--rounds` rounds (each in its own namespaces;
every other round the ardiff operator goes first; a round's pool and its Pods are gone before the next phase):
- baseline: a bare kopf operator with the operator's kopf settings whose only handler creates one Secret and
  marks each new session `Ready` (one status patch): the floor that kopf and this API server put under an
  operator that must give each session a token;
- ardiff: the real operator (`ardiff operator run`), a pool of fake-runtime worker Pods (the worker image's
  worker app over the fake runtime, processes on the process nodes, started and registered before the clock
  starts), token Secrets, placement in Redis.

Sessions are created by `--clients` concurrent HTTP clients as the cluster's admin (TLS, client certificate);
Ready is observed on a watch. Printed: p50/p99/max apply → Ready, the time until all are Ready, sessions/s,
the operator's peak RSS, its CPU and kube-apiserver + etcd's while idle with every session Ready (the
operator's level-triggered rounds, the kubelets' beats), the CPU
the operator, kube-apiserver + etcd, Redis + the pool's worker processes and this process (the creating
clients, the watch) spent per session, and their sum (the two cores are shared: the burst's rate follows it),
the API writes per session each operator caused (from the API server's `apiserver_request_total`), and
ardiff's figures as ratios of the baseline's in the same round, with their median over the rounds (one
machine's noise moves a single pair by +-0.2x).

    .venv/bin/python benchmarks/reconcile.py [--sessions 1000] [--pods 4] [--clients 8] [--rounds 4]

`--smoke`: one round of 10 sessions at once from 2 clients and 4 paced at 10/s, one pod, idle CPU sampled
for 1 s (the test's run, tests/operator/test_reconcile_benchmark.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from ardiff.devcluster.cluster import OPERATOR_COMMAND, DevCluster, pod_pid
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.operator_process import OperatorProcess

GROUP_PATH = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}"
BASELINE, ARDIFF = "bare kopf (baseline)", "ardiff operator"
OPERATOR_ENV = {"ARDIFF_OPERATOR_RECONCILE_SECONDS": "2", "ARDIFF_OPERATOR_MIRROR_SECONDS": "5"}
MUTATING_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY"}
# Written on their own clock whatever the operators do (the kubelets' Leases and Node status).
BACKGROUND_RESOURCES = {"leases", "nodes"}
REQUEST_LINE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def session_body(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": name},
        "spec": {"poolRef": pool, "prompt": "a slow walk through a misty forest", "seed": 7},
    }


def pool_body(pods: int, capacity: int) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": "bench"},
        "spec": {
            "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
            "image": "ghcr.io/ardiff/ardiff-worker:bench",
            "env": [
                {"name": "ARDIFF_RUNTIME", "value": "fake"},
                {"name": "ARDIFF_FAKE_CAPACITY", "value": str(capacity)},
            ],
            "replicas": {"min": pods, "max": pods},
        },
    }


def api_writes(client: httpx.Client) -> Counter[str]:
    """The API server's mutating requests so far (`apiserver_request_total`), by "VERB resource[/sub]",
    without the kubelets' Lease and Node heartbeats."""
    counts: Counter[str] = Counter()
    for labels, value in REQUEST_LINE.findall(client.get("/metrics").text):
        found = dict(LABEL.findall(labels))
        if found.get("verb") not in MUTATING_VERBS or found.get("resource") in BACKGROUND_RESOURCES:
            continue
        sub = found.get("subresource")
        counts[f"{found['verb']} {found.get('resource', '')}{'/' + sub if sub else ''}"] += int(float(value))
    return counts


def component_pids(cluster: DevCluster, names: Sequence[str] = ("kube-apiserver", "etcd")) -> list[int]:
    """The pids of the named control-plane components (nsenter execs each binary: its pid is theirs)."""
    assert cluster.control_plane is not None
    return [
        c.process.pid for c in cluster.control_plane.components if c.name in names and c.process is not None
    ]


def worker_pids(cluster: DevCluster, namespace: str) -> list[int]:
    """The processes of the namespace's Pods' containers, with their children (none in the baseline's)."""
    with cluster.admin.client() as client:
        pods = client.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]
    pids = []
    for pod in pods:
        pid = pod_pid(pod)
        if pid is not None:
            pids += [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    return pids


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:  # a worker's child that has exited: its CPU is not known any more
            continue
        total += times.user + times.system
    return total


class PeakRss:
    """Samples a process' RSS on a thread; `peak` in bytes."""

    def __init__(self, pid: int, period: float = 0.2) -> None:
        self.process = psutil.Process(pid)
        self.period = period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.period)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Cost:
    """What a phase cost beyond the latencies: CPU of the operator, of kube-apiserver + etcd, of Redis + the
    pool's worker processes and of this process (the clients and the watch), and the API writes made meanwhile
    (the benchmark's own creates taken out)."""

    operator_cpu_s: float = 0.0
    api_cpu_s: float = 0.0
    store_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    writes: Counter[str] = field(default_factory=Counter)

    @property
    def total_cpu_s(self) -> float:
        return self.operator_cpu_s + self.api_cpu_s + self.store_cpu_s + self.client_cpu_s


@contextmanager
def costed(cluster: DevCluster, operator_pid: int, namespace: str, created: int) -> Iterator[Cost]:
    """Measure the CPU and the API writes of the block; `created` sessions are the block's own POSTs."""
    cost = Cost()
    api = component_pids(cluster)
    assert cluster.redis is not None
    assert cluster.redis.process is not None
    store = [cluster.redis.process.pid, *worker_pids(cluster, namespace)]
    with cluster.admin.client() as client:
        writes_before = api_writes(client)
        operator_before, api_before = cpu_seconds([operator_pid]), cpu_seconds(api)
        store_before, client_before = cpu_seconds(store), cpu_seconds([os.getpid()])
        yield cost
        cost.operator_cpu_s = cpu_seconds([operator_pid]) - operator_before
        cost.api_cpu_s = cpu_seconds(api) - api_before
        cost.store_cpu_s = cpu_seconds(store) - store_before
        cost.client_cpu_s = cpu_seconds([os.getpid()]) - client_before
        writes = api_writes(client)
    writes.subtract(writes_before)
    writes["POST ardiffusionsessions"] -= created
    cost.writes = Counter({k: v for k, v in writes.items() if v > 0})


@dataclass(frozen=True)
class Phase:
    """One way of applying sessions: a burst (all at once) or paced (a fixed arrival rate)."""

    latencies: list[float]  # apply → Ready, seconds
    all_ready_s: float  # first apply → last Ready
    applying_s: float = 0.0  # first apply → last apply (the creates themselves)

    @classmethod
    def of(cls, applied_at: dict[str, float], ready_at: dict[str, float]) -> Phase:
        return cls(
            latencies=[ready_at[n] - applied_at[n] for n in applied_at],
            all_ready_s=max(ready_at.values()) - min(applied_at.values()),
            applying_s=max(applied_at.values()) - min(applied_at.values()),
        )

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.all_ready_s

    def quantile(self, q: float) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[round(q * 100) - 1]


@dataclass(frozen=True)
class Result:
    name: str
    burst: Phase
    paced: Phase
    burst_cost: Cost
    paced_cost: Cost
    start_rss: int  # serving, before any session
    peak_rss: int
    idle_rss: int  # after the idle CPU sample, every session Ready
    idle_cpu_percent: float
    idle_api_cpu_percent: float  # kube-apiserver + etcd's in the same sample (kubelets' beats, rounds' reads)


async def watch_ready(
    credentials: Credentials, namespace: str, names: set[str], ready_at: dict[str, float], since: str
) -> None:
    """Record when each of `names` is first seen Ready on a watch (resumed from `since`)."""
    path = f"{GROUP_PATH.format(ns=namespace)}/ardiffusionsessions"
    async with credentials.async_client(timeout=None) as client:
        while not names <= ready_at.keys():
            params = {"watch": "1", "resourceVersion": since, "allowWatchBookmarks": "true"}
            async with client.stream("GET", path, params=params) as response:
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    obj = json.loads(line)["object"]
                    since = obj.get("metadata", {}).get("resourceVersion", since)
                    name = obj.get("metadata", {}).get("name")
                    if (
                        name in names
                        and name not in ready_at
                        and (obj.get("status") or {}).get("phase") == "Ready"
                    ):
                        ready_at[name] = time.monotonic()
                        if names <= ready_at.keys():
                            return


async def apply_sessions(
    credentials: Credentials,
    namespace: str,
    pool: str,
    names: list[str],
    *,
    clients: int,
    rate: float,
    ready_within: float,
) -> tuple[dict[str, float], dict[str, float]]:
    """Create the sessions (all at once from `clients` concurrent clients, or one every 1/`rate` seconds) and
    watch them become Ready; returns (applied_at, ready_at) in monotonic seconds."""
    path = f"{GROUP_PATH.format(ns=namespace)}/ardiffusionsessions"
    applied_at: dict[str, float] = {}
    ready_at: dict[str, float] = {}
    async with credentials.async_client(timeout=60) as client:
        listed = await client.get(path, params={"limit": "1"})
        listed.raise_for_status()
        since = listed.json()["metadata"]["resourceVersion"]
        watcher = asyncio.create_task(watch_ready(credentials, namespace, set(names), ready_at, since))

        async def create(name: str) -> None:
            applied_at[name] = time.monotonic()
            response = await client.post(path, json=session_body(name, pool))
            response.raise_for_status()

        async def create_all(chunk: list[str]) -> None:
            for name in chunk:
                await create(name)

        if rate:
            started, posts = time.monotonic(), []
            for i, name in enumerate(names):
                await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
                posts.append(asyncio.create_task(create(name)))
            await asyncio.gather(*posts)
        else:
            await asyncio.gather(*(create_all(names[i::clients]) for i in range(clients)))
        try:
            await asyncio.wait_for(watcher, ready_within)
        except TimeoutError:
            watcher.cancel()
            missing = sorted(set(names) - set(ready_at))
            raise SystemExit(
                f"{len(missing)} sessions not Ready within {ready_within}s, e.g. {missing[:5]}"
            ) from None
    return applied_at, ready_at


def idle_cpu_percent(groups: Sequence[Sequence[int]], seconds: float) -> list[float]:
    """Each group of processes' CPU over the same `seconds`, in % of one core."""
    before = [cpu_seconds(pids) for pids in groups]
    time.sleep(seconds)
    return [100 * (cpu_seconds(pids) - b) / seconds for pids, b in zip(groups, before, strict=True)]


def measure(
    name: str,
    cluster: DevCluster,
    operator: OperatorProcess,
    namespace: str,
    pool: str,
    args: argparse.Namespace,
) -> Result:
    operator.start()
    operator.wait_ready()
    assert operator.pid is not None
    start_rss = psutil.Process(operator.pid).memory_info().rss
    burst_names = [f"burst-{i:04d}" for i in range(args.sessions)]
    paced_names = [f"paced-{i:04d}" for i in range(args.paced)]
    with PeakRss(operator.pid) as rss:
        with costed(cluster, operator.pid, namespace, len(burst_names)) as burst_cost:
            burst = asyncio.run(
                apply_sessions(
                    cluster.admin,
                    namespace,
                    pool,
                    burst_names,
                    clients=args.clients,
                    rate=0,
                    ready_within=args.timeout,
                )
            )
        # Paced arrivals on top of the resident burst: what one user waits for in a busy pool.
        with costed(cluster, operator.pid, namespace, len(paced_names)) as paced_cost:
            paced = asyncio.run(
                apply_sessions(
                    cluster.admin,
                    namespace,
                    pool,
                    paced_names,
                    clients=1,
                    rate=args.rate,
                    ready_within=args.timeout,
                )
            )
        print(
            f"{name}: {len(burst_names) + len(paced_names)} sessions Ready; sampling idle CPU",
            file=sys.stderr,
        )
        idle, idle_api = idle_cpu_percent([[operator.pid], component_pids(cluster)], args.idle_seconds)
        idle_rss = psutil.Process(operator.pid).memory_info().rss
    operator.stop()
    return Result(
        name,
        Phase.of(*burst),
        Phase.of(*paced),
        burst_cost,
        paced_cost,
        start_rss,
        rss.peak,
        idle_rss,
        idle,
        idle_api,
    )


def create_namespace(cluster: DevCluster, namespace: str) -> None:
    assert cluster.control_plane is not None
    cluster.control_plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}])


def boot_pool(cluster: DevCluster, namespace: str, args: argparse.Namespace) -> OperatorProcess:
    """The pool `bench` of `namespace` with its Pods up and registered in Redis (so that the clock measures
    admission only), and its operator, stopped."""
    create_namespace(cluster, namespace)
    capacity = -(-(args.sessions + args.paced) // args.pods)
    pool_path = f"{GROUP_PATH.format(ns=namespace)}/ardiffusionworkerpools"
    with cluster.admin.client() as http:
        http.post(pool_path, json=pool_body(args.pods, capacity)).raise_for_status()
    operator = OperatorProcess(
        OPERATOR_COMMAND,
        kubeconfig=cluster.kubeconfig,
        redis_url=cluster.redis_url,
        namespace=namespace,
        log_path=cluster.logs_dir / f"operator-{namespace}.log",
        env={**OPERATOR_ENV, "ARDIFF_WORKER_REDIS_URL": cluster.cluster_redis_url},
    )
    operator.start()
    deadline = time.monotonic() + args.pool_timeout
    with cluster.admin.client() as http:
        while True:
            status = http.get(f"{pool_path}/bench").json().get("status") or {}
            if (
                status.get("readyReplicas") == args.pods
                and status.get("capacity", 0) >= args.sessions + args.paced
            ):
                break
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"the pool did not come up within {args.pool_timeout} s: {status}; see {cluster.logs_dir}"
                )
            time.sleep(0.5)
    operator.stop()
    return operator


def retire_pool(cluster: DevCluster, namespace: str, timeout: float) -> None:
    """Delete the pool and wait until its Pods are gone: a later phase runs without its workers."""
    with cluster.admin.client() as http:
        http.delete(f"{GROUP_PATH.format(ns=namespace)}/ardiffusionworkerpools/bench").raise_for_status()
        deadline = time.monotonic() + timeout
        while http.get(f"/api/v1/namespaces/{namespace}/pods").json()["items"]:
            if time.monotonic() > deadline:
                raise SystemExit(f"the pool's Pods in {namespace} are not gone after {timeout} s")
            time.sleep(0.5)


def measure_baseline(cluster: DevCluster, namespace: str, args: argparse.Namespace) -> Result:
    create_namespace(cluster, namespace)
    operator = OperatorProcess(
        [sys.executable, __file__, "--baseline-operator"],
        kubeconfig=cluster.kubeconfig,
        redis_url=cluster.redis_url,
        namespace=namespace,
        log_path=cluster.logs_dir / f"baseline-operator-{namespace}.log",
    )
    return measure(BASELINE, cluster, operator, namespace, "none", args)


def measure_ardiff(cluster: DevCluster, namespace: str, args: argparse.Namespace) -> Result:
    operator = boot_pool(cluster, namespace, args)
    result = measure(ARDIFF, cluster, operator, namespace, "bench", args)
    with cluster.admin.client() as http:
        session = http.get(f"{GROUP_PATH.format(ns=namespace)}/ardiffusionsessions/burst-0000").json()
    managed = len(json.dumps(session["metadata"].get("managedFields", [])))
    print(f"a Ready session as the API returns it: {len(json.dumps(session))} bytes of JSON", end=" ")
    print(f"({managed} of them managedFields)")
    retire_pool(cluster, namespace, args.pool_timeout)
    return result


def run(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ardiff-bench-reconcile-"))
    load = os.getloadavg()
    print(f"dev cluster under {workdir}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    rounds: list[tuple[Result, Result]] = []
    with DevCluster(workdir) as cluster:
        for r in range(args.rounds):
            # Every other round the ardiff operator goes first: a drift of the machine over the run (a busy
            # neighbour, etcd growing by each phase's objects) does not always favour the same side.
            if r % 2 == 0:
                baseline = measure_baseline(cluster, f"baseline-{r}", args)
                ardiff = measure_ardiff(cluster, f"bench-{r}", args)
            else:
                ardiff = measure_ardiff(cluster, f"bench-{r}", args)
                baseline = measure_baseline(cluster, f"baseline-{r}", args)
            rounds.append((baseline, ardiff))
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print_table(rounds, args)


def per_session(cost: Cost, sessions: int) -> tuple[float, float, float, float, float]:
    """(operator, kube-apiserver + etcd, Redis + workers, all CPU ms; API writes) per session."""
    return (
        1000 * cost.operator_cpu_s / sessions,
        1000 * cost.api_cpu_s / sessions,
        1000 * cost.store_cpu_s / sessions,
        1000 * cost.total_cpu_s / sessions,
        sum(cost.writes.values()) / sessions,
    )


def print_table(rounds: list[tuple[Result, Result]], args: argparse.Namespace) -> None:
    print(
        f"\nburst: {args.sessions} sessions at once ({args.clients} clients); paced: {args.paced} more at "
        f"{args.rate:g}/s on top; {args.pods} fake-runtime pods; {len(rounds)} rounds, each a baseline "
        "and an ardiff phase (every other round ardiff first)\n"
    )
    header = (
        f"{'operator':<22} {'round':>5} {'phase':<6} {'p50 (s)':>8} {'p99 (s)':>8} {'max (s)':>8} "
        f"{'all Ready (s)':>14} {'sessions/s':>11} {'RSS start/peak/idle MiB':>24} "
        f"{'idle CPU op/API (%)':>20} {'op CPU ms/s.':>13} {'API+etcd CPU ms/s.':>19} "
        f"{'Redis+workers ms/s.':>20} {'all CPU ms/s.':>14} "
        f"{'writes/s.':>10}"
    )
    print(header)
    print("-" * len(header))
    for i, pair in enumerate(rounds, 1):
        for r in pair:
            for label, phase, cost in (("burst", r.burst, r.burst_cost), ("paced", r.paced, r.paced_cost)):
                op_ms, api_ms, store_ms, all_ms, writes = per_session(cost, len(phase.latencies))
                p50, p99 = phase.quantile(0.5), phase.quantile(0.99)
                print(
                    f"{r.name:<22} {i:>5} {label:<6} {p50:>8.3f} {p99:>8.3f} {max(phase.latencies):>8.3f} "
                    f"{phase.all_ready_s:>14.1f} {phase.rate:>11.1f} "
                    f"{' / '.join(f'{b / 2**20:.0f}' for b in (r.start_rss, r.peak_rss, r.idle_rss)):>24} "
                    f"{f'{r.idle_cpu_percent:.1f} / {r.idle_api_cpu_percent:.1f}':>20} "
                    f"{op_ms:>13.1f} {api_ms:>19.1f} {store_ms:>20.1f} {all_ms:>14.1f} "
                    f"{writes:>10.2f}"
                )
    last = rounds[-1]
    print("\nAPI writes per session of the burst, beyond its create (apiserver_request_total), last round:")
    for r in last:
        n = len(r.burst.latencies)
        parts = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(r.burst_cost.writes.items()) if v / n >= 0.01)
        print(f"  {r.name}: {parts or 'none'}")
    print("the burst's creates, first to last sent, and this process' CPU (the clients creating, the watch):")
    for i, pair in enumerate(rounds, 1):
        for r in pair:
            n = len(r.burst.latencies)
            print(
                f"  round {i}, {r.name}: {r.burst.applying_s:.1f} s ({n / r.burst.applying_s:.0f}/s), "
                f"{1000 * r.burst_cost.client_cpu_s / n:.1f} ms CPU a session"
            )

    def ratios(of: Callable[[Result], float]) -> list[float]:
        return [of(ardiff) / of(baseline) for baseline, ardiff in rounds]

    def summary(values: list[float]) -> str:
        each = ", ".join(f"{v:.2f}" for v in values)
        return f"{statistics.median(values):.2f}x (rounds: {each})"

    def burst_cost(index: int) -> Callable[[Result], float]:
        return lambda r: per_session(r.burst_cost, len(r.burst.latencies))[index]

    burst = ratios(lambda r: r.burst.rate)
    print(f"\nburst sessions/s, ardiff / baseline, median of the rounds: {summary(burst)}")
    print(f"paced p50, ardiff / baseline: {summary(ratios(lambda r: r.paced.quantile(0.5)))}")
    print(
        f"burst per session, ardiff / baseline: operator CPU {summary(ratios(burst_cost(0)))}; "
        f"kube-apiserver + etcd CPU {summary(ratios(burst_cost(1)))}; "
        f"all CPU {summary(ratios(burst_cost(3)))}; API writes {summary(ratios(burst_cost(4)))}"
    )
    # On cores that every process shares the rate follows the CPU a session costs in all: the baseline's all
    # CPU over ardiff's is what the rate ratio would be if nothing else ran.
    all_cpu = [1 / r for r in ratios(burst_cost(3))]
    print(f"burst all CPU per session, baseline / ardiff (the rate ratio it predicts): {summary(all_cpu)}")
    paced_met = "met" if all(a.paced.quantile(0.5) <= 0.5 for _, a in rounds) else "MISSED"
    burst_met = "met" if all(a.burst.all_ready_s <= 60 for _, a in rounds) else "MISSED"
    rate_met = "met" if statistics.median(burst) >= 0.8 else "MISSED"
    print(
        f"targets: burst sessions/s >= 0.8x the baseline's (median): {rate_met}; paced p50 <= 0.5 s: "
        f"{paced_met}; all {args.sessions} of the burst Ready <= 60 s: {burst_met} (every round)"
    )


def run_baseline_operator(liveness: str) -> None:
    """A bare kopf operator with the operator's kopf settings (`operator/kopf_settings.py`) and its Kubernetes
    client: one create handler that creates one Secret (the shape of a session's token Secret, owned by it)
    and returns one status patch; nothing else."""
    import kopf

    from ardiff.operator import kopf_settings
    from ardiff.operator.config import config_from_env
    from ardiff.operator.kube import SECRETS, KubeApi
    from ardiff.operator.tokens import build_token_secret, new_token

    @kopf.on.startup()
    async def configure(
        settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
    ) -> None:
        kopf_settings.apply(settings, config_from_env())
        memo.kube = KubeApi(lambda: kopf.login_via_client(logger=logger, settings=settings))

    @kopf.on.cleanup()
    async def close(memo: kopf.Memo, **_: Any) -> None:
        await memo.kube.close()

    @kopf.on.create("ardiffusion.dev", "v1alpha1", "ardiffusionsessions")
    async def ready(
        namespace: str, name: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any
    ) -> None:
        secret = build_token_secret(namespace, name, new_token())
        kopf.adopt(secret, owner=body)
        await memo.kube.create_or_get(SECRETS, secret)
        patch.status["phase"] = "Ready"

    kopf.run(namespaces=[os.environ["ARDIFF_WATCH_NAMESPACES"]], standalone=True, liveness_endpoint=liveness)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients creating the burst")
    parser.add_argument("--paced", type=int, default=100, help="sessions applied at --rate after the burst")
    parser.add_argument("--rate", type=float, default=10, help="paced arrivals per second")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for all sessions to become Ready")
    parser.add_argument("--pool-timeout", type=float, default=300, help="seconds for the pool's Pods")
    parser.add_argument("--idle-seconds", type=float, default=10, help="how long idle CPU is sampled")
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="baseline and ardiff phases, alternating which goes first (an even number: each first as often)",
    )
    parser.add_argument("--workdir", help="where the dev cluster keeps its logs (default: a temp dir)")
    parser.add_argument("--baseline-operator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--liveness", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="one tiny round (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.sessions, args.pods, args.clients, args.paced, args.rounds, args.idle_seconds = 10, 1, 2, 4, 1, 1
    if args.baseline_operator:
        run_baseline_operator(args.liveness)
    else:
        run(args)


if __name__ == "__main__":
    main()
