"""Worker start-up and exit: `ardiff worker serve` (standalone, the embedded tiny LingBot-World, CPU) from
spawn to `/healthz` and to `/readyz`, and from SIGTERM to exit, with and without humming-kernels' background
builds.

vllm imports `humming` (a kernel library) at import time, and `import humming` spawns two
`python -c import humming...` processes that build CUDA launchers in the background; without CUDA they can
only fail. Baseline: the builds on (`HUMMING_DISABLE_PARALLEL_BUILD=0`, humming's default); the other variant
sets humming's own switch to 1, which the worker does by default on a host without CUDA. The variants
alternate, `--runs` starts each; after each run the benchmark waits for the worker's humming children to end,
so no run pays for another's.

    .venv/bin/python benchmarks/startup.py [--runs 3] [--model-cache DIR] [--smoke]

`--smoke`: one start per variant, the model made by the first (no warm-up start; the test's run).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ardiff.devcluster.daemon import process_start
from ardiff.worker.net import free_port

VARIANTS = {"builds on (baseline)": "0", "builds off": "1"}
START_TIMEOUT = 300.0
CHILD_EXIT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Run:
    healthz_s: float
    readyz_s: float
    exit_s: float
    humming_children: int


def humming_children(parent: int) -> set[int]:
    """Live processes whose parent is `parent` and whose command line imports humming."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"import humming" in cmdline:
            found.add(int(entry.name))
    return found


def start_once(builds: str, model_cache: str, log: Path) -> Run:
    port = free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "ARDIFF_HOST": "127.0.0.1",
        "ARDIFF_PORT": str(port),
        "ARDIFF_MODEL_CACHE": model_cache,
        "HUMMING_DISABLE_PARALLEL_BUILD": builds,
    }
    env.pop("ARDIFF_REDIS_URL", None)
    started = time.monotonic()
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "ardiff.cli", "worker", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    children: set[int] = set()
    healthz = readyz = None
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:
            while readyz is None:
                if time.monotonic() - started > START_TIMEOUT or worker.poll() is not None:
                    raise RuntimeError(f"the worker did not become ready; its log: {log}")
                children |= humming_children(worker.pid)
                try:
                    if healthz is None and client.get("/healthz").status_code == 200:
                        healthz = time.monotonic() - started
                    if healthz is not None and client.get("/readyz").status_code == 200:
                        readyz = time.monotonic() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        exit_s = time.monotonic() - signalled
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    deadline = time.monotonic() + CHILD_EXIT_TIMEOUT
    while any(process_start(pid) is not None for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    return Run(healthz, readyz, exit_s, len(children))


def print_table(runs: dict[str, list[Run]]) -> None:
    header = (
        f"{'variant':<22} {'runs':>4} {'/healthz p50':>13} {'/readyz p50':>12} {'min':>6} {'max':>6} "
        f"{'exit p50':>9} {'humming children':>17}"
    )
    print(header)
    print("-" * len(header))
    for name, results in runs.items():
        ready = [r.readyz_s for r in results]
        print(
            f"{name:<22} {len(results):>4} {statistics.median(r.healthz_s for r in results):>12.1f}s "
            f"{statistics.median(ready):>11.1f}s {min(ready):>5.1f}s {max(ready):>5.1f}s "
            f"{statistics.median(r.exit_s for r in results):>8.1f}s "
            f"{'/'.join(str(r.humming_children) for r in results):>17}"
        )
    baseline, other = (statistics.median(r.readyz_s for r in results) for results in runs.values())
    print(f"/readyz p50 without the builds / with them: {other / baseline:.3f} ({other - baseline:+.1f}s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="starts per variant")
    parser.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "ardiff-bench-models"))
    parser.add_argument("--smoke", action="store_true", help="one start per variant, no warm-up (the test's)")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    logs = Path(tempfile.mkdtemp(prefix="ardiff-bench-startup-"))
    print(f"worker logs in {logs}; loadavg at start {os.getloadavg()[0]:.1f}", flush=True)
    if not args.smoke:
        start_once(
            "1", args.model_cache, logs / "warmup.log"
        )  # the tiny model is written once, page cache warm
    runs: dict[str, list[Run]] = {name: [] for name in VARIANTS}
    for i in range(args.runs):
        for name, builds in VARIANTS.items():
            run = start_once(builds, args.model_cache, logs / f"{builds}-{i}.log")
            runs[name].append(run)
            print(
                f"  {name}: /readyz {run.readyz_s:.1f}s, {run.humming_children} humming children", flush=True
            )
    print_table(runs)
    print(f"loadavg at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
