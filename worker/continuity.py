"""Session continuity (issue 12; docs/contracts.md §2, §9): a session outlives the pod that ran it.

A `suspend` event exports the session at a tick boundary (this pod's host tier, else the shared tier; a
migration's stays in the runner too, held for its new pod to pull: worker/transfer.py), reports it to the
placement store and only then frees its slot. The pod a suspended session is placed on imports its export
before its first tick (`resume`): pulled from the pod holding it when one does, else read from a tier, else
its snapshot (the client is told `rewound`), else it needs a reset; a refusal (no room, another model) loses
nothing. Periodic snapshots go to the shared tier, and a sweep removes the tiers' files of sessions the store
closed. It talks only to the pod's sessions (worker/pod_sessions.py): it reads and writes their books and
export books (worker/exports.py), calls the runtime on their forward thread, admits and releases through them
and pulls and holds through their transfer (worker/transfer.py); it keeps no state of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, NoReturn

from ardiff.kv import errors as placement
from ardiff.kv.records import SessionRecord, SessionState, parse_kept_location
from ardiff.worker.errors import (
    AtCapacity,
    ExportCorrupt,
    ExportIdentityMismatch,
    ExportNoCapacity,
    NotReady,
    ResetRequired,
    Resuming,
    SessionExportError,
    TransferFailed,
)
from ardiff.worker.export_download import TransferResult
from ardiff.worker.exports import UnreportedExport
from ardiff.worker.host_tier import HostTierFull, copy_needed, host_holder
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.pod_sessions import PodSessions
from ardiff.worker.session_book import SessionBook, SessionStatus
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.shared_tier import direct_source
from ardiff.worker.transfer import kept_url, transfer_url

log = logging.getLogger(__name__)


def export_kind(location: str) -> str:
    """What an export location holds: `host` (a pod's host-tier copy), `fork` (another session's kept chunk:
    worker/history.py), a `snapshot` or a `suspend` export in the shared tier."""
    if host_holder(location) is not None:
        return "host"
    if parse_kept_location(location) is not None:
        return "fork"
    return "snapshot" if Path(location).name.startswith("snapshot-") else "suspend"


def resume_note(
    record: SessionRecord,
    location: str,
    kind: str,
    pulled: dict[str, TransferResult | None],
    seconds: float,
    *,
    pod: str,
) -> dict[str, Any]:
    """How a resume went, for the operator's Event (contracts §2 `resumed_note`): where the export came from
    (`direct` from the pod that held it, else this pod's own `host` tier or the shared tier's `suspend` or
    `snapshot` copy; a `fork` from its parent's kept chunk, here or pulled), its bytes and the seconds until
    it was installed, and whether a direct pull failed first."""
    direct = pulled.get(location)
    if kind == "fork":
        source, size, took = kind, direct.bytes if direct is not None else None, seconds
    elif direct is not None:
        source, size, took = "direct", direct.bytes, direct.seconds
    else:
        source, took = kind, seconds
        size = record.bytes if location == record.location and record.bytes else None
    kept = parse_kept_location(location)
    return {
        "source": source,
        "bytes": size,
        "seconds": round(took, 4),
        "from": host_holder(location) or direct_source(location) or (kept[0] if kept else ""),
        "to": pod,
        "direct_failed": location in pulled and direct is None,
    }


class Continuity:
    """Suspend, resume, snapshot and sweep for one pod (the module's docstring); placement mode only."""

    def __init__(
        self,
        settings: WorkerSettings,
        sessions: PodSessions,
        metrics: WorkerMetrics,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics

    # ---------------------------------------------------------------- resume

    async def resume(
        self, session_id: str, record: SessionRecord, *, direct_only: bool = False
    ) -> SessionBook:
        """Import the export the store placed here (`resume_from`) before the session's first tick.

        An export that cannot be used (corrupt, truncated) falls back to the session's snapshot when there is
        one (the client is then told `rewound`), else the session needs a reset. A refusal loses nothing: a
        worker without room for the export answers 429 and leaves everything as it was (retried later), one of
        another identity gives the session back, suspended at the same copy (`_give_back`).
        `direct_only` (a prefetch, no tick waiting): only a pull from the holding pod; any failure leaves
        everything as it was for the first tick to resume the usual way.
        """
        await self.sessions.transfer.drop_held(
            session_id, "placed back on this pod: it resumes from the shared tier"
        )
        await self.sessions.admit(session_id, record)
        started = time.perf_counter()
        candidates = [record.resume_from]
        if record.snapshot_location and record.snapshot_location != record.resume_from and not direct_only:
            candidates.append(record.snapshot_location)
        failures = []
        pulled: dict[str, TransferResult | None] = {}  # pod-to-pod attempts by location (None: failed)
        for location in candidates:
            try:
                size = record.bytes if location == record.location else 0
                book = await self._import(session_id, location, pulled, size=size, direct_only=direct_only)
            except ExportNoCapacity as exc:
                self.sessions.books.pop(session_id, None)
                raise AtCapacity(f"no room to resume session {session_id!r} here: {exc}") from None
            except SessionExportError as exc:
                if direct_only:
                    self.sessions.books.pop(session_id, None)
                    raise
                if isinstance(exc, ExportIdentityMismatch) and location == record.location:
                    await self._give_back(session_id, record, exc)  # a refusal: the export itself is fine
                log.warning("session %s could not be resumed from %s: %s", session_id, location, exc)
                failures.append(exc.code)
                continue
            break
        else:
            self.sessions.books.pop(session_id, None)
            await self.sessions.placement.resumed(
                session_id
            )  # the exports are of no use: never try them again
            await self.sessions.mark_reset_required(session_id)
            raise ResetRequired(
                f"session {session_id!r} could not be resumed ({', '.join(failures)}); "
                "send reset=true with chunk_index=0"
            )
        book = self.sessions.books[session_id] = dataclasses.replace(book, token_sha256=record.token_sha256)
        kind = export_kind(location)
        seconds = time.perf_counter() - started
        note = resume_note(record, location, kind, pulled, seconds, pod=self.sessions.placement.pod)
        try:
            await self.sessions.placement.resumed(session_id, note=json.dumps(note, sort_keys=True))
        except placement.SessionNotHere as exc:
            # Taken from this pod while it was imported (the pod's lease lapsed, the session was placed
            # again): the import is not this pod's to serve. The caller retries and is sent where it is.
            await self.sessions.release(session_id, "stale")
            raise NotReady(f"session {session_id!r} left this pod while it was resumed here: {exc}") from None
        except placement.PodFenced:
            self.sessions.fence()
            raise NotReady("this pod was fenced (a newer incarnation, or its lease was reaped)") from None
        if kind not in ("snapshot", "fork"):  # a fork never consumes its parent's kept chunk
            self.sessions.exports.forget(location)
        # The snapshot the session continues with, written here or by the pod it came from: this pod's next
        # snapshot replaces it (and removes it), as it replaces its own.
        adopted = location if kind == "snapshot" else record.snapshot_location
        if adopted:
            self.sessions.exports.snapshots[session_id] = adopted
        self.metrics.resumes.labels(note["source"]).inc()
        self.metrics.continuity_seconds.labels("import").observe(seconds)
        log.info("resumed session %s at chunk %d from its %s", session_id, book.next_chunk_index, kind)
        return book

    async def resume_offered(self, session_id: str) -> None:
        """Import a session placed here from the pod holding it, before its first tick (the holder offered it:
        `Transfer.prefetch`); anything that stands in the way (not placed here, a tick already at it, no room,
        the pull failing) leaves it to that tick, which resumes it the usual way."""
        try:
            record = await self.sessions.placement.session(session_id)
            book = self.sessions.books.get(session_id)
            if (
                record is None
                or not record.resume_from
                or not self.sessions.placement.is_here(record)
                or (book is not None and book.holds_slot)
            ):
                return
            with self.sessions.books.exclusive(session_id):
                await self.resume(session_id, record, direct_only=True)
        except Exception as exc:
            log.info("prefetch of session %s left to its first tick: %s", session_id, exc)

    async def _give_back(self, session_id: str, record: SessionRecord, refusal: Exception) -> NoReturn:
        """This worker cannot import the session's export (another model, resolution, dtype: another
        identity): the session goes back to `suspended` at the same copy, its slot here freed, so a pod that
        can import it resumes it on the next demand. The tick is told to retry (`resuming`)."""
        self.sessions.books.pop(session_id, None)
        try:
            await self.sessions.placement.mark_suspended(
                session_id,
                tier=record.tier,
                location=record.location,
                size=record.bytes,
                chunk_index=record.suspended_chunk,
            )
        except Exception as exc:  # still placed here: the next tick refuses it again and gives it back
            raise NotReady(
                f"could not give session {session_id!r} back to the placement store: {exc}"
            ) from exc
        log.warning("gave session %s back: this worker cannot import its export (%s)", session_id, refusal)
        raise Resuming(
            f"session {session_id!r} was placed on a worker that cannot import its export ({refusal}); it "
            "waits suspended for one that can, retry"
        )

    async def _import(
        self,
        session_id: str,
        location: str,
        pulled: dict[str, TransferResult | None],
        *,
        size: int,
        direct_only: bool = False,
    ) -> SessionBook:
        """Install the export at `location` (`size` bytes, as the store recorded it) as `session_id`; refused
        (typed) when it holds another one.

        A migration's export names the pod that still holds the session: it is pulled from there first
        (`Transfer.pull`), and the shared tier's copy is read only when that fails. A host-tier export is read
        from this pod's memory, or pulled from the pod that keeps it (it has no other copy)."""
        kept = parse_kept_location(location)
        if kept is not None:
            return await self._import_fork(session_id, location, *kept, pulled)
        runtime = self.sessions.forward.runtime
        assert runtime is not None
        source = await self.sessions.transfer.source_of(location)
        holder = host_holder(location)
        if source is None:
            direct = None
        else:
            pod, endpoint = source
            direct = await self.sessions.transfer.pull(
                session_id, pod, transfer_url(endpoint, session_id), size=size
            )
        if source is not None:
            pulled[location] = None if direct is None else direct[1]
        async with self.sessions.forward.lock.hold():
            if direct is not None:
                book = direct[0]
            elif direct_only:
                raise TransferFailed(f"session {session_id!r} could not be pulled from the pod holding it")
            elif holder is not None and holder != self.sessions.placement.pod:
                raise ExportCorrupt(f"the host-tier export {location} could not be pulled from pod {holder}")
            elif holder is not None:
                book = await self.sessions.forward.run(self.sessions.exports.read_host, location)
            elif self.sessions.exports.tier is None:
                raise ExportCorrupt("this worker mounts no shared tier (ARDIFF_SUSPEND_DIR) to resume from")
            else:
                book = await self.sessions.forward.run(self.sessions.exports.read_shared, location)
            if book.session_id != session_id:
                await self.sessions.forward.run(runtime.close, book.session_id)
                raise ExportCorrupt(f"{location} holds session {book.session_id!r}, not {session_id!r}")
        return book

    async def _import_fork(
        self, session_id: str, location: str, pod: str, parent: str, chunk: int, pulled: dict[str, Any]
    ) -> SessionBook:
        """Install the parent's kept chunk `chunk` (issue 26) as the fork `session_id`: read from this pod's
        history, or pulled from the pod that keeps it (`GET /internal/v1/kept/...`, at most the bytes a pod
        keeps in history). The parent's copy stays. `ExportCorrupt` when it is kept nowhere any more (the
        parent rewound, reset or closed, its pod gone): the fork then needs a reset."""
        runtime = self.sessions.forward.runtime
        assert runtime is not None
        if pod != self.sessions.placement.pod:
            endpoint = await self.sessions.transfer.endpoint_of(pod)
            if endpoint is None:
                raise ExportCorrupt(
                    f"the kept chunk {location} cannot be pulled: pod {pod} cannot be reached"
                )
            url = kept_url(endpoint, parent, chunk)
            direct = await self.sessions.transfer.pull(
                session_id, pod, url, size=self.settings.history_bytes, as_session=session_id
            )
            pulled[location] = None if direct is None else direct[1]
            if direct is None:
                raise ExportCorrupt(f"the kept chunk {location} could not be pulled from pod {pod}")
            return direct[0]
        async with self.sessions.forward.lock.hold():
            copy = self.sessions.exports.history.get(parent, chunk)
            if copy is None:
                raise ExportCorrupt(
                    f"this pod no longer keeps chunk {chunk} of session {parent!r} (rewound, reset or closed)"
                )
            # The parent, still at that chunk here, lends the fork its KV blocks (worker/block_share.py).
            return await self.sessions.forward.run(
                runtime.import_session, copy.reader(), as_session=session_id, share_with=parent
            )

    # ---------------------------------------------------------------- snapshot and suspend

    async def snapshot(self, session_id: str) -> None:
        """A periodic snapshot to the shared tier; the previous one is replaced. A failure costs nothing but
        the snapshot (logged): the session goes on."""
        book = self.sessions.books.get(session_id)
        tier = self.sessions.exports.tier
        if tier is None or book is None or book.status is not SessionStatus.ACTIVE:
            return
        started = time.perf_counter()
        try:
            location, size = await self.sessions.export(
                session_id, self.sessions.exports.write_shared, book, "snapshot"
            )
        except Exception as exc:
            log.warning("snapshot of session %s failed: %s", session_id, exc)
            return
        try:
            await self.sessions.placement.note_snapshot(
                session_id, location=location, chunk_index=book.next_chunk_index
            )
        except Exception as exc:  # nothing points at it: it would stay until the session is closed
            log.warning("snapshot of session %s failed: %s (removed)", session_id, exc)
            tier.remove(location)
            return
        snapshots = self.sessions.exports.snapshots
        previous, snapshots[session_id] = snapshots.get(session_id), location
        if previous:
            tier.remove(previous)
        self.metrics.continuity_bytes.labels("snapshot").inc(size)
        self.metrics.continuity_seconds.labels("snapshot").observe(time.perf_counter() - started)

    async def suspend(self, session_id: str, reason: str) -> None:
        """A `suspend` event: export the session to the shared tier at a tick boundary, report it, release it.

        The slot stays taken until the store hears of the export (`suspending`), so the runner never holds
        more than its capacity. An export that fails (or a session that never ticked here) is reported with no
        location: the store then evicts it as before (its KV is lost, `reset_required`).
        """
        runtime = self.sessions.forward.runtime
        assert runtime is not None
        # Its tick ends first: exports happen between ticks.
        while session_id in self.sessions.books.in_flight:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        tier, location, size, chunk = "shared", "", 0, 0
        # A migration keeps the session here for its new pod to pull (the pool shares a transfer token); its
        # shared-tier copy is the fallback. Without a shared tier the host tier's copy is what is pulled.
        migrating = (
            reason == "migrate" and self.settings.transfer_token and self.sessions.exports.tier is not None
        )
        holder = self.sessions.placement.pod if migrating else None
        held = False
        started = time.perf_counter()
        with self.sessions.books.exclusive(session_id):
            book = self.sessions.books.get(session_id)
            resident = session_id in runtime.resident_sessions()
            unreported = self.sessions.exports.unreported.pop(session_id, None)
            if unreported is not None and not (book is not None and unreported.fits(book, holder)):
                self.sessions.exports.forget(unreported.location)  # of another state or kind: no use any more
                unreported = None
            if unreported is not None:
                # A retried suspend (the report failed): the export written then is reported again.
                tier, location, size, chunk = (
                    unreported.tier,
                    unreported.location,
                    unreported.size,
                    unreported.chunk,
                )
            elif (
                self.sessions.exports.any_tier
                and book is not None
                and book.status is SessionStatus.ACTIVE
                and resident
            ):
                try:
                    tier, location, size = await self.sessions.export(
                        session_id, self.sessions.exports.write_suspension, book, holder
                    )
                    chunk = book.next_chunk_index
                except (SessionExportError, HostTierFull, OSError) as exc:
                    log.warning("session %s could not be exported (%s): evicted instead", session_id, exc)
            if location:
                self.sessions.exports.unreported[session_id] = UnreportedExport(
                    tier, location, size, chunk, holder
                )
            try:
                await self.sessions.placement.mark_suspended(
                    session_id, tier=tier, location=location, size=size, chunk_index=chunk
                )
            except placement.SessionNotHere as exc:  # deleted or moved meanwhile: nothing to report
                log.info("suspend of %s no longer applies (%s)", session_id, exc)
                if location:
                    self.sessions.exports.forget(location)
            else:
                held = bool(location and holder and book is not None)
            # Reported, or of no use (any other failure keeps it for the retry).
            self.sessions.exports.unreported.pop(session_id, None)
        if held:
            assert book is not None
            self.sessions.hold_for_transfer(session_id, book, location)
        else:
            await self.sessions.release(session_id, "suspend")
        if location:
            self.metrics.continuity_bytes.labels("suspend").inc(size)
            self.metrics.continuity_seconds.labels("suspend").observe(time.perf_counter() - started)
        log.info(
            "suspended session %s (%s) at chunk %d: %d bytes at %s (%s tier)",
            session_id,
            reason,
            chunk,
            size,
            location,
            tier,
        )

    # ---------------------------------------------------------------- tier sweeps

    async def sweep_tier_forever(self) -> None:
        """Remove the tier's files of sessions the store has closed (deleted while suspended, or lost ones):
        one suspended when it was deleted has no pod to do it. Only `closed` counts, never a missing record:
        after Redis loses its data the operator rebuilds suspended records from their statuses (contracts
        §2), and their exports must still be there. Closed records stay for an hour, several sweeps. The host
        tier is swept too (`sweep_host_tier`)."""
        while True:
            await asyncio.sleep(self.settings.tier_sweep_seconds)
            try:
                await self.sweep_tier()
            except Exception as exc:  # Redis or the volume away: the next sweep tries again
                log.warning("tier sweep failed: %s", exc)

    async def sweep_host_tier(self) -> list[str]:
        """The host tier's share of a sweep: copies the store no longer points at (`copy_needed`: closed,
        expired, resumed); never one of a session without a record (the operator may restore it)."""
        host_tier = self.sessions.exports.host_tier
        assert host_tier is not None
        copies = host_tier.copies()
        bindings = (
            await self.sessions.placement.bindings([copy.session_id for copy in copies]) if copies else {}
        )
        dropped = []
        for copy in copies:
            if not copy_needed(bindings.get(copy.session_id), copy.location):
                host_tier.remove(copy.location)
                dropped.append(copy.session_id)
        if dropped:
            log.info("removed %d host-tier exports nothing points at: %s", len(dropped), dropped[:10])
        return dropped

    async def sweep_tier(self) -> list[str]:
        """One sweep (`sweep_tier_forever`): the closed sessions whose files it removed."""
        if self.sessions.exports.host_tier is not None:
            await self.sweep_host_tier()
        tier = self.sessions.exports.tier
        if tier is None:
            return []
        stored = await asyncio.to_thread(tier.sessions)
        bindings = await self.sessions.placement.bindings(stored) if stored else {}
        closed = [
            name for name, binding in bindings.items() if binding and binding.state is SessionState.CLOSED
        ]
        for name in closed:
            await asyncio.to_thread(tier.forget_session, name)
        if closed:
            log.info("removed the shared tier's files of %d closed sessions: %s", len(closed), closed[:10])
        return closed
