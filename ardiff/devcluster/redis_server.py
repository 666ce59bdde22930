"""A real `redis-server` (and optionally a Sentinel in front of it) on a free loopback port.

Used by the tests, the benchmarks and the dev cluster. Nothing is persisted: a restart loses the data,
which is exactly the failure the placement store must survive.
"""

from __future__ import annotations

import abc
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise TimeoutError(f"redis did not listen on 127.0.0.1:{port} within {timeout}s")


def redis_server_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (make setup installs it with apt-get)")
    return binary


class _ServerProcess(abc.ABC):
    """The lifecycle both servers share: `start()` (each its own), `stop()`, use as a context manager."""

    process: subprocess.Popen[bytes] | None

    @abc.abstractmethod
    def start(self) -> Self:
        """Launch the process and return once it listens."""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RedisServer(_ServerProcess):
    """One `redis-server` process. `restart()` keeps the port and loses every key."""

    port: int = field(default_factory=free_port)
    password: str | None = None
    process: subprocess.Popen[bytes] | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ardiff-redis-")))

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        args = [
            redis_server_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_port(self.port, timeout=10)
        return self

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop (with `sig`; SIGKILL for a crash) and start on the same port: like a Redis pod restarted
        without persistence."""
        self.stop(sig)
        self.start()


@dataclass
class RedisSentinel(_ServerProcess):
    """A `redis-server --sentinel` monitoring `master` under `service_name`."""

    master: RedisServer
    service_name: str = "ardiff"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.master.password}@" if self.master.password else ""
        return f"redis+sentinel://{auth}127.0.0.1:{self.port}/{self.service_name}/0"

    def start(self) -> Self:
        conf = self.master.workdir / f"sentinel-{self.port}.conf"
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"dir {self.master.workdir}",
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.master.port} 1",
            f"sentinel down-after-milliseconds {self.service_name} 5000",
        ]
        if self.master.password:
            lines.append(f"sentinel auth-pass {self.service_name} {self.master.password}")
        conf.write_text("\n".join(lines) + "\n")
        self.process = subprocess.Popen(
            [redis_server_binary(), str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, timeout=10)
        return self
