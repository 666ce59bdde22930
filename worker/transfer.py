"""Pod-to-pod transfer of a migrating session (issue 12 item 3; docs/contracts.md §4 "Transfer"): the wire,
and `Transfer`, both ends of it on one pod.

The new pod pulls: `GET /internal/v1/sessions/{id}/export` on the pod that still holds the session, with
the pool's transfer token as a bearer token. Pull rather than push because only the new pod knows when it
needs the session (its first tick) and that it has room for it; the old pod only keeps it for a while, and
offers it (`POST …/prefetch`) as soon as the store places it elsewhere, so the pull need not wait for a tick.

Neither side holds its forward lock while bytes cross the network (issue 23 item 6): a peer that stalls must
not stall the other sessions' ticks. The holder writes the export (docs/contracts.md §9) into host memory
under its lock (`PieceCollector`, worker/pieces.py: a copy of device memory, fast) and sends the pieces
without it; the puller downloads the body into memory (`download`: at most the bytes the store recorded for
the export, within `transfer_deadline_seconds`), then imports it under its lock. Each side holds one export
in host memory for the transfer. The export's own checksum covers the transfer: a body cut off or altered is
`export_corrupt` at the import, which releases whatever it built.

`Transfer`'s job is the holder's side (sessions held for their new pod, offers, claims and sends, a draining
pod's wait for its handoffs and the spill of its host tier to the shared tier) and the puller's (where to pull
from, the pull, the offers it accepts). It keeps the held sessions, the sends under way and the prefetches;
it is owned by, and reaches the runtime (on the forward thread), the exports and the placement port only
through, the pod's sessions (worker/pod_sessions.py), and never touches a session's book: holding, resuming
and releasing sessions is the continuity's (worker/continuity.py) and their owner's.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from ardiff.kv.records import SessionState
from ardiff.worker.background import Background
from ardiff.worker.errors import (
    ChunkNotKept,
    ExportIdentityMismatch,
    ExportNoCapacity,
    SessionExportError,
    TransferFailed,
    Unauthorized,
    UnknownSession,
)
from ardiff.worker.export_download import (
    READ_TIMEOUT_SECONDS,
    StagingMemory,
    TransferResult,
    download,
    peer_ssl_context,
)
from ardiff.worker.host_tier import HostCopy, copy_needed, host_holder
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.pieces import BodyReader, PieceCollector
from ardiff.worker.session_book import SessionBook
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.shared_tier import direct_source

if TYPE_CHECKING:
    from ardiff.worker.pod_sessions import PodSessions

log = logging.getLogger(__name__)

TRANSFER_PATH = "/internal/v1/sessions/{session_id}/export"
# A session's kept chunk boundary (issue 26, worker/history.py), pulled by the pod a fork of it was placed on.
KEPT_PATH = "/internal/v1/kept/{session_id}/{chunk}"
# The holder offers a session to the pod it was placed on, which pulls it at once (not at its first tick).
PREFETCH_PATH = "/internal/v1/sessions/{session_id}/prefetch"
# Tests only (ARDIFF_TEST_TRANSFER_STALL_SECONDS): bytes sent before the stall (the export's header).
STALL_AFTER_BYTES = 4096
# How often a pod holding sessions for a transfer looks for their new pods, and how long an offer may take.
OFFER_POLL_SECONDS = 0.2
OFFER_TIMEOUT = httpx.Timeout(2.0)
# Draining with sessions held for a transfer: how long one still unplaced may wait for its new pod (the
# operator places a migrated session within a round or two; a pod cannot wait longer than its grace period).
HANDOFF_PLACEMENT_SECONDS = 5.0


def transfer_url(endpoint: str, session_id: str) -> str:
    return endpoint.rstrip("/") + TRANSFER_PATH.format(session_id=session_id)


def kept_url(endpoint: str, session_id: str, chunk: int) -> str:
    return endpoint.rstrip("/") + KEPT_PATH.format(session_id=session_id, chunk=chunk)


async def iter_pieces(pieces: tuple[memoryview, ...]) -> AsyncIterator[memoryview]:
    for piece in pieces:
        yield piece


def check_pool_token(token: str | None, authorization: str | None) -> None:
    """401 unless `authorization` carries the pool's transfer `token` (a worker without one refuses all)."""
    scheme, _, presented = (authorization or "").partition(" ")
    if (
        not token
        or scheme.lower() != "bearer"
        or not hmac.compare_digest(presented.strip().encode(), token.encode())
    ):
        raise Unauthorized("missing or wrong pool transfer token")


@dataclass(frozen=True)
class Outgoing:
    """An export on its way to the pod that pulls it: its pieces, and their length, which the answer
    declares (`content-length`): the puller then provides its whole buffer at once, the cheapest way to
    receive into fresh memory here (docs/benchmarks.md "The transfer code per side")."""

    size: int
    body: AsyncIterator[memoryview]


@dataclass(frozen=True)
class HeldForTransfer:
    """A migrated session kept in the runner after its export reached the shared tier, until its new pod pulls
    it (docs/contracts.md §4 "Transfer") or `until` (monotonic) passes; it holds no slot."""

    book: SessionBook
    location: str
    until: float


class Transfer:
    """Both ends of pod-to-pod transfers on this pod (the module's docstring). `held` (read by the pod's
    sessions: a held session makes room for an admitted one, and is waited for by its next tick) is changed
    only here."""

    def __init__(
        self,
        settings: WorkerSettings,
        sessions: PodSessions,  # their owner, which owns this too
        metrics: WorkerMetrics,
        tasks: Background,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self._tasks = tasks
        self.held: dict[str, HeldForTransfer] = {}  # migrated sessions its new pod may pull from here
        # Held sessions being pulled right now, with when to stop waiting for them (a response whose body
        # never started would never say it ended).
        self._sending: dict[str, float] = {}
        self._offering: asyncio.Task[None] | None = None  # `_offer_held`, while sessions are held
        self._prefetching: dict[str, asyncio.Task[None]] = {}  # pulls offered by the holder, under way
        self._peer_context: ssl.SSLContext | None = None  # made at the first pull or offer
        self.staging = StagingMemory(settings.transfer_staging_bytes)  # empty until a pull fits it

    @property
    def peer_context(self) -> ssl.SSLContext:
        """How the pulls and offers verify the pool's other pods over https (made once: building an SSL
        context takes ~0.2 s, too slow per pull)."""
        if self._peer_context is None:
            self._peer_context = peer_ssl_context(self.settings.tls_ca_file)
        return self._peer_context

    # ---------------------------------------------------------------- the holder

    def hold(self, session_id: str, book: SessionBook, location: str) -> None:
        """Keep a migrated session's state in the runner (no slot: the store freed it) for its new pod to
        pull; dropped after `transfer_hold_seconds`, when its slot is needed, or when the pod goes."""
        until = time.monotonic() + self.settings.transfer_hold_seconds
        self.held[session_id] = HeldForTransfer(book, location, until)
        if self._offering is None or self._offering.done():
            self._offering = self._tasks.supervise("offer-held", self._offer_held)
        self._tasks.spawn(self._drop_held_at(session_id, until), f"hold-{session_id}")

    async def _offer_held(self) -> None:
        """While sessions are held here: as soon as the store places one on another pod, ask that pod to pull
        it now (`POST …/prefetch`) rather than at its first tick, so the move does not wait for the client
        and this pod, which is usually going, need not wait either."""
        offered: set[tuple[str, str]] = set()
        async with httpx.AsyncClient(timeout=OFFER_TIMEOUT, verify=self.peer_context) as client:
            while self.held:
                try:
                    bindings = await self.sessions.placement.bindings(list(self.held))
                except Exception as exc:
                    log.warning("could not check the held sessions' placements: %s", exc)
                    bindings = {}
                for session_id, binding in bindings.items():
                    held = self.held.get(session_id)
                    if held is None or binding is None or binding.resume_from != held.location:
                        continue
                    if binding.pod == self.sessions.placement.pod or (session_id, binding.pod) in offered:
                        continue
                    offered.add((session_id, binding.pod))
                    await self._offer(client, session_id, binding.pod)
                await asyncio.sleep(OFFER_POLL_SECONDS)

    async def _offer(self, client: httpx.AsyncClient, session_id: str, pod: str) -> None:
        token = self.settings.transfer_token
        try:
            endpoint = await self.sessions.placement.endpoint_of(pod)
            if endpoint is None or token is None:
                return
            url = endpoint.rstrip("/") + PREFETCH_PATH.format(session_id=session_id)
            answer = await client.post(url, headers={"authorization": f"Bearer {token}"})
            log.info("offered session %s to pod %s: %d", session_id, pod, answer.status_code)
        except Exception as exc:  # it pulls at its first tick instead
            log.info("could not offer session %s to pod %s: %s", session_id, pod, exc)

    async def _drop_held_at(self, session_id: str, until: float) -> None:
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        held = self.held.get(session_id)
        if held is not None and held.until <= time.monotonic():
            await self.drop_held(session_id, "not pulled in time")

    async def drop_held(self, session_id: str, why: str) -> None:
        """Release a held session's state (its shared-tier copy stays: the new pod resumes from that)."""
        runtime = self.sessions.forward.runtime
        if self.held.pop(session_id, None) is None or runtime is None:
            return
        await self.sessions.release(session_id, "unheld")
        log.info("released session %s held for a transfer (%s)", session_id, why)

    def discard_held(self, session_id: str) -> None:
        """A held session closed or moved: nothing to pull (the caller closes it in the runner)."""
        self.held.pop(session_id, None)

    async def claim(self, session_id: str, authorization: str | None) -> HeldForTransfer | HostCopy:
        """The held session (sent once) or host-tier copy (kept until the store no longer points at it) a pull
        asks for (401 without the pool's transfer token, 404 if this pod has neither, or a copy nothing needs
        any more: it is dropped)."""
        check_pool_token(self.settings.transfer_token, authorization)
        held: HeldForTransfer | HostCopy | None = self.held.pop(session_id, None)
        host_tier = self.sessions.exports.host_tier
        if held is None and host_tier is not None:
            held = host_tier.copy_of(session_id)
            if held is not None and not await self._copy_still_needed(held):
                held = None
        if held is None:
            raise UnknownSession(f"session {session_id!r} is not held on this pod for a transfer")
        self._sending[session_id] = time.monotonic() + READ_TIMEOUT_SECONDS
        return held

    async def _copy_still_needed(self, copy: HostCopy) -> bool:
        """Whether the store still points at a host-tier copy (`copy_needed`); one it no longer does is
        dropped. A store that cannot be asked is no verdict: the copy stays."""
        assert self.sessions.exports.host_tier is not None
        try:
            binding = (await self.sessions.placement.bindings([copy.session_id]))[copy.session_id]
        except Exception as exc:
            log.warning("could not check session %s's host-tier copy: %s", copy.session_id, exc)
            return True
        if copy_needed(binding, copy.location):
            return True
        self.sessions.exports.host_tier.remove(copy.location)
        log.info("dropped session %s's host-tier copy: nothing points at it any more", copy.session_id)
        return False

    async def _drop_copy_once_resumed(self, copy: HostCopy) -> None:
        """After a pull of a host-tier copy: drop it as soon as the puller reported it resumed (its slot in
        the budget is wanted), looking for `transfer_hold_seconds`; the sweep takes over after that."""
        deadline = time.monotonic() + self.settings.transfer_hold_seconds
        while time.monotonic() < deadline and await self._copy_still_needed(copy):  # noqa: ASYNC110 (the store)
            await asyncio.sleep(OFFER_POLL_SECONDS)

    async def send(self, session_id: str, held: HeldForTransfer | HostCopy) -> Outgoing:
        """The session's export, the HTTP body of a pull: a host-tier copy as it lies in memory (kept), a held
        session's written into memory first (under the forward lock, before the answer starts, so that its
        length goes with it) and released (the puller has it, or reads the shared tier's copy). No forward
        lock is held while the body goes out."""
        if isinstance(held, HostCopy):
            return Outgoing(held.size, self._send_copy(held))
        pieces = await self._export_held(session_id, held)
        return Outgoing(sum(map(len, pieces)), self._send_pieces(session_id, pieces))

    async def _send_copy(self, copy: HostCopy) -> AsyncIterator[memoryview]:
        async for piece in self._send_pieces(copy.session_id, copy.pieces):
            yield piece
        self._tasks.spawn(self._drop_copy_once_resumed(copy), f"sent-{copy.session_id}")

    async def _export_held(self, session_id: str, held: HeldForTransfer) -> tuple[memoryview, ...]:
        runtime = self.sessions.forward.runtime
        assert runtime is not None
        collector = PieceCollector(sys.maxsize)
        try:
            async with self.sessions.forward.lock.hold():
                try:
                    await self.sessions.forward.run(
                        runtime.export_session, session_id, collector, book=held.book
                    )
                finally:
                    await self.sessions.forward.run(runtime.close, session_id)
        except BaseException:
            self._record_sent(session_id, "failed", 0, 0.0)
            raise
        return collector.finish()

    def send_kept(self, session_id: str, chunk: int, authorization: str | None) -> Outgoing:
        """The body of a pull of the session's kept chunk `chunk` (a fork placed on another pod, issue 26),
        for the pool's transfer token: its pieces as they lie in memory, kept (a fork consumes nothing)."""
        check_pool_token(self.settings.transfer_token, authorization)
        copy = self.sessions.exports.history.get(session_id, chunk)
        if copy is None:
            kept = self.sessions.exports.history.chunks(session_id)
            raise ChunkNotKept(
                f"this pod keeps no chunk {chunk} of session {session_id!r} (it keeps {kept})",
                kept_chunks=kept,
            )
        log.info("sending kept chunk %d of session %s: %d bytes", chunk, session_id, copy.size)
        return Outgoing(copy.size, iter_pieces(copy.pieces))

    async def _send_pieces(
        self, session_id: str, pieces: tuple[memoryview, ...]
    ) -> AsyncIterator[memoryview]:
        """Send an export's pieces, counted. The test fault (`ARDIFF_TEST_TRANSFER_STALL_SECONDS`) stops after
        the first `STALL_AFTER_BYTES` for that long: a holder that dies, or stalls, mid-transfer."""
        stall = self.settings.test_transfer_stall_seconds if self.settings.test_faults else 0.0
        started = time.perf_counter()
        sent = 0
        result = "failed"
        self.metrics.transfers_in_progress.labels("out").inc()
        try:
            async for piece in iter_pieces(pieces):
                if stall and sent == 0 and len(piece) > STALL_AFTER_BYTES:
                    yield piece[:STALL_AFTER_BYTES]
                    sent, piece = STALL_AFTER_BYTES, piece[STALL_AFTER_BYTES:]
                    await asyncio.sleep(stall)
                yield piece
                sent += len(piece)
            result = "ok"
        finally:
            self.metrics.transfers_in_progress.labels("out").dec()
            self._record_sent(session_id, result, sent, time.perf_counter() - started)

    def _record_sent(self, session_id: str, result: str, sent: int, seconds: float) -> None:
        self._sending.pop(session_id, None)
        self.metrics.transfers.labels("out", result).inc()
        self.metrics.transfer_bytes.labels("out").inc(sent)
        self.metrics.transfer_seconds.labels("out").observe(seconds)
        log.info("transfer of session %s: %s, %d bytes sent in %.3f s", session_id, result, sent, seconds)

    # ---------------------------------------------------------------- a draining holder

    async def spill_host_tier(self) -> None:
        """Draining: the host tier's copies die with this pod, so each one the store still points at is copied
        to the shared tier first. Without a shared tier they stay for pulls under way (`await_handoffs`);
        the others' sessions resume from their snapshot or need a reset (contracts §2)."""
        host_tier, tier = self.sessions.exports.host_tier, self.sessions.exports.tier
        if host_tier is None or tier is None:
            return
        for copy in host_tier.copies():
            try:
                location, _ = await asyncio.to_thread(tier.write, copy.session_id, "suspend", copy.write_to)
            except OSError as exc:
                log.warning("could not move session %s's host-tier export: %s", copy.session_id, exc)
                continue
            try:
                moved = await self.sessions.placement.relocate_export(
                    copy.session_id, from_location=copy.location, to_location=location
                )
            except Exception as exc:
                log.warning("could not record session %s's moved export: %s", copy.session_id, exc)
                moved = False
            if moved:
                host_tier.remove(copy.location)
                log.info("moved session %s's export from the host tier to %s", copy.session_id, location)
            else:  # resumed or closed meanwhile
                tier.remove(location)

    async def await_handoffs(self) -> None:
        """Draining (the pod goes): keep the held sessions whose new pod is about to pull them, each until its
        hold ends; a session nobody was placed for within `HANDOFF_PLACEMENT_SECONDS` resumes from the shared
        tier. Then wait for the pulls under way."""
        placement_deadline = time.monotonic() + HANDOFF_PLACEMENT_SECONDS
        while self.held:
            now = time.monotonic()
            try:
                bindings = await self.sessions.placement.bindings(list(self.held))
            except Exception as exc:
                log.warning("could not check the held sessions' placements: %s", exc)
                bindings = {}
            for session_id, held in list(self.held.items()):
                binding = bindings.get(session_id)
                placed = binding is not None and binding.resume_from == held.location
                waiting = binding is not None and binding.state is SessionState.SUSPENDED
                if now >= held.until or not (placed or (waiting and now < placement_deadline)):
                    await self.drop_held(session_id, "the pod is going")
            if self.held:
                await asyncio.sleep(0.1)
        await self._await_host_pulls()
        while self._sending and time.monotonic() < max(self._sending.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def _await_host_pulls(self) -> None:
        """Draining without a shared tier: wait (up to `transfer_hold_seconds`) while host-tier copies are
        about to be pulled by the pods their sessions were placed on, or wait to be placed (a migration)."""
        host_tier = self.sessions.exports.host_tier
        if host_tier is None or self.sessions.exports.tier is not None:
            return
        deadline = time.monotonic() + self.settings.transfer_hold_seconds
        while time.monotonic() < deadline and (copies := host_tier.copies()):
            try:
                bindings = await self.sessions.placement.bindings([copy.session_id for copy in copies])
            except Exception as exc:
                log.warning("could not check the host tier's sessions: %s", exc)
                return
            awaited = [
                copy
                for copy in copies
                if (binding := bindings.get(copy.session_id)) is not None
                and (
                    binding.resume_from == copy.location
                    or (binding.location == copy.location and binding.resume_requested_ms > 0)
                )
            ]
            if not awaited:
                return
            await asyncio.sleep(0.1)

    # ---------------------------------------------------------------- the puller

    def prefetch(
        self, session_id: str, authorization: str | None, resume: Callable[[str], Coroutine[Any, Any, None]]
    ) -> None:
        """The pod holding a migrated session placed here offers it: `resume(session_id)` (the continuity's
        pull of it) now, in the background, once at a time; its first tick waits for that (`prefetch_of`)."""
        check_pool_token(self.settings.transfer_token, authorization)
        if session_id in self._prefetching:
            return
        task = self._tasks.spawn(resume(session_id), f"prefetch-{session_id}")
        self._prefetching[session_id] = task
        task.add_done_callback(lambda _: self._prefetching.pop(session_id, None))

    def prefetch_of(self, session_id: str) -> asyncio.Task[None] | None:
        """The prefetch of the session under way, if any."""
        return self._prefetching.get(session_id)

    async def source_of(self, location: str) -> tuple[str, str] | None:
        """(pod, endpoint) of the pod a migration's export names as holding the session, when this worker may
        pull from it; None to read the shared tier instead (no token, no holder, the holder gone)."""
        pod = host_holder(location) or direct_source(location)
        if pod is None or pod == self.sessions.placement.pod:
            return None
        endpoint = await self.endpoint_of(pod)
        if endpoint is None:
            log.info(
                "pod %s that held %s cannot be pulled from: trying the session's other copies", pod, location
            )
            return None
        return pod, endpoint

    async def endpoint_of(self, pod: str) -> str | None:
        """The endpoint of another pod of the pool this worker may pull from; None without a transfer token,
        or when the pod is gone or cannot be looked up."""
        if not self.settings.transfer_token:
            return None
        try:
            return await self.sessions.placement.endpoint_of(pod)
        except Exception as exc:
            log.warning("could not look up pod %s for a direct transfer: %s", pod, exc)
            return None

    async def pull(
        self, session_id: str, pod: str, url: str, *, size: int, as_session: str | None = None
    ) -> tuple[SessionBook, TransferResult] | None:
        """Download the session's export at `url` from the pod that holds it (without the forward lock: a
        holder that stalls holds up nobody else's tick; at most `size` bytes, within the transfer deadline),
        then import it under the lock (`as_session`: a fork's kept chunk, as the fork). None (logged,
        counted) when that fails, so the caller reads the shared tier's copy instead; this worker's refusals
        (no room, another identity) are raised: no copy would do."""
        runtime = self.sessions.forward.runtime
        assert runtime is not None
        token = self.settings.transfer_token
        assert token is not None
        self.metrics.transfers_in_progress.labels("in").inc()
        memory: object = None  # what the body lies in: the staging memory goes back after the import
        try:
            if not size:
                raise TransferFailed("the store records no size for the export: nothing bounds the pull")
            body, result = await download(
                url, token, size=size, context=self.peer_context, staging=self.staging
            )
            memory = body.obj
            book = await self.sessions.import_(
                runtime.import_session, BodyReader(iter((body,))), as_session=as_session
            )
            del body  # the import copied what the session keeps: nothing views the body any more
        except (ExportNoCapacity, ExportIdentityMismatch):
            raise  # this worker refuses the session: no other copy would do, and the holder's stays
        except Exception as exc:
            code = exc.code if isinstance(exc, SessionExportError | TransferFailed) else type(exc).__name__
            log.warning(
                "direct transfer of session %s from pod %s failed (%s: %s); trying its other copies",
                session_id,
                pod,
                code,
                exc,
            )
            self.metrics.transfers.labels("in", "failed").inc()
            return None
        finally:
            self.metrics.transfers_in_progress.labels("in").dec()
            self.staging.give_back(memory)
        self.metrics.transfers.labels("in", "ok").inc()
        self.metrics.transfer_bytes.labels("in").inc(result.bytes)
        self.metrics.transfer_seconds.labels("in").observe(result.seconds)
        log.info(
            "pulled session %s from pod %s: %d bytes in %.3f s (%.0f MB/s) into %s memory",
            session_id,
            pod,
            result.bytes,
            result.seconds,
            result.bytes_per_second / 1e6,
            "the staging" if self.staging.holds(memory) else "fresh",
        )
        return book, result
