"""Redis Sentinel failover under a stream of placements (issue 14 item 3): kill -9 the master while several
placers place (evicting when the pool is full) and release, and worker-like clients touch, each through its
own `PlacementStore` on a `redis+sentinel://` URL; 3 Sentinels, a master and a replica.

Measured per run: the unavailability window (kill -> first place that succeeds), the acknowledged writes
lost at the failover (placements whose record is gone, releases undone, evictions undone), the writes
reported instead (`NotReplicated`), and place latency before the kill, with and without `wait_replicas`.
The old master comes back as a replica of the new one (as Kubernetes restarts its Pod) so that WAIT can be
satisfied again. `tests/kv/test_placement_failover.py` runs `run_failover` once per mode,
`benchmarks/failover.py` several times with the latency of each write.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import TypeVar

from redis.exceptions import BusyLoadingError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ardiff.devcluster.redis_server import SentinelGroup
from ardiff.kv.errors import NotReplicated, SessionNotHere, UnknownSession
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState

POOL = PoolId("failover", "gpu")
TOKEN = hashlib.sha256(b"failover").hexdigest()
PODS, CAPACITY, LEASE_MS = 4, 6, 600_000
# What a client sees while there is no master: retried, never an answer.
T = TypeVar("T")
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, BusyLoadingError, OSError)


@dataclass
class Ledger:
    """What the clients were told (acknowledged) and what they were refused or warned about."""

    placed: dict[str, tuple[str, int]] = field(default_factory=dict)  # session -> (pod, epoch)
    released: set[str] = field(default_factory=set)
    evicted: set[str] = field(default_factory=set)
    not_replicated: list[tuple[str, str]] = field(default_factory=list)  # (operation, session)
    unavailable: int = 0
    touches: int = 0
    place_latencies_s: list[float] = field(default_factory=list)
    first_place_after_kill: float | None = None
    killed_at: float | None = None


@dataclass(frozen=True)
class FailoverRun:
    wait_replicas: int
    acked_placements: int
    acked_releases: int
    acked_evictions: int
    lost: list[str]  # acknowledged writes the new master does not have
    lost_reported: list[str]  # the lost placements a worker's touch answers with UnknownSession
    not_replicated: int
    unavailable_calls: int
    touches: int
    window_s: float  # kill -> first successful place
    place_p50_us: float
    place_p99_us: float
    violations: list[str]


def spec(name: str) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, prompt=f"the world of {name}")


async def placer(url: str, wait_replicas: int, index: int, ledger: Ledger, stop: asyncio.Event) -> None:
    rng = random.Random(index)
    mine: list[str] = []
    async with PlacementStore.from_url(url, wait_replicas=wait_replicas) as store:
        for n in range(1_000_000):
            if stop.is_set():
                return
            name = f"p{index}-{n}"
            release = mine and rng.random() < 0.25
            target = rng.choice(mine) if release else name
            try:
                start = time.monotonic()
                if release:
                    await store.release(POOL, target, reason="closed")
                    ledger.released.add(target)
                    mine.remove(target)
                    continue
                result = await store.place(POOL, spec(name), may_evict=True)
                done = time.monotonic()
                if ledger.killed_at is None:
                    ledger.place_latencies_s.append(done - start)
                elif start > ledger.killed_at and ledger.first_place_after_kill is None:
                    ledger.first_place_after_kill = done  # sent after the master died
                if result.placement is not None:
                    ledger.placed[name] = (result.placement.pod, result.placement.pod_epoch)
                    mine.append(name)
                if result.victim:
                    ledger.evicted.add(result.victim)
            except NotReplicated as exc:  # applied, reported: not acknowledged
                ledger.not_replicated.append((exc.operation, target))
            except UNAVAILABLE:
                ledger.unavailable += 1
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.002)


async def worker(url: str, pod: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """Ticks every session the placers were told is on this pod (the worker learns it from Redis)."""
    async with PlacementStore.from_url(url) as store:
        while not stop.is_set():
            mine = [(s, e) for s, (p, e) in list(ledger.placed.items()) if p == pod][-CAPACITY:]
            for session, epoch in mine:
                try:
                    await store.touch(POOL, session, pod=pod, epoch=epoch, chunk_index=1)
                    ledger.touches += 1
                except (SessionNotHere, UnknownSession):
                    pass
                except UNAVAILABLE:
                    ledger.unavailable += 1
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.005)


async def lost_writes(store: PlacementStore, ledger: Ledger) -> tuple[list[str], list[str]]:
    """Acknowledged writes missing from the store; the lost placements a touch reports (UnknownSession)."""
    names = sorted(ledger.placed.keys() | ledger.released | ledger.evicted)
    records = await store.get_sessions(POOL, names)
    lost: list[str] = []
    for name in names:
        record = records.get(name)
        if name in ledger.placed and record is None:
            lost.append(f"placement of {name}")
        elif name in ledger.released and (record is None or record.state is not SessionState.CLOSED):
            lost.append(f"release of {name}")
        elif name in ledger.evicted and (
            record is None or record.state not in (SessionState.EVICTED, SessionState.CLOSED)
        ):
            lost.append(f"eviction of {name}")
    reported = []
    for entry in lost:
        name = entry.rsplit(" ", 1)[1]
        if entry.startswith("placement") and name in ledger.placed:
            pod, epoch = ledger.placed[name]
            try:
                await store.touch(POOL, name, pod=pod, epoch=epoch, chunk_index=1)
            except UnknownSession:
                reported.append(name)
    return lost, reported


async def run_failover(
    wait_replicas: int, *, placers: int = 3, before_s: float = 1.0, after_s: float = 1.0
) -> FailoverRun:
    with SentinelGroup(down_after_ms=500, failover_timeout_ms=2000) as group:
        ledger = Ledger()
        async with PlacementStore.from_url(group.url) as store:
            for i in range(PODS):
                await store.register_pod(
                    POOL, f"w-{i}", capacity=CAPACITY, endpoint=f"http://w-{i}:8000", lease_ms=LEASE_MS
                )
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(placer(group.url, wait_replicas, i, ledger, stop)) for i in range(placers)
        ]
        tasks += [asyncio.create_task(worker(group.url, f"w-{i}", ledger, stop)) for i in range(PODS)]
        try:
            await asyncio.sleep(before_s)
            old_master = group.master
            old_master.kill()  # returns once the process is gone
            ledger.killed_at = time.monotonic()
            while ledger.first_place_after_kill is None:
                if any(task.done() for task in tasks):
                    break
                if group.master_port() != old_master.port and old_master.process is None:
                    # Kubernetes restarts the dead Pod; it rejoins as a replica of the promoted one.
                    old_master.replica_of = group.master_port()
                    old_master.start()
                await asyncio.sleep(0.05)
            await asyncio.sleep(after_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        new_master = group.replica if group.master_port() == group.replica.port else old_master
        async with PlacementStore.from_url(new_master.url) as store:
            violations = await store.check_invariants(POOL)
            lost, reported = await lost_writes(store, ledger)
        if ledger.first_place_after_kill is None or ledger.killed_at is None:
            raise RuntimeError("no placement succeeded after the failover")
        latencies = sorted(ledger.place_latencies_s)
        return FailoverRun(
            wait_replicas=wait_replicas,
            acked_placements=len(ledger.placed),
            acked_releases=len(ledger.released),
            acked_evictions=len(ledger.evicted),
            lost=lost,
            lost_reported=reported,
            not_replicated=len(ledger.not_replicated),
            unavailable_calls=ledger.unavailable,
            touches=ledger.touches,
            window_s=ledger.first_place_after_kill - ledger.killed_at,
            place_p50_us=statistics.median(latencies) * 1e6,
            place_p99_us=latencies[int(len(latencies) * 0.99)] * 1e6,
            violations=violations,
        )
