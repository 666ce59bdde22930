"""The realtime video stream (issue 38 item 5): what a chunk costs to encode and send as vllm-omni's
fragmented MP4 against today's per-frame JPEG and WebP stream, and the generation a server-paced stream
spends for a viewer that watches without input against client-paced streams, in the same run.

Encoding (in this process, one thread): the same chunks through vllm-omni's `create_streaming_video_encoder`
(the realtime route's, x264 ultrafast/zerolatency: one stream, one segment per chunk) and the frame stream's
`encode_images` (JPEG, WebP at quality 90, one image per frame). Two sources: the tiny world's frames at 64x64
(a real worker of the trained tiny LingBot-World, ticked over HTTP while its camera turns; `--no-real`
skips it) and the fake runtime's frames at 480x832 (a tinted textured picture, `fake_frames`). Per format:
encode time per 12-frame chunk (p50, p90), bytes per chunk (after the first, whose segment carries the init
segment), and bytes per second per session at `--fps` (chunks of 12 frames), against JPEG's.

Pacing (a worker process of the fake runtime, standalone, its forward `--tick-ms` long: the stand-in for a
GPU forward), one session per arm, each watched for `--watch` seconds by a viewer playing at `--fps` from the
first chunk it receives, pressing nothing:
- `greedy`: the frame stream, the next tick sent as soon as a chunk arrives (a client that asks as fast as
  it is answered: what an unpaced stream, vllm-omni's own, generates);
- `buffered`: the frame stream, ticking only while the viewer holds less than `--buffer-chunks` chunks (the
  viewer page's and `ardiff.player`'s rule, with `buffer_ms`);
- `paced`: the realtime route (vllm-omni's protocol): the worker paces itself.
Per arm, from the worker's metrics: chunks generated, forward seconds (`ardiff_tick_latency_seconds{stage=
"forward"}`) and their share of the watch, against `greedy`'s; the chunks whose playback started (on the
viewer's clock) + bufferChunks, the most a paced stream may make (target: generated <= played + buffer); the
bytes per second received.

    .venv/bin/python benchmarks/realtime.py [--watch 60] [--chunks 30] [--tick-ms 100] [--no-real]
    .venv/bin/python benchmarks/realtime.py --smoke     # < 60 s: fake frames, 3 s per arm (the test's run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import connect

from ardiff.worker.conditioning import Conditioning, seed_image
from ardiff.worker.encoding import encode_images
from ardiff.worker.fake_runtime import fake_frames
from ardiff.worker.tick_rules import parse_tick

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_process import WorkerProcess, metric

FRAMES_PER_CHUNK = 12  # LingBot-World's chunks after the first (9 frames)
FORMATS = ("m4s", "jpeg", "webp")
CAMERA = {"track": "camera", "schema": "lingbot.camera_actions.v1"}
FORWARD = 'ardiff_tick_latency_seconds_sum{stage="forward"}'


def camera(*keys: str) -> list[dict[str, Any]]:
    """A tick's camera: `keys` held for the chunk's 3 latent frames."""
    return [{**CAMERA, "data": {"mode": "frames", "frames": [list(keys)] * 3}}]


def standalone_env(size: int, **settings: str) -> dict[str, str]:
    """A standalone worker (no placement store, no auth) on loopback at `size`x`size`, one torch thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ARDIFF_HOST": "127.0.0.1"}
    env.pop("ARDIFF_REDIS_URL", None)
    return {**env, "ARDIFF_HEIGHT": str(size), "ARDIFF_WIDTH": str(size), **settings}


# ------------------------------------------------------------------------------------------------- encoding


def tiny_world_chunks(count: int, logs: Path) -> list[np.ndarray]:
    """`count` chunks of the trained tiny world at 64x64, its camera turning (j) then walking (w)."""
    worker = WorkerProcess.start(
        "bench-tiny-world", standalone_env(64, ARDIFF_MODEL="tiny-world-trained"), logs
    )
    try:
        worker.wait_ready(300)
        chunks = []
        with httpx.Client(timeout=120) as client:
            for index in range(count):
                body = {"request_id": f"w-{index}", "chunk_index": index, "prompt": "a walk in a small world"}
                body["controls"] = camera("j" if index % 4 < 2 else "w")
                answer = client.post(f"{worker.url}/v1/sessions/world/ticks", json=body)
                answer.raise_for_status()
                shape = tuple(int(n) for n in answer.headers["ardiff-frame-shape"].split(","))
                chunks.append(np.frombuffer(answer.content, dtype=np.uint8).reshape(shape))
        return chunks
    finally:
        worker.stop()


def fake_chunks(count: int, height: int, width: int) -> list[np.ndarray]:
    """`count` chunks of the fake runtime's frames (seed 0), its camera walking."""
    image, conditioning = seed_image(0, height, width), Conditioning(seed=0, prompt="a walk")
    return [
        fake_frames(
            conditioning,
            image,
            parse_tick("s", {"request_id": "r", "chunk_index": i, "controls": camera("w")}),
        )
        for i in range(count)
    ]


@dataclass(frozen=True)
class Encoded:
    source: str
    size: str
    format: str
    encode_ms: list[float]  # per chunk
    chunk_bytes: list[int]  # per chunk


def encode_all(source: str, chunks: list[np.ndarray], fps: float) -> list[Encoded]:
    """Each chunk encoded in each format (m4s: one stream through vllm-omni's encoder)."""
    from ardiff.worker.realtime_messages import STREAM_FORMAT, VIDEO_CODEC_OPTIONS, upstream

    size = f"{chunks[0].shape[1]}x{chunks[0].shape[2]}"
    encoder = upstream().create_encoder(
        output_format=STREAM_FORMAT, fps=fps, video_codec_options=dict(VIDEO_CODEC_OPTIONS)
    )
    coders: dict[str, Callable[[np.ndarray], bytes | list[bytes]]] = {
        "m4s": encoder.encode,
        "jpeg": lambda frames: encode_images(frames, "jpeg"),
        "webp": lambda frames: encode_images(frames, "webp"),
    }
    results = []
    for name, code in coders.items():
        times, sizes = [], []
        for frames in chunks:
            started = time.perf_counter()
            out = code(frames)
            times.append((time.perf_counter() - started) * 1000)
            sizes.append(len(out) if isinstance(out, bytes) else sum(len(image) for image in out))
        results.append(Encoded(source, size, name, times, sizes))
    encoder.close()
    return results


def print_encoding(results: list[Encoded], fps: float) -> None:
    chunks_per_s = fps / FRAMES_PER_CHUNK
    print(
        f"\nencoding: per chunk of 12 frames (the first, with the init segment, left out of bytes); "
        f"bytes/s at {fps:g} fps ({chunks_per_s:.2f} chunks/s)"
    )
    print(
        f"{'source':<11} {'size':>7} {'format':>6} {'encode_ms_p50':>13} {'encode_ms_p90':>13} "
        f"{'bytes_per_chunk':>15} {'bytes_per_s':>11} {'vs_jpeg':>7}"
    )
    for result in results:
        jpeg = next(
            r for r in results if (r.source, r.size, r.format) == (result.source, result.size, "jpeg")
        )
        per_chunk = statistics.median(result.chunk_bytes[1:])
        p50, p90 = statistics.median(result.encode_ms[1:]), float(np.percentile(result.encode_ms[1:], 90))
        print(
            f"{result.source:<11} {result.size:>7} {result.format:>6} {p50:>13.2f} "
            f"{p90:>13.2f} {per_chunk:>15.0f} {per_chunk * chunks_per_s:>11.0f} "
            f"{per_chunk / statistics.median(jpeg.chunk_bytes[1:]):>7.3f}"
        )


# --------------------------------------------------------------------------------------------------- pacing


@dataclass
class Watch:
    """What one arm's viewer received, on its clock: when each chunk arrived and its frames, and the bytes."""

    arrivals: list[tuple[float, int]]
    received_bytes: int = 0

    def played(self, at: float, fps: float) -> int:
        """Chunks whose playback started by `at` (the viewer plays from the first chunk's arrival)."""
        first, frames, started = self.arrivals[0][0], 0, 0
        for _, count in self.arrivals:
            if first + frames / fps > at:
                break
            started += 1
            frames += count
        return started


async def frame_stream(
    url: str, session: str, watch_s: float, fps: float, buffer_chunks: int | None
) -> Watch:
    """The frame stream, one tick in flight: at once (`buffer_chunks` None: greedy) or while the viewer holds
    less than `buffer_chunks` chunks of play."""
    watch, index, frames_received = Watch([]), 0, 0
    async with connect(f"{url}/v1/sessions/{session}/stream?format=jpeg", max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "ready"
        started = time.monotonic()
        while time.monotonic() - started < watch_s:
            now = time.monotonic()
            held = (
                0.0 if not watch.arrivals else max(0.0, frames_received / fps - (now - watch.arrivals[0][0]))
            )
            if (
                buffer_chunks is not None
                and watch.arrivals
                and held >= buffer_chunks * FRAMES_PER_CHUNK / fps
            ):
                await asyncio.sleep(0.005)
                continue
            tick = {
                "type": "tick",
                "request_id": f"{session}-{index}",
                "chunk_index": index,
                "prompt": "a walk",
                "controls": camera(),
            }
            if buffer_chunks is not None:
                tick["buffer_ms"] = round(held * 1000)
            await ws.send(json.dumps(tick))
            chunk = json.loads(await ws.recv())
            assert chunk["type"] == "chunk", chunk
            for _ in range(chunk["frames"]):
                watch.received_bytes += len(await ws.recv())
            watch.arrivals.append((time.monotonic(), chunk["frames"]))
            frames_received += chunk["frames"]
            index += 1
    return watch


async def paced_stream(url: str, session: str, watch_s: float) -> Watch:
    """vllm-omni's realtime protocol: start, read the chunks the worker sends, stop."""
    watch = Watch([])
    async with connect(f"{url}/v1/realtime/video?session={session}", max_size=None, open_timeout=300) as ws:
        await ws.send(json.dumps({"type": "session.start", "prompt": "a walk", "format": "m4s"}))
        start = json.loads(await asyncio.wait_for(ws.recv(), 300))  # a fake runtime imports vllm-omni first
        assert start["type"] == "video.start", start
        started = None
        while started is None or time.monotonic() - started < watch_s:
            metadata = json.loads(await ws.recv())
            assert metadata["type"] == "video.chunk_metadata", metadata
            watch.received_bytes += len(await ws.recv())
            watch.arrivals.append((time.monotonic(), metadata["num_frames"]))
            started = started or time.monotonic()
        await ws.send(json.dumps({"type": "session.stop"}))
        frames = 0
        async for message in ws:  # the chunk in flight, then session.done
            if isinstance(message, bytes):
                watch.received_bytes += len(message)
                watch.arrivals.append((time.monotonic(), frames))
            elif (value := json.loads(message))["type"] == "session.done":
                break
            else:
                frames = value["num_frames"]
    return watch


def pacing_worker(args: argparse.Namespace, logs: Path) -> WorkerProcess:
    """The pacing arms' worker, started now; `warm_up` makes it ready to stream."""
    settings = {
        "ARDIFF_RUNTIME": "fake",
        "ARDIFF_FAKE_TICK_SECONDS": str(args.tick_ms / 1000),
        "ARDIFF_PLAYOUT_FPS": str(args.fps),
        "ARDIFF_PLAYOUT_BUFFER_CHUNKS": str(args.buffer_chunks),
    }
    return WorkerProcess.start("bench-pacing", standalone_env(args.size, **settings), logs)


def warm_up(worker: WorkerProcess) -> threading.Thread:
    """In the background: the worker ready, and its first realtime stream (a fake runtime imports vllm-omni's
    pieces then, ~20 s) done, while this process encodes."""

    def run() -> None:
        worker.wait_ready(120)
        asyncio.run(paced_stream(ws_url(worker), "warm-up", 0.1))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def ws_url(worker: WorkerProcess) -> str:
    return worker.url.replace("http://", "ws://")


def measure_pacing(worker: WorkerProcess, args: argparse.Namespace) -> list[dict[str, Any]]:
    url, rows = ws_url(worker), []
    arms = {
        "greedy": lambda session: frame_stream(url, session, args.watch, args.fps, None),
        "buffered": lambda session: frame_stream(url, session, args.watch, args.fps, args.buffer_chunks),
        "paced": lambda session: paced_stream(url, session, args.watch),
    }
    for name, arm in arms.items():
        before = {sample: metric(worker.url, sample) for sample in ("ardiff_ticks_total", FORWARD)}
        watch = asyncio.run(arm(f"watch-{name}"))
        after = {sample: metric(worker.url, sample) for sample in before}
        seconds = watch.arrivals[-1][0] - watch.arrivals[0][0]
        rows.append(
            {
                "arm": name,
                "watch_s": seconds,
                "generated": int(after["ardiff_ticks_total"] - before["ardiff_ticks_total"]),
                "played": watch.played(watch.arrivals[-1][0], args.fps),
                "forward_s": after[FORWARD] - before[FORWARD],
                "bytes_per_s": watch.received_bytes / seconds,
            }
        )
    return rows


def print_pacing(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    greedy = next(row for row in rows if row["arm"] == "greedy")
    print(
        f"\npacing: a viewer watching ~{args.watch:g} s without input at {args.fps:g} fps, "
        f"{args.buffer_chunks} chunks buffered; fake runtime {args.size}x{args.size}, "
        f"forward {args.tick_ms:g} ms"
    )
    print(
        f"{'arm':<9} {'watch_s':>7} {'generated':>9} {'played+buffer':>13} {'within':>6} {'forward_s':>9} "
        f"{'forward_share':>13} {'vs_greedy':>9} {'bytes_per_s':>11}"
    )
    for row in rows:
        bound = row["played"] + args.buffer_chunks
        print(
            f"{row['arm']:<9} {row['watch_s']:>7.1f} {row['generated']:>9} {bound:>13} "
            f"{'yes' if row['generated'] <= bound else 'no':>6} {row['forward_s']:>9.2f} "
            f"{row['forward_s'] / row['watch_s']:>13.3f} {row['forward_s'] / greedy['forward_s']:>9.3f} "
            f"{row['bytes_per_s']:>11.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=30, help="chunks per encoding source")
    parser.add_argument("--watch", type=float, default=60.0, help="seconds each pacing arm is watched")
    parser.add_argument("--fps", type=float, default=16.0, help="the sessions' playout rate")
    parser.add_argument("--buffer-chunks", type=int, default=2)
    parser.add_argument("--tick-ms", type=float, default=100.0, help="the fake runtime's forward time")
    parser.add_argument("--size", type=int, default=64, help="the pacing worker's frame size")
    parser.add_argument("--no-real", action="store_true", help="no tiny-world worker: fake frames at 64x64")
    parser.add_argument(
        "--smoke", action="store_true", help="fake frames, 4 chunks, 3 s per arm (the test's)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.chunks, args.watch, args.no_real, args.tick_ms = 4, 3.0, True, 20.0
    if args.chunks < 2 or args.watch <= 0:
        parser.error("--chunks must be >= 2 and --watch positive")
    logs = Path(tempfile.mkdtemp(prefix="ardiff-bench-realtime-"))
    small = fake_chunks(args.chunks, 64, 64) if args.no_real else tiny_world_chunks(args.chunks, logs)
    worker = pacing_worker(args, logs)
    try:
        warming = warm_up(worker)
        encoded = encode_all("fake" if args.no_real else "tiny-world", small, args.fps)
        encoded += encode_all("fake", fake_chunks(args.chunks, 480, 832), args.fps)
        warming.join()
        rows = measure_pacing(worker, args)
    finally:
        worker.stop()
    print_encoding(encoded, args.fps)
    print_pacing(rows, args)
    paced = next(row for row in rows if row["arm"] == "paced")
    if paced["generated"] > paced["played"] + args.buffer_chunks:
        sys.exit("the paced stream generated more than played + bufferChunks")


if __name__ == "__main__":
    main()
