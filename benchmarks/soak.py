"""A soak (issue 40 item 5): sessions played through the player while a seeded schedule injects a fault from
the menu every few seconds; then the history checker, each session's end state, the store's invariants, and
what is left once the sessions are deleted.

One namespace of the dev cluster with its own Redis and the real operator, and a pool of two workers of the
fake runtime (`ardiff.devcluster.pools`: the worker image, deterministic frames, 5 s leases, a snapshot
every 2 chunks to the shared tier, so that a session lost with its Pod is resumed elsewhere, not reset).
Each session is played by a thread (`ardiff.player.Player` through `KubeSessions.connect`'s
`SessionClient`: it reports its buffer and keeps two chunks ahead at 16 fps); every answer of a session
route goes into one `History`. On `ResetRequired` the thread resets, on `Rewound` it goes on where it is
told, on anything else it connects again (the status names where the session is now).

The menu (`FAULT_MENU`; `ardiff.devcluster.faults.FaultInjector`, each fault logged with its start and end):
a worker Pod's process killed (`kill -9`), paused (SIGSTOP) or cut from Redis (iptables in its network
namespace) for a short while (1-3 s, within its lease) or past its lease (8-10 s); the operator killed (and
started again at once, as its Deployment would) or paused; Redis killed and started empty on its port, or
paused; etcd killed and restarted. The schedule is a pure function of the seed: a fault every `--fault-every`
seconds on average (uniform 0.5-1.5x), kinds in shuffled rounds of the menu (every kind once in each round of
8), durations and the worker each hits (an index into the Ready workers, sorted by name).

Checked at the end (each failure a line of the report, "violations: N" last; exit status 1 if any):
- the history (`History.violations`): no split brain, no silent fork, no 5xx without a code, and no chunk from
  an incarnation a fault ended (a kill, a pause or a cut past its lease) for a request sent more than
  `IN_FLIGHT_SECONDS` after the fault began;
- every session Ready again after the last fault and delivering chunks (within `SETTLE_TIMEOUT`);
- no answer the menu should never cause (`UNEXPECTED_CODES`: a refused token, a tick called invalid);
- the store's invariants (`check_invariants`), and every session's record where its status says, on its
  pod's current epoch, the slots used equal to the sessions bound;
- after deleting every session: none in the API server, no token Secret left, no placed record or resident
  in the store, every pod's slots free, and no worker holding one.

With a Prometheus (the script's own run: Debian's `prometheus` scraping the operator and both workers, with
the chart's alerting rules, `ardiff.devcluster.prometheus`), the sessions first play `--quiet-minutes`
without a fault, during which no alert may become active (a violation otherwise); the report lists every
alert episode (pending, or firing once its `for` passed) with the fault before it, and for each kind of fault
the alerts that became active within `ALERT_WINDOW` of one. After the schedule, each of `SUSTAINED_FAULTS`
(Redis paused; every worker cut from Redis) is held until the alert that tells of it fires, at most
`ALERT_WINDOW` (a violation otherwise), then healed, and the sessions must settle again
(`benchmarks/soak_alerts.py`).

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--quiet-minutes 3] [--seed 1] [--sessions 4]
        [--fault-every 8] [--smoke]

`--smoke`: 1 minute of faults after 30 s of quiet, no fault held. The suite runs a fixed seed for 2 minutes
on the test session's cluster (`tests/e2e/test_soak.py`), with a Prometheus whose rules' `for`s are a few
seconds (`rules_held_for`), so that its held faults fire their alerts in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_alerts import (
    ALERT_WINDOW,
    SUSTAINED_FAULTS,
    AlertEpisode,
    AlertWatch,
    SustainedFault,
    print_alerts,
    print_sustained,
    wait_fired,
)

from ardiff.client import ResetRequired, Rewound
from ardiff.client.errors import ChunkOutOfOrder
from ardiff.devcluster.bench_target import BenchTarget
from ardiff.devcluster.cluster import BENCHMARK_OPERATOR_ENV, OPERATOR_COMMAND, DevCluster, pod_pid
from ardiff.devcluster.faults import FaultInjector
from ardiff.devcluster.history import Answer, History
from ardiff.devcluster.network import short_pod_id
from ardiff.devcluster.pools import (
    SHARED_TIER_CLAIM,
    WORKER_LEASE_SECONDS,
    build_pool,
    transfer_token,
    with_shared_tier,
    worker_sessions,
)
from ardiff.devcluster.prometheus import Prometheus
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.errors import ArdiffError
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.player import Player
from ardiff.wire import ServedBy
from ardiff.worker.net import free_port

T = TypeVar("T")
POOL_NAME = "soak"
# Two fake workers of 4 slots: either one holds every session when the other is down.
POOL = with_shared_tier(
    build_pool(POOL_NAME, capacity=4, min_replicas=2, max_replicas=2, fake=True), snapshot_every_chunks=2
)
FAULT_MENU = (
    "worker-kill",
    "worker-pause",
    "worker-partition",
    "operator-kill",
    "operator-pause",
    "redis-restart",
    "redis-pause",
    "etcd-restart",
)
SHORT_FAULT_SECONDS = (1.0, 3.0)  # within a worker's lease: nothing moves
LONG_FAULT_SECONDS = (
    WORKER_LEASE_SECONDS + 3,
    WORKER_LEASE_SECONDS + 5,
)  # past it: the worker is reaped and fenced
FPS, BUFFER_CHUNKS = 16.0, 2
CLIENT_TIMEOUT = 15.0  # a tick to a paused worker waits at most this long
CLIENT_RETRY_SECONDS = 20.0  # retryable answers (a restarting Redis) are retried this long
CONNECT_TIMEOUT = 20.0  # waiting for Ready before connecting again
SETTLE_TIMEOUT = 180.0  # every session Ready and ticking again after the last fault
# A fault takes effect a little after it is logged (iptables rules inserted, a signal delivered): an
# incarnation a fault ended may answer no request sent from this long after the fault began with a chunk. (A
# chunk made before, read late by a busy client — 3 s late in the recorded run of 22:03 — is no violation: the
# request's send time decides, `History.violations`.)
IN_FLIGHT_SECONDS = 1.0
START_TIMEOUT = 300.0
# Deleted sessions' Secrets go by the garbage collector, whose informers relist after an etcd restart.
LEFTOVER_TIMEOUT = 120.0
UNEXPECTED_CODES = frozenset({"unauthorized", "invalid_tick", "body_too_large", "session_closed"})


@dataclass(frozen=True)
class ScheduledFault:
    """A fault of the schedule: when (seconds from the soak's start), what, for how long, on which worker."""

    at: float
    kind: str
    seconds: float  # a pause or a partition; 0 for the others
    pick: int  # which of the Ready workers, sorted by name (worker faults)

    @property
    def ends_incarnation(self) -> bool:
        """Whether it ends the worker incarnation it hits (a kill, or a pause or a cut past its lease)."""
        return self.kind == "worker-kill" or self.seconds >= LONG_FAULT_SECONDS[0]


def schedule(seed: int, seconds: float, every: float) -> list[ScheduledFault]:
    """The faults of a soak of `seconds`, one every `every` seconds on average (see the module docstring)."""
    rng = random.Random(seed)
    faults: list[ScheduledFault] = []
    kinds: list[str] = []
    at = every * rng.uniform(0.5, 1.5)
    while at < seconds:
        if not kinds:
            kinds = rng.sample(FAULT_MENU, len(FAULT_MENU))
        kind = kinds.pop()
        lasting = kind.endswith(("pause", "partition"))
        bounds = SHORT_FAULT_SECONDS if rng.random() < 0.5 else LONG_FAULT_SECONDS
        length = round(rng.uniform(*bounds), 1) if lasting else 0.0
        if kind.startswith(("operator", "redis")):
            length = min(length, SHORT_FAULT_SECONDS[1])  # a long one only delays: no more to see
        faults.append(ScheduledFault(round(at, 1), kind, length, rng.randrange(1 << 16)))
        at += length + every * rng.uniform(0.5, 1.5)
    return faults


def in_store(target: BenchTarget, use: Callable[[PlacementStore], Coroutine[Any, Any, T]]) -> T:
    """`use(store)` on the target's Redis (a fresh client: Redis may have restarted)."""

    async def run() -> T:
        async with PlacementStore.from_url(target.redis.url) as store:
            return await use(store)

    return asyncio.run(run())


def epochs(target: BenchTarget) -> dict[str, int]:
    pool = PoolId(target.namespace, target.pool)
    return {p.name: p.epoch for p in in_store(target, lambda store: store.list_pods(pool))}


class SessionPlay(threading.Thread):
    """Plays session `session` until stopped (see the module docstring); counts what happened by kind."""

    def __init__(self, target: BenchTarget, session: str, history: History) -> None:
        super().__init__(daemon=True, name=f"soak-{session}")
        self.target = target
        self.session = session
        self.history = history
        self.outcomes = collections.Counter[str]()
        self.crashes: list[str] = []  # what no fault explains: a bug of the client, or of the soak
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=CLIENT_TIMEOUT + CLIENT_RETRY_SECONDS + 10)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._play_connection()
            except (ArdiffError, httpx.HTTPError) as exc:
                self.outcomes[getattr(exc, "code", None) or type(exc).__name__] += 1
                self._stopping.wait(0.2)
            except Exception as exc:  # kept as a violation; the thread goes on playing
                self.crashes.append(f"{self.session}: {type(exc).__name__}: {exc}")
                self._stopping.wait(0.2)

    def _play_connection(self) -> None:
        client = self.target.sessions.connect(
            self.session, timeout=CONNECT_TIMEOUT, retry_seconds=CLIENT_RETRY_SECONDS
        )
        client.timeout = CLIENT_TIMEOUT
        client.http.event_hooks["response"].append(self.history.record)
        self.outcomes["connections"] += 1
        with client:
            player = Player(client, fps=FPS, buffer_chunks=BUFFER_CHUNKS)
            while not self._stopping.is_set():
                try:
                    player.run(seconds=0.5)
                except ResetRequired:
                    self.outcomes["reset_required"] += 1
                    client.reset()
                except Rewound:
                    self.outcomes["rewound"] += 1  # the client ticks on from where it was told
                except ChunkOutOfOrder:
                    self.outcomes["chunk_out_of_order"] += 1
                    client.sync()


@dataclass
class SoakReport:
    faults: collections.Counter[str]
    skipped: collections.Counter[str]
    outcomes: dict[str, collections.Counter[str]]
    chunks: dict[str, int]  # chunks delivered (200s of ticks)
    incarnations: dict[str, int]  # the Pod incarnations that delivered them
    refused: collections.Counter[str]  # the answers that were not a 200, by status and code
    ended: int  # worker incarnations a fault ended
    injected: list[tuple[float, str]]  # each fault's start (`time.time()`) and kind, in order
    alerts: list[AlertEpisode] | None  # every alert episode of the run (None: no Prometheus)
    held: list[SustainedFault]  # the faults held until their alert fired (with a Prometheus, when asked)
    quiet_until: float  # the end of the quiet phase before the first fault (`time.time()`)
    answers: int
    violations: list[str]
    wall_s: float


@dataclass
class Soak:
    """One soak on `target` (see the module docstring)."""

    target: BenchTarget
    seed: int
    seconds: float
    every: float
    sessions: int
    workdir: Path
    history: History = field(default_factory=History)
    ended: dict[ServedBy, float] = field(default_factory=dict)  # incarnations a fault ended: from when
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    quiet_seconds: float = 0.0  # sessions played without a fault before the first one
    prometheus: Prometheus | None = None  # evaluating the chart's rules on the target's series
    hold_faults: bool = False  # after the schedule, hold each of SUSTAINED_FAULTS until its alert fires
    injected: list[tuple[float, str]] = field(default_factory=list)
    held: list[SustainedFault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.injector = FaultInjector(self.workdir / "faults.jsonl")
        self.held_injector = FaultInjector(self.workdir / "held-faults.jsonl")  # the held faults, apart

    @property
    def names(self) -> list[str]:
        return [f"soak-{self.seed}-{i}" for i in range(self.sessions)]

    def run(self) -> SoakReport:
        started = time.monotonic()
        players = self._start_sessions()
        watch = AlertWatch(self.prometheus) if self.prometheus is not None else None
        if watch is not None:
            watch.start()
        violations: list[str] = []
        try:
            time.sleep(self.quiet_seconds)
            quiet_until, faulting = time.time(), time.monotonic()
            for fault in schedule(self.seed, self.seconds, self.every):
                delay = faulting + fault.at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._inject(fault)
                print(f"  {time.monotonic() - faulting:6.1f}s {fault.kind} {fault.seconds:g}s", flush=True)
            time.sleep(max(0.0, faulting + self.seconds - time.monotonic()))
            violations += self._settle()
            if self.hold_faults and self.prometheus is not None:
                for kind, alert in SUSTAINED_FAULTS:
                    violations += self._hold(kind, alert)
        finally:
            for player in players:
                player.stop()
            alerts = watch.stop() if watch is not None else None
        violations += [
            f"alert {a.alert} active in the quiet phase" for a in alerts or [] if a.active_at < quiet_until
        ]
        violations += [crash for player in players for crash in player.crashes]
        violations += self.history.violations(stale=self.ended)
        violations += [
            f"{a.session} chunk {a.chunk_index}: {a.status} {a.code}"
            for a in self.history.answers
            if a.code in UNEXPECTED_CODES
        ]
        violations += self._consistent()
        violations += self._nothing_left()
        return SoakReport(
            faults=collections.Counter(kind for _, kind in self.injected),
            skipped=self.skipped,
            outcomes={p.session: p.outcomes for p in players},
            chunks={n: len(self._deliveries(n)) for n in self.names},
            incarnations={n: len({a.served_by for a in self._deliveries(n)}) for n in self.names},
            refused=collections.Counter(
                f"{a.status} {a.code}" for a in self.history.answers if a.status != 200
            ),
            ended=len(self.ended),
            injected=self.injected,
            alerts=alerts,
            held=self.held,
            quiet_until=quiet_until,
            answers=len(self.history.answers),
            violations=violations,
            wall_s=time.monotonic() - started,
        )

    def _deliveries(self, session: str) -> list[Answer]:
        return [a for a in self.history.of(session) if a.status == 200 and a.chunk_index is not None]

    def _start_sessions(self) -> list[SessionPlay]:
        for name in self.names:
            self.target.sessions.create(name, pool=self.target.pool, prompt=f"the world of {name}", seed=7)
        for name in self.names:
            self.target.sessions.wait_ready(name, timeout=START_TIMEOUT)
        players = [SessionPlay(self.target, name, self.history) for name in self.names]
        for player in players:
            player.start()
        return players

    # --- faults ----------------------------------------------------------------------------------------

    def _inject(self, fault: ScheduledFault) -> None:
        kind, begun = fault.kind, time.time()
        if kind.startswith("worker-"):
            if not self._on_worker(fault):
                self.skipped[kind] += 1
                return
        elif kind == "operator-kill":
            operator = self.target.operator
            assert operator.pid is not None
            self.injector.kill(operator.pid, "operator")
            operator.stop()  # reaps it
            operator.start().wait_ready(timeout=120)
        elif kind == "operator-pause":
            assert self.target.operator.pid is not None
            with self.injector.paused(self.target.operator.pid, "operator"):
                time.sleep(fault.seconds)
        elif kind == "redis-restart":
            redis = self.target.redis
            assert redis.process is not None
            self.injector.kill(redis.process.pid, "redis-server")
            redis.restart()  # on its port, empty
        elif kind == "redis-pause":
            assert self.target.redis.process is not None
            with self.injector.paused(self.target.redis.process.pid, "redis-server"):
                time.sleep(fault.seconds)
        elif kind == "etcd-restart":
            control_plane = self.target.kube.control_plane
            assert control_plane is not None
            self.injector.restart_etcd(control_plane)
        else:
            raise ValueError(f"soak fault kind must be one of {FAULT_MENU}, got {kind!r}")
        self.injected.append((begun, kind))

    def _on_worker(self, fault: ScheduledFault) -> bool:
        """The fault on the worker it picks among the Ready ones; False when none is Ready or running."""
        pods = self.target.worker_pods()
        ready = sorted(name for name, pod in pods.items() if condition_true(pod, "Ready"))
        if not ready:
            return False
        name = ready[fault.pick % len(ready)]
        pid = pod_pid(pods[name])
        epoch = epochs(self.target).get(name)
        if pid is None or epoch is None:
            return False
        begun = time.monotonic()
        what = f"pod {name}"
        if fault.kind == "worker-kill":
            self.injector.kill(pid, what)
        elif fault.kind == "worker-pause":
            with self.injector.paused(pid, what):
                time.sleep(fault.seconds)
        else:
            network = self.target.kube.network
            assert network is not None
            namespace = network.pod_namespace(short_pod_id(pods[name]["metadata"]["uid"]))
            with self.injector.partition(namespace, network.host_ip, self.target.redis.port):
                time.sleep(fault.seconds)
        if fault.ends_incarnation:
            self.ended.setdefault(ServedBy(name, epoch), begun + IN_FLIGHT_SECONDS)
        return True

    def _hold(self, kind: str, alert: str) -> list[str]:
        """`kind` held until `alert` fires for the pool (at most `ALERT_WINDOW`), then healed; the sessions
        settle again. Violations: the alert not fired, sessions not settled."""
        assert self.prometheus is not None
        begun, begun_monotonic = time.time(), time.monotonic()
        with contextlib.ExitStack() as held:
            if kind == "redis-pause":
                assert self.target.redis.process is not None
                held.enter_context(self.held_injector.paused(self.target.redis.process.pid, "redis-server"))
            elif kind == "worker-partition":
                network = self.target.kube.network
                assert network is not None
                current = epochs(self.target)
                for name, pod in self.target.worker_pods().items():
                    namespace = network.pod_namespace(short_pod_id(pod["metadata"]["uid"]))
                    held.enter_context(
                        self.held_injector.partition(namespace, network.host_ip, self.target.redis.port)
                    )
                    if name in current:  # cut past its lease: fenced, its chunks stale from now on
                        self.ended.setdefault(
                            ServedBy(name, current[name]), begun_monotonic + IN_FLIGHT_SECONDS
                        )
            else:
                raise ValueError(f"a held fault is one of {[k for k, _ in SUSTAINED_FAULTS]}, got {kind!r}")
            fired_after = wait_fired(self.prometheus, alert, self.target.pool, begun)
        self.held.append(SustainedFault(kind, alert, begun, fired_after))
        print(f"  held {kind} until {alert} fired: {fired_after}", flush=True)
        found = (
            []
            if fired_after is not None
            else [f"held {kind}: {alert} did not fire within {ALERT_WINDOW:g} s"]
        )
        return found + self._settle()

    # --- checks ----------------------------------------------------------------------------------------

    def _settle(self) -> list[str]:
        """Every session Ready and delivering chunks again after the last fault; the ones that are not."""
        quiet = time.monotonic()

        def unsettled() -> list[str]:
            behind = []
            for name in self.names:
                status = self.target.sessions.status(name)
                ticked = any(a.status == 200 and a.sent > quiet for a in self.history.of(name))
                if not ticked or status.get("phase") != "Ready":
                    behind.append(f"{name} (phase {status.get('phase')}, reason {status.get('reason')})")
            return behind

        with contextlib.suppress(AssertionError):  # wait_until's time-out: told below
            wait_until(
                lambda: not unsettled(), timeout=SETTLE_TIMEOUT, what="every session ticking", poll=0.5
            )
        return [f"{n}: not Ready and ticking {SETTLE_TIMEOUT:g} s after the last fault" for n in unsettled()]

    def _consistent(self) -> list[str]:
        """The store agrees with itself and with every session's status."""
        pool = PoolId(self.target.namespace, self.target.pool)
        found = [f"store: {v}" for v in in_store(self.target, lambda store: store.check_invariants(pool))]
        records = in_store(self.target, lambda store: store.get_sessions(pool, self.names))
        pods = {p.name: p for p in in_store(self.target, lambda store: store.list_pods(pool))}
        for name in self.names:
            status = self.target.sessions.status(name)
            record = records.get(name)
            where = (status.get("pod"), status.get("podEpoch"))
            if record is None or (record.pod, record.pod_epoch) != where:
                found.append(
                    f"{name}: status says {where}, the store {record and (record.pod, record.pod_epoch)}"
                )
            elif record.pod not in pods or pods[record.pod].epoch != record.pod_epoch:
                found.append(f"{name}: bound to {where}, not a current incarnation")
        bound = sum(1 for r in records.values() if r.state == "placed")
        if sum(p.used for p in pods.values()) != bound:
            found.append(f"store: {sum(p.used for p in pods.values())} slots used, {bound} sessions bound")
        return found

    def _nothing_left(self) -> list[str]:
        """Delete every session; what is left of them anywhere."""
        for name in self.names:
            self.target.sessions.delete(name)
        for name in self.names:
            self.target.sessions.delete(name, wait=True, timeout=120)
        pool = PoolId(self.target.namespace, self.target.pool)
        found = [f"API: {s['metadata']['name']} remains" for s in self.target.sessions.list()]

        def released() -> list[str]:
            records = in_store(self.target, lambda store: store.get_sessions(pool, self.names))
            left = [f"store: {n} is {r.state}" for n, r in records.items() if r.state != "closed"]
            left += [f"store: {p.name} has {p.used} slots used" for p in self._pods(pool) if p.used]
            left += [f"store: {v}" for v in in_store(self.target, lambda store: store.check_invariants(pool))]
            left += [f"worker {pod}: holds {held}" for pod, held in self._held().items() if held]
            with self.target.kube.admin.client(timeout=10) as client:
                secrets = client.get(f"/api/v1/namespaces/{self.target.namespace}/secrets").json()["items"]
            left += [
                f"API: secret {s['metadata']['name']} remains"
                for s in secrets
                if any(s["metadata"]["name"].startswith(name) for name in self.names)
            ]
            return left

        with contextlib.suppress(AssertionError):  # wait_until's time-out: told below
            wait_until(lambda: not released(), timeout=LEFTOVER_TIMEOUT, what="nothing left", poll=1)
        return found + released()

    def _pods(self, pool: PoolId) -> list[Any]:
        return in_store(self.target, lambda store: store.list_pods(pool))

    def _held(self) -> dict[str, list[str]]:
        """Each running worker's sessions of the soak (its `GET /v1/sessions`, with the pool's transfer
        token; a worker whose process is not running holds none: it starts again as an incarnation without
        them)."""
        token = transfer_token(self.target.kube.admin, self.target.namespace, self.target.pool)
        held = {}
        for name, pod in self.target.worker_pods().items():
            if pod_pid(pod) is None:  # no process (waiting to restart, back-off after many): it holds nothing
                continue
            try:
                reply = worker_sessions(pod, token)
            except httpx.HTTPError as exc:  # a worker restarting: what it holds is not known yet
                held[name] = [f"? ({type(exc).__name__})"]
                continue
            held[name] = [s["session_id"] for s in reply["sessions"] if s["session_id"] in self.names]
        return held


def print_report(report: SoakReport, seed: int) -> None:
    print(
        f"\nsoak, seed {seed}: {report.wall_s:.0f} s, {report.answers} answers recorded, "
        f"{report.ended} worker incarnations ended by a fault"
    )
    header = f"{'fault':<18} {'injected':>8} {'skipped':>8}"
    print(header)
    print("-" * len(header))
    for kind in FAULT_MENU:
        print(f"{kind:<18} {report.faults[kind]:8d} {report.skipped[kind]:8d}")
    print()
    header = (
        f"{'session':<12} {'chunks':>7} {'served by':>9} {'connections':>11} {'resets':>7} {'rewinds':>8} "
        f"{'other errors':>13}"
    )
    print(header)
    print("-" * len(header))
    for name, outcomes in report.outcomes.items():
        counted = {"connections", "reset_required", "rewound"}
        other = sum(n for k, n in outcomes.items() if k not in counted)
        served = report.incarnations[name]
        print(
            f"{name:<12} {report.chunks[name]:7d} {served:9d} {outcomes['connections']:11d} "
            f"{outcomes['reset_required']:7d} {outcomes['rewound']:8d} {other:13d}"
        )
    errors = collections.Counter[str]()
    for outcomes in report.outcomes.values():
        errors.update({k: n for k, n in outcomes.items() if k not in {"connections"}})
    print("client errors by code: " + (", ".join(f"{k} {n}" for k, n in sorted(errors.items())) or "none"))
    refused = ", ".join(f"{k} {n}" for k, n in sorted(report.refused.items()))
    print(f"answers other than 200 (status code): {refused or 'none'}")
    if report.alerts is not None:
        print_alerts(report.alerts, report.injected, report.quiet_until, FAULT_MENU, report.held)
    if report.held:
        print_sustained(report.held)
    for violation in report.violations:
        print(f"VIOLATION {violation}")
    print(f"violations: {len(report.violations)}")


@contextlib.contextmanager
def own_cluster(workdir: Path, metrics_url: str) -> Iterator[BenchTarget]:
    """A dev cluster of the script's own with the soak's pool, its two workers Ready; the operator serves its
    metrics at `metrics_url`."""
    namespace = "soak"
    cluster = DevCluster(
        workdir,
        operator_command=(*OPERATOR_COMMAND, "--metrics", metrics_url),
        namespace=namespace,
        operator_env=BENCHMARK_OPERATOR_ENV,
    )
    with cluster:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(SHARED_TIER_CLAIM))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(POOL))
        target = BenchTarget.of_cluster(cluster, POOL_NAME, metrics_url)
        wait_ready_workers(target)
        yield target


def wait_ready_workers(target: BenchTarget) -> None:
    def ready() -> bool:
        return sum(condition_true(p, "Ready") for p in target.worker_pods().values()) == 2

    wait_until(ready, timeout=START_TIMEOUT, what="the pool's two workers Ready", poll=0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="of faults")
    parser.add_argument("--quiet-minutes", type=float, default=3.0, help="played without a fault first")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--fault-every", type=float, default=8.0, help="seconds between faults on average")
    parser.add_argument("--smoke", action="store_true", help="1 minute of faults after 30 s of quiet")
    args = parser.parse_args()
    if args.smoke:
        args.minutes, args.quiet_minutes = 1.0, 0.5
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    workdir = Path(tempfile.mkdtemp(prefix="ardiff-bench-soak-"))
    print(f"dev cluster in {workdir}; loadavg at start {os.getloadavg()[0]:.1f}", flush=True)
    metrics_url = f"http://127.0.0.1:{free_port()}/metrics"
    with own_cluster(workdir, metrics_url) as target:
        workers = [f"http://{p['status']['podIP']}:8000/metrics" for p in target.worker_pods().values()]
        with Prometheus([metrics_url, *workers]) as prometheus:
            soak = Soak(
                target,
                args.seed,
                args.minutes * 60,
                args.fault_every,
                args.sessions,
                workdir,
                quiet_seconds=args.quiet_minutes * 60,
                prometheus=prometheus,
                hold_faults=not args.smoke,
            )
            report = soak.run()
    print_report(report, args.seed)
    print(f"loadavg at end {os.getloadavg()[0]:.1f}")
    sys.exit(1 if report.violations else 0)


if __name__ == "__main__":
    main()
