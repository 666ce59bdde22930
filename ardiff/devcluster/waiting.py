"""Polling for whatever watches a running dev cluster: the tests of the operator tier and the chart, and the
benchmarks, and the status conditions they poll for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def condition_true(obj: dict[str, Any], condition_type: str) -> bool:
    """Whether `obj`'s status holds `condition_type` with status "True".

    The API server writes `status.conditions: null` on some kinds (a CRD's conditions have no omitempty) until
    a controller sets the first one, so an absent status, an absent list and a null list all mean "not yet".
    """
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == condition_type and c.get("status") == "True" for c in conditions)


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
