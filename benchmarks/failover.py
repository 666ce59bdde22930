"""Redis Sentinel failover of the placement store (issue 14 item 3): what waiting for a replica costs
(sequential write latency, master + in-sync replica) and buys (acknowledged writes lost when the master is
killed under load), and the unavailability window; the scenario is `ardiff.devcluster.redis_failover`.

    .venv/bin/python benchmarks/failover.py [--runs 5] [--operations 2000]

`--smoke`: one failover run per variant, 50 writes of each kind per latency run (the test's run).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

from ardiff.devcluster.redis_failover import LEASE_MS, run_failover, spec
from ardiff.devcluster.redis_server import SentinelGroup
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

T = TypeVar("T")


def percentile_us(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e6


async def timed(into: list[float], call: Awaitable[T]) -> T:
    start = time.perf_counter()
    result = await call
    into.append(time.perf_counter() - start)
    return result


async def write_latency(wait_replicas: int, operations: int) -> dict[str, tuple[float, float]]:
    """{operation: (p50 µs, p99 µs)} of sequential place, release and touch (one client, a master and an
    in-sync replica, no failover): what WAIT costs when nothing goes wrong."""
    pool = PoolId("latency", f"wait-{wait_replicas}")
    timings: dict[str, list[float]] = {"place": [], "touch": [], "release": [], "PING": []}
    with SentinelGroup() as group:
        async with PlacementStore.from_url(group.url, wait_replicas=wait_replicas) as store:
            await store.register_pod(
                pool, "w-0", capacity=operations, endpoint="http://w-0:8000", lease_ms=LEASE_MS
            )
            for n in range(operations):
                name = f"s-{n}"
                await timed(timings["PING"], store.ping())
                placed = await timed(timings["place"], store.place(pool, spec(name)))
                epoch = placed.placement.pod_epoch if placed.placement else 0
                await timed(timings["touch"], store.touch(pool, name, pod="w-0", epoch=epoch, chunk_index=1))
                await timed(timings["release"], store.release(pool, name, reason="closed"))
    return {name: (percentile_us(v, 0.5), percentile_us(v, 0.99)) for name, v in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--operations", type=int, default=2000, help="sequential writes per latency run")
    parser.add_argument("--smoke", action="store_true", help="one run, 50 operations (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.operations = 1, 50
    print(f"write latency, one client, master + in-sync replica ({args.operations} of each)")
    print(
        f"{'wait':>4} "
        + " ".join(f"{name + ' p50/p99 µs':>22}" for name in ("PING", "place", "touch", "release"))
    )
    for wait_replicas in (0, 1):
        measured = asyncio.run(write_latency(wait_replicas, args.operations))
        cells = " ".join(
            f"{f'{measured[n][0]:.0f} / {measured[n][1]:.0f}':>22}"
            for n in ("PING", "place", "touch", "release")
        )
        print(f"{wait_replicas:>4} {cells}")
    print()
    print("kill -9 of the master under load (3 placers, 4 workers)")
    header = (
        f"{'wait':>4} {'placed':>6} {'released':>8} {'evicted':>7} {'lost':>4} {'reported':>8} "
        f"{'NotRepl':>7} {'window s':>8} {'place p50 µs':>12} {'place p99 µs':>12} {'violations':>10}"
    )
    print(header)
    print("-" * len(header))
    for _ in range(args.runs):
        for wait_replicas in (0, 1):
            r = asyncio.run(run_failover(wait_replicas))
            print(
                f"{r.wait_replicas:>4} {r.acked_placements:>6} {r.acked_releases:>8} {r.acked_evictions:>7} "
                f"{len(r.lost):>4} {len(r.lost_reported):>8} {r.not_replicated:>7} {r.window_s:>8.2f} "
                f"{r.place_p50_us:>12.0f} {r.place_p99_us:>12.0f} {len(r.violations):>10}"
            )


if __name__ == "__main__":
    main()
