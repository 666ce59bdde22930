"""Helpers for the dev cluster's tests."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.kubeconfig import Credentials


class Watcher:
    """Reads a watch stream on a thread (with its own client) and collects its events."""

    def __init__(self, credentials: Credentials, url: str, **params: str) -> None:
        self.events: list[dict[str, Any]] = []
        self._ready = threading.Event()
        args = (credentials, url, {"watch": "true", "timeoutSeconds": "6", **params})
        threading.Thread(target=self._read, args=args, daemon=True).start()
        assert self._ready.wait(5)

    def _read(self, credentials: Credentials, url: str, params: dict[str, str]) -> None:
        with (
            contextlib.suppress(httpx.TransportError),  # a server that goes away ends the stream too
            credentials.client(timeout=30) as client,  # the server ends the stream after 6 s
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
def watch(dev_cluster: DevCluster) -> Callable[..., Watcher]:
    """`watch(url, **params)`: a Watcher on the session's API server as its admin (a `?watch=true` stream,
    closed after 6 s)."""
    return lambda url, **params: Watcher(dev_cluster.admin, url, **params)
