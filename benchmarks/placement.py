"""Placement store latency against a Redis PING measured in the same run (DESIGN §8).

100 pods x 10,000 sessions by default. Every operation is timed as one sequential call on the same client,
and each is preceded by a timed PING, so the baseline sees the same load as the operation. Prints a table
with p50/p99 latency, operations per second, script calls and Redis-side script time per operation (from
Redis' own command statistics) and the ratios to PING; the target is place and touch p99 <= 3x PING p99.

    .venv/bin/python benchmarks/placement.py [--pods 100] [--sessions 10000] [--evictions 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import MAX_PRIORITY, PoolId, SessionSpec

POOL = PoolId("bench", "placement")
TOKEN = hashlib.sha256(b"bench").hexdigest()
TARGET_P99_RATIO = 3.0


@dataclass(frozen=True)
class Measured:
    name: str
    latencies_s: list[float]
    ping_latencies_s: list[float]
    wall_s: float
    script_calls: int
    script_usec: int

    @staticmethod
    def percentile(values: list[float], q: float) -> float:
        return (
            statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]
        )

    @property
    def p50_us(self) -> float:
        return self.percentile(self.latencies_s, 50) * 1e6

    @property
    def p99_us(self) -> float:
        return self.percentile(self.latencies_s, 99) * 1e6

    @property
    def ping_p50_us(self) -> float:
        return self.percentile(self.ping_latencies_s, 50) * 1e6

    @property
    def ping_p99_us(self) -> float:
        return self.percentile(self.ping_latencies_s, 99) * 1e6

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s


async def script_stats(store: PlacementStore) -> tuple[int, int]:
    """(calls, microseconds) Redis spent in scripts so far."""
    stats = await store.client.info("commandstats")
    scripts = [stats.get(f"cmdstat_{cmd}", {}) for cmd in ("evalsha", "eval")]
    return sum(int(s.get("calls", 0)) for s in scripts), sum(int(s.get("usec", 0)) for s in scripts)


async def measure(
    store: PlacementStore, name: str, operations: list[Callable[[], Awaitable[object]]]
) -> Measured:
    latencies, pings = [], []
    calls_before, usec_before = await script_stats(store)
    op_time = 0.0
    for operation in operations:
        start = time.perf_counter()
        await store.client.ping()
        pings.append(time.perf_counter() - start)
        start = time.perf_counter()
        await operation()
        elapsed = time.perf_counter() - start
        latencies.append(elapsed)
        op_time += elapsed
    calls, usec = await script_stats(store)
    return Measured(name, latencies, pings, op_time, calls - calls_before, usec - usec_before)


def spec(name: str, priority: int = 0) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, prompt="a quiet valley at dawn", priority=priority)


async def run(url: str, pods: int, sessions: int, evictions: int) -> list[Measured]:
    rng = random.Random(0)
    async with PlacementStore.from_url(url) as store:
        await store.delete_pool(POOL)
        capacity = -(-sessions // pods)
        epochs = {}
        for i in range(pods):
            pod = f"w-{i:03d}"
            registration = await store.register_pod(
                POOL, pod, capacity=capacity, endpoint=f"http://{pod}:8000", lease_ms=3_600_000
            )
            epochs[pod] = registration.epoch
        names = [f"s-{i:05d}" for i in range(sessions)]
        results = [await measure(store, "place", [lambda n=n: store.place(POOL, spec(n)) for n in names])]

        records = await store.get_sessions(POOL, names)
        order = rng.sample(names, len(names))
        results.append(
            await measure(
                store,
                "touch",
                [
                    lambda n=n: store.touch(
                        POOL, n, pod=records[n].pod, epoch=records[n].pod_epoch, chunk_index=1
                    )
                    for n in order
                ],
            )
        )
        # The pool is full: each newcomer evicts the least recently ticked session.
        newcomers = [f"new-{i:05d}" for i in range(evictions)]
        results.append(
            await measure(
                store,
                "place+evict",
                [lambda n=n: store.place(POOL, spec(n, MAX_PRIORITY), may_evict=True) for n in newcomers],
            )
        )
        results.append(
            await measure(
                store,
                "evict_lru",
                [lambda: store.evict_lru(POOL, min_idle_ms=0) for _ in range(evictions)],
            )
        )
        problems = await store.check_invariants(POOL)
        if problems:
            raise SystemExit(f"invariants violated after the benchmark: {problems[:5]}")
        await store.delete_pool(POOL)
    return results


def report(results: list[Measured], pods: int, sessions: int) -> bool:
    print(f"placement store: {pods} pods x {sessions} sessions, one client, sequential round trips")
    header = (
        f"{'operation':<12} {'n':>6} {'p50 µs':>8} {'p99 µs':>8} {'ops/s':>8} {'scripts/op':>10} "
        f"{'redis µs/op':>11} "
        f"{'PING p50':>8} {'PING p99':>8} {'p50/PING':>8} {'p99/PING':>8}"
    )
    print(header)
    print("-" * len(header))
    for m in results:
        print(
            f"{m.name:<12} {len(m.latencies_s):>6} {m.p50_us:>8.0f} {m.p99_us:>8.0f} {m.ops_per_s:>8.0f} "
            f"{m.script_calls / len(m.latencies_s):>10.2f} {m.script_usec / len(m.latencies_s):>11.1f} "
            f"{m.ping_p50_us:>8.0f} {m.ping_p99_us:>8.0f} "
            f"{m.p50_us / m.ping_p50_us:>8.2f} {m.p99_us / m.ping_p99_us:>8.2f}"
        )
    verdicts = {
        m.name: m.p99_us / m.ping_p99_us <= TARGET_P99_RATIO for m in results if m.name in ("place", "touch")
    }
    for name, ok in verdicts.items():
        print(f"target {name} p99 <= {TARGET_P99_RATIO:g}x PING p99: {'met' if ok else 'MISSED'}")
    return all(verdicts.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--evictions", type=int, default=2_000)
    parser.add_argument(
        "--redis-url", help="an existing Redis (default: a fresh redis-server on a free port)"
    )
    args = parser.parse_args()
    if args.redis_url:
        results = asyncio.run(run(args.redis_url, args.pods, args.sessions, args.evictions))
    else:
        with RedisServer() as server:
            results = asyncio.run(run(server.url, args.pods, args.sessions, args.evictions))
    report(results, args.pods, args.sessions)


if __name__ == "__main__":
    main()
