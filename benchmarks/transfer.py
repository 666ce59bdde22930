"""Pod-to-pod transfer on loopback (issue 42 item 1): the transfer code alone, without a runtime, per side.

The holder is a child process: a synthetic export of `--gib` (16 MiB tensors, the last chunk's frames in its
book) written through `write_export` into the worker's `PieceCollector` (its CPU per GB: `write`), then served
as the worker serves it (`app.export_response`: the pieces in a Starlette `StreamingResponse`, their length
declared, uvicorn's h11 protocol, as `ardiff worker serve`). The puller, this process, takes it as the worker
does — `export_download.download` into one buffer, an `ExportReader` over it (every tensor read, the
XXH3-128 checked) — and copies each tensor into a resident buffer, as an import copies KV pages into the pool.
Per run: GB/s from the request to the last tensor copied, and CPU seconds per GB on each side (the holder's
from its own clock, before and after).

Baseline in the same run: the puller as it was before issue 42 (httpx's streamed body collected piece by
piece, then read), against the same holder. The same pull into staging memory the puller keeps between pulls
(`transfer_staging_bytes`: its first pull fills it, the others reuse its pages), and over TLS (a pool with
TLS: its CA made here). Runs alternate between the four, `--runs` each. Last, the CPU the export's checksum
costs per GB on the same bytes: XXH3-128 (format version 2) against SHA-256 (version 1).

    .venv/bin/python benchmarks/transfer.py [--gib 2] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PART_BYTES = 16 << 20
CPU_PATH = "/cpu"
READY_MARKER = "ARDIFF-TRANSFER-HOLDER "


def synthetic_export(total_bytes: int) -> tuple[tuple[bytearray, ...], float]:
    """A synthetic export of about `total_bytes` in the holder's pieces, and the CPU its writing took."""
    import numpy as np

    from ardiff.worker.pieces import PieceCollector
    from ardiff.worker.session_book import CachedChunk, SessionBook
    from ardiff.worker.session_export import TensorPart, write_export

    part = bytearray(os.urandom(1 << 16)) * (PART_BYTES >> 16)  # not zeros: no page is left untouched
    parts = [
        TensorPart(f"kv/{i}", "U8", (PART_BYTES,), lambda: part)
        for i in range(max(1, total_bytes // PART_BYTES))
    ]
    frames = np.zeros((9, 64, 64, 3), np.uint8)
    book = SessionBook("wire").advanced(CachedChunk("wire-8", 8, frames, {}))
    collector = PieceCollector(sys.maxsize)
    started = time.process_time()
    write_export(collector, session_id="wire", identity={}, book=book, state={}, tensors=parts)
    return collector.finish(), time.process_time() - started


def serve_holder(total_bytes: int, tls_dir: str | None) -> None:
    """The holder's process: the export in pieces, served on a free port until killed."""
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from ardiff.worker.app import export_response
    from ardiff.worker.net import free_port
    from ardiff.worker.transfer import TRANSFER_PATH, Outgoing, iter_pieces

    pieces, write_seconds = synthetic_export(total_bytes)
    size = sum(map(len, pieces))
    app = FastAPI()

    @app.get(TRANSFER_PATH)
    async def export(session_id: str) -> StreamingResponse:
        return export_response(Outgoing(size, iter_pieces(pieces)))

    @app.get(CPU_PATH)
    async def cpu() -> dict[str, float]:
        # The process's CPU clock in nanoseconds: `os.times` counts 10 ms ticks, more than the smoke run's
        # 32 MiB send may take (CI of 2026-12-08 read a holder's 0.00 CPU s/GB).
        return {"cpu": time.process_time()}

    port = free_port()
    print(READY_MARKER + json.dumps({"port": port, "bytes": size, "write_s": write_seconds}), flush=True)
    tls = (
        {}
        if tls_dir is None
        else {"ssl_certfile": f"{tls_dir}/holder.crt", "ssl_keyfile": f"{tls_dir}/holder.key"}
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http="h11", **tls)


class Holder:
    """A holder child process (`--holder`), its address, and its CPU clock."""

    def __init__(self, total_bytes: int, tls_dir: str | None) -> None:
        command = [sys.executable, __file__, "--holder", str(total_bytes)]
        self.process = subprocess.Popen(
            [*command, *(["--tls-dir", tls_dir] if tls_dir else [])], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith(READY_MARKER):
            self.process.kill()
            sys.exit(f"the holder did not start: {line!r}")
        info = json.loads(line.removeprefix(READY_MARKER))
        self.bytes, self.write_seconds = info["bytes"], info["write_s"]
        scheme = "https" if tls_dir else "http"
        self.endpoint = f"{scheme}://{'localhost' if tls_dir else '127.0.0.1'}:{info['port']}"
        # Made once, as the worker makes its peers' context once (~0.1 s of CPU each).
        self.context = ssl.create_default_context(cafile=f"{tls_dir}/ca.crt" if tls_dir else None)

    def cpu(self) -> float:
        import httpx

        for _ in range(100):
            try:
                return float(httpx.get(self.endpoint + CPU_PATH, verify=self.context).json()["cpu"])
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"the holder at {self.endpoint} does not answer")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


async def pull_now(url: str, size: int, context: ssl.SSLContext, staging: Any) -> tuple[Any, object]:
    """The worker's puller: one download into one buffer (its `staging` memory, kept between pulls, where
    given), read by the export reader as views; the reader, and the memory its body lies in."""
    from ardiff.worker.export_download import download
    from ardiff.worker.pieces import BodyReader

    body, _ = await download(url, "-", size=size, context=context, staging=staging)
    return BodyReader(iter((body,))), body.obj


async def pull_before(url: str, size: int, context: ssl.SSLContext, staging: Any) -> tuple[Any, object]:
    """The puller before issue 42: httpx's streamed body, its pieces collected, then read."""
    import httpx

    from ardiff.worker.pieces import BodyReader

    pieces: list[bytes] = []
    client = httpx.AsyncClient(timeout=30.0, verify=context)
    async with client, client.stream("GET", url, headers={"authorization": "Bearer -"}) as response:
        assert response.status_code == 200, response.status_code
        async for piece in response.aiter_raw():
            pieces.append(piece)
    assert sum(len(piece) for piece in pieces) <= size
    return BodyReader(iter(pieces)), None


def measure_run(holder: Holder, pull: Any, staging: Any) -> dict[str, float]:
    """One pull: wall time to the last tensor installed, the puller's CPU and the holder's, per GB."""
    from ardiff.worker.session_export import ExportReader
    from ardiff.worker.transfer import transfer_url

    installed = memoryview(bytearray(PART_BYTES))  # resident, reused: as the KV pool
    holder_started = holder.cpu()
    cpu_started, started = time.process_time(), time.perf_counter()
    body, memory = asyncio.run(
        pull(transfer_url(holder.endpoint, "wire"), holder.bytes, holder.context, staging)
    )
    pulled = time.process_time()
    reader = ExportReader(body)
    copied = 0
    for read in reader.tensors(lambda name, dtype, shape: None):
        installed[: len(read.data)] = read.data
        copied += len(read.data)
    reader.book()  # the checksum held and the book came through
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    del read, reader, body  # as an import ends: nothing views the body any more
    if staging is not None:
        assert staging.holds(memory), "the staged pull did not land in the staging memory"
        staging.give_back(memory)
    holder_cpu = holder.cpu() - holder_started
    assert copied >= holder.bytes - (1 << 20)
    gb = holder.bytes / 1e9
    return {
        "gb_per_s": gb / seconds,
        "puller_cpu_per_gb": cpu / gb,
        "pull_cpu_per_gb": (pulled - cpu_started) / gb,
        "holder_cpu_per_gb": holder_cpu / gb,
    }


def tls_material(directory: Path) -> str:
    """A CA and the holder's certificate for `localhost` (a TLS pool's, as in tests/worker/test_tls.py)."""
    import shutil

    from ardiff.devcluster.pki import CertificateAuthority

    ca = CertificateAuthority(directory / "ca", common_name="bench-ca")
    pair = ca.issue("holder", common_name="localhost", server=True, dns_names=["localhost"])
    shutil.copy(ca.cert_path, directory / "ca.crt")
    shutil.copy(pair.cert, directory / "holder.crt")
    shutil.copy(pair.key, directory / "holder.key")
    return str(directory)


def measure(total_bytes: int, runs: int) -> dict[str, Any]:
    from ardiff.worker.export_download import StagingMemory

    with tempfile.TemporaryDirectory() as directory:
        plain, tls = Holder(total_bytes, None), Holder(total_bytes, tls_material(Path(directory)))
        try:
            staging = StagingMemory(plain.bytes)  # the worker's, kept between this path's pulls
            paths = {
                "now": (plain, pull_now, None),
                "staged": (plain, pull_now, staging),
                "before": (plain, pull_before, None),
                "tls": (tls, pull_now, None),
            }
            samples: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
            for _ in range(runs):
                for name, (holder, pull, memory) in paths.items():
                    samples[name].append(measure_run(holder, pull, memory))
        finally:
            plain.stop()
            tls.stop()
    medians = {
        name: {key: statistics.median(run[key] for run in runs_) for key in runs_[0]}
        for name, runs_ in samples.items()
    }
    return {
        "checksums": checksum_cpu_per_gb(),
        "memory": memory_cpu_per_gb(),
        "bytes": plain.bytes,
        "runs": runs,
        "write_cpu_per_gb": plain.write_seconds / (plain.bytes / 1e9),
        "medians": medians,
        "samples": samples,
    }


def memory_cpu_per_gb() -> dict[str, float]:
    """What filling 256 MiB of host memory costs, per GB: fresh pages faulted in one at a time, fresh pages
    provided at once (`fresh_memory`), and pages touched before (the copy alone)."""
    import mmap

    from ardiff.worker.pieces import fresh_memory

    size = 256 << 20
    source = memoryview(os.urandom(PART_BYTES))

    def fill(buffer: Any) -> None:
        view = memoryview(buffer)
        for offset in range(0, size, PART_BYTES):
            view[offset : offset + PART_BYTES] = source

    makers = {"faulted": lambda: mmap.mmap(-1, size), "provided": lambda: fresh_memory(size)}
    result = {}
    for name, make in makers.items():
        started = time.process_time()
        buffer = make()
        fill(buffer)
        result[name] = (time.process_time() - started) / (size / 1e9)
    started = time.process_time()
    fill(buffer)
    result["touched"] = (time.process_time() - started) / (size / 1e9)
    return result


def checksum_cpu_per_gb() -> dict[int, float]:
    """Each export version's checksum over 128 MiB, in CPU seconds per GB."""
    from ardiff.worker.session_export import CHECKSUMS

    data = os.urandom(PART_BYTES)
    result = {}
    for version, (checksum, _) in CHECKSUMS.items():
        started = time.process_time()
        for _ in range(8):
            checksum(data).digest()
        result[version] = (time.process_time() - started) / (8 * len(data) / 1e9)
    return result


def print_table(result: dict[str, Any]) -> None:
    medians = result["medians"]
    print(
        f"pod-to-pod transfer on loopback: a synthetic {result['bytes'] / 2**30:.2f} GiB export, median of "
        f"{result['runs']} runs each; the holder wrote it into its pieces at "
        f"{result['write_cpu_per_gb']:.2f} CPU s/GB"
    )
    header = (
        f"{'path':<34} {'GB/s':>6} {'puller CPU s/GB':>16} {'of it the pull':>15} {'holder CPU s/GB':>16}"
    )
    print(header)
    print("-" * len(header))
    names = {
        "now": "download into one buffer (now)",
        "staged": "the same, into staging memory",
        "before": "httpx streamed pieces (before)",
        "tls": "download into one buffer, TLS",
    }
    for name, label in names.items():
        m = medians[name]
        cpu = f"{m['puller_cpu_per_gb']:>16.2f} {m['pull_cpu_per_gb']:>15.2f} {m['holder_cpu_per_gb']:>16.2f}"
        print(f"{label:<34} {m['gb_per_s']:>6.2f} {cpu}")
    now, staged, before = medians["now"], medians["staged"], medians["before"]
    print(
        f"now against before: {now['gb_per_s'] / before['gb_per_s']:.1f}x the rate, "
        f"{before['puller_cpu_per_gb'] / now['puller_cpu_per_gb']:.1f}x less puller CPU per GB; "
        f"staging memory against fresh: {staged['gb_per_s'] / now['gb_per_s']:.1f}x the rate, "
        f"{now['puller_cpu_per_gb'] / staged['puller_cpu_per_gb']:.1f}x less puller CPU per GB "
        f"(its first pull filled it: {result['samples']['staged'][0]['puller_cpu_per_gb']:.2f} CPU s/GB)"
    )
    memory = result["memory"]
    print(
        f"filling fresh memory: {memory['faulted']:.2f} CPU s/GB page by page, {memory['provided']:.2f} "
        f"provided at once (fresh_memory); {memory['touched']:.3f} once touched (the copy alone)"
    )
    checksums = result["checksums"]
    print(
        f"the checksum alone: XXH3-128 (version 2) {checksums[2]:.3f} CPU s/GB, SHA-256 (version 1) "
        f"{checksums[1]:.3f}: {checksums[1] / checksums[2]:.0f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of the synthetic export")
    parser.add_argument("--runs", type=int, default=3, help="pulls per path")
    parser.add_argument("--smoke", action="store_true", help="a 32 MiB export, one run per path (the test's)")
    parser.add_argument("--holder", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.holder is not None:
        serve_holder(args.holder, args.tls_dir)
        return
    if args.smoke:
        args.gib, args.runs = 1 / 32, 1
    print_table(measure(int(args.gib * 2**30), args.runs))


if __name__ == "__main__":
    main()
