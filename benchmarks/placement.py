"""Placement store latency against a Redis PING measured in the same run (DESIGN §8).

100 pods x 10,000 sessions by default. Every operation is timed as one sequential call on the same client,
and each is preceded by a timed PING, so the baseline sees the same load as the operation. Prints a table
with p50/p99 latency, operations per second, script calls and Redis-side script time per operation (from
Redis' own command statistics) and the ratios to PING; the target is place and touch p99 <= 3x PING p99.

    .venv/bin/python benchmarks/placement.py [--pods 100] [--sessions 10000] [--evictions 2000]

With `--clients N --pools M` it measures throughput under concurrency instead: N clients (half place new
sessions, half tick placed ones) over M pools, flat out for the peak aggregate place+touch ops/s; then
`redis-benchmark` runs the same FCALL calls (the argv our store sends, captured) at the same concurrency;
then the clients again, paced at ~70% of the peak, for latency against PING. Script time per call comes from
`INFO commandstats`; one pool's ceiling is one node's thread running its scripts.

    .venv/bin/python benchmarks/placement.py --clients 32 --pools 8 [--procs 2] [--duration 5]

With `--cost` it measures what one operation costs the client (issue 27 item 3): this process's CPU per
`PlacementStore.place` and `touch` against a bare redis-py FCALL of the same function with the argv the store
sends, and a bare PING, interleaved over rounds on one connection each (the median round); then Redis' own
time per call, each alone after `CONFIG RESETSTAT`, and the one-pool ceiling that follows from it (one hash
slot: one node, one thread); then (issue 42 item 4) Redis' time per place as the store ran it before, one
script by EVALSHA that defines the shared helpers on every call (built here only, `script_source`), against
FCALL of the library's function, interleaved over the rounds; last, both ways part by part (a copy of the
operation marking Redis' clock after each part).

    .venv/bin/python benchmarks/placement.py --cost [--calls 2000] [--rounds 5]

`--smoke`: the latency table at 4 pods x 50 sessions (10 evictions), then the throughput mode with 4 clients
in one process over 2 pools, 0.5 s per phase (tests/kv/test_placement_benchmark.py; the cost mode's test runs
`--cost --calls 200 --rounds 1`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.resources
import itertools
import multiprocessing
import os
import random
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.keys import PoolKeys
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
    scripts = [stats.get(f"cmdstat_{cmd}", {}) for cmd in ("fcall", "fcall_ro", "evalsha", "eval")]
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


# ---- throughput under concurrency (--clients N --pools M) ------------------------------------------------

BIG_CAPACITY = 10_000_000  # the pool never fills: every place takes the free-slot path
TOUCHED_PER_POOL = 64


@dataclass(frozen=True)
class Shape:
    url: str
    pools: list[PoolId]
    epochs: dict[PoolId, int]  # pool -> epoch of its one pod "w-0"
    touched: list[str]  # sessions the workers tick, placed in every pool


@dataclass
class ClientStats:
    places: list[float]  # latencies, s
    touches: list[float]
    pings: list[float]
    wall_s: float
    cpu_s: float = 0.0  # CPU time of the client processes


def pool_of(index: int) -> PoolId:
    return PoolId("bench", f"pool-{index}")


async def setup_pools(url: str, pools: int) -> Shape:
    """M pools of one pod each (capacity without limit: the free-slot path), TOUCHED_PER_POOL sessions placed
    in each for the workers to tick."""
    ids = [pool_of(i) for i in range(pools)]
    touched = [f"t-{i:03d}" for i in range(TOUCHED_PER_POOL)]
    epochs = {}
    async with PlacementStore.from_url(url) as store:
        for pool in [*ids, RB_POOL]:
            await store.delete_pool(pool)
            registration = await store.register_pod(
                pool, "w-0", capacity=BIG_CAPACITY, endpoint="http://w-0:8000", lease_ms=3_600_000
            )
            epochs[pool] = registration.epoch
            for name in touched:
                await store.place(pool, spec(name))
    return Shape(url, ids, epochs, touched)


async def run_clients(
    shape: Shape, proc: int, tasks: int, duration_s: float, rate: float | None
) -> ClientStats:
    """`tasks` clients on one store: even ones place new sessions, odd ones tick placed ones, round-robin
    over the pools; `rate` (ops/s per client) paces them, None runs flat out. Process 0 also times PING."""
    stats = ClientStats([], [], [], 0.0)
    async with PlacementStore.from_url(shape.url) as store:
        deadline = time.perf_counter() + duration_s

        async def client(index: int) -> None:
            rng = random.Random(proc * 1000 + index)
            n = 0
            next_at = time.perf_counter()
            while (now := time.perf_counter()) < deadline:
                if rate:
                    next_at += 1 / rate
                    if next_at > now:
                        await asyncio.sleep(next_at - now)
                pool = shape.pools[(index + n) % len(shape.pools)]
                start = time.perf_counter()
                if index % 2 == 0:
                    await store.place(pool, spec(f"p{proc}-{index}-{n}"))
                    stats.places.append(time.perf_counter() - start)
                else:
                    name = rng.choice(shape.touched)
                    await store.touch(pool, name, pod="w-0", epoch=shape.epochs[pool], chunk_index=n)
                    stats.touches.append(time.perf_counter() - start)
                n += 1

        async def pinger() -> None:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                await store.client.ping()
                stats.pings.append(time.perf_counter() - start)
                await asyncio.sleep(0.005)

        began, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(i) for i in range(tasks)), *([pinger()] if proc == 0 else []))
        stats.wall_s, stats.cpu_s = time.perf_counter() - began, time.process_time() - cpu
    return stats


def _client_process(
    shape: Shape, proc: int, tasks: int, duration_s: float, rate: float | None, out: Any
) -> None:
    out.put(asyncio.run(run_clients(shape, proc, tasks, duration_s, rate)))


def run_phase(shape: Shape, clients: int, procs: int, duration_s: float, rate: float | None) -> ClientStats:
    """`clients` concurrent clients over `procs` processes (one Python process cannot keep Redis busy)."""
    queue: multiprocessing.Queue[ClientStats] = multiprocessing.Queue()
    per_proc = [clients // procs + (1 if p < clients % procs else 0) for p in range(procs)]
    workers = [
        multiprocessing.Process(target=_client_process, args=(shape, p, n, duration_s, rate, queue))
        for p, n in enumerate(per_proc)
        if n
    ]
    for worker in workers:
        worker.start()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
    return ClientStats(
        places=[x for r in results for x in r.places],
        touches=[x for r in results for x in r.touches],
        pings=[x for r in results for x in r.pings],
        wall_s=max(r.wall_s for r in results),
        cpu_s=sum(r.cpu_s for r in results),
    )


RB_POOL = PoolId("bench", "redis-benchmark")


async def captured_calls(url: str, epoch: int) -> dict[str, list[str]]:
    """The FCALL argv our store sends for a steady-state place and a touch (in RB_POOL), the place's session
    key and name made random per request (`__rand_int__`), for redis-benchmark."""
    calls: dict[str, list[str]] = {}
    async with PlacementStore.from_url(url) as store:
        original = store._call

        async def recording(name: str, keys: list[str], args: list[Any]) -> list[Any]:
            calls[name] = [
                "FCALL",
                store.library.functions[name],
                str(len(keys)),
                *keys,
                *(a.decode() if isinstance(a, bytes) else str(a) for a in args),
            ]
            return await original(name, keys, args)

        store._call = recording  # type: ignore[method-assign]
        await store.place(RB_POOL, spec("rb-warm-0"))
        await store.place(RB_POOL, spec("rb-warm-1"))  # the pod is now in the hint: one round trip
        await store.touch(RB_POOL, "t-000", pod="w-0", epoch=epoch, chunk_index=1)
    place = calls["place"]
    session_key = PoolKeys(RB_POOL).session("rb-warm-1")
    place[place.index(session_key)] = PoolKeys(RB_POOL).session("rb-__rand_int__")
    place[place.index("rb-warm-1")] = "rb-__rand_int__"
    return {"place": place, "touch": calls["touch"]}


def redis_benchmark(port: int, argv: list[str], clients: int, requests: int) -> float:
    """redis-benchmark's requests per second for one command at `clients` connections."""
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-c",
            str(clients),
            "-n",
            str(requests),
            "-r",
            "100000000",
            "--csv",
            *argv,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    row = [line for line in out.splitlines() if line.startswith('"') and not line.startswith('"test"')][-1]
    return float(row.split(",")[1].strip('"'))


async def commandstats(url: str) -> dict[str, tuple[int, float]]:
    """{command: (calls, usec)} from INFO commandstats."""
    async with PlacementStore.from_url(url) as store:
        stats = await store.client.info("commandstats")
    return {k.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for k, v in stats.items()}


def us(values: list[float], q: int) -> float:
    return Measured.percentile(values, q) * 1e6 if values else float("nan")


def throughput(url: str, port: int, clients: int, pools: int, procs: int, duration_s: float) -> bool:
    shape = asyncio.run(setup_pools(url, pools))
    before = asyncio.run(commandstats(url))
    peak = run_phase(shape, clients, procs, duration_s, rate=None)
    after = asyncio.run(commandstats(url))
    ops = len(peak.places) + len(peak.touches)
    peak_rate = ops / peak.wall_s
    calls = after["fcall"][0] - before.get("fcall", (0, 0.0))[0]
    script_us = (after["fcall"][1] - before.get("fcall", (0, 0.0))[1]) / max(calls, 1)

    argv = asyncio.run(captured_calls(url, shape.epochs[RB_POOL]))
    requests = max(20_000, int(peak_rate * duration_s))
    rb_before = asyncio.run(commandstats(url))
    rb_touch = redis_benchmark(port, argv["touch"], clients, requests)
    rb_mid = asyncio.run(commandstats(url))
    rb_place = redis_benchmark(port, argv["place"], clients, requests)
    rb_after = asyncio.run(commandstats(url))
    touch_us = (rb_mid["fcall"][1] - rb_before["fcall"][1]) / (rb_mid["fcall"][0] - rb_before["fcall"][0])
    place_us = (rb_after["fcall"][1] - rb_mid["fcall"][1]) / (rb_after["fcall"][0] - rb_mid["fcall"][0])
    share = len(peak.places) / ops  # the same mix of places and touches, at redis-benchmark's rates
    rb_mix = 1 / (share / rb_place + (1 - share) / rb_touch)

    paced = run_phase(shape, clients, procs, duration_s, rate=0.7 * peak_rate / clients)
    paced_rate = (len(paced.places) + len(paced.touches)) / paced.wall_s
    load = os.getloadavg()
    print(
        f"placement store under concurrency: {clients} clients ({procs} processes), {pools} pools, "
        f"{duration_s:g} s per phase; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'':<28} {'place/s':>9} {'touch/s':>9} {'place+touch/s':>13}")
    print(
        f"{'ardiff (peak)':<28} {len(peak.places) / peak.wall_s:>9.0f} "
        f"{len(peak.touches) / peak.wall_s:>9.0f} {peak_rate:>13.0f}"
    )
    print(f"{'redis-benchmark (FCALL)':<28} {rb_place:>9.0f} {rb_touch:>9.0f} {rb_mix:>13.0f}  (same mix)")
    ratio = peak_rate / rb_mix
    print(
        f"client CPU per operation: {peak.cpu_s / ops * 1e6:.0f} µs (Python, {procs} processes) against "
        f"{script_us:.0f} µs of script in Redis"
    )
    print(f"ardiff / redis-benchmark: {ratio:.2f} (target >= 0.80: {'met' if ratio >= 0.8 else 'MISSED'})")
    print(
        f"script time in Redis: {script_us:.1f} µs per call in our run; "
        f"redis-benchmark: place {place_us:.1f} µs, touch {touch_us:.1f} µs"
    )
    print(
        f"one pool's ceiling (one hash slot: one node, one thread): ~{1e6 / place_us:.0f} places/s or "
        f"~{1e6 / touch_us:.0f} touches/s of script time alone"
    )
    ping99 = us(paced.pings, 99)
    print(f"at ~70% of the peak ({paced_rate:.0f} ops/s, target {0.7 * peak_rate:.0f}):")
    print(f"{'':<8} {'p50 µs':>8} {'p99 µs':>8} {'p99/PING p99':>13}")
    for name, values in (("place", paced.places), ("touch", paced.touches), ("PING", paced.pings)):
        print(f"{name:<8} {us(values, 50):>8.0f} {us(values, 99):>8.0f} {us(values, 99) / ping99:>13.2f}")
    met = max(us(paced.places, 99), us(paced.touches, 99)) / ping99 <= TARGET_P99_RATIO
    print(f"target p99 <= {TARGET_P99_RATIO:g}x PING p99 at 70% load: {'met' if met else 'MISSED'}")
    return met and ratio >= 0.8


TARGET_CPU_RATIO = 1.5  # the store's client CPU per operation against a bare FCALL of its function
TARGET_REDIS_CHANGE = -0.15  # issue 42 item 4: the place's Redis time, FCALL against EVALSHA of the script


@dataclass(frozen=True)
class Cost:
    cpu_us: float  # this process's CPU per call
    wall_us: float


async def timed_calls(
    call: Callable[[Any], Awaitable[object]], make_input: Callable[[int], object], first: int, calls: int
) -> Cost:
    """`calls` sequential calls, each given its own input (`make_input(i)`, made before the clocks start: an
    arm's cost is its call's, not the making of its arguments)."""
    inputs = [make_input(i) for i in range(first, first + calls)]
    cpu, wall = time.process_time(), time.perf_counter()
    for value in inputs:
        await call(value)
    return Cost((time.process_time() - cpu) / calls * 1e6, (time.perf_counter() - wall) / calls * 1e6)


def numbered(argv: list[str], i: int) -> list[str]:
    """`captured_calls`' argv for call `i` (its random session name made a counter: each place is new)."""
    return [a.replace("__rand_int__", f"c{i}") for a in argv]


async def script_usec(bare: aioredis.Redis, argv: list[str], calls: int, first: int = 10_000_000) -> float:
    """Redis' own µs per call of `argv` (numbered from `first`: new sessions), alone, counters reset."""
    await bare.config_resetstat()
    for i in range(first, first + calls):
        await bare.execute_command(*numbered(argv, i))
    stats = await bare.info("commandstats")
    command = "cmdstat_" + argv[0].lower()
    return float(stats[command]["usec_per_call"])


# The place script's free-slot path, part by part (issue 27 item 3): a copy of the operation marks Redis'
# clock (`TIME`, µs) where the operation's own code starts and after each of these top-level lines, and
# returns the marks instead of its reply; a part is what runs between two marks. Issue 42 item 4: the same
# copy both ways, as the script EVALSHA ran before (the record fields and _lib.lua defined again by every
# call) and as a function of a library of its own (FCALL: defined once, at FUNCTION LOAD).
PLACE_MARKS = (
    ("plan and arguments read", "\nlocal missing = new_missing()"),
    ("session record read", "\n  'suspended_chunk', 'resume_from', 'snapshot_location', 'snapshot_chunk'"),
    ("pod choice (open index, lease, compute)", "\nlocal pod = choose_pod()"),
    ("record, residents and LRU written (bind)", "\nbind(session_key, residents_key, lru_key, session"),
    ("resume_from written, slot charged", "\ncharge(pod_key, session_key, 1)"),
    ("open index refreshed", "\nrefresh_open(open_key, headroom_key, pod_key, pod)"),
    ("hints for the next call", "\nlocal hint_pod, hint_victim_pod, hint_victim = hints()"),
)
CLOCK = (
    "\nlocal __marks = {}\nlocal function __mark()\n  local t = redis.call('TIME')\n"
    "  table.insert(__marks, tonumber(t[1]) * 1000000 + tonumber(t[2]))\nend"
)
# The benchmark's own libraries (the marked place, an empty function, marks alone): names of their own, so
# they never meet the product's library.
MARKED_LIBRARY = "ardiff_bench_marked"
EMPTY_LIBRARY = "ardiff_bench_empty"
CLOCK_LIBRARY = "ardiff_bench_clock"


def script_source(name: str) -> str:
    """The operation as the one script EVALSHA ran before issue 42 item 4: the record field tables, the shared
    helpers, then the operation. The baseline of `--cost` only; the store runs the library."""
    from ardiff.kv.scripts import load_script, record_fields_lua

    lib = (importlib.resources.files("ardiff.kv") / "lua" / "_lib.lua").read_text()
    return "\n".join((record_fields_lua(), lib, load_script(name)))


def marked_place_body() -> str:
    """place.lua, a clock mark where it starts and after each line of `PLACE_MARKS`, returning the marks once
    placed."""
    from ardiff.kv.scripts import load_script

    body = "\n" + load_script("place")
    for _, line in reversed(PLACE_MARKS):  # from the last: earlier offsets stay valid
        end = body.index("\n", body.index(line) + 1) + 1
        body = body[:end] + "__mark()\n" + body[end:]
    body = CLOCK + "\n__mark()" + body  # the clock starts where the operation's own code does
    placed = body.index("\nreturn answer({OK, 'placed'") + 1
    return body[:placed] + "do return __marks end\n" + body[placed:]


def marked_place_source() -> str:
    """The marked place as one script (EVALSHA, before)."""
    from ardiff.kv.scripts import load_script

    place = load_script("place")
    return script_source("place").replace(place, marked_place_body())


def marked_place_library() -> str:
    """The marked place as a function of a library (FCALL `<MARKED_LIBRARY>_place`)."""
    from ardiff.kv.scripts import library_source, load_script

    place = load_script("place")
    source = library_source(MARKED_LIBRARY)
    whole = f"local function op_place()\n{place}\nend\n"
    assert whole in source
    return source.replace(whole, f"local function op_place()\n{marked_place_body()}\nend\n")


def one_function_library(name: str, body: str) -> str:
    return f"#!lua name={name}\nredis.register_function('{name}', function(keys, args)\n{body}\nend)\n"


async def place_parts(bare: aioredis.Redis, argv: list[str], calls: int, first: int) -> dict[str, float]:
    """Redis' own µs of each part of the place operation's free-slot path, means over `calls` new sessions,
    run as `argv` runs it (EVALSHA of the whole script, or FCALL of the library's function), sessions numbered
    from `first`: an empty script
    or function given the same keys and arguments (what any call costs); the marked parts, each less one
    mark's own cost (a `redis.call('TIME')` from Lua and a table insert: marks alone, less the empty call);
    what runs before the first mark (EVALSHA: the shared helpers defined; FCALL: the callback handing over
    keys and arguments): the marked call's time (`INFO commandstats`, over the same calls) less its marks, the
    parts and the empty call."""
    marks_count = len(PLACE_MARKS) + 1
    clock_body = CLOCK + "\n__mark()" * marks_count + "\nreturn __marks"
    if argv[0] == "FCALL":
        await bare.execute_command(
            "FUNCTION", "LOAD", "REPLACE", one_function_library(EMPTY_LIBRARY, "return 0")
        )
        await bare.execute_command(
            "FUNCTION", "LOAD", "REPLACE", one_function_library(CLOCK_LIBRARY, clock_body)
        )
        await bare.execute_command("FUNCTION", "LOAD", "REPLACE", marked_place_library())
        empty, clock_only, marked = EMPTY_LIBRARY, CLOCK_LIBRARY, f"{MARKED_LIBRARY}_place"
    else:
        empty = await bare.script_load("return 0")
        clock_only = await bare.script_load(clock_body)
        marked = await bare.script_load(marked_place_source())
    empty_us = await script_usec(bare, [argv[0], empty, *argv[2:]], calls)
    mark_us = (await script_usec(bare, [argv[0], clock_only, *argv[2:]], calls) - empty_us) / marks_count
    sums = [0.0] * len(PLACE_MARKS)
    await bare.config_resetstat()
    for i in range(calls):
        marks = await bare.execute_command(*numbered([argv[0], marked, *argv[2:]], first + i))
        assert len(marks) == marks_count, marks  # the free-slot path: every mark passed
        for part, (start, end) in enumerate(itertools.pairwise(marks)):
            sums[part] += int(end) - int(start)
    stats = await bare.info("commandstats")
    whole_us = float(stats[f"cmdstat_{argv[0].lower()}"]["usec_per_call"]) - marks_count * mark_us
    parts = {name: total / calls - mark_us for (name, _), total in zip(PLACE_MARKS, sums, strict=True)}
    before_marks = (
        "the shared helpers defined (kv/lua/_lib.lua)" if argv[0] == "EVALSHA" else "the function's callback"
    )
    return {
        "any script call with these keys and arguments": empty_us,
        before_marks: whole_us - empty_us - sum(parts.values()),
        **parts,
        "whole script, its marks' cost taken off": whole_us,
    }


async def client_cost(url: str, calls: int, rounds: int) -> bool:
    shape = await setup_pools(url, 1)
    argv = await captured_calls(url, shape.epochs[RB_POOL])
    epoch = shape.epochs[RB_POOL]
    # name: (the call, its input for call i): every place a new session
    arms: dict[str, tuple[Callable[[Any], Awaitable[object]], Callable[[int], object]]]
    async with PlacementStore.from_url(url) as store, aioredis.from_url(url) as bare:
        arms = {
            "PING (bare redis-py)": (lambda _: bare.ping(), lambda i: None),
            "place: FCALL (bare redis-py)": (
                lambda argv_i: bare.execute_command(*argv_i),
                lambda i: numbered(argv["place"], i),
            ),
            "place: PlacementStore.place": (lambda s: store.place(RB_POOL, s), lambda i: spec(f"rb-s{i}")),
            "touch: FCALL (bare redis-py)": (
                lambda _: bare.execute_command(*argv["touch"]),
                lambda i: None,
            ),
            "touch: PlacementStore.touch": (
                lambda _: store.touch(RB_POOL, "t-000", pod="w-0", epoch=epoch, chunk_index=1),
                lambda i: None,
            ),
        }
        for call, make_input in arms.values():  # warm: connections made, scripts loaded
            await timed_calls(call, make_input, 0, 50)
        runs: dict[str, list[Cost]] = {name: [] for name in arms}
        for number in range(rounds):
            for name, (call, make_input) in arms.items():
                runs[name].append(await timed_calls(call, make_input, (number + 1) * calls, calls))
        redis_us = {
            "PING": await script_usec(bare, ["PING"], calls),
            "place": await script_usec(bare, argv["place"], calls),
            "touch": await script_usec(bare, argv["touch"], calls),
        }
        # Issue 42 item 4: the place as the whole script by EVALSHA (before) against FCALL of the library's
        # function, the same keys and arguments, new sessions, interleaved over the rounds (the median).
        evalsha_place = ["EVALSHA", await bare.script_load(script_source("place")), *argv["place"][2:]]
        before_after: dict[str, list[float]] = {"EVALSHA": [], "FCALL": []}
        for number in range(rounds):  # each first in every other round: the pool grows as they place
            first = 30_000_000 + number * 2 * calls
            order = [("EVALSHA", evalsha_place), ("FCALL", argv["place"])]
            for offset, (command, command_argv) in enumerate(order[:: 1 if number % 2 == 0 else -1]):
                usec = await script_usec(bare, command_argv, calls, first + offset * calls)
                before_after[command].append(usec)
        place_us = {command: statistics.median(values) for command, values in before_after.items()}
        parts = {
            "EVALSHA": await place_parts(bare, evalsha_place, calls, 20_000_000),
            "FCALL": await place_parts(bare, argv["place"], calls, 40_000_000),
        }
    cost = {
        name: Cost(statistics.median(c.cpu_us for c in costs), statistics.median(c.wall_us for c in costs))
        for name, costs in runs.items()
    }
    load = os.getloadavg()
    print(
        f"client cost per operation: {calls} sequential calls per arm and round, {rounds} rounds "
        f"interleaved, the median round; load average {load[0]:.2f}"
    )
    print(f"{'arm':<32} {'CPU µs':>8} {'wall µs':>8} {'CPU ÷ bare FCALL':>19} {'CPU ÷ PING':>11}")
    ping = cost["PING (bare redis-py)"].cpu_us
    met = True
    for name, measured in cost.items():
        kind = name.split(":")[0]
        bare_cpu = cost[f"{kind}: FCALL (bare redis-py)"].cpu_us if kind in ("place", "touch") else None
        ratio = f"{measured.cpu_us / bare_cpu:>19.2f}" if bare_cpu else f"{'':>19}"
        to_ping = measured.cpu_us / ping
        print(f"{name:<32} {measured.cpu_us:>8.0f} {measured.wall_us:>8.0f} {ratio} {to_ping:>11.2f}")
        if bare_cpu and name.endswith(("place", "touch")):
            met = met and measured.cpu_us / bare_cpu <= TARGET_CPU_RATIO
    print(
        f"Redis' own time per call, alone: place {redis_us['place']:.1f} µs, "
        f"touch {redis_us['touch']:.1f} µs, PING {redis_us['PING']:.1f} µs"
    )
    print(
        f"one pool's ceiling (one hash slot: one node, one thread): ~{1e6 / redis_us['place']:,.0f} places/s "
        f"or ~{1e6 / redis_us['touch']:,.0f} touches/s of script time alone"
    )
    change = place_us["FCALL"] / place_us["EVALSHA"] - 1
    library_met = change <= TARGET_REDIS_CHANGE
    print(
        f"\nRedis' own time per place, the median of {rounds} interleaved rounds: EVALSHA of the whole "
        f"script (before) {place_us['EVALSHA']:.1f} µs, FCALL of the library's function "
        f"{place_us['FCALL']:.1f} µs: "
        f"{change:+.0%} (target {TARGET_REDIS_CHANGE:+.0%}: {'met' if library_met else 'MISSED'})"
    )
    for command, title in (
        ("EVALSHA", "EVALSHA of the whole script (before)"),
        ("FCALL", "FCALL (the library)"),
    ):
        print(f"\nRedis' own µs of one place (a new session, a free slot), part by part (means), {title}:")
        whole = parts[command]["whole script, its marks' cost taken off"]
        for name, value in parts[command].items():
            print(f"  {name:<52} {value:>7.1f} µs {value / whole:>6.0%}")
    verdict = "met" if met else "MISSED"
    print(f"target: the store's client CPU within {TARGET_CPU_RATIO:g}x the bare FCALL: {verdict}")
    return met and library_met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--evictions", type=int, default=2_000)
    parser.add_argument(
        "--redis-url", help="an existing Redis (default: a fresh redis-server on a free port)"
    )
    parser.add_argument("--clients", type=int, help="throughput mode: this many concurrent clients")
    parser.add_argument("--pools", type=int, default=8, help="throughput mode: pools the clients spread over")
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="client processes")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per throughput phase")
    parser.add_argument("--cost", action="store_true", help="client CPU per operation against bare FCALL")
    parser.add_argument("--calls", type=int, default=2_000, help="cost mode: calls per arm and round")
    parser.add_argument("--rounds", type=int, default=5, help="cost mode: interleaved rounds")
    parser.add_argument("--smoke", action="store_true", help="both tables tiny (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        with RedisServer() as server:
            report(asyncio.run(run(server.url, 4, 50, 10)), 4, 50)
        print()
        with RedisServer() as server:
            throughput(server.url, server.port, clients=4, pools=2, procs=1, duration_s=0.5)
        return
    if args.cost:
        with RedisServer() as server:
            asyncio.run(client_cost(server.url, args.calls, args.rounds))
        return
    if args.clients:
        with RedisServer() as server:
            throughput(server.url, server.port, args.clients, args.pools, args.procs, args.duration)
        return
    if args.redis_url:
        results = asyncio.run(run(args.redis_url, args.pods, args.sessions, args.evictions))
    else:
        with RedisServer() as server:
            results = asyncio.run(run(server.url, args.pods, args.sessions, args.evictions))
    report(results, args.pods, args.sessions)


if __name__ == "__main__":
    main()
