"""Forks (issue 26): a fork's latency to its first chunk on its parent's pod and on another pod, against a
fresh session's first chunk in the same run, and the bytes a kept chunk and a fork cost.

Two real worker processes, A and B (the vllm-omni runner, the tiny LingBot-World at each `--resolutions` size,
one torch thread each; real Redis, the pool's transfer token), in one pool; the benchmark plays the operator
with the placement store's own calls. A parent session with `history_keep_chunks = --keep` is placed on A and
ticked `--chunks` chunks (A keeps its state at each boundary). Then, `--repeats` times, each arm is placed and
ticked once, timed from the `place` call to its first chunk in the client's hands:

- `fresh`: a new session (the parent's prompt and seed) on A: chunk 0, prompt and image encoded, KV empty;
- `fork-same-pod`: a fork at the parent's latest kept chunk, preferring A: A imports it from its own memory;
- `fork-other-pod`: the same fork preferring B: B pulls the kept chunk from A (`GET /internal/v1/kept/...`)
  and imports it.

Each arm's session is released after its tick (its slot freed before the next arm). The forks' first chunks
are checked bit-identical to each other and to the parent's own next chunk with the same controls (the
parent, untouched, ticks it last). Bytes: A's history memory per kept chunk (`ardiff_worker_history_bytes` /
chunks kept), and what B pulled per other-pod fork (`ardiff_session_transfer_bytes_total{direction="in"}`);
a fork on the parent's pod holds the parent's KV blocks (worker/block_share.py): the blocks each arm took on
its pod by its first chunk (`ardiff_kv_free_blocks` before and after) and those shared then
(`ardiff_kv_shared_blocks`) are reported beside the full copy the other-pod fork made. `--smoke`: one 64x64
run, one repeat, 2 chunks (the test's).

    .venv/bin/python benchmarks/fork.py [--resolutions 64 128] [--repeats 5] [--chunks 4] [--keep 4]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from worker_process import CAMERA, WorkerProcess, metric, pool_worker_env

ARMS = ("fresh", "fork-same-pod", "fork-other-pod")
PROMPT, SEED = "a walk through a quiet village", 7


def worker_sessions(url: str, transfer_token: str) -> set[str]:
    """The sessions a worker holds (its `GET /v1/sessions`, for the pool's transfer token)."""
    import httpx

    listing = httpx.get(
        f"{url}/v1/sessions", headers={"Authorization": f"Bearer {transfer_token}"}, timeout=10
    )
    return {s["session_id"] for s in listing.json()["sessions"]}


def measure_forks(size: int, redis_url: str, args: argparse.Namespace, model_cache: str) -> dict[str, Any]:
    import numpy as np

    from ardiff import client as ardiff_client
    from ardiff.kv.placement import PlacementStore
    from ardiff.kv.records import PoolId, SessionSpec, kept_location, token_sha256

    pool = PoolId("bench", f"fork-{size}")
    transfer_token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="ardiff-bench-fork-") as workdir:
        env = pool_worker_env(
            redis_url,
            pool,
            size=size,
            threads=args.threads,
            ARDIFF_MODEL_CACHE=model_cache,
            ARDIFF_TRANSFER_TOKEN=transfer_token,
        )
        workers = [WorkerProcess.start(pod, env, Path(workdir)) for pod in ("a", "b")]
        urls = {worker.pod: worker.url for worker in workers}

        def place(spec: SessionSpec, prefer_pod: str) -> str:
            async def call() -> str:
                async with PlacementStore.from_url(redis_url) as store:
                    placement = (await store.place(pool, spec, prefer_pod=prefer_pod)).placement
                    assert placement is not None, f"{spec.name} not placed"
                    return placement.pod

            return asyncio.run(call())

        def release(name: str, pod: str) -> None:
            async def call() -> None:
                async with PlacementStore.from_url(redis_url) as store:
                    await store.release(pool, name, reason="benchmark")

            asyncio.run(call())
            deadline = time.monotonic() + 60
            while name in worker_sessions(urls[pod], transfer_token):  # its slot free in the runner too
                if time.monotonic() > deadline:
                    sys.exit(f"worker {pod} still holds {name} 60 s after its release")
                time.sleep(0.05)

        def spec(name: str, token: str, **fields: Any) -> SessionSpec:
            return SessionSpec(
                name=name, token_sha256=token_sha256(token), prompt=PROMPT, seed=SEED, **fields
            )

        def first_chunk(
            name: str, prefer_pod: str, at: int, **fields: Any
        ) -> tuple[float, str, Any, int, int]:
            """(seconds from the placement to the first chunk, the pod, the chunk, the KV blocks the session
            took on its pod by then, the pod's blocks held by more than one session) of a new session whose
            first chunk is `at`."""
            token = secrets.token_urlsafe(16)
            free_before = metric(urls[prefer_pod], "ardiff_kv_free_blocks")
            started = time.perf_counter()
            pod = place(spec(name, token, **fields), prefer_pod)
            with ardiff_client.SessionClient(name, urls[pod], token, retry_seconds=60) as session:
                session.next_chunk_index = at
                chunk = session.tick([CAMERA])
            latency = time.perf_counter() - started
            taken = int(free_before - metric(urls[pod], "ardiff_kv_free_blocks"))
            shared = int(metric(urls[pod], "ardiff_kv_shared_blocks"))
            release(name, pod)
            return latency, pod, chunk, taken, shared

        try:
            for worker in workers:
                worker.wait_ready(600)
            parent_token = secrets.token_urlsafe(16)
            assert place(spec("parent", parent_token, history_keep_chunks=args.keep), "a") == "a"
            with ardiff_client.SessionClient("parent", urls["a"], parent_token) as parent:
                ticks = [parent.tick([CAMERA]).latency_s for _ in range(args.chunks)]
                at = parent.next_chunk_index
                location = kept_location("a", "parent", at)
                kept = min(args.keep, args.chunks)
                history_bytes = metric(urls["a"], "ardiff_worker_history_bytes")
                pulled_before = metric(urls["b"], 'ardiff_session_transfer_bytes_total{direction="in"}')
                latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
                blocks: dict[str, list[int]] = {arm: [] for arm in ARMS}
                shared: dict[str, list[int]] = {arm: [] for arm in ARMS}
                pods: dict[str, set[str]] = {arm: set() for arm in ARMS}
                fork_frames = []
                for repeat in range(args.repeats):
                    arms = {
                        "fresh": ("a", {}),
                        "fork-same-pod": ("a", {"fork_from": location}),
                        "fork-other-pod": ("b", {"fork_from": location}),
                    }
                    for arm, (prefer, fields) in arms.items():
                        first = 0 if arm == "fresh" else at
                        latency, pod, chunk, taken, held = first_chunk(
                            f"{arm}-{repeat}", prefer, first, **fields
                        )
                        latencies[arm].append(latency)
                        blocks[arm].append(taken)
                        shared[arm].append(held)
                        pods[arm].add(pod)
                        assert chunk.metadata.chunk_index == first, (arm, chunk.metadata)
                        if arm != "fresh":
                            fork_frames.append(chunk.frames)
                pulled = (
                    metric(urls["b"], 'ardiff_session_transfer_bytes_total{direction="in"}') - pulled_before
                )
                own = parent.tick([CAMERA])  # the parent, untouched, goes on at its chunk `at`
            assert own.metadata.chunk_index == at
            identical = all(np.array_equal(frames, own.frames) for frames in fork_frames)
            assert pods == {"fresh": {"a"}, "fork-same-pod": {"a"}, "fork-other-pod": {"b"}}, pods
            return {
                "size": size,
                "at": at,
                "kept": kept,
                "first_chunk_s": {arm: statistics.median(values) for arm, values in latencies.items()},
                "kv_blocks_after_first_chunk": {arm: statistics.median(v) for arm, v in blocks.items()},
                "kv_blocks_shared": {arm: statistics.median(v) for arm, v in shared.items()},
                "bytes_per_kept_chunk": history_bytes / kept,
                "bytes_per_other_pod_fork": pulled / args.repeats,
                "parent_tick_s": statistics.median(ticks[1:] or ticks),
                "identical": identical,
            }
        finally:
            for worker in workers:
                worker.stop()


def print_tables(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nfirst chunk from the placement (median of {args.repeats}; the parent ticked {args.chunks} "
        f"chunks, keeping {args.keep}; one torch thread per worker); kv_blocks: the paged KV blocks the "
        "session took on its pod by its first chunk, shared_blocks: the pod's blocks two sessions held then, "
        "vs_copy: kv_blocks against the fork pulled to the other pod (a full copy)"
    )
    header = (
        f"{'arm':<15} {'size':>5} {'chunk':>6} {'first_chunk_ms':>15} {'vs_fresh':>9} {'kv_blocks':>10} "
        f"{'shared_blocks':>14} {'vs_copy':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        fresh = r["first_chunk_s"]["fresh"]
        copy = r["kv_blocks_after_first_chunk"]["fork-other-pod"] or 1
        for arm in ARMS:
            seconds = r["first_chunk_s"][arm]
            chunk = 0 if arm == "fresh" else r["at"]
            taken = r["kv_blocks_after_first_chunk"][arm]
            print(
                f"{arm:<15} {r['size']:>5} {chunk:>6} {seconds * 1000:>15.1f} {seconds / fresh:>9.2f} "
                f"{taken:>10.0f} {r['kv_blocks_shared'][arm]:>14.0f} {taken / copy:>8.2f}"
            )
    print("\nbytes (kept chunks: full exports in the pod's memory; a fork pulled to another pod moves one)")
    header = (
        f"{'size':>5} {'kept':>5} {'bytes_per_kept_chunk':>21} {'bytes_per_other_pod_fork':>25} "
        f"{'parent_tick_ms':>15} {'forks_identical':>16}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['size']:>5} {r['kept']:>5} {r['bytes_per_kept_chunk']:>21.0f} "
            f"{r['bytes_per_other_pod_fork']:>25.0f} {r['parent_tick_s'] * 1000:>15.1f} "
            f"{'yes' if r['identical'] else 'NO':>16}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64])
    parser.add_argument("--repeats", type=int, default=5, help="placements per arm")
    parser.add_argument("--chunks", type=int, default=4, help="chunks the parent ticks before the forks")
    parser.add_argument("--keep", type=int, default=4, help="the parent's history_keep_chunks")
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads of each worker")
    parser.add_argument(
        "--model-cache", default=None, help="where the tiny model is generated (default: temp)"
    )
    parser.add_argument("--smoke", action="store_true", help="64x64, one repeat, 2 chunks (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.resolutions, args.repeats, args.chunks, args.keep = [64], 1, 2, 2
    if min(args.repeats, args.chunks, args.keep) < 1:
        parser.error("--repeats, --chunks and --keep must be >= 1")
    model_cache = args.model_cache or str(Path(tempfile.gettempdir()) / "ardiff-bench-models")
    from ardiff.devcluster.redis_server import RedisServer

    with RedisServer() as redis:
        results = [measure_forks(size, redis.url, args, model_cache) for size in args.resolutions]
    print_tables(results, args)
    if not all(r["identical"] for r in results):
        sys.exit("a fork's first chunk differs from its parent's")


if __name__ == "__main__":
    main()
