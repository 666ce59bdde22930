"""`ardiff demo` (`make demo`): the whole system on CPU, from `kubectl apply` to one MP4 per session.

A dev cluster (emulated API, real Redis, the real operator, real workers with the trained tiny world model),
the KV capacity plan of each pool (`ardiff.kv.capacity`), `kubectl apply -f examples/`, a progress display
until every session is Ready (the third session makes the pool grow to its second Pod), the capacity each pod
registered next to the planned one, then every session ticked concurrently through the Python client with
camera controls, one MP4 and one PNG strip of frames per session in `demo-out/` (kept), a table (session,
pod, chunks, mean tick latency, frames/s) and `kubectl get ardiffusionsessions`. The cluster is torn down at
the end, on an error, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import numpy as np

from ardiff.client import TERMINAL_PHASES, KubeSessions, camera, hold, is_ready, write_mp4, write_strip
from ardiff.devcluster.cluster import INTERACTIVE_OPERATOR_ENV, DevCluster, load_manifests
from ardiff.errors import ArdiffError
from ardiff.kv.capacity import format_bytes
from ardiff.kv.placement import PlacementStore
from ardiff.kv.pod_plan import PodPlan, plan_for_pool
from ardiff.kv.presets import get_preset
from ardiff.kv.records import PodRecord, PoolId
from ardiff.operator.specs import WorkerPoolSpec
from ardiff.wire import API_VERSION, POOL_PLURAL
from ardiff.worker.settings import DEFAULT_CPU_FREE_MEMORY_BYTES, EMBEDDED_TINY_MODEL, TRAINED_WORLD_MODEL

NAMESPACE = "default"
POOLS_PATH = f"/apis/{API_VERSION}/namespaces/{{namespace}}/{POOL_PLURAL}"
MIRROR_WAIT_SECONDS = 15.0
# The capacity preset of the embedded models, by (height, width): what a pool of them plans with (the trained
# world keeps the random tiny model's KV geometry: layers, heads, head size, window, VAE).
TINY_PRESETS = {(64, 64): "tiny-lingbot-64x64"}
TINY_MODELS = (EMBEDDED_TINY_MODEL, TRAINED_WORLD_MODEL)
# The camera tour: the trained world only turns (issue 16), so look left, then back right, within the yaw
# range it was trained on; the first latent frame is the start image.
CAMERA_TOUR = (
    camera("", "j", "j"),
    hold("j"),
    hold("l"),
    hold("l"),
    hold("l"),
    hold("l"),
    hold("j"),
    hold("j"),
)


class DemoError(ArdiffError):
    code = "demo_failed"


@dataclass(frozen=True)
class DemoSettings:
    examples: Path
    out_dir: Path
    state_dir: Path
    chunks: int = 8
    timeout: float = 600.0  # for the sessions to become Ready

    def __post_init__(self) -> None:
        if self.chunks < 1:
            raise DemoError(f"demo chunks must be >= 1, got {self.chunks}")
        if self.timeout <= 0:
            raise DemoError(f"demo timeout must be positive, got {self.timeout}")
        if not self.examples.exists():
            raise DemoError(
                f"demo examples must exist, got {self.examples} (run it from the repository root)"
            )


@dataclass(frozen=True)
class SessionResult:
    """One session's part of the demo."""

    name: str
    pod: str
    chunks: int
    frames: int
    tick_seconds: tuple[float, ...]
    video: Path
    strip: Path  # a PNG of frames taken along the video

    @property
    def mean_tick_ms(self) -> float:
        return 1000 * sum(self.tick_seconds) / len(self.tick_seconds)

    @property
    def frames_per_second(self) -> float:
        return self.frames / sum(self.tick_seconds)


def session_names(examples: Path) -> list[str]:
    names = [d["metadata"]["name"] for d in load_manifests(examples) if d.get("kind") == "ARDiffusionSession"]
    if not names:
        raise DemoError(f"{examples} holds no ARDiffusionSession")
    return names


ROBOT_CHUNKS = 2  # a robot session's chunks (a tiny DreamZero tick on CPU: first ~15 s, then 1-3 s)
ROBOT_CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
ROBOT_CAMERA_SIZE = (64, 64)


def robot_session_names(examples: Path) -> list[str]:
    """The DreamZero sessions (`spec.family: dreamzero`): ticked with observations, they answer actions."""
    return [
        d["metadata"]["name"]
        for d in load_manifests(examples)
        if d.get("kind") == "ARDiffusionSession" and (d.get("spec") or {}).get("family") == "dreamzero"
    ]


def robot_observation(seed: int, chunk: int) -> dict[str, Any]:
    """A deterministic observation: three small raw cameras and the arm's joint/cartesian/gripper state."""
    rng = np.random.default_rng([seed, chunk])
    height, width = ROBOT_CAMERA_SIZE
    images = {}
    for camera_name in ROBOT_CAMERAS:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        data = base64.b64encode(pixels.tobytes()).decode()
        images[camera_name] = {"encoding": "raw", "shape": [height, width, 3], "data": data}
    return {
        "images": images,
        "joint_position": rng.uniform(-1, 1, 7).round(3).tolist(),
        "cartesian_position": rng.uniform(-1, 1, 6).round(3).tolist(),
        "gripper_position": [round(float(rng.uniform(0, 1)), 3)],
    }


@dataclass(frozen=True)
class RobotResult:
    name: str
    pod: str
    action_shapes: tuple[tuple[int, ...], ...]
    tick_seconds: tuple[float, ...]

    @property
    def mean_tick_ms(self) -> float:
        return 1000 * sum(self.tick_seconds) / len(self.tick_seconds)


_OUTPUT_LOCK = threading.Lock()


def say(out: TextIO, line: str) -> None:
    """Write one whole line to the demo's output. The sessions tick on threads that share it, and print()
    writes a line's text and its end separately: another thread's line could land between them."""
    with _OUTPUT_LOCK:
        out.write(f"{line}\n")
        out.flush()


def tick_robot_session(sessions: KubeSessions, name: str, chunks: int, out: TextIO) -> RobotResult:
    """Tick a robot session `chunks` times with observations; print each chunk's action shape and values."""
    with sessions.connect(name) as client:
        pod = sessions.status(name).get("pod", "?")
        shapes, latencies = [], []
        for i in range(chunks):
            chunk = client.robot_tick(robot_observation(7, i))
            shapes.append(chunk.actions.shape)
            latencies.append(chunk.latency_s)
            first = ", ".join(f"{v:+.3f}" for v in chunk.actions[0][:4])
            say(
                out,
                f"  {name} chunk {chunk.metadata.chunk_index}: actions {list(chunk.actions.shape)} in "
                f"{chunk.latency_s * 1000:.0f} ms; step 0: [{first}, ...]",
            )
    return RobotResult(name, pod, tuple(shapes), tuple(latencies))


def pool_manifests(examples: Path) -> list[dict[str, Any]]:
    return [d for d in load_manifests(examples) if d.get("kind") == "ARDiffusionWorkerPool"]


def plan_pool(pool: dict[str, Any]) -> tuple[str, PodPlan] | None:
    """The capacity plan of one pod of `pool` on CPU, with the preset of its model (None without one): the
    worker takes the pool's `kv.cpuFreeMemoryBytes` (else its default) as free device memory and the pool's
    `kv.gpuMemoryFraction` and `kv.sessionCapacity`, as the operator passes them to every worker Pod."""
    spec = WorkerPoolSpec.from_resource(pool["spec"])
    preset = TINY_PRESETS.get((spec.model.height, spec.model.width))
    if spec.model.name not in TINY_MODELS or preset is None:
        return None
    plan = plan_for_pool(
        get_preset(preset),
        device_memory_bytes=spec.cpu_free_memory_bytes or DEFAULT_CPU_FREE_MEMORY_BYTES,
        gpu_memory_fraction=spec.kv_memory_fraction,
        pool_session_capacity=spec.session_capacity,
    )
    return preset, plan


def format_plan(pool: dict[str, Any]) -> str:
    name = pool["metadata"]["name"]
    planned = plan_pool(pool)
    if planned is None:
        model = pool["spec"].get("model", {})
        return f"pool {name}: no capacity preset for model {model.get('name', model.get('path'))!r}; " + (
            "its pods report their capacity once loaded"
        )
    preset, plan = planned
    command = (
        f"ardiff kv explain {preset} --gpu-memory-gib {plan.device_memory_bytes / (1 << 30):g} "
        f"--fraction {plan.kv.gpu_memory_fraction:g}"
        + ("" if plan.pool_session_capacity is None else f" --session-capacity {plan.pool_session_capacity}")
    )
    lines = [
        f"KV capacity plan for one pod of pool {name} ({command}; on CPU the worker takes "
        f"{format_bytes(plan.device_memory_bytes)} as free device memory, or the RAM available if less):",
        *(f"  {line}" for line in plan.explain()),
    ]
    return "\n".join(lines)


def align(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A text table: columns padded to their widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    )


def format_capacities(pods: Sequence[PodRecord], planned: int | None, kv_blocks: dict[str, str]) -> str:
    """Each registered pod's capacity (its runner's, after load) next to the planned one."""
    header = ("pod", "capacity (registered)", "planned", "KV blocks free/total (worker)")
    rows = [
        (pod.name, str(pod.capacity), "-" if planned is None else str(planned), kv_blocks.get(pod.name, "?"))
        for pod in pods
    ]
    return align(header, rows)


def registered_pods(redis_url: str, pool: PoolId) -> list[PodRecord]:
    async def read() -> list[PodRecord]:
        async with PlacementStore.from_url(redis_url) as store:
            return await store.list_pods(pool)

    return asyncio.run(read())


def worker_kv_blocks(pods: Sequence[PodRecord]) -> dict[str, str]:
    """`free/total` KV blocks from each worker's `GET /v1/sessions`."""
    blocks = {}
    for pod in pods:
        listing = httpx.get(f"{pod.endpoint}/v1/sessions", timeout=10).json()
        if listing.get("kv_blocks"):
            blocks[pod.name] = f"{listing['kv_blocks']['free']}/{listing['kv_blocks']['total']}"
    return blocks


def format_progress(
    elapsed: float, statuses: dict[str, dict[str, Any]], pools: Sequence[dict[str, Any]]
) -> str:
    """One line of the progress display: each session's phase (and pod), each pool's ready pods."""
    parts = []
    for name, status in statuses.items():
        phase = status.get("phase", "-")
        where = f" on {status['pod']}" if phase == "Ready" and status.get("pod") else ""
        why = f" ({status['reason']})" if phase != "Ready" and status.get("reason") else ""
        parts.append(f"{name}: {phase}{where}{why}")
    for pool in pools:
        status = pool.get("status") or {}
        parts.append(
            f"pool {pool['metadata']['name']}: {status.get('readyReplicas', 0)}/{status.get('replicas', 0)} "
            f"pods ready"
        )
    return f"[{elapsed:5.1f}s] " + " | ".join(parts)


def format_table(results: Sequence[SessionResult]) -> str:
    header = ("session", "pod", "chunks", "frames", "mean tick (ms)", "frames/s", "video")
    rows = [
        (
            r.name,
            r.pod,
            str(r.chunks),
            str(r.frames),
            f"{r.mean_tick_ms:.0f}",
            f"{r.frames_per_second:.1f}",
            str(r.video),
        )
        for r in results
    ]
    return align(header, rows)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the demo like Ctrl-C does (so the cluster is torn down)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until_ready(
    sessions: KubeSessions,
    names: Sequence[str],
    pools: Callable[[], list[dict[str, Any]]],
    *,
    timeout: float,
    out: TextIO,
) -> dict[str, dict[str, Any]]:
    """Poll every session until all are Ready, printing a progress line whenever something changed."""
    started = time.monotonic()
    shown = ""
    while True:
        listed = {s["metadata"]["name"]: s.get("status") or {} for s in sessions.list()}
        statuses = {name: listed.get(name, {}) for name in names}
        line = format_progress(time.monotonic() - started, statuses, pools())
        if line.partition("] ")[2] != shown.partition("] ")[2]:
            print(line, file=out, flush=True)
            shown = line
        if all(is_ready(s) for s in statuses.values()):
            return statuses
        failed = {n: s for n, s in statuses.items() if s.get("phase") in TERMINAL_PHASES}
        if failed:
            raise DemoError(f"sessions did not become Ready: {failed}")
        if time.monotonic() - started > timeout:
            raise DemoError(f"sessions were not Ready within {timeout:.0f}s: {line}")
        time.sleep(0.5)


def tick_session(sessions: KubeSessions, name: str, chunks: int, out_dir: Path, out: TextIO) -> SessionResult:
    """Tick one session `chunks` times along the camera tour; write its MP4."""
    with sessions.connect(name) as client:
        pod = sessions.status(name).get("pod", "?")
        say(out, f"  {name}: {client.endpoint}")
        frames, latencies = [], []
        for i in range(chunks):
            chunk = client.tick([CAMERA_TOUR[i % len(CAMERA_TOUR)]])
            frames.append(chunk.frames)
            latencies.append(chunk.latency_s)
            say(
                out,
                f"  {name} chunk {chunk.metadata.chunk_index}: {len(chunk.frames)} frames in "
                f"{chunk.latency_s * 1000:.0f} ms",
            )
    video = write_mp4(out_dir / f"{name}.mp4", frames)
    strip = write_strip(out_dir / f"{name}.png", frames)
    count = sum(len(f) for f in frames)
    return SessionResult(name, pod, chunks, count, tuple(latencies), video.resolve(), strip.resolve())


def wait_for_mirror(sessions: KubeSessions, names: Sequence[str], chunks: int) -> None:
    """Give the operator's throttled status mirror a moment, so `kubectl get` shows the final chunk."""
    deadline = time.monotonic() + MIRROR_WAIT_SECONDS
    while time.monotonic() < deadline:
        if all((sessions.status(n).get("chunkIndex") or 0) >= chunks for n in names):
            return
        time.sleep(0.5)


def kubectl(cluster: DevCluster, *args: str) -> str:
    """The real kubectl's output; a `DemoError` with its stderr when it fails."""
    result = cluster.kubectl(*args, check=False)
    if result.returncode != 0:
        raise DemoError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def run_demo(settings: DemoSettings, out: TextIO = sys.stdout) -> list[SessionResult]:
    names = session_names(settings.examples)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request (pod probes) otherwise
    started = time.monotonic()
    pools_applied = pool_manifests(settings.examples)
    for pool in pools_applied:
        print(format_plan(pool), file=out, flush=True)
    # The operator and its Redis are the chart's: `helm install` as a user runs it (its CRDs included).
    cluster = DevCluster(
        settings.state_dir,
        chart=True,
        install_crds=False,
        namespace=NAMESPACE,
        operator_env=INTERACTIVE_OPERATOR_ENV,
    )
    print(
        f"starting the dev cluster (logs in {settings.state_dir.resolve() / 'logs'}) ...",
        file=out,
        flush=True,
    )
    with sigterm_interrupts(), cluster:
        print(f"$ kubectl apply -f {settings.examples}", file=out)
        print(kubectl(cluster, "apply", "-f", str(settings.examples)), file=out, end="", flush=True)
        sessions = cluster.sessions()
        pools_path = POOLS_PATH.format(namespace=NAMESPACE)

        def pools() -> list[dict[str, Any]]:
            with cluster.admin.client(timeout=10) as client:
                return client.get(pools_path).json()["items"]

        wait_until_ready(sessions, names, pools, timeout=settings.timeout, out=out)
        for pool in pools_applied:
            registered = registered_pods(cluster.redis_url, PoolId(NAMESPACE, pool["metadata"]["name"]))
            planned = plan_pool(pool)
            print(f"pool {pool['metadata']['name']}: capacity per pod, registered vs planned", file=out)
            print(
                format_capacities(registered, planned and planned[1].sessions, worker_kv_blocks(registered)),
                file=out,
                flush=True,
            )
        robots = robot_session_names(settings.examples)
        robot_chunks = min(settings.chunks, ROBOT_CHUNKS)
        print(
            f"the front door: {cluster.front_door_url} (the chart's Envoy and endpoint picker, a NodePort); "
            f"every session ticks at its status.url, {cluster.front_door_url}/pools/{NAMESPACE}/<pool>",
            file=out,
            flush=True,
        )
        print(
            f"all {len(names)} sessions Ready; ticking {settings.chunks} chunks each"
            + (f" ({robot_chunks} for the robot sessions: {', '.join(robots)})" if robots else ""),
            file=out,
            flush=True,
        )
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="demo-tick")
        try:
            futures = [
                executor.submit(tick_session, sessions, name, settings.chunks, settings.out_dir, out)
                for name in names
                if name not in robots
            ]
            robot_futures = [
                executor.submit(tick_robot_session, sessions, name, robot_chunks, out) for name in robots
            ]
            results = [future.result() for future in futures]
            robot_results = [future.result() for future in robot_futures]
        finally:  # on Ctrl-C, do not wait for the other sessions' ticks: the teardown ends them
            executor.shutdown(wait=False, cancel_futures=True)
        wait_for_mirror(sessions, [r.name for r in results], settings.chunks)
        wait_for_mirror(sessions, robots, robot_chunks)
        print("", format_table(results), "", sep="\n", file=out)
        for robot in robot_results:
            print(
                f"robot session {robot.name} on {robot.pod}: {len(robot.action_shapes)} action chunks of "
                f"{list(robot.action_shapes[0])}, mean tick {robot.mean_tick_ms:.0f} ms",
                file=out,
                flush=True,
            )
        print("$ kubectl get ardiffusionsessions", file=out)
        print(kubectl(cluster, "get", "ardiffusionsessions"), file=out, end="")
        print("$ kubectl get ardiffusionworkerpools", file=out)
        print(kubectl(cluster, "get", "ardiffusionworkerpools"), file=out, end="", flush=True)
        print("tearing the dev cluster down ...", file=out, flush=True)
    print(
        f"done in {time.monotonic() - started:.0f}s; videos: "
        + ", ".join(str(r.video) for r in results)
        + "; frame strips: "
        + ", ".join(str(r.strip) for r in results),
        file=out,
        flush=True,
    )
    return results
