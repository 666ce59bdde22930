"""Tick overhead: a tick over HTTP (uvicorn on loopback, standalone mode) against the same tick in-process.

For each resolution a child process loads the tiny LingBot-World model once (the real vllm-omni runner, paged
KV, streaming decoder) and serves it with the worker app in a background uvicorn thread. The baseline is the
same runtime object called directly: `prepare` (vllm-omni's tick rules, LingBot's pre-process) + `forward`
(one AR block and its decode). Two sessions, one per path, advance in lockstep, alternating in-process and
HTTP ticks, so both see the same KV lengths and the same machine load. The HTTP tick adds what a client pays:
JSON and validation, admission and ordering checks, the forward queue, the raw-frame body and loopback HTTP.
Target (DESIGN §8): overhead <= 5% of the tick at 64x64.

`--family dreamzero` measures the robot tick the same way (issue 15): the tiny DreamZero (real
DreamZeroPipeline/CausalWanModel, random weights, bf16 on CPU), a JSON body with three raw 180x320 cameras
(DROID's size, what an openpi client sends; ~0.7 MB of base64) and the arm's vectors, the action chunk back as
JSON. The in-process path is handed the decoded observation (the tick built once, outside the timing), so the
HTTP overhead includes the cameras' base64 decoding and validation as well as everything above.

    .venv/bin/python benchmarks/tick.py [--ticks 40] [--warmup 3] [--resolutions 64 128] [--threads 1]
    .venv/bin/python benchmarks/tick.py --family dreamzero --ticks 12 --warmup 2 --resolutions 64

`--smoke`: the LingBot tick at 64x64, one warm-up and 2 measured ticks per path (the test's run,
tests/worker/test_tick_benchmark.py; a tiny DreamZero tick takes ~10 s on a 2-core CPU, so the robot tick is
left to `benchmarks/dreamzero_export.py --smoke`, which ticks the same model).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from worker_process import robot_observation

TARGET_OVERHEAD = 0.05
RESULT_MARKER = "ARDIFF-TICK-RESULT "
CAMERA = [
    {"track": "camera", "schema": "lingbot.camera_actions.v1", "data": {"mode": "frames", "frames": frames}}
    for frames in ([["w"], ["w"], ["w", "j"]], [["a"], [], ["d"]], [["w", "l"], ["w"], []])
]
PROMPT = "camera moving forward through a forest"
ROBOT_PROMPT = "pick up the red cup and put it in the bowl"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(size: int, ticks: int, warmup: int, model_cache: str) -> dict[str, Any]:
    """One resolution, in this process: load, serve, tick both paths, report."""
    import httpx
    import uvicorn

    from ardiff.client import parse_server_timing
    from ardiff.worker import tick_rules
    from ardiff.worker.app import create_app
    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.net import free_port
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.service import WorkerService
    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    settings = WorkerSettings(height=size, width=size, model_cache=model_cache, port=free_port())
    runtime = load_vllm_runtime(settings)
    if runtime.capacity < 2:  # one session per path; a third would make the runner evict silently
        raise SystemExit(
            f"the runner holds {runtime.capacity} session(s) at {size}x{size}; raise the KV budget"
        )
    service = WorkerService(settings, lambda: runtime)
    server = uvicorn.Server(
        uvicorn.Config(create_app(service), host="127.0.0.1", port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    client = httpx.Client(base_url=url, timeout=120)
    while not (server.started and client.get("/readyz").status_code == 200):
        time.sleep(0.05)

    def body(chunk: int) -> dict[str, Any]:
        return {
            "request_id": f"t{chunk}",
            "chunk_index": chunk,
            "prompt": PROMPT,
            "controls": [CAMERA[chunk % 3]],
        }

    def in_process(chunk: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        tick = tick_rules.parse_tick("inproc", body(chunk))
        output = run_tick(runtime, runtime.ticks.prepare(tick, Conditioning(seed=0, prompt=PROMPT)))
        frames = output.frames.tobytes()  # what a caller holding the frames as bytes gets
        wall = time.perf_counter() - started
        return wall, output.forward_s + output.decode_s, len(frames) // (size * size * 3)

    def over_http(chunk: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        response = client.post("/v1/sessions/http/ticks", json=body(chunk))
        wall = time.perf_counter() - started
        response.raise_for_status()
        timing_ms = parse_server_timing(response.headers["server-timing"])
        frames = int(response.headers["ardiff-frame-shape"].split(",")[0])
        assert len(response.content) == frames * size * size * 3
        return wall, (timing_ms["forward"] + timing_ms["decode"]) / 1000, frames

    walls: dict[str, list[float]] = {"in-process": [], "http": []}
    around: dict[str, list[float]] = {"in-process": [], "http": []}  # wall minus the model's forward+decode
    frames: dict[str, int] = {"in-process": 0, "http": 0}
    for chunk in range(warmup + ticks):
        # Alternate which path goes first, so neither always follows the other's cache state.
        order = [("in-process", in_process), ("http", over_http)]
        for name, tick in order if chunk % 2 == 0 else order[::-1]:
            wall, model, count = tick(chunk)
            if chunk >= warmup:
                walls[name].append(wall)
                around[name].append(wall - model)
                frames[name] += count
    client.close()
    server.should_exit = True
    thread.join(timeout=60)
    rows = {}
    for name, values in walls.items():
        rows[name] = {
            "p50_ms": statistics.median(values) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
            "mean_ms": statistics.fmean(values) * 1000,
            "around_model_p50_ms": statistics.median(around[name]) * 1000,
            "frames_per_s": frames[name] / sum(values),
        }
    return {
        "size": size,
        "ticks": ticks,
        "rows": rows,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "capacity": runtime.capacity,
    }


def measure_robot(size: int, ticks: int, warmup: int, model_cache: str) -> dict[str, Any]:
    """The DreamZero robot tick, in this process: load, serve, tick both paths in lockstep, report."""
    import httpx
    import uvicorn

    from ardiff.client import parse_server_timing
    from ardiff.worker.app import create_app
    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.families import dreamzero
    from ardiff.worker.net import free_port
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.service import WorkerService
    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    settings = WorkerSettings(
        pipeline="DreamZeroPipeline",
        model="tiny-dreamzero",
        height=size,
        width=size,
        model_cache=model_cache,
        port=free_port(),
        cpu_free_memory_bytes=2 << 30,  # two sessions of ~603 MiB model-owned state at fraction 0.7
        kv_memory_fraction=0.7,
    )
    runtime = load_vllm_runtime(settings)
    if runtime.capacity < 2:
        raise SystemExit(f"the DreamZero runner holds {runtime.capacity} session(s); raise the KV budget")
    service = WorkerService(settings, lambda: runtime)
    server = uvicorn.Server(
        uvicorn.Config(create_app(service), host="127.0.0.1", port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{settings.port}", timeout=300)
    while not (server.started and client.get("/readyz").status_code == 200):
        time.sleep(0.05)
    bodies = [
        {
            "request_id": f"t{chunk}",
            "chunk_index": chunk,
            "prompt": ROBOT_PROMPT,
            "observation": robot_observation(chunk),
        }
        for chunk in range(warmup + ticks)
    ]
    # The in-process caller holds decoded arrays: its ticks are built before the clock starts.
    parsed = [dreamzero.decode_tick(dreamzero.parse_tick("inproc", body)) for body in bodies]
    request_bytes = len(json.dumps(bodies[-1]))

    def in_process(chunk: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        output = run_tick(
            runtime, runtime.ticks.prepare(parsed[chunk], Conditioning(seed=0, prompt=ROBOT_PROMPT))
        )
        actions = output.actions.tobytes()  # what a caller holding the actions as bytes gets
        wall = time.perf_counter() - started
        return wall, output.forward_s + output.decode_s, len(actions)

    def over_http(chunk: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        response = client.post(
            "/v1/sessions/http/ticks",
            content=json.dumps(bodies[chunk]),
            headers={"content-type": "application/json", "accept": "application/json"},
        )
        wall = time.perf_counter() - started
        response.raise_for_status()
        timing_ms = parse_server_timing(response.headers["server-timing"])
        assert response.json()["action_shape"][1] == 8
        return wall, (timing_ms["forward"] + timing_ms["decode"]) / 1000, len(response.content)

    walls: dict[str, list[float]] = {"in-process": [], "http": []}
    around: dict[str, list[float]] = {"in-process": [], "http": []}
    for chunk in range(warmup + ticks):
        order = [("in-process", in_process), ("http", over_http)]
        for name, tick in order if chunk % 2 == 0 else order[::-1]:
            wall, model, _ = tick(chunk)
            if chunk >= warmup:
                walls[name].append(wall)
                around[name].append(wall - model)
    client.close()
    server.should_exit = True
    thread.join(timeout=60)
    rows = {
        name: {
            "p50_ms": statistics.median(values) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
            "mean_ms": statistics.fmean(values) * 1000,
            "around_model_p50_ms": statistics.median(around[name]) * 1000,
            "frames_per_s": 0.0,
        }
        for name, values in walls.items()
    }
    return {
        "size": size,
        "ticks": ticks,
        "rows": rows,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "capacity": runtime.capacity,
        "request_bytes": request_bytes,
    }


def run_child(size: int, args: argparse.Namespace, model_cache: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        __file__,
        "--child",
        str(size),
        "--ticks",
        str(args.ticks),
        "--warmup",
        str(args.warmup),
        "--model-cache",
        model_cache,
        "--family",
        args.family,
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"the {size}x{size} run failed:\n{out.stderr[-4000:]}")
    # The runner prefixes this process's stdout lines with its name: find the result by its marker.
    line = next(line for line in reversed(out.stdout.splitlines()) if RESULT_MARKER in line)
    return json.loads(line.split(RESULT_MARKER, 1)[1])


def print_table(results: list[dict[str, Any]], threads: int, family: str = "lingbot") -> None:
    """Two overhead figures: the ratio of wall-time p50s (what a client sees, noisy on a shared machine) and
    the paired one: time spent outside the model's forward+decode per tick (HTTP minus in-process), over the
    in-process tick p50 — the forward's own jitter cancels out of it."""
    model = (
        "tiny LingBot-World"
        if family == "lingbot"
        else (
            "tiny DreamZero (robot tick: 3 raw 180x320 cameras, "
            f"{results[0]['request_bytes'] / 1e6:.2f} MB JSON body, actions as JSON)"
        )
    )
    print(f"{model}, CPU, torch threads={threads}; measured ticks per path: {results[0]['ticks']}")
    header = (
        f"{'size':>7} {'path':<11} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'frames/s':>9} "
        f"{'outside model p50 ms':>21} {'overhead (p50s)':>16} {'overhead (paired)':>18} {'peak RSS MB':>12}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        base = result["rows"]["in-process"]
        for name, row in result["rows"].items():
            wall_ratio = row["p50_ms"] / base["p50_ms"] - 1
            paired = (row["around_model_p50_ms"] - base["around_model_p50_ms"]) / base["p50_ms"]
            print(
                f"{result['size']:>4}^2  {name:<11} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} "
                f"{row['mean_ms']:>8.1f} {row['frames_per_s']:>9.1f} {row['around_model_p50_ms']:>21.2f} "
                f"{wall_ratio:>+16.1%} {paired:>+18.2%} {result['peak_rss_mb']:>12.0f}"
            )
            result["paired"] = paired
    first = results[0]
    verdict = "met" if first["paired"] <= TARGET_OVERHEAD else "NOT met"
    print(
        f"target: HTTP overhead <= {TARGET_OVERHEAD:.0%} of the tick at {first['size']}x{first['size']}: "
        f"{first['paired']:+.2%} (paired), {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=40, help="measured ticks per path and resolution")
    parser.add_argument(
        "--warmup", type=int, default=3, help="ticks per path before measuring (KV window fills)"
    )
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the measured process")
    parser.add_argument(
        "--model-cache", default=None, help="where the tiny model is generated (default: temp)"
    )
    parser.add_argument(
        "--family", choices=("lingbot", "dreamzero"), default="lingbot", help="the model family's tick"
    )
    parser.add_argument("--smoke", action="store_true", help="64x64, 1 + 2 ticks per path (the test's run)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.ticks, args.warmup, args.resolutions = 2, 1, [64]
    if args.child is not None:
        run = measure if args.family == "lingbot" else measure_robot
        print(
            RESULT_MARKER + json.dumps(run(args.child, args.ticks, args.warmup, args.model_cache)), flush=True
        )
        return
    import tempfile

    model_cache = args.model_cache or str(Path(tempfile.gettempdir()) / "ardiff-bench-models")
    print_table([run_child(size, args, model_cache) for size in args.resolutions], args.threads, args.family)


if __name__ == "__main__":
    main()
