"""What a worker's tick reads of its session's record from Redis (issue 41 item 2), before and after.

Before, every tick read the whole record (`HGETALL`), the session's conditioning image (PNG/JPEG, up to 1 MiB)
included, and decoded the image again; now a tick reads the record's fields but the image (`HMGET` of
`SESSION_FIELDS_BUT_IMAGE`) and the image is read once per session on its pod (`HGET`). A real `redis-server`,
one session placed as the operator places it with an image of each size; each read is done `--reads` times
alternately, and the bytes Redis sent for them are taken from its own `INFO stats` (`total_net_output_bytes`),
so they are the reply's bytes on the wire. Prints a table of bytes and microseconds per read and the ratio.

    .venv/bin/python benchmarks/tick_reads.py [--reads 200]

`--smoke`: 10 reads, the image sizes 0 and 64 KiB (tests/kv/test_tick_reads_benchmark.py).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time
from collections.abc import Awaitable, Callable

import numpy as np
import redis.asyncio as aioredis

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import MAX_IMAGE_BYTES, PoolId, SessionSpec

POOL = PoolId("bench", "tick-reads")
TOKEN = hashlib.sha256(b"bench").hexdigest()
PROMPT = "camera moving forward through a forest at dawn, mist between the trees"
IMAGE_SIZES = (0, 64 << 10, MAX_IMAGE_BYTES)


async def measure(url: str, image_bytes: int, reads: int) -> dict[str, tuple[float, float]]:
    """Bytes and microseconds per read of the session's record each way (the median of `reads`)."""
    store = PlacementStore.from_url(url)
    info = aioredis.from_url(url)
    try:
        registration = await store.register_pod(
            POOL, "w-0", capacity=8, endpoint="http://w-0:8000", lease_ms=3_600_000
        )
        assert registration.epoch > 0
        name = f"s-{image_bytes}"
        image = np.random.default_rng(image_bytes).bytes(image_bytes)  # the size is what matters
        await store.place(POOL, SessionSpec(name, TOKEN, seed=1, prompt=PROMPT, image=image))
        ways: dict[str, Callable[[], Awaitable[object]]] = {
            "HGETALL (before)": lambda: store.get_session(POOL, name),
            "HMGET (after)": lambda: store.get_session(POOL, name, image=False),
        }
        sent = dict.fromkeys(ways, 0)
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(reads):
            for way, read in ways.items():
                before = int((await info.info("stats"))["total_net_output_bytes"])
                started = time.perf_counter()
                record = await read()
                times[way].append(time.perf_counter() - started)
                assert record is not None
                after = int((await info.info("stats"))["total_net_output_bytes"])
                sent[way] += after - before
        # The INFO reply itself is counted in each delta; an empty read's bytes measured alike cancel it.
        overhead = await _info_overhead(info, reads)
        return {way: (sent[way] / reads - overhead, statistics.median(times[way]) * 1e6) for way in ways}
    finally:
        await store.close()
        await info.aclose()


async def _info_overhead(info: aioredis.Redis, reads: int) -> float:
    """Bytes `INFO stats` adds to a delta between two of its calls (its own reply), per call."""
    total = 0
    for _ in range(reads):
        before = int((await info.info("stats"))["total_net_output_bytes"])
        after = int((await info.info("stats"))["total_net_output_bytes"])
        total += after - before
    return total / reads


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    reads, sizes = (10, IMAGE_SIZES[:2]) if args.smoke else (args.reads, IMAGE_SIZES)
    print(f"a tick's read of its session record, {reads} reads each way, alternating; bytes Redis sent")
    print(f"{'image bytes':>12} {'read':<18} {'bytes/read':>12} {'p50 us':>9} {'bytes ratio':>12}")
    print("-" * 67)
    with RedisServer() as server:
        for size in sizes:
            measured = asyncio.run(measure(server.url, size, reads))
            baseline = measured["HGETALL (before)"][0]
            for way, (sent, p50_us) in measured.items():
                ratio = sent / baseline if baseline > 0 else float("nan")
                print(f"{size:>12,} {way:<18} {sent:>12,.0f} {p50_us:>9.1f} {ratio:>11.3f}x")


if __name__ == "__main__":
    main()
