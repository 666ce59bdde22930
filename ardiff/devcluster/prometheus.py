"""A real Prometheus (Debian's `prometheus`, `make packages`) that scrapes chosen `/metrics` URLs and
evaluates the chart's alerting rules (charts/ardiff/monitoring/alerts.rules.yaml), for tests and benchmarks:
what it queries and which alerts it holds are what an operator of the system would see.

It scrapes and evaluates every second (a real one: 15-60 s), keeps its data in a temporary directory and
listens on a free loopback port. `alerts()` lists the alerts in both states, `pending` (the expression holds,
its `for` has not passed yet) and `firing`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
import yaml

from ardiff.worker.net import free_port

CHECKOUT = Path(__file__).resolve().parents[2]
ALERT_RULES = CHECKOUT / "charts" / "ardiff" / "monitoring" / "alerts.rules.yaml"
START_SECONDS = 30.0


def rules_held_for(seconds: float, directory: Path) -> Path:
    """The chart's rules with every `for` shortened to `seconds`, written into `directory`: the expressions as
    shipped, so that a test sees an alert fire within seconds (the `for`s themselves are covered by
    `promtool test rules`, tests/chart/alerts_test.yaml)."""
    rules = yaml.safe_load(ALERT_RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{seconds:g}s"
    path = directory / "alerts-held-short.rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


@dataclass
class Prometheus:
    """`prometheus` scraping `targets` (http URLs of /metrics) with `rule_files`; `start()`, then `stop()`."""

    targets: Sequence[str]
    rule_files: Sequence[Path] = (ALERT_RULES,)
    # Labels a target's series get (by its URL): what Kubernetes' service discovery adds in a cluster, such as
    # `namespace` and `pod`, which the workers' own series do not carry and the dashboard selects on.
    target_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    interval: str = "1s"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    _directory: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (make packages installs it with apt-get)")
        self._directory = tempfile.TemporaryDirectory(prefix="ardiff-prometheus-")
        directory = Path(self._directory.name)
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config()))
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(directory / "prometheus.log").open("wb"),
        )
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus was not ready within {START_SECONDS} s: {self.log()[-3000:]}")

    def _config(self) -> dict[str, Any]:
        jobs = []
        for index, target in enumerate(self.targets):
            parts = urlsplit(target)
            jobs.append(
                {
                    "job_name": f"target-{index}",
                    "metrics_path": parts.path or "/metrics",
                    "static_configs": [
                        {"targets": [parts.netloc], "labels": dict(self.target_labels.get(target, {}))}
                    ],
                }
            )
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": jobs,
        }

    def log(self) -> str:
        if self._directory is None:
            return ""
        path = Path(self._directory.name) / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _api(self, path: str, **params: str) -> Any:
        reply = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        if reply.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {reply}")
        return reply["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """The instant vector (or an empty list) of `expression` now."""
        return self._api("query", query=expression)["result"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing: `labels`, `state`, `annotations`, `value`."""
        return self._api("alerts")["alerts"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._directory is not None:
            self._directory.cleanup()
            self._directory = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
