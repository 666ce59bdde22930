"""Polling for whatever watches a running dev cluster: the tests of the operator tier and the chart, and the
benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None], *, timeout: float = 30, what: str = "condition", poll: float = 0.1
) -> T:
    """Poll until `predicate()` is truthy and return it; fail with the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
