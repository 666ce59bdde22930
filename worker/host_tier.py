"""The host tier (issue 12): exports of suspended sessions kept in the worker's own host memory, within a
byte budget per pod (`ARDIFF_HOST_TIER_BYTES`).

An eviction frees the session's slot and its KV blocks in the runner; the export (docs/contracts.md §9)
waits here instead of on the shared volume: resuming on this pod imports it from memory, another pod pulls
it over the transfer endpoint (worker/transfer.py) as it pulls a migrated session. A pull does not consume the
copy: it stays until the store no longer points at it (`copy_needed`: the puller reported it resumed, or the
session was closed), so a refusal or a failure on the pulling pod loses nothing. What does not fit the
budget goes to the shared tier (when the pod mounts one), else the session is evicted as before. A copy is
volatile: it dies with the pod, so a draining pod moves its copies to the shared tier, and a session whose
copy is gone resumes from its snapshot or needs a reset (contracts §2).

A location is `host:<pod>/<session>/<nonce>`: it names the pod holding the copy, which is all another pod
needs to pull it; the store records it as an opaque string with `tier=host`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ardiff.kv.records import SessionBinding, SessionState
from ardiff.worker.errors import ExportCorrupt
from ardiff.worker.pieces import BodyReader, PieceCollector
from ardiff.worker.session_export import Writable

HOST_PREFIX = "host:"


def host_holder(location: str) -> str | None:
    """The pod a host-tier location names as holding the copy (None: not a host-tier location)."""
    if not location.startswith(HOST_PREFIX):
        return None
    pod = location[len(HOST_PREFIX) :].partition("/")[0]
    return pod or None


def copy_needed(binding: SessionBinding | None, location: str) -> bool:
    """Whether the store may still send someone to the copy at `location`: a session without a record (no
    verdict: the operator may restore it), one being suspended (its report is on the way), one placed to
    import it (`resume_from`, a `lost` one included) or suspended at it. Closed, resumed, evicted or
    re-exported sessions no longer need it."""
    if binding is None or binding.state is SessionState.SUSPENDING or binding.resume_from == location:
        return True
    return binding.state is SessionState.SUSPENDED and binding.location == location


class HostTierFull(Exception):
    """The export does not fit what is left of the budget (the caller uses the shared tier instead)."""


@dataclass(frozen=True)
class HostCopy:
    """One session's export in host memory, in the pieces it was written in."""

    session_id: str
    location: str
    pieces: tuple[memoryview, ...]

    @property
    def size(self) -> int:
        return sum(len(piece) for piece in self.pieces)

    def reader(self) -> BodyReader:
        return BodyReader(iter(self.pieces))

    def write_to(self, out: Writable) -> int:
        """Write the export to `out` (moving it to the shared tier); the bytes written."""
        for piece in self.pieces:
            out.write(piece)
        return self.size


class HostTier:
    """Exports by session, within `budget_bytes`. Written on the forward thread, read and dropped on the
    event loop: one lock guards the copies and the bytes they use."""

    def __init__(self, budget_bytes: int, pod: str) -> None:
        self.budget_bytes = budget_bytes
        self._pod = pod
        self._copies: dict[str, HostCopy] = {}
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    def write(self, session_id: str, export: Callable[[Writable], int]) -> tuple[str, int]:
        """Keep one export written by `export(out)`; its location and size. `HostTierFull` (nothing kept)
        when it does not fit the budget left; a session's earlier copy is replaced."""
        with self._lock:
            previous = self._copies.get(session_id)
            room = self.budget_bytes - self._used + (previous.size if previous else 0)
        collector = PieceCollector(room, HostTierFull)
        export(collector)
        pieces = collector.finish()
        location = f"{HOST_PREFIX}{self._pod}/{session_id}/{uuid.uuid4().hex[:12]}"
        copy = HostCopy(session_id, location, pieces)
        with self._lock:
            replaced = self._copies.get(session_id)
            if self._used - (replaced.size if replaced else 0) + copy.size > self.budget_bytes:
                raise HostTierFull(f"the export's {copy.size} bytes no longer fit the host tier")
            self._used += copy.size - (replaced.size if replaced else 0)
            self._copies[session_id] = copy
        return location, copy.size

    def get(self, location: str) -> HostCopy:
        """The copy at `location` (kept); `ExportCorrupt` when this pod holds no such copy."""
        with self._lock:
            copy = self._copies.get(self._session_of(location))
        if copy is None or copy.location != location:
            raise ExportCorrupt(f"no export {location!r} in this pod's host tier (the pod restarted?)")
        return copy

    def copy_of(self, session_id: str) -> HostCopy | None:
        """The session's copy (kept: a pull does not consume it), None when there is none."""
        with self._lock:
            return self._copies.get(session_id)

    def remove(self, location: str) -> None:
        """Forget the copy at `location` (resumed, closed, or moved to the shared tier)."""
        with self._lock:
            copy = self._copies.get(self._session_of(location))
            if copy is not None and copy.location == location:
                del self._copies[copy.session_id]
                self._used -= copy.size

    def copies(self) -> list[HostCopy]:
        with self._lock:
            return list(self._copies.values())

    def _session_of(self, location: str) -> str:
        return location[len(HOST_PREFIX) :].partition("/")[2].partition("/")[0]
