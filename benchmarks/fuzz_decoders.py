"""Coverage-guided fuzzing (atheris, libFuzzer) of the two readers of untrusted bytes (issue 23 item 2):

- `openpi`: a WebSocket message of the `/openpi` route, through everything before the runtime sees it: the
  msgpack-numpy decoder (`openpi.unpack`), the tick it becomes (`openpi.tick_of`) and the DreamZero family's
  checks (`dreamzero.parse_tick`, `decode_tick`). The only answer allowed is a `WorkerError` (a 4xx).
- `export`: a session export (docs/contracts.md §9) imported by the fake runtime (`ExportReader`: preamble,
  headers, tensor index, tensors, checksum, the book). The only answer allowed is a `SessionExportError`.

Anything else, a hang past `-timeout`, or a process grown past `-rss_limit_mb` is a crash (libFuzzer stops and
writes the input). Seeds are valid inputs, so mutations start deep in the formats. Run one target at a time,
niced (docs/benchmarks.md "Fuzzing" has the runs):

    nice -n 19 .venv/bin/python benchmarks/fuzz_decoders.py openpi -max_total_time=600 -rss_limit_mb=512
    nice -n 19 .venv/bin/python benchmarks/fuzz_decoders.py export -max_total_time=600 -rss_limit_mb=512

Not collected by pytest (a script, not a test); `pip install atheris` into the venv first.

`--smoke` needs no atheris (tests/worker/test_fuzz_decoders_benchmark.py): each target's seed and a fixed set
of its mutations (every prefix at 64 lengths, a byte flipped at 64 places, 64 random strings of the seed's
bytes) through the same target function, uninstrumented; any answer but the allowed one fails the run.

    .venv/bin/python benchmarks/fuzz_decoders.py --smoke
"""

from __future__ import annotations

import contextlib
import io
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SMOKE = sys.argv[1:] == ["--smoke"]
if SMOKE:
    instrumented: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
else:
    import atheris

    instrumented = atheris.instrument_imports()

with instrumented:
    import msgpack
    import numpy as np

    from ardiff.worker import openpi, session_export
    from ardiff.worker.errors import SessionExportError, WorkerError
    from ardiff.worker.families import dreamzero

from ardiff.worker import tick_rules  # noqa: E402 (the fuzzed modules are imported instrumented, first)
from ardiff.worker.conditioning import Conditioning  # noqa: E402
from ardiff.worker.fake_runtime import FakeRuntime  # noqa: E402
from ardiff.worker.runtime import run_tick  # noqa: E402
from ardiff.worker.session_book import CachedChunk, SessionBook  # noqa: E402

FRAME = 8  # the fake runtime's frame side: small exports, so mutations reach every section


def openpi_seed() -> bytes:
    def array(value: np.ndarray) -> dict:
        return {
            b"__ndarray__": True,
            b"data": value.tobytes(),
            b"dtype": value.dtype.str,
            b"shape": value.shape,
        }

    cameras = {
        f"observation/{camera}": array(np.zeros((32, 32, 3), np.uint8)) for camera in dreamzero.CAMERAS
    }
    return msgpack.packb(
        {
            **cameras,
            "observation/joint_position": [{b"__npgeneric__": True, b"data": 0.5, b"dtype": "<f8"}] * 7,
            "observation/cartesian_position": array(np.zeros(6)),
            "observation/gripper_position": array(np.zeros(1, np.float32)),
            "prompt": "stack the cups",
        },
        use_bin_type=True,
    )


def fuzz_openpi(data: bytes) -> None:
    try:
        message = openpi.unpack(data)
        body = openpi.tick_of(message, request_id="fuzz-0", chunk_index=0, reset=True)
        dreamzero.decode_tick(dreamzero.parse_tick("fuzz", body))
    except WorkerError:
        pass


def export_seed(runtime: FakeRuntime) -> bytes:
    tick = tick_rules.parse_tick("s", {"request_id": "s-0", "chunk_index": 0})
    output = run_tick(runtime, runtime.ticks.prepare(tick, Conditioning(seed=1, prompt="a forest")))
    book = SessionBook("s", token_sha256="ab" * 32).advanced(
        CachedChunk("s-0", 0, output.frames, output.metadata)
    )
    out = io.BytesIO()
    runtime.export_session("s", out, book=book)
    runtime.close("s")
    return out.getvalue()


RUNTIME = FakeRuntime(height=FRAME, width=FRAME, capacity=2)


def fuzz_export(data: bytes) -> None:
    try:
        RUNTIME.import_session(io.BytesIO(data))
    except SessionExportError:
        pass
    finally:
        RUNTIME.close("s")
    reader_only(data)


def reader_only(data: bytes) -> None:
    """The reader alone, read through with every declared tensor accepted (what a runtime's spec narrows)."""
    try:
        reader = session_export.ExportReader(io.BytesIO(data))
        for _ in reader.tensors(lambda name, dtype, shape: None):
            pass
        reader.book()
    except SessionExportError:
        pass


TARGETS = {"openpi": (fuzz_openpi, openpi_seed), "export": (fuzz_export, lambda: export_seed(RUNTIME))}


def mutations(seed: bytes, count: int = 64) -> Iterator[bytes]:
    """The seed, then `count` of its prefixes, of its one-byte flips and of random strings of its bytes."""
    rng = random.Random(0)
    yield seed
    for i in range(count):
        yield seed[: len(seed) * i // count]
    for _ in range(count):
        at = rng.randrange(len(seed))
        yield seed[:at] + bytes([seed[at] ^ (1 << rng.randrange(8))]) + seed[at + 1 :]
    for _ in range(count):
        yield bytes(rng.choices(seed, k=rng.randrange(1, 256)))


def smoke() -> None:
    print(f"{'target':<8} {'inputs':>6} {'seed bytes':>10} {'ms':>8}")
    for name, (target, seed) in TARGETS.items():
        started = time.perf_counter()
        inputs = list(mutations(seed()))
        for data in inputs:
            target(data)
        elapsed_ms = 1000 * (time.perf_counter() - started)
        print(f"{name:<8} {len(inputs):>6} {len(inputs[0]):>10} {elapsed_ms:>8.1f}")


def main() -> None:
    if SMOKE:
        smoke()
        return
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: fuzz_decoders.py {{{','.join(TARGETS)}}} [libFuzzer flags]")
    target, seed = TARGETS[sys.argv[1]]
    corpus = Path(tempfile.mkdtemp(prefix=f"ardiff-fuzz-{sys.argv[1]}-"))
    (corpus / "seed").write_bytes(seed())
    print(f"corpus: {corpus}", flush=True)
    atheris.Setup([sys.argv[0], *sys.argv[2:], "-max_len=65536", str(corpus)], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
