"""A real worker process for the benchmarks (`ardiff worker serve` on a free loopback port): started with
the environment a benchmark gives it, waited for until `/readyz` answers, stopped. A worker that exits or is
not ready in time ends the benchmark with its log's tail."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ardiff.devcluster.redis_server import free_port


@dataclass
class WorkerProcess:
    pod: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, pod: str, env: dict[str, str], logs: Path) -> WorkerProcess:
        """`ardiff worker serve` as pod `pod` (`ARDIFF_POD_NAME`), its output in `logs/<pod>.log`."""
        port = free_port()
        log = logs / f"{pod}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "ardiff.cli", "worker", "serve"],
            env={**env, "ARDIFF_POD_NAME": pod, "ARDIFF_PORT": str(port)},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        return cls(pod, f"http://127.0.0.1:{port}", process, log)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"worker {self.pod} exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        sys.exit(f"worker {self.pod} not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
