"""Kept history (issue 26): sessions' states at their last chunk boundaries, in this pod's host memory, within
a byte budget per pod (`ARDIFF_HISTORY_BYTES`), for a rewind and for forks.

Kept chunk N of a session is its export (docs/contracts.md §9, the bytes `export_session` writes) at the
boundary before chunk N: its book's `next_chunk_index` is N. A session whose record keeps K > 0 boundaries
(`history_keep_chunks`) has one kept after each committed chunk, on the forward thread in the tick's forward
lock hold (the state is at the boundary then, and nothing else runs); its oldest beyond K go first, and one
that still does not fit the budget is not kept (logged, counted: the tick goes on). A rewind installs one as
the same session and drops those after it (history is linear); a fork installs one as another session,
read from here or pulled over `GET /internal/v1/kept/{session}/{chunk}` (worker/transfer.py), and never
consumes it. A reset, a close, a release (suspension, migration, eviction) drop the session's history: kept
chunks are volatile, they die with the pod and never travel in an export.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ardiff.kv.records import kept_location
from ardiff.worker.host_tier import HostCopy
from ardiff.worker.pieces import PieceCollector
from ardiff.worker.session_export import Writable


class HistoryFull(Exception):
    """A kept chunk does not fit what is left of the budget (it is not kept)."""


class KeptChunks:
    """Kept exports by (session, chunk) within `budget_bytes`. Written on the forward thread, read and dropped
    on the event loop: one lock guards the copies and the bytes they use."""

    def __init__(self, budget_bytes: int, pod: str) -> None:
        self.budget_bytes = budget_bytes
        self._pod = pod
        self._kept: dict[str, dict[int, HostCopy]] = {}  # session -> chunk -> its export, ascending chunks
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used

    def chunks(self, session_id: str) -> list[int]:
        """The chunk boundaries kept of the session, ascending."""
        with self._lock:
            return sorted(self._kept.get(session_id, {}))

    def keep(self, session_id: str, chunk: int, keep_chunks: int, export: Callable[[Writable], int]) -> None:
        """Keep the session's boundary `chunk`, written by `export(out)`, after dropping its oldest so that at
        most `keep_chunks` stay (a boundary kept before is replaced). `HistoryFull` (not kept) when it does
        not fit what is left of the budget."""
        with self._lock:
            kept = self._kept.setdefault(session_id, {})
            self._drop(session_id, [chunk] if chunk in kept else [])
            self._drop(session_id, sorted(kept)[: max(0, len(kept) - keep_chunks + 1)])
            room = self.budget_bytes - self._used
        collector = PieceCollector(room, HistoryFull)
        export(collector)
        copy = HostCopy(session_id, kept_location(self._pod, session_id, chunk), collector.finish())
        with self._lock:
            if self._used + copy.size > self.budget_bytes:
                raise HistoryFull(f"the kept chunk's {copy.size} bytes no longer fit the history budget")
            self._kept.setdefault(session_id, {})[chunk] = copy
            self._used += copy.size

    def get(self, session_id: str, chunk: int) -> HostCopy | None:
        """The session's kept boundary `chunk` (reading it consumes nothing); None when not kept."""
        with self._lock:
            return self._kept.get(session_id, {}).get(chunk)

    def drop_after(self, session_id: str, chunk: int) -> list[int]:
        """A rewind to `chunk`: drop the session's boundaries after it; the ones still kept."""
        with self._lock:
            kept = self._kept.get(session_id, {})
            self._drop(session_id, [index for index in kept if index > chunk])
            return sorted(self._kept.get(session_id, {}))

    def drop(self, session_id: str) -> None:
        """Forget the session's history (reset, close, release)."""
        with self._lock:
            self._drop(session_id, list(self._kept.get(session_id, {})))

    def _drop(self, session_id: str, chunks: list[int]) -> None:
        kept = self._kept.get(session_id, {})
        for chunk in chunks:
            self._used -= kept.pop(chunk).size
        if not kept:
            self._kept.pop(session_id, None)
