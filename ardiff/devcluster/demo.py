"""`ardiff demo` (`make demo`): the whole system on CPU, from `kubectl apply` to one MP4 per session.

A dev cluster (emulated API, real Redis, the real operator, real workers with the tiny LingBot-World model),
`kubectl apply -f examples/`, a progress display until every session is Ready (the third session makes the
pool grow to its second Pod), then every session ticked concurrently through the Python client with camera
controls, one MP4 per session in `demo-out/` (kept), a table (session, pod, chunks, mean tick latency,
frames/s) and `kubectl get ardiffusionsessions`. The cluster is torn down at the end, on an error, on Ctrl-C
and on SIGTERM.
"""

from __future__ import annotations

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

from ardiff.client import CAMERA_TOUR, KubeSessions, write_mp4
from ardiff.devcluster.cluster import INTERACTIVE_OPERATOR_ENV, OPERATOR_COMMAND, DevCluster
from ardiff.devcluster.crd import load_manifests
from ardiff.errors import ArdiffError

NAMESPACE = "default"
POOLS_PATH = "/apis/ardiffusion.dev/v1alpha1/namespaces/{namespace}/ardiffusionworkerpools"
MIRROR_WAIT_SECONDS = 15.0


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
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in (header, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)


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
        if all(s.get("phase") == "Ready" and s.get("endpoint") for s in statuses.values()):
            return statuses
        failed = {n: s for n, s in statuses.items() if s.get("phase") in ("Failed", "Expired")}
        if failed:
            raise DemoError(f"sessions did not become Ready: {failed}")
        if time.monotonic() - started > timeout:
            raise DemoError(f"sessions were not Ready within {timeout:.0f}s: {line}")
        time.sleep(0.5)


def tick_session(sessions: KubeSessions, name: str, chunks: int, out_dir: Path, out: TextIO) -> SessionResult:
    """Tick one session `chunks` times along the camera tour; write its MP4."""
    with sessions.connect(name) as client:
        pod = sessions.status(name).get("pod", "?")
        frames, latencies = [], []
        for i in range(chunks):
            chunk = client.tick([CAMERA_TOUR[i % len(CAMERA_TOUR)]])
            frames.append(chunk.frames)
            latencies.append(chunk.latency_s)
            print(
                f"  {name} chunk {chunk.metadata.chunk_index}: {len(chunk.frames)} frames in "
                f"{chunk.latency_s * 1000:.0f} ms",
                file=out,
                flush=True,
            )
    video = write_mp4(out_dir / f"{name}.mp4", frames)
    return SessionResult(name, pod, chunks, sum(len(f) for f in frames), tuple(latencies), video.resolve())


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
    cluster = DevCluster(
        settings.state_dir,
        operator_command=OPERATOR_COMMAND,
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
        pools_url = cluster.api_url + POOLS_PATH.format(namespace=NAMESPACE)

        def pools() -> list[dict[str, Any]]:
            return httpx.get(pools_url, timeout=10).json()["items"]

        wait_until_ready(sessions, names, pools, timeout=settings.timeout, out=out)
        print(f"all {len(names)} sessions Ready; ticking {settings.chunks} chunks each", file=out, flush=True)
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="demo-tick")
        try:
            futures = [
                executor.submit(tick_session, sessions, name, settings.chunks, settings.out_dir, out)
                for name in names
            ]
            results = [future.result() for future in futures]
        finally:  # on Ctrl-C, do not wait for the other sessions' ticks: the teardown ends them
            executor.shutdown(wait=False, cancel_futures=True)
        wait_for_mirror(sessions, names, settings.chunks)
        print("", format_table(results), "", sep="\n", file=out)
        print("$ kubectl get ardiffusionsessions", file=out)
        print(kubectl(cluster, "get", "ardiffusionsessions"), file=out, end="")
        print("$ kubectl get ardiffusionworkerpools", file=out)
        print(kubectl(cluster, "get", "ardiffusionworkerpools"), file=out, end="", flush=True)
        print("tearing the dev cluster down ...", file=out, flush=True)
    print(
        f"done in {time.monotonic() - started:.0f}s; videos: " + ", ".join(str(r.video) for r in results),
        file=out,
        flush=True,
    )
    return results
