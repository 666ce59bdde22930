"""The placement store at scale (issue 14 item 7, the store's part): P pods x S sessions in one pool, seeded
through the store, at several sizes. Per size: Redis memory per session (`INFO memory` before and after the
sessions), what one operator round reads from Redis (`server_time_ms` + `reap_expired` + `list_pods` +
`get_bindings` of every session of the pool, as `operator/reconcile.py` does), the invariant check, a touch,
and a burst of 1,000 new sessions placed by 8 concurrent placers (the store's part of apply -> Ready) into a
pool with room for twice the burst (32 placers racing for a 100-pod pool's last free slots can exhaust
`place`'s 16 plan attempts: PlacementContention).

    .venv/bin/python benchmarks/scale_store.py [--sizes 10x1000,100x10000,1000x100000]

`--smoke`: sizes 2x20 and 4x40 (the burst as ever; the test's run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass

from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.scale_seed import bounded, place_sessions, session_spec, used_memory
from ardiff.devcluster.scale_seed import percentile as pct
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

POOL = PoolId("scale", "gpu")
BURST = 1_000
CONCURRENCY = 32  # seeding and touching
BURST_PLACERS = 8
INVARIANTS_UP_TO = 20_000


@dataclass(frozen=True)
class SizeResult:
    pods: int
    sessions: int
    seed_s: float
    bytes_per_session: float
    bytes_per_pod: float
    round_reads_ms: float
    bindings_ms: float
    invariants_ms: float
    touch_p50_us: float
    touch_p99_us: float
    burst_s: float
    burst_p50_ms: float
    burst_p99_ms: float


async def measure(url: str, pods: int, sessions: int) -> SizeResult:
    rng = random.Random(0)
    async with PlacementStore.from_url(url) as store:
        base = await used_memory(store)
        capacity = -(-(sessions + 2 * BURST) // pods)
        epochs = {}
        for i in range(pods):
            pod = f"w-{i:04d}"
            registration = await store.register_pod(
                POOL, pod, capacity=capacity, endpoint=f"http://{pod}:8000", lease_ms=3_600_000
            )
            epochs[pod] = registration.epoch
        with_pods = await used_memory(store)
        names = [f"s-{i:06d}" for i in range(sessions)]
        start = time.perf_counter()
        bindings = await place_sessions(store, POOL, names, CONCURRENCY)
        seed_s = time.perf_counter() - start
        with_sessions = await used_memory(store)

        start = time.perf_counter()
        await store.server_time_ms()
        await store.reap_expired(POOL)
        await store.list_pods(POOL)
        bindings_start = time.perf_counter()
        await store.get_bindings(POOL, names)
        done = time.perf_counter()
        round_reads_ms, bindings_ms = (done - start) * 1e3, (done - bindings_start) * 1e3

        invariants_ms = float("nan")  # a test's tool: one MULTI of every record, too big past ~20k sessions
        if sessions <= INVARIANTS_UP_TO:
            start = time.perf_counter()
            problems = await store.check_invariants(POOL)
            invariants_ms = (time.perf_counter() - start) * 1e3
            if problems:
                raise SystemExit(f"invariants violated at {pods}x{sessions}: {problems[:3]}")

        touches = []
        for name in rng.sample(names, min(2_000, sessions)):
            binding = bindings[name]
            start = time.perf_counter()
            await store.touch(POOL, name, pod=binding.pod, epoch=binding.pod_epoch, chunk_index=2)
            touches.append(time.perf_counter() - start)

        newcomers = [f"burst-{i:04d}" for i in range(BURST)]
        start = time.perf_counter()
        burst = await bounded(
            [lambda n=n: store.place(POOL, session_spec(n)) for n in newcomers], BURST_PLACERS
        )
        burst_s = time.perf_counter() - start
        await store.delete_pool(POOL)
    return SizeResult(
        pods=pods,
        sessions=sessions,
        seed_s=seed_s,
        bytes_per_session=(with_sessions - with_pods) / sessions,
        bytes_per_pod=(with_pods - base) / pods,
        round_reads_ms=round_reads_ms,
        bindings_ms=bindings_ms,
        invariants_ms=invariants_ms,
        touch_p50_us=pct(touches, 50) * 1e6,
        touch_p99_us=pct(touches, 99) * 1e6,
        burst_s=burst_s,
        burst_p50_ms=pct(burst, 50) * 1e3,
        burst_p99_ms=pct(burst, 99) * 1e3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10x1000,100x10000,1000x100000", help="PODSxSESSIONS,...")
    parser.add_argument("--smoke", action="store_true", help="sizes 2x20,4x40 (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.sizes = "2x20,4x40"
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    load = os.getloadavg()
    print(f"placement store at scale, one pool; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    header = (
        f"{'pods':>5} {'sessions':>8} {'seed s':>7} {'B/session':>9} {'B/pod':>7} {'round reads ms':>14} "
        f"{'(bindings)':>10} {'invariants ms':>13} {'touch p50/p99 µs':>17} {'burst 1k s':>10} "
        f"{'burst p50/p99 ms':>17}"
    )
    print(header)
    print("-" * len(header))
    for pods, sessions in sizes:
        with RedisServer() as server:
            r = asyncio.run(measure(server.url, pods, sessions))
        print(
            f"{r.pods:>5} {r.sessions:>8} {r.seed_s:>7.1f} {r.bytes_per_session:>9.0f} "
            f"{r.bytes_per_pod:>7.0f} "
            f"{r.round_reads_ms:>14.1f} {r.bindings_ms:>10.1f} {r.invariants_ms:>13.1f} "
            f"{f'{r.touch_p50_us:.0f} / {r.touch_p99_us:.0f}':>17} {r.burst_s:>10.2f} "
            f"{f'{r.burst_p50_ms:.1f} / {r.burst_p99_ms:.1f}':>17}"
        )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
