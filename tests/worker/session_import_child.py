"""A fresh worker process for `test_session_adapter`: imports `DIR/a.export` after ticking another session,
continues it interleaved with that one, and writes what it produced to `DIR/continued.pt`.

    python -m tests.worker.session_import_child DIR MODEL_CACHE
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import torch

from ardiff.worker.settings import WorkerSettings
from ardiff.worker.vllm_runtime import load_vllm_runtime
from tests.worker.test_session_adapter import run


def main(directory: Path, model_cache: str) -> None:
    runtime = load_vllm_runtime(
        WorkerSettings(model="tiny-lingbot-world", model_cache=model_cache, cpu_free_memory_bytes=2 << 30)
    )
    try:
        run(runtime, "b", 0)  # another session first, in a larger pool: the import gets other block ids
        book = runtime.import_session(io.BytesIO((directory / "a.export").read_bytes()))
        chunks, other = [], None
        for chunk in range(book.next_chunk_index, book.next_chunk_index + 3):
            other = run(runtime, "b", chunk - book.next_chunk_index + 1)
            output = run(runtime, "a", chunk)
            chunks.append((output.latents, torch.from_numpy(output.frames)))
        torch.save(
            {"book": book.to_dict(), "chunks": chunks, "other_session_frames": other.frames.shape[0]},
            directory / "continued.pt",
        )
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
