"""Helpers for the dev cluster's tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ardiff.devcluster.kube_api import KubeAPIThread


class Watcher:
    """Reads a watch stream on a thread (with its own client) and collects its events."""

    def __init__(self, base_url: str, url: str, **params: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._ready = threading.Event()
        args = (base_url, url, {"watch": "true", "timeoutSeconds": "6", **params})
        threading.Thread(target=self._read, args=args, daemon=True).start()
        assert self._ready.wait(5)

    def _read(self, base_url: str, url: str, params: dict[str, str]) -> None:
        with (
            httpx.Client(base_url=base_url, timeout=None) as client,
            client.stream("GET", url, params=params) as response,
        ):
            self._ready.set()
            for line in response.iter_lines():
                if line:
                    self.events.append(json.loads(line))

    def wait(self, count: int, timeout: float = 5) -> list[tuple[str, str]]:
        """(type, name) of the first `count` events, once they arrived."""
        deadline = time.monotonic() + timeout
        while len(self.events) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return [(e["type"], e["object"].get("metadata", {}).get("name", "")) for e in self.events[:count]]


@pytest.fixture
def watch(kube_api: KubeAPIThread) -> Callable[..., Watcher]:
    """`watch(url, **params)`: a Watcher on the emulated API (a `?watch=true` stream, closed after 6 s)."""
    return lambda url, **params: Watcher(kube_api.url, url, **params)
