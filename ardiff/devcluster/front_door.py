"""The front door on loopback, without a cluster: real Envoy and the endpoint picker as processes, for the
tests and the benchmark of issue 37 (the dev cluster runs the same two as the chart's gateway Pods).

The picker runs from the gateway image's venv (`ardiff.devcluster.images.build_image_venv(..., "gateway")`:
what the gateway Pods run, with `xds-protos`, which the dev venv does not hold), Envoy from the pinned binary
(`ardiff.devcluster.binaries.ensure_envoy`) with the bootstrap `ardiff.gateway.envoy_config` makes. The
picker can be stopped and started again (a test of the front door failing closed).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx

from ardiff.devcluster.binaries import ensure_envoy
from ardiff.devcluster.images import build_image_venv
from ardiff.gateway.envoy_config import EnvoySettings, render, write_tls_clusters
from ardiff.worker.net import free_port

CHECKOUT = Path(__file__).resolve().parents[2]
READY_SECONDS = 60.0


def gateway_venv() -> Path:
    """The gateway image's venv (built once per content of the sources)."""
    return build_image_venv(CHECKOUT, "gateway")


def _wait_ready(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = READY_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.args[0]} exited with {process.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 within {timeout} s:\n{log.read_text()[-4000:]}")


@dataclass
class LocalFrontDoor:
    """Envoy on `port` in front of the picker, which reads the store at `redis_url` (or at the URL in
    `redis_url_file`, read again as the picker runs). `url(namespace, pool)` is a pool's base URL (a
    session's `status.url`)."""

    redis_url: str = ""
    redis_url_file: Path | None = None
    concurrency: int = 1
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ardiff-front-door-")))
    settings: EnvoySettings = field(init=False)
    picker_port: int = field(default_factory=free_port)
    picker_http_port: int = field(default_factory=free_port)
    picker: subprocess.Popen[bytes] | None = None
    envoy: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.settings = EnvoySettings(
            listen_port=free_port(),
            health_port=free_port(),
            admin_port=free_port(),
            picker=f"127.0.0.1:{self.picker_port}",
            dynamic_dir=str(self.directory / "dynamic"),
        )

    @property
    def port(self) -> int:
        return self.settings.listen_port

    def url(self, namespace: str, pool: str) -> str:
        from ardiff.wire import front_door_url

        return front_door_url(f"http://127.0.0.1:{self.port}", namespace, pool)

    @property
    def picker_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.picker_http_port}/metrics"

    def start(self) -> Self:
        write_tls_clusters(Path(str(self.settings.dynamic_dir)), {})
        self.start_picker()
        bootstrap = self.directory / "envoy.yaml"
        bootstrap.write_text(render(self.settings))
        log = self.directory / "envoy.log"
        self.envoy = subprocess.Popen(
            [
                str(ensure_envoy()),
                "-c",
                str(bootstrap),
                "--disable-hot-restart",
                "--concurrency",
                str(self.concurrency),
                "-l",
                "warning",
                "--log-path",
                str(log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        _wait_ready(f"http://127.0.0.1:{self.settings.health_port}/ready", self.envoy, log)
        return self

    def start_picker(self) -> None:
        log = self.directory / "picker.log"
        self.picker = subprocess.Popen(
            [
                str(gateway_venv() / "bin" / "ardiff"),
                "gateway",
                "picker",
                *(
                    ["--redis-url-file", str(self.redis_url_file)]
                    if self.redis_url_file is not None
                    else ["--redis-url", self.redis_url]
                ),
                "--listen",
                f"127.0.0.1:{self.picker_port}",
                "--http-listen",
                f"127.0.0.1:{self.picker_http_port}",
                "--dynamic-dir",
                str(self.settings.dynamic_dir),
                "--envoy-admin",
                f"127.0.0.1:{self.settings.admin_port}",
            ],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        _wait_ready(f"http://127.0.0.1:{self.picker_http_port}/readyz", self.picker, log)

    def stop_picker(self) -> None:
        if self.picker is not None and self.picker.poll() is None:
            self.picker.kill()
            self.picker.wait()

    def stop(self) -> None:
        self.stop_picker()
        if self.envoy is not None and self.envoy.poll() is None:
            self.envoy.terminate()
            try:
                self.envoy.wait(10)
            except subprocess.TimeoutExpired:
                self.envoy.kill()
                self.envoy.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
