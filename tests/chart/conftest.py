"""The chart under test, rendered by the real `helm` binary (`make setup` puts it in the venv's bin)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# The variants every static check runs over: the defaults and one per optional feature.
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-redis-secret": {
        "redis": {
            "mode": "external",
            "external": {
                "existingSecret": "team-redis",
                "existingSecretKey": "uri",
                "tls": {"caSecret": "redis-ca"},
            },
        }
    },
    "external-redis-url": {
        "redis": {"mode": "external", "external": {"url": "rediss://:s3cret@redis.example.com:6380/2"}}
    },
    "redis-auth-secret": {
        "imagePullSecrets": [{"name": "ghcr-pull"}],
        "redis": {"bundled": {"auth": {"existingSecret": "team-redis-auth"}}},
        "defaultPool": {"enabled": True},
    },
    "bundled-redis-tls": {"redis": {"bundled": {"tls": {"secretName": "redis-tls"}}}},
    "cluster-wide": {"clusterWide": True, "operator": {"replicas": 2}},
    "monitoring": {
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "grafanaDashboard": {"enabled": True},
        }
    },
    "default-pool": {"defaultPool": {"enabled": True, "spec": {"replicas": {"max": 3}}}},
    "multi-namespace": {
        "operator": {"replicas": 3, "watchNamespaces": ["team-a", "team-b"]},
        "redis": {"bundled": {"persistence": {"enabled": True, "storageClassName": "fast"}}},
        "networkPolicy": {
            "workerClients": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "router"}}},
                {"podSelector": {"matchLabels": {"app": "prometheus"}}},
            ]
        },
    },
}


@dataclass(frozen=True)
class Chart:
    """charts/ardiff installed as release `release` into `namespace` (rendered offline, never installed)."""

    path: Path = ROOT / "charts" / "ardiff"
    helm_binary: Path = Path(sys.executable).parent / "helm"
    release: str = "rel"
    namespace: str = "worlds"

    @property
    def fullname(self) -> str:
        """The chart's `ardiff.fullname`: the release name, plus `-ardiff` unless it contains it."""
        return self.release if "ardiff" in self.release else f"{self.release}-ardiff"

    def helm(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """Runs helm; the caller checks the return code."""
        return subprocess.run(
            [str(self.helm_binary), *map(str, args)], capture_output=True, text=True, check=False
        )

    def helm_with_values(
        self, command: str, values: dict[str, Any], *args: str
    ) -> subprocess.CompletedProcess[str]:
        """`helm <command>` on the chart with `values` given as a values file (as users pass them)."""
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(values, file)
            file.flush()
            if command == "lint":
                return self.helm(
                    "lint", "--strict", self.path, "--namespace", self.namespace, "--values", file.name
                )
            return self.helm(
                command, self.release, self.path, "--namespace", self.namespace, "--values", file.name, *args
            )

    def render(self, values: dict[str, Any] | None = None, *args: str) -> list[dict[str, Any]]:
        """`helm template` with `values`; the rendered objects, in order."""
        result = self.helm_with_values("template", values or {}, *args)
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session")
def chart() -> Chart:
    return Chart()


@pytest.fixture(params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The values of one variant (a test that takes it runs once per variant)."""
    return VARIANTS[request.param]
