"""The exports this pod writes and reads (docs/contracts.md §9), in whichever tier they lie, and those it
still answers for.

An export goes to this pod's host tier (worker/host_tier.py: its memory, within a budget) or the pool's
shared tier (worker/shared_tier.py: a volume every pod mounts); `Exports` writes and reads both through the
runtime (its methods that do run on the forward thread: worker/pod_state.py), and removes what is no longer
needed. It keeps two books the worker's collaborators share: each session's latest snapshot (the next
replaces it, a close removes it) and each suspension written but not yet reported to the placement store
(`UnreportedExport`, for the suspend's retry), and the sessions' kept history (worker/history.py: their
last chunk boundaries in this pod's memory, for a rewind and for forks). It touches nothing else: when to
export, import or forget is its callers' (worker/continuity.py; the one release path of its owner,
worker/pod_sessions.py; the transfer's claims and spill, which read the tiers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ardiff.worker.errors import ExportCorrupt
from ardiff.worker.history import KeptChunks
from ardiff.worker.host_tier import HostTier, HostTierFull, host_holder
from ardiff.worker.pod_state import ForwardThread
from ardiff.worker.session_book import SessionBook
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.shared_tier import ExportKind, SharedTier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnreportedExport:
    """A suspension's export written but not yet reported (`mark_suspended` failed): a retry of the suspend
    reports it again instead of writing another, which would leave this one behind."""

    tier: str
    location: str
    size: int
    chunk: int
    holder: str | None

    def fits(self, book: SessionBook, holder: str | None) -> bool:
        """Still the session's state (no tick since: a suspending session is not ticked) and kind."""
        return self.chunk == book.next_chunk_index and self.holder == holder


class Exports:
    """The shared tier (None without `suspend_dir`) and the host tier (None without `host_tier_bytes`) as this
    pod uses them, with its sessions' latest `snapshots` and `unreported` suspensions."""

    def __init__(self, settings: WorkerSettings, forward: ForwardThread) -> None:
        self.tier = (
            SharedTier(settings.suspend_dir, settings.namespace, settings.pool)
            if settings.suspend_dir
            else None
        )
        # The host tier: suspended sessions' exports in this pod's memory, within a byte budget.
        self.host_tier = (
            HostTier(settings.host_tier_bytes, settings.pod_name) if settings.host_tier_bytes else None
        )
        # Kept history (issue 26): sessions' last chunk boundaries, for a rewind and for forks.
        self.history = KeptChunks(settings.history_bytes, settings.pod_name)
        self.snapshots: dict[str, str] = {}  # session -> the location of its latest snapshot
        self.unreported: dict[str, UnreportedExport] = {}  # suspensions whose report failed, for the retry
        self._forward = forward

    @property
    def any_tier(self) -> bool:
        """A tier to suspend sessions to: evictions and migrations keep them instead of dropping them."""
        return self.tier is not None or self.host_tier is not None

    def write_shared(
        self, session_id: str, book: SessionBook, kind: ExportKind, holder: str | None = None
    ) -> tuple[str, int]:
        """On the forward thread: the session's export written to the shared tier; its location, size."""
        assert self.tier is not None
        runtime = self._forward.runtime
        assert runtime is not None
        return self.tier.write(
            session_id, kind, lambda out: runtime.export_session(session_id, out, book=book), holder=holder
        )

    def write_suspension(
        self, session_id: str, book: SessionBook, holder: str | None
    ) -> tuple[str, str, int]:
        """On the forward thread: a suspended session's export; (tier, location, size). This pod's host memory
        when it fits (no holder: a migration with a shared tier keeps the session in the runner instead),
        else the shared tier; `HostTierFull` when neither takes it."""
        runtime = self._forward.runtime
        assert runtime is not None
        if self.host_tier is not None and holder is None:
            try:
                location, size = self.host_tier.write(
                    session_id, lambda out: runtime.export_session(session_id, out, book=book)
                )
                return "host", location, size
            except HostTierFull as exc:
                if self.tier is None:
                    raise
                log.info("session %s goes to the shared tier: %s", session_id, exc)
        location, size = self.write_shared(session_id, book, "suspend", holder)
        return "shared", location, size

    def keep_boundary(self, session_id: str, book: SessionBook, keep_chunks: int) -> None:
        """On the forward thread: keep the session's state at its boundary `book.next_chunk_index` in the
        history (`KeptChunks.keep`; `HistoryFull` when it does not fit)."""
        runtime = self._forward.runtime
        assert runtime is not None
        self.history.keep(
            session_id,
            book.next_chunk_index,
            keep_chunks,
            lambda out: runtime.export_session(session_id, out, book=book),
        )

    def read_host(self, location: str) -> SessionBook:
        """On the forward thread: install the export this pod keeps in its host memory at `location`."""
        runtime = self._forward.runtime
        assert runtime is not None
        if self.host_tier is None:
            raise ExportCorrupt(
                f"this worker keeps no host tier (ARDIFF_HOST_TIER_BYTES) to resume {location}"
            )
        return runtime.import_session(self.host_tier.get(location).reader())

    def read_shared(self, location: str) -> SessionBook:
        """On the forward thread: install the export at `location`; the book that travelled with it."""
        assert self.tier is not None
        runtime = self._forward.runtime
        assert runtime is not None
        with self.tier.open(location) as source:
            return runtime.import_session(source)

    def forget(self, location: str) -> None:
        """Remove an export this pod wrote that is no longer needed, in whichever tier it lies."""
        if host_holder(location) is not None:
            if self.host_tier is not None:
                self.host_tier.remove(location)
        elif self.tier is not None:
            self.tier.remove(location)

    def release(self, session_id: str, *, keep_snapshot: bool) -> None:
        """A session released here: its snapshot removed (unless `keep_snapshot`: a suspended session resumes
        from it), its kept history, and a suspension it never reported."""
        self.history.drop(session_id)
        snapshot = self.snapshots.pop(session_id, None)
        if snapshot and not keep_snapshot and self.tier is not None:  # closed: its snapshot is of no use
            self.tier.remove(snapshot)
        unreported = self.unreported.pop(session_id, None)
        if unreported is not None:  # closed or evicted before its suspension was reported
            self.forget(unreported.location)
