"""The real operator (`ardiff operator run`) as a process of the dev cluster: it can be stopped and restarted.

It reaches the API server through `KUBECONFIG` and Redis through `ARDIFF_REDIS_URL`, watches
`ARDIFF_WATCH_NAMESPACES`, and serves kopf's liveness probe on a loopback port (`--liveness` is appended to
the command, unless the command serves its own on `liveness_port`, as the chart's does): the probe answers
once the startup handlers ran, which is how `wait_ready` knows it serves. The dev cluster, the operator tests,
the chart test and `benchmarks/reconcile.py` all start the operator through this one class.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from ardiff.devcluster.kubectl import kube_env
from ardiff.errors import ArdiffError
from ardiff.worker.net import free_port

STOP_TIMEOUT_SECONDS = 30.0


def resolve_executable(name: str) -> list[str]:
    """`ardiff` and `python` mean this virtualenv's, whatever PATH says."""
    if name == "ardiff":
        script = Path(sys.executable).with_name("ardiff")
        return [str(script)] if script.exists() else [sys.executable, "-m", "ardiff.cli"]
    if name in ("python", "python3"):
        return [sys.executable]
    return [name]


def stop_process(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Send `sig` to a running process and wait for it; kill it after `STOP_TIMEOUT_SECONDS`."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class OperatorStartError(ArdiffError):
    code = "operator_not_ready"


@dataclass
class OperatorProcess:
    """`command` (e.g. `ardiff operator run --standalone`) with its output appended to `log_path`."""

    command: Sequence[str]
    kubeconfig: Path
    redis_url: str
    namespace: str
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)  # e.g. ARDIFF_OPERATOR_RECONCILE_SECONDS
    # The port of the command's own `--liveness` endpoint (e.g. the chart's arguments); 0: a free loopback
    # port is chosen and `--liveness` appended at each start.
    liveness_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    appends_liveness: bool = field(init=False)

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("operator process command must not be empty, got []")
        if self.liveness_port < 0:
            raise ValueError(f"operator process liveness_port must be >= 0, got {self.liveness_port}")
        self.appends_liveness = self.liveness_port == 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Self:
        self.starts += 1
        argv = [*resolve_executable(self.command[0]), *self.command[1:]]
        if self.appends_liveness:
            self.liveness_port = free_port()
            argv += ["--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz"]
        env = {
            **kube_env(self.kubeconfig),
            "ARDIFF_REDIS_URL": self.redis_url,
            "ARDIFF_WATCH_NAMESPACES": self.namespace,
            **self.env,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"===== operator start #{self.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        """Until kopf answers its liveness probe (startup handlers done); raise if the process died."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        while time.monotonic() < deadline:
            if not self.running:
                raise OperatorStartError(f"the operator exited during startup; see {self.log_path}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise OperatorStartError(f"the operator was not ready within {timeout}s; see {self.log_path}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop it (SIGTERM lets kopf finish, SIGKILL is a crash); its exit code, None if never started."""
        if self.process is None:
            return None
        stop_process(self.process, sig)
        code = self.process.returncode
        self.process = None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
