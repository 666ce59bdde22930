"""Session continuity, part 1 (issue 12 item 7): export and import time against the export's size.

For each resolution a child process loads the tiny LingBot-World model (the real vllm-omni runner, paged KV,
streaming decoder), ticks one session until its KV window is full (9 chunks), then exports it at that tick
boundary into memory `--repeats` times (read-only: every export is the same bytes) and imports it as often
(each import closed again, the close not timed). The export carries the worker's book with its cached chunk.
Sizes are split by what they hold (docs/contracts.md §9). Not yet here: the transfer path, the migration stall
in ticks, the first tick after a resume, the extrapolation to LingBot 480x832 bf16.

    .venv/bin/python benchmarks/continuity.py [--resolutions 64 128] [--repeats 20] [--threads 1]
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

RESULT_MARKER = "ARDIFF-CONTINUITY-RESULT "
CHUNKS = 9  # sink (3) + window (6) latent frames: the largest a session's KV gets
CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]},
}
GROUPS = {"kv/": "self KV", "cross/": "cross KV", "pipe/": "pipeline", "dec/": "decoder", "book/": "book"}


def measure(size: int, repeats: int, model_cache: str) -> dict[str, Any]:
    from ardiff.worker import tick_rules
    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.session_book import CachedChunk, SessionBook
    from ardiff.worker.session_export import ITEM_SIZES, ExportReader
    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    runtime = load_vllm_runtime(WorkerSettings(height=size, width=size, model_cache=model_cache))
    conditioning = Conditioning(seed=1234, prompt="camera moving forward through a forest")
    book = SessionBook("a")
    for chunk in range(CHUNKS):
        body = {"request_id": f"a-{chunk}", "chunk_index": chunk, "controls": [CAMERA]}
        output = runtime.forward(runtime.prepare(tick_rules.parse_tick("a", body), conditioning))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=20, help="exports and imports measured per resolution")
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads of the measured process")
    parser.add_argument(
        "--model-cache", default=None, help="where the tiny model is generated (default: temp)"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(RESULT_MARKER + json.dumps(measure(args.child, args.repeats, args.model_cache)), flush=True)
        return
    model_cache = args.model_cache or str(Path(tempfile.gettempdir()) / "ardiff-bench-models")
    print_table([run_child(size, args, model_cache) for size in args.resolutions], args.threads)


if __name__ == "__main__":
    main()
