"""Crash points (issue 40 item 2, Sieve's "intermediate state"): every write the operator makes is a named
point where a test can make the process exit right after the write took effect, as a crash between two writes
would leave things.

The points sit in the two client layers every operator write goes through, so that a restructure of the
operator does not move them: the Kubernetes client (`operator/kube.py`: `kube:create <plural>`,
`kube:patch <plural>[/<subresource>]`, `kube:delete <plural>`) and the placement store (`kv/scripts.py`:
`redis:<function>` for each FCALL of the library; FCALL_RO reads are not points). Events go through kopf's own
poster and its finalizer patches through kopf's client: neither is a point.

Read once at start-up from the environment, off by default; off, a point costs one attribute test:
- `ARDIFF_CRASH_AFTER=<point>` exits (`os._exit(CRASH_EXIT_CODE)`, no cleanup, as `kill -9` would) right after
  the first write at `<point>`; `<point>#<n>` after the n-th.
- `ARDIFF_CRASH_POINTS_LOG=<file>` appends each point's name to `<file>` as the process passes it (how a walk
  finds the points a scenario reaches).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

CRASH_AFTER_ENV = "ARDIFF_CRASH_AFTER"
CRASH_POINTS_LOG_ENV = "ARDIFF_CRASH_POINTS_LOG"
CRASH_EXIT_CODE = 87  # tells a crash point's exit from any other


class CrashPoints:
    """The process's crash setting (see the module docstring)."""

    def __init__(self, point: str | None = None, count: int = 1, log_path: Path | None = None) -> None:
        if count < 1:
            raise ValueError(f"{CRASH_AFTER_ENV}: the write count after '#' must be >= 1, got {count}")
        self.point = point
        self.remaining = count
        self.log_path = log_path
        self.on = point is not None or log_path is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CrashPoints:
        value = environ.get(CRASH_AFTER_ENV, "")
        point, _, count = value.partition("#")
        if count and not count.isdigit():
            raise ValueError(f"{CRASH_AFTER_ENV}={value!r}: expected <point> or <point>#<n> with n >= 1")
        logged = environ.get(CRASH_POINTS_LOG_ENV, "")
        return cls(point or None, int(count or 1), Path(logged) if logged else None)

    def passed(self, name: str) -> None:
        """A write at point `name` just took effect."""
        if not self.on:
            return
        if self.log_path is not None:
            with self.log_path.open("a") as file:
                file.write(f"{name}\n")
        if name == self.point:
            self.remaining -= 1
            if self.remaining == 0:
                log.warning("crash point %s reached: exiting with code %d", name, CRASH_EXIT_CODE)
                logging.shutdown()
                os._exit(CRASH_EXIT_CODE)


CRASH_POINTS = CrashPoints.from_environ(os.environ)


def passed(name: str) -> None:
    """A write at point `name` just took effect (see `CrashPoints.passed`)."""
    CRASH_POINTS.passed(name)
