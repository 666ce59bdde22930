"""Playout under load (issue 25 item 5): sessions arriving at random, each watched by a player at its target
rate, against three arms of the same pool in the same run — `fifo` (ticks in arrival order, admission by KV
slots: today), `deadline` (earliest deadline first, KV slots) and `deadline+bound` (earliest deadline first,
and a pod admits a session only while the playout demand of its sessions stays under `--bound` x its measured
throughput: the pool's `computeUtilisation`).

Per arm: a redis-server (one for the run), `--max-pods` worker processes (`ardiff worker serve` in placement
mode, one pool per arm); sessions are placed through the placement store as the operator places them (no API
server): every round (`--round-s`) the waiting sessions are placed in arrival order, finished ones released.
The operator's scaling is emulated on the pods that already run: `--pods` are open at the start, the others
are parked (draining: no placements, no pod-seconds); while sessions wait, one more pod opens `--pod-start-s`
after the round that asked for it (a pod's start), and a pod empty for `--idle-s` beyond `--pods` is parked
again. Goodput counts the open (and opening) pods' seconds.

The trace (one per offered load, the same for every arm): Poisson arrivals for `--duration` seconds, session
lengths lognormal around `--length-s` (sigma 0.5); the offered load is the compute it asks for, as a share of
the `--pods` pods' throughput: load = arrival rate x mean length x (fps / frames per chunk) x tick time /
pods. Each session is an `ardiff.player.Player` (its target from the session view: fps `--fps` and
`--buffer-chunks` chunks, set in the session record as the operator sets it) that plays for its length once
placed, then leaves.

Two tick sources. The fake runtime at `--size`^2 whose forward takes a lognormal time around `--tick-ms`
(sigma `--tick-sigma`): the tiny model's distribution — measured first by the real arm, else the recorded
figures of docs/benchmarks.md ("Tick overhead": p50 233 ms, p99 328 ms at 64x64: sigma 0.15). And with
`--real`, a small arm of real workers (the tiny LingBot-World model at 64x64, the vllm-omni runner, on CPU):
one pod (its runner's 2 KV slots), each arm in turn (they share the cores).

Figures per arm and load, from the players (what viewers saw): mean and p5 CPR of admitted sessions, the share
of chunks on time (the buffer had not run dry), p99 gap between chunks, time to first chunk (from the first
tick) p50/p99, sessions that waited for a pod (> 1 s; `for_compute`: the last `place` answer said compute)
and the mean wait, the pods' own tick estimate (their records' `tick_ms`), goodput (session-seconds played at
CPR >= 0.95 per pod-second), the mean CPR over every arrival (time waiting for a pod and for the first chunk
counts as stall; a session never placed counts 0) and goodput against the `fifo` arm's.

    .venv/bin/python benchmarks/playout.py [--loads 0.5 1.0 1.5] [--duration 120] [--real]
    .venv/bin/python benchmarks/playout.py --smoke      # < 60 s: one load, short trace, two pods
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ardiff.client import SessionClient, WorkerAPIError, WorkerUnreachable, hold
from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec
from ardiff.player import Player, PlayoutFigures

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import WorkerProcess, pool_worker_env

FRAMES_PER_CHUNK = 12  # LingBot-World's chunks after the first (9 frames)
GOOD_CPR = 0.95
RECORDED_TICK_MS, RECORDED_TICK_SIGMA = 233.0, 0.15  # docs/benchmarks.md "Tick overhead", 64x64, p50 and p99


@dataclass(frozen=True)
class Arm:
    name: str
    tick_order: str
    utilisation: float


@dataclass(frozen=True)
class Arrival:
    at: float
    length_s: float


def trace(load: float, args: argparse.Namespace, tick_s: float, seed: int) -> list[Arrival]:
    """Poisson arrivals for `args.duration` s whose compute demand is `load` x the `args.pods` pods'."""
    per_session = args.fps / FRAMES_PER_CHUNK * tick_s  # a pod's share one session asks for
    rate = load * args.pods / per_session / args.length_s  # arrivals per second
    rng = np.random.default_rng(seed)
    arrivals, at = [], 0.0
    mu = math.log(args.length_s) - 0.5**2 / 2  # lognormal with mean length_s
    while (at := at + rng.exponential(1 / rate)) < args.duration:
        arrivals.append(Arrival(at, float(np.clip(rng.lognormal(mu, 0.5), 2.0, 4 * args.length_s))))
    return arrivals


# --------------------------------------------------------------------------------------------- workers


def worker_env(
    arm: Arm, pool: PoolId, redis_url: str, args: argparse.Namespace, real: bool
) -> dict[str, str]:
    arm_settings = {
        "ARDIFF_TICK_ORDER": arm.tick_order,
        "ARDIFF_COMPUTE_UTILISATION": str(arm.utilisation),
        "ARDIFF_PLAYOUT_FPS": str(args.fps),
    }
    if real:  # the runner's KV slots: the tiny model's 2
        return pool_worker_env(redis_url, pool, size=64, **arm_settings)
    return pool_worker_env(
        redis_url,
        pool,
        size=args.size,
        **arm_settings,
        ARDIFF_RUNTIME="fake",
        ARDIFF_FAKE_CAPACITY=str(args.capacity),
        ARDIFF_FAKE_TICK_SECONDS=str(args.tick_ms / 1000),
        ARDIFF_FAKE_TICK_SPREAD=str(args.tick_sigma),
    )


# ------------------------------------------------------------------------------------------- one arm


@dataclass
class Session:
    name: str
    arrival: Arrival
    token: str
    arrived_at: float = 0.0  # on the run's clock
    placed_at: float | None = None
    endpoint: str = ""
    ended_at: float | None = None
    figures: PlayoutFigures | None = None
    error: str = ""
    pending_reason: str = ""  # the last `place` answer's while it waited ('capacity' or 'compute')
    placed: threading.Event = field(default_factory=threading.Event)

    def spec(self, args: argparse.Namespace) -> SessionSpec:
        return SessionSpec(
            name=self.name,
            token_sha256=hashlib.sha256(self.token.encode()).hexdigest(),
            prompt="a walk through a misty forest",
            seed=len(self.name),
            playout_fps=args.fps,
            playout_buffer_chunks=args.buffer_chunks,
        )


@dataclass
class ArmRun:
    """One arm's trace: the sessions, the emulated operator's rounds and the pods' open time."""

    arm: Arm
    pool: PoolId
    workers: Sequence[WorkerProcess]
    args: argparse.Namespace
    sessions: list[Session]
    started: float = field(default_factory=time.monotonic)
    waiting: list[Session] = field(default_factory=list)
    finished: list[Session] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    pod_seconds: float = 0.0
    failure: BaseException | None = None  # the emulated operator's, which ends the run
    tick_ms: dict[str, float] = field(default_factory=dict)  # the pods' own tick estimates (their records)

    def now(self) -> float:
        return time.monotonic() - self.started

    def watch(self, session: Session) -> None:
        """A viewer: arrives, waits for a pod, plays for its length, leaves."""
        delay = session.arrival.at - self.now()
        if delay > 0:
            time.sleep(delay)
        session.arrived_at = self.now()
        with self.lock:
            self.waiting.append(session)
        if not session.placed.wait(timeout=max(1.0, self.args.duration + self.args.drain_s - self.now())):
            return
        if self.failure is not None:
            return
        try:
            with SessionClient(session.name, session.endpoint, session.token, timeout=60) as client:
                session.figures = Player(client).run(
                    seconds=session.arrival.length_s, controls=lambda i: (hold("wj"[i % 2]),)
                )
        except (WorkerAPIError, WorkerUnreachable) as exc:
            session.error = f"{type(exc).__name__}: {exc}"
        session.ended_at = self.now()
        with self.lock:
            self.finished.append(session)

    def operate_until_stopped(self, redis_url: str) -> None:
        try:
            asyncio.run(self.operate(redis_url))
        except BaseException as exc:
            self.failure = exc
            for session in self.sessions:
                session.placed.set()
            raise

    async def operate(self, redis_url: str) -> None:
        """The operator's part: place waiting sessions in arrival order, release finished ones, open a parked
        pod while sessions wait and park an empty one, every round."""
        args = self.args
        pods = [w.pod for w in self.workers]
        open_pods = set(pods[: args.pods])
        opening: dict[str, float] = {}  # pod -> when it opens
        empty_since: dict[str, float] = {}
        async with PlacementStore.from_url(redis_url) as store:
            last = self.now()
            while not self.stop.is_set():
                now = self.now()
                self.pod_seconds += (len(open_pods) + len(opening)) * (now - last)
                last = now
                with self.lock:
                    waiting, self.waiting = list(self.waiting), []
                    finished, self.finished = list(self.finished), []
                for session in finished:
                    await store.release(self.pool, session.name, reason="deleted")
                for pod, at in list(opening.items()):
                    if at <= now:
                        del opening[pod]
                        open_pods.add(pod)
                        await store.set_draining(self.pool, pod, draining=False)
                still = []
                for session in waiting:
                    result = None if still else await store.place(self.pool, session.spec(args))
                    if result is None or result.placement is None:
                        session.pending_reason = result.pending_reason if result else session.pending_reason
                        still.append(session)  # in arrival order: the next ones wait behind it
                        continue
                    session.placed_at, session.endpoint = self.now(), result.placement.endpoint
                    session.placed.set()
                with self.lock:
                    self.waiting[:0] = still
                parked = [p for p in pods if p not in open_pods and p not in opening]
                if still and parked and not opening:
                    opening[parked[0]] = now + args.pod_start_s
                records = {r.name: r for r in await store.list_pods(self.pool)}
                self.tick_ms.update({pod: r.tick_ms for pod, r in records.items() if r.tick_ms})
                for pod in sorted(open_pods - set(pods[: args.pods])):
                    used = records[pod].used if pod in records else 0
                    if used or still:
                        empty_since.pop(pod, None)
                    elif now - empty_since.setdefault(pod, now) >= args.idle_s and await store.drain_pod(
                        self.pool, pod, only_if_empty=True
                    ):
                        open_pods.discard(pod)
                        empty_since.pop(pod, None)
                await asyncio.sleep(args.round_s)


def run_arm(
    arm: Arm,
    arrivals: Sequence[Arrival],
    workers: Sequence[WorkerProcess],
    pool: PoolId,
    redis_url: str,
    args: argparse.Namespace,
    tag: str,
) -> ArmRun:
    sessions = [Session(f"s{tag}-{i}", a, f"token-{tag}-{i}") for i, a in enumerate(arrivals)]
    run = ArmRun(arm, pool, workers, args, sessions)
    operator = threading.Thread(target=run.operate_until_stopped, args=(redis_url,), daemon=True)
    viewers = [threading.Thread(target=run.watch, args=(s,), daemon=True) for s in sessions]
    operator.start()
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join(timeout=max(0.0, args.duration + args.drain_s + 4 * args.length_s - run.now()))
    run.stop.set()
    operator.join(timeout=10)
    if run.failure is not None:
        raise RuntimeError(f"the {arm.name} arm's placement loop failed") from run.failure
    return run


def park_spares(pool: PoolId, workers: Sequence[WorkerProcess], redis_url: str, pods: int) -> None:
    async def park() -> None:
        async with PlacementStore.from_url(redis_url) as store:
            for worker in workers[pods:]:
                await store.set_draining(pool, worker.pod, draining=True)

    asyncio.run(park())


# ------------------------------------------------------------------------------------------- figures


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def figures_of(run: ArmRun) -> dict[str, float]:
    played = [s for s in run.sessions if s.figures is not None and s.figures.chunks]
    cprs = [s.figures.cpr for s in played]  # type: ignore[union-attr]
    on_time = sum(s.figures.chunks_on_time for s in played)  # type: ignore[union-attr]
    late = sum(s.figures.chunks_late for s in played)  # type: ignore[union-attr]
    gaps = [g for s in played for g in s.figures.gaps_s]  # type: ignore[union-attr]
    ttfc = [s.figures.time_to_first_chunk_s for s in played]  # type: ignore[union-attr]
    waits = [(s.placed_at if s.placed_at is not None else run.now()) - s.arrived_at for s in run.sessions]
    good = sum(s.figures.played_s for s in played if s.figures.cpr >= GOOD_CPR)  # type: ignore[union-attr]

    def over_arrival(s: Session) -> float:
        """Shown time over the time since arrival: waiting, the first chunk and stalls count against it."""
        if s.figures is None or not s.figures.chunks or s.ended_at is None:
            return 0.0
        shown = s.figures.played_s - s.figures.stall_s
        return shown / max(shown, s.ended_at - s.arrived_at)

    return {
        "arrivals": len(run.sessions),
        "admitted": len(played),
        "errors": sum(bool(s.error) for s in run.sessions),
        "cpr_mean": statistics.fmean(cprs) if cprs else float("nan"),
        "cpr_p5": percentile(cprs, 5),
        "on_time": on_time / (on_time + late) if on_time + late else float("nan"),
        "gap_p99": percentile(gaps, 99),
        "ttfc_p50": percentile(ttfc, 50),  # type: ignore[arg-type]
        "ttfc_p99": percentile(ttfc, 99),  # type: ignore[arg-type]
        "waited": sum(w > 1.0 for w in waits),
        "for_compute": sum(s.pending_reason == "compute" for s in run.sessions),
        "wait_mean": statistics.fmean(waits) if waits else 0.0,
        "goodput": good / run.pod_seconds if run.pod_seconds else 0.0,
        "cpr_all": statistics.fmean(over_arrival(s) for s in run.sessions) if run.sessions else float("nan"),
        "pod_seconds": run.pod_seconds,
        "tick_ms": statistics.fmean(run.tick_ms.values()) if run.tick_ms else float("nan"),
    }


COLUMNS = (
    ("arm", "{:<15}"),
    ("arrivals", "{:>8}"),
    ("admitted", "{:>8}"),
    ("cpr_mean", "{:>8.3f}"),
    ("cpr_p5", "{:>7.3f}"),
    ("on_time", "{:>7.3f}"),
    ("gap_p99", "{:>7.2f}"),
    ("ttfc_p50", "{:>8.2f}"),
    ("ttfc_p99", "{:>8.2f}"),
    ("waited", "{:>6}"),
    ("for_compute", "{:>11}"),
    ("wait_mean", "{:>9.1f}"),
    ("pod_seconds", "{:>11.0f}"),
    ("tick_ms", "{:>7.0f}"),
    ("goodput", "{:>7.2f}"),
    ("cpr_all", "{:>7.3f}"),
    ("vs_fifo", "{:>7.2f}"),
)


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    print(f"\n{title}")
    header = " ".join(f"{name:>{len(fmt.format(0)) if name != 'arm' else 15}}" for name, fmt in COLUMNS)
    print(header)
    print("-" * len(header))
    fifo = next((r["goodput"] for r in rows if r["arm"] == "fifo"), 0.0)
    for row in rows:
        ratio = row["goodput"] / fifo if fifo else (math.inf if row["goodput"] else math.nan)
        row = {**row, "vs_fifo": ratio}
        print(" ".join(fmt.format(row[name]) for name, fmt in COLUMNS))
    print("-" * len(header))


# ------------------------------------------------------------------------------------------- the run


def measure_tick(redis_url: str, args: argparse.Namespace, logs: Path) -> tuple[float, float]:
    """The tiny model's tick time at 64x64 (forward + decode, the worker's server timing) over `--measure`
    back-to-back ticks of one session on a real worker: the median (ms) and the lognormal sigma (from p50 and
    p90, as the fake runtime draws them)."""
    pool = PoolId("bench", "playout-measure")
    worker = WorkerProcess.start(
        "measure-0", worker_env(Arm("measure", "fifo", 0.0), pool, redis_url, args, True), logs
    )
    try:
        worker.wait_ready(600)
        session = Session("measure", Arrival(0, 0), "token-measure")

        async def place() -> str:
            async with PlacementStore.from_url(redis_url) as store:
                result = await store.place(pool, session.spec(args))
                assert result.placement is not None, "the measuring worker took no session"
                return result.placement.endpoint

        with SessionClient(session.name, asyncio.run(place()), session.token, timeout=120) as client:
            times = []
            for i in range(args.measure + 3):
                chunk = client.tick([hold("w")])
                if i >= 3:  # the first chunks warm the runner
                    times.append(chunk.server_timing.get("forward", 0) + chunk.server_timing.get("decode", 0))
    finally:
        worker.stop()
    p50, p90 = percentile(times, 50), percentile(times, 90)
    return p50, max(0.0, math.log(p90 / p50) / 1.2816)


def run_load(
    load: float,
    arms: Sequence[Arm],
    redis_url: str,
    args: argparse.Namespace,
    logs: Path,
    *,
    real: bool,
    index: int,
) -> list[dict[str, Any]]:
    """One offered load through every arm. Fake arms run side by side (the same machine noise for all; their
    ticks are sleeps); real arms one after another (their ticks are the cores')."""
    tick_s = args.tick_ms / 1000
    arrivals = trace(load, args, tick_s, seed=args.seed + index)
    pods = 1 if real else args.max_pods
    prepared = []
    for arm in arms:
        pool = PoolId("bench", f"playout-{'real' if real else 'fake'}-{index}-{arm.name.replace('+', '-')}")
        env = worker_env(arm, pool, redis_url, args, real)
        workers = [WorkerProcess.start(f"{pool.name}-{i}", env, logs) for i in range(pods)]
        prepared.append((arm, pool, workers))
    try:
        for _, _, workers in prepared:
            for worker in workers:
                worker.wait_ready(600 if real else 120)
        for _, pool, workers in prepared:
            park_spares(pool, workers, redis_url, min(args.pods, pods))
        results: dict[str, ArmRun] = {}

        def one(arm: Arm, pool: PoolId, workers: Sequence[WorkerProcess]) -> None:
            tag = f"{index}-{arms.index(arm)}"
            results[arm.name] = run_arm(arm, arrivals, workers, pool, redis_url, args, tag)

        if real:
            for prepared_arm in prepared:
                one(*prepared_arm)
        else:
            threads = [threading.Thread(target=one, args=p) for p in prepared]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for _, _, workers in prepared:
            for worker in workers:
                worker.stop()
    return [{"arm": arm.name, **figures_of(results[arm.name])} for arm in arms]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=float, nargs="*", default=[0.5, 1.0, 1.5])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per load")
    parser.add_argument(
        "--drain-s", type=float, default=60.0, help="how long sessions may wait after the last"
    )
    parser.add_argument("--length-s", type=float, default=30.0, help="mean session length (play seconds)")
    parser.add_argument("--pods", type=int, default=2, help="pods open at the start (the pool's minimum)")
    parser.add_argument("--max-pods", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=6, help="KV slots per fake pod")
    parser.add_argument("--size", type=int, default=16, help="fake frames' side")
    parser.add_argument("--fps", type=float, default=16.0)
    parser.add_argument("--buffer-chunks", type=int, default=2)
    parser.add_argument("--bound", type=float, default=0.95, help="computeUtilisation of the bound arm")
    parser.add_argument("--tick-ms", type=float, default=None, help="default: measured (--real) or recorded")
    parser.add_argument("--tick-sigma", type=float, default=None)
    parser.add_argument("--pod-start-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--round-s", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument(
        "--real", action="store_true", help="also the real tiny model arm (and measure ticks)"
    )
    parser.add_argument("--real-load", type=float, default=1.2)
    parser.add_argument("--real-duration", type=float, default=60.0)
    parser.add_argument("--measure", type=int, default=30, help="ticks measured on the real model")
    parser.add_argument("--smoke", action="store_true", help="one short load on two pods: < 60 s")
    args = parser.parse_args()
    if args.smoke:
        args.loads, args.duration, args.drain_s, args.length_s = [1.5], 12.0, 8.0, 6.0
        args.pods, args.max_pods, args.pod_start_s, args.idle_s = 1, 2, 2.0, 3.0
    arms = (
        Arm("fifo", "fifo", 0.0),
        Arm("deadline", "deadline", 0.0),
        Arm("deadline+bound", "deadline", args.bound),
    )
    with RedisServer() as redis, tempfile.TemporaryDirectory(prefix="ardiff-bench-playout-") as workdir:
        logs = Path(workdir)
        source = "set"
        if args.tick_ms is None and args.real:
            args.tick_ms, measured_sigma = measure_tick(redis.url, args, logs)
            args.tick_sigma = measured_sigma if args.tick_sigma is None else args.tick_sigma
            source = f"measured on the tiny model ({args.measure} ticks)"
        elif args.tick_ms is None:
            args.tick_ms, source = RECORDED_TICK_MS, "recorded (docs/benchmarks.md, Tick overhead)"
        args.tick_sigma = RECORDED_TICK_SIGMA if args.tick_sigma is None else args.tick_sigma
        per_pod = 1000 * FRAMES_PER_CHUNK / args.tick_ms / args.fps
        print(
            f"tick {args.tick_ms:.0f} ms, lognormal sigma {args.tick_sigma:.2f} ({source}); a pod plays "
            f"{per_pod:.2f} sessions at {args.fps:g} fps; {args.capacity} KV slots per fake pod; bound "
            f"{args.bound:g}; pods {args.pods}..{args.max_pods} (start {args.pod_start_s:g} s); buffer "
            f"{args.buffer_chunks} chunks; mean length {args.length_s:g} s; arrivals for {args.duration:g} s"
        )
        for index, load in enumerate(args.loads):
            rows = run_load(load, arms, redis.url, args, logs, real=False, index=index)
            print_table(f"fake runtime, offered load {load:g} ({args.pods} pods' compute)", rows)
        if args.real:
            real_args = argparse.Namespace(
                **{**vars(args), "pods": 1, "max_pods": 1, "duration": args.real_duration}
            )
            rows = run_load(
                args.real_load, arms, redis.url, real_args, logs, real=True, index=len(args.loads)
            )
            print_table(
                f"tiny model (real runner), 1 pod (2 KV slots), load {args.real_load:g}",
                rows,
            )


if __name__ == "__main__":
    main()
