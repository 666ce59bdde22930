"""DreamZero's session export (issue 26): its size by part and its cost, chunk by chunk, against the tick.

In this process: the tiny DreamZero (the real DreamZeroPipeline/CausalWanModel with random weights, bf16 on
CPU, its VAE in float32) behind the session adapter, one session ticked `--chunks` times with three raw
180x320 cameras. After each chunk the session is exported into memory `--repeats` times (read-only: the same
bytes) and imported as often (closed first; the close not timed), and the export's bytes are split by what
they hold (docs/contracts.md §9): both KV branches' pages, their cross-attention, the pipeline's
`DreamZeroState` (of which the VAE encoder's stream cache and every chunk's predicted latents, which vllm-omni
keeps until a reset) and the book. The baseline is the chunk's own tick, measured in the same run: the ratio
is (export + import) / tick.

    .venv/bin/python benchmarks/dreamzero_export.py [--chunks 8] [--repeats 3] [--threads 1] [--smoke]

`--smoke`: 2 chunks (the second continues the first's KV), one export and import each (the test's run).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from worker_process import robot_observation

# Longest prefix first: a tensor counts in the first group whose prefix it has.
GROUPS = {
    "kv/positive/": "KV +",
    "kv/negative/": "KV -",
    "cross/": "cross KV",
    "dz/video_latents_across_time/": "latents",
    "dz/vae_enc_feat_map/": "VAE cache",
    "dz/": "state rest",
    "book/": "book",
}
FREE_BYTES, FRACTION = 2 << 30, 0.7  # two sessions' model-owned state, as tests/worker/test_dreamzero.py


def measure(chunks: int, repeats: int, model_cache: str) -> list[dict[str, Any]]:
    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.families import dreamzero
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.session_book import CachedChunk, SessionBook
    from ardiff.worker.session_export import ITEM_SIZES, ExportReader
    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    runtime = load_vllm_runtime(
        WorkerSettings(
            model="tiny-dreamzero",
            pipeline="DreamZeroPipeline",
            model_cache=model_cache,
            cpu_free_memory_bytes=FREE_BYTES,
            kv_memory_fraction=FRACTION,
        )
    )
    conditioning = Conditioning(seed=7, prompt="pick up the red cup")
    book, rows = SessionBook("arm"), []
    for chunk in range(chunks):
        body = {"request_id": f"arm-{chunk}", "chunk_index": chunk, "observation": robot_observation(chunk)}
        tick = dreamzero.decode_tick(dreamzero.parse_tick("arm", body))
        started = time.perf_counter()
        output = run_tick(runtime, runtime.ticks.prepare(tick, conditioning))
        tick_s = time.perf_counter() - started
        book = book.advanced(
            CachedChunk(f"arm-{chunk}", chunk, output.frames, output.metadata, output.actions)
        )
        exports, imports, blob = [], [], b""
        for _ in range(repeats):
            out = io.BytesIO()
            started = time.perf_counter()
            runtime.export_session("arm", out, book=book)
            exports.append(time.perf_counter() - started)
            blob = out.getvalue()
        for _ in range(repeats):
            runtime.close("arm")
            started = time.perf_counter()
            runtime.import_session(io.BytesIO(blob))
            imports.append(time.perf_counter() - started)
        groups: dict[str, int] = {}
        for name, (dtype, shape) in ExportReader(io.BytesIO(blob)).tensor_shapes().items():
            group = next(label for prefix, label in GROUPS.items() if name.startswith(prefix))
            groups[group] = groups.get(group, 0) + math.prod(shape) * ITEM_SIZES[dtype]
        rows.append(
            {
                "chunk": chunk,
                "bytes": len(blob),
                "groups": groups,
                "tick_ms": 1000 * tick_s,
                "export_ms": 1000 * statistics.median(exports),
                "import_ms": 1000 * statistics.median(imports),
            }
        )
    runtime.shutdown()
    return rows


def print_table(rows: list[dict[str, Any]], threads: int, repeats: int) -> None:
    print(
        f"tiny DreamZero, CPU bf16 (VAE fp32), torch threads={threads}; one session; "
        f"export/import medians of {repeats}; sizes in KiB"
    )
    labels = list(dict.fromkeys(GROUPS.values()))
    header = (
        f"{'chunk':>5} {'bytes':>11} "
        + " ".join(f"{label:>10}" for label in labels)
        + f" {'tick ms':>9} {'export ms':>10} {'import ms':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        split = " ".join(f"{r['groups'].get(label, 0) / 1024:>10.0f}" for label in labels)
        ratio = (r["export_ms"] + r["import_ms"]) / r["tick_ms"]
        print(
            f"{r['chunk']:>5} {r['bytes']:>11} {split} {r['tick_ms']:>9.0f} {r['export_ms']:>10.1f} "
            f"{r['import_ms']:>10.1f} {ratio:>6.3f}"
        )
    growth = (rows[-1]["groups"].get("latents", 0) - rows[0]["groups"].get("latents", 0)) / max(
        1, len(rows) - 1
    )
    print(f"\npredicted latents kept by vllm-omni: +{growth / 1024:.0f} KiB a chunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="exports and imports measured per chunk")
    parser.add_argument("--threads", type=int, default=1, help="OMP/torch threads")
    parser.add_argument("--smoke", action="store_true", help="2 chunks, one repeat (the test's run)")
    args = parser.parse_args()
    if args.smoke:
        args.chunks, args.repeats = 2, 1
    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        os.execv(sys.executable, [sys.executable, *sys.argv])  # torch reads it once, at import
    with tempfile.TemporaryDirectory(prefix="ardiff-dz-models-") as model_cache:
        print_table(measure(args.chunks, args.repeats, model_cache), args.threads, args.repeats)


if __name__ == "__main__":
    main()
