"""Session continuity (issue 12 item 7): export, import and shared-tier transfer time against the export's
size, and the first tick after a resume against the first tick after a reset.

For each resolution a child process loads the tiny LingBot-World model (the real vllm-omni runner, paged KV,
streaming decoder), ticks one session until its KV window is full (9 chunks), then exports it at that tick
boundary into memory `--repeats` times (read-only: every export is the same bytes) and imports it as often
(each import closed again, the close not timed). The export carries the worker's book with its cached chunk.
Sizes are split by what they hold (docs/contracts.md §9). Then the host tier (`HostTier`: the export kept
in the worker's memory and imported back from it), and the transfer path the worker uses: the
export written into the shared tier (`SharedTier.write`: a `.part` file, fsync, rename), read back and
imported from it, as bytes/s; and, in the same process, the tick that continues the resumed session (chunk 9)
against a reset session's first tick (chunk 0: prompt and image encoded again, the KV empty). Last, the
extrapolation to a LingBot-World 480x832 bf16 session: its self-attention KV from the capacity planner
(`lingbot-world-480x832`, pages per session x page bytes) divided by the self-KV share of the measured
export, moved at the measured tier bytes/s and at 100 Gb/s.

Then the pod-to-pod transfer (issue 12 item 3): a migration between two real worker processes per
`--migrations` resolution (Redis, a shared tier, the transfer token): the pulled bytes/s (pull and import into
the runner) and the stall of the client's next tick, in ticks. The transfer code alone, at sizes that matter,
per side: benchmarks/transfer.py.

    .venv/bin/python benchmarks/continuity.py [--resolutions 64 128] [--repeats 20] [--threads 1]
        [--migrations 64 128] [--smoke]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from worker_process import CAMERA, WorkerProcess, metric, pool_worker_env

RESULT_MARKER = "ARDIFF-CONTINUITY-RESULT "
CHUNKS = 9  # sink (3) + window (6) latent frames: the largest a session's KV gets
GROUPS = {"kv/": "self KV", "cross/": "cross KV", "pipe/": "pipeline", "dec/": "decoder", "book/": "book"}


def measure(size: int, repeats: int, model_cache: str) -> dict[str, Any]:
    from ardiff.worker import tick_rules
    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.host_tier import HostTier
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.session_book import CachedChunk, SessionBook
    from ardiff.worker.session_export import ITEM_SIZES, ExportReader
    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.shared_tier import SharedTier
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    runtime = load_vllm_runtime(WorkerSettings(height=size, width=size, model_cache=model_cache))
    conditioning = Conditioning(seed=1234, prompt="camera moving forward through a forest")

    def tick(session: str, chunk: int) -> Any:
        body = {"request_id": f"{session}-{chunk}", "chunk_index": chunk, "controls": [CAMERA]}
        return run_tick(runtime, runtime.ticks.prepare(tick_rules.parse_tick(session, body), conditioning))

    book = SessionBook("a")
    for chunk in range(CHUNKS):
        output = tick("a", chunk)
        book = book.advanced(CachedChunk(f"a-{chunk}", chunk, output.frames, output.metadata))
    runtime.export_session("a", io.BytesIO(), book=book)  # the weights fingerprint is computed once, here
    exports, blob = [], b""
    for _ in range(repeats):
        out = io.BytesIO()
        started = time.perf_counter()
        runtime.export_session("a", out, book=book)
        exports.append(time.perf_counter() - started)
        blob = out.getvalue()
    runtime.close("a")
    imports = []
    for _ in range(repeats):
        started = time.perf_counter()
        runtime.import_session(io.BytesIO(blob))
        imports.append(time.perf_counter() - started)
        runtime.close("a")
    # The host tier: the export kept in the worker's memory (pieces of 1 MiB) and imported back from it.
    runtime.import_session(io.BytesIO(blob))
    host, host_writes, host_reads = HostTier(4 * len(blob), "bench"), [], []
    for _ in range(repeats):
        started = time.perf_counter()
        location, _ = host.write("a", lambda out: runtime.export_session("a", out, book=book))
        host_writes.append(time.perf_counter() - started)
        runtime.close("a")
        started = time.perf_counter()
        runtime.import_session(host.get(location).reader())
        host_reads.append(time.perf_counter() - started)
        host.remove(location)
    # The worker's transfer path: into the shared tier (fsync, rename) and back.
    writes, reads, resumed_ticks, reset_ticks = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="ardiff-tier-") as root:
        tier = SharedTier(root, "bench", "pool")
        for _ in range(repeats):
            started = time.perf_counter()
            location, _ = tier.write("a", "suspend", lambda out: runtime.export_session("a", out, book=book))
            writes.append(time.perf_counter() - started)
            runtime.close("a")
            started = time.perf_counter()
            with tier.open(location) as source:
                runtime.import_session(source)
            reads.append(time.perf_counter() - started)
            tier.remove(location)
            # The first tick after a resume continues at chunk 9; after a reset it is chunk 0 of a new world.
            started = time.perf_counter()
            tick("a", CHUNKS)
            resumed_ticks.append(time.perf_counter() - started)
            runtime.close("a")
            started = time.perf_counter()  # alone, as the runner holds one session at this budget
            tick("fresh", 0)
            reset_ticks.append(time.perf_counter() - started)
            runtime.close("fresh")
            runtime.import_session(io.BytesIO(blob))
    runtime.close("a")
    groups: dict[str, int] = {}
    for name, (dtype, shape) in ExportReader(io.BytesIO(blob)).tensor_shapes().items():
        group = next(label for prefix, label in GROUPS.items() if name.startswith(prefix))
        groups[group] = groups.get(group, 0) + math.prod(shape) * ITEM_SIZES[dtype]
    runtime.shutdown()
    return {
        "size": size,
        "bytes": len(blob),
        "groups": groups,
        "export_ms": 1000 * statistics.median(exports),
        "import_ms": 1000 * statistics.median(imports),
        "host_write_ms": 1000 * statistics.median(host_writes),
        "host_read_import_ms": 1000 * statistics.median(host_reads),
        "tier_write_ms": 1000 * statistics.median(writes),
        "tier_read_import_ms": 1000 * statistics.median(reads),
        "first_tick_after_resume_ms": 1000 * statistics.median(resumed_ticks),
        "first_tick_after_reset_ms": 1000 * statistics.median(reset_ticks),
        "repeats": repeats,
    }


def run_child(size: int, args: argparse.Namespace, model_cache: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, __file__, "--child", str(size), "--repeats", str(args.repeats)]
    out = subprocess.run([*command, "--model-cache", model_cache], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the {size}x{size} run failed:\n{out.stderr[-4000:]}")
    line = next(line for line in reversed(out.stdout.splitlines()) if RESULT_MARKER in line)
    return json.loads(line.split(RESULT_MARKER, 1)[1])


def print_table(results: list[dict[str, Any]], threads: int) -> None:
    print(
        f"tiny LingBot-World, CPU fp32, torch threads={threads}; one session after {CHUNKS} chunks; medians"
    )
    labels = list(GROUPS.values())
    header = f"{'size':>7} {'bytes':>11} {'export ms':>10} {'import ms':>10} " + " ".join(
        f"{label:>10}" for label in labels
    )
    print(header)
    print("-" * len(header))
    for r in results:
        split = " ".join(f"{r['groups'].get(label, 0):>10}" for label in labels)
        print(f"{r['size']:>4}^2  {r['bytes']:>11} {r['export_ms']:>10.2f} {r['import_ms']:>10.2f} {split}")
    print(
        "\nthrough the tiers: the host tier (the worker's memory, 1 MiB pieces) and the shared tier (a local "
        "directory here: write + fsync + rename; read + import); ratio: shared / host"
    )
    header = (
        f"{'size':>7} {'host write ms':>14} {'host read+import ms':>20} {'tier write ms':>14} "
        f"{'write MB/s':>11} {'read+import ms':>15} {'read MB/s':>10} {'ratio w/r':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        mb = r["bytes"] / 1e6
        write_ratio = r["tier_write_ms"] / r["host_write_ms"]
        ratios = f"{write_ratio:.2f}/{r['tier_read_import_ms'] / r['host_read_import_ms']:.2f}"
        print(
            f"{r['size']:>4}^2  {r['host_write_ms']:>14.2f} {r['host_read_import_ms']:>20.2f} "
            f"{r['tier_write_ms']:>14.2f} {mb / r['tier_write_ms'] * 1000:>11.0f} "
            f"{r['tier_read_import_ms']:>15.2f} {mb / r['tier_read_import_ms'] * 1000:>10.0f} {ratios:>10}"
        )
    print("\nthe first tick of a resumed session (chunk 9) against a reset one's (chunk 0)")
    header = f"{'size':>7} {'tick after resume ms':>21} {'tick after reset ms':>20} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r["first_tick_after_resume_ms"] / r["first_tick_after_reset_ms"]
        print(
            f"{r['size']:>4}^2  {r['first_tick_after_resume_ms']:>21.1f} "
            f"{r['first_tick_after_reset_ms']:>20.1f} {ratio:>6.2f}"
        )


def print_extrapolation(results: list[dict[str, Any]]) -> None:
    """A LingBot-World 480x832 bf16 session: the state the planner counts per session (KV pages, cross-
    attention, model-owned state), moved at the measured tier rates and at 100 Gb/s."""
    from ardiff.kv.pod_plan import plan_for_pool
    from ardiff.kv.presets import get_preset

    plan = plan_for_pool(
        get_preset("lingbot-world-480x832"),
        device_memory_bytes=141 << 30,
        gpu_memory_fraction=0.9,
        pool_session_capacity=None,
    )
    footprint = plan.kv.footprint
    total = footprint.bytes_per_session
    self_kv = footprint.pages_per_session * footprint.page_bytes
    largest = max(results, key=lambda r: r["size"])
    write = largest["bytes"] / largest["tier_write_ms"] * 1000
    read = largest["bytes"] / largest["tier_read_import_ms"] * 1000
    print(
        f"\nLingBot-World 480x832 bf16: {total / 1e9:.1f} GB per session (planner: self KV "
        f"{self_kv / 1e9:.1f} GB, {self_kv / total:.0%}); at the {largest['size']}^2 tier rates "
        f"{total / write:.0f} s to write and {total / read:.0f} s to read+import; "
        f"{total * 8 / 100e9:.1f} s over 100 Gb/s"
    )


# ------------------------------------------------------------------------------ pod-to-pod transfer (item 3)


def measure_migration(
    size: int, redis_url: str, args: argparse.Namespace, model_cache: str
) -> dict[str, Any]:
    """Two real workers (the vllm-omni runner, the tiny model at `size`) in one pool with a shared tier and a
    transfer token. A client ticks a session on A for CHUNKS chunks; then the operator's part of a migration
    (suspend with reason migrate; once suspended, placed with A drained, as a round would at once) while the
    client sends its next tick, which follows 503 `resuming` and 421 to B. The stall is that tick's latency
    over a median tick; the transfer's bytes/s is B's (the pull and the import into its runner)."""
    import asyncio
    import secrets
    import threading

    from ardiff import client as ardiff_client
    from ardiff.kv.placement import PlacementStore
    from ardiff.kv.records import PoolId, SessionSpec, SessionState, token_sha256

    pool = PoolId("bench", f"mig-{size}")
    token, session = "bench-token", f"walk-{size}"
    with tempfile.TemporaryDirectory(prefix="ardiff-bench-mig-") as workdir:
        env = pool_worker_env(
            redis_url,
            pool,
            size=size,
            threads=args.threads,
            ARDIFF_MODEL_CACHE=model_cache,
            ARDIFF_SUSPEND_DIR=str(Path(workdir) / "tier"),
            ARDIFF_TRANSFER_TOKEN=secrets.token_urlsafe(32),
        )
        workers = [WorkerProcess.start(pod, env, Path(workdir)) for pod in ("a", "b")]
        try:
            for worker in workers:
                worker.wait_ready(600)
            url_a, url_b = (worker.url for worker in workers)

            async def store_call(call: Any) -> Any:
                async with PlacementStore.from_url(redis_url) as store:
                    return await call(store)

            async def place_on_a(store: PlacementStore) -> None:
                await store.set_draining(pool, "b", draining=True)
                spec = SessionSpec(name=session, token_sha256=token_sha256(token), prompt="a walk", seed=7)
                assert (await store.place(pool, spec)).placement.pod == "a"
                await store.set_draining(pool, "b", draining=False)

            asyncio.run(store_call(place_on_a))
            with ardiff_client.SessionClient(session, url_a, token) as walker:
                latencies = [walker.tick([CAMERA]).latency_s for _ in range(CHUNKS)]

                async def suspend(store: PlacementStore) -> None:
                    assert await store.suspend(pool, session, reason="migrate")

                async def operator(store: PlacementStore) -> float:
                    while (await store.get_session(pool, session)).state is not SessionState.SUSPENDED:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
                    exported = time.perf_counter() - started  # from the suspend call
                    await store.set_draining(pool, "a", draining=True)
                    assert (
                        await store.place(pool, (await store.get_session(pool, session)).spec())
                    ).placement
                    return exported

                exported: list[float] = []
                started = time.perf_counter()  # the stall and the export are timed from here
                asyncio.run(store_call(suspend))  # the round's suspend; the client ticks on meanwhile
                mover = threading.Thread(target=lambda: exported.append(asyncio.run(store_call(operator))))
                mover.start()
                moved = walker.tick([CAMERA])
                stalled = time.perf_counter() - started
                mover.join()
                after = [walker.tick([CAMERA]).latency_s for _ in range(3)]
            assert moved.endpoint.rstrip("/") == url_b, (moved.endpoint, url_b)
            assert moved.metadata.chunk_index == CHUNKS
            pulled = metric(url_b, 'ardiff_session_transfer_bytes_total{direction="in"}')
            seconds = metric(url_b, 'ardiff_session_transfer_seconds_sum{direction="in"}')
            tick = statistics.median(latencies[1:] + after)
            return {
                "size": size,
                "bytes": int(pulled),
                "transfer_s": seconds,
                "sent_s": metric(url_a, 'ardiff_session_transfer_seconds_sum{direction="out"}'),
                "export_to_tier_s": exported[0],
                "tick_s": tick,
                "migrated_tick_s": stalled,
                "direct": metric(url_b, 'ardiff_session_resumes_total{source="direct"}') == 1,
            }
        finally:
            for worker in workers:
                worker.stop()


def print_transfer(migrations: list[dict[str, Any]]) -> None:
    if not migrations:
        return
    print(
        "\nmigration between two real workers on loopback (pull + import into B's runner; the client's "
        "next tick)"
    )
    header = (
        f"{'size':>7} {'bytes':>10} {'direct':>6} {'pull ms':>8} {'MB/s':>6} {'tier write ms':>14} "
        f"{'tick ms':>8} {'migrated tick ms':>17} {'stall ticks':>12}"
    )
    print(header)
    print("-" * len(header))
    for m in migrations:
        rate = m["bytes"] / m["transfer_s"] / 1e6 if m["transfer_s"] else 0.0
        stall = (m["migrated_tick_s"] - m["tick_s"]) / m["tick_s"]
        print(
            f"{m['size']:>4}^2  {m['bytes']:>10} {'yes' if m['direct'] else 'no':>6} "
            f"{m['transfer_s'] * 1000:>8.1f} {rate:>6.0f} {m['export_to_tier_s'] * 1000:>14.1f} "
            f"{m['tick_s'] * 1000:>8.0f} {m['migrated_tick_s'] * 1000:>17.0f} {stall:>12.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=20, help="exports and imports measured per resolution")
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the measured process")
    parser.add_argument(
        "--model-cache", default=None, help="where the tiny model is generated (default: temp)"
    )
    parser.add_argument(
        "--migrations",
        type=int,
        nargs="*",
        default=[64, 128],
        help="resolutions of the two-worker migration (pod-to-pod transfer and stall); none to skip",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="64x64, two repeats, a 32 MiB synthetic transfer, no migration (the test's run)",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.resolutions, args.repeats, args.migrations = [64], 2, []
    if args.child is not None:
        print(RESULT_MARKER + json.dumps(measure(args.child, args.repeats, args.model_cache)), flush=True)
        return
    model_cache = args.model_cache or str(Path(tempfile.gettempdir()) / "ardiff-bench-models")
    results = [run_child(size, args, model_cache) for size in args.resolutions]
    print_table(results, args.threads)
    migrations = []
    if args.migrations:
        from ardiff.devcluster.redis_server import RedisServer

        with RedisServer() as redis:
            migrations = [measure_migration(size, redis.url, args, model_cache) for size in args.migrations]
    print_transfer(migrations)
    print_extrapolation(results)


if __name__ == "__main__":
    main()
