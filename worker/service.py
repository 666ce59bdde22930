"""The worker's behaviour, independent of HTTP: admission, auth, chunk order, retries, fail-closed, draining.

One forward at a time per pod: every call into the runtime that touches session state (forward, reset,
close) runs on one dedicated thread while the FIFO `asyncio.Lock` is held, so ticks of different sessions are
served in arrival order and `/healthz`/`/metrics` stay responsive. At most one tick per session is in flight.
The runner would evict its least recently used session silently when full; the worker never lets it: it admits
at most `capacity` sessions, releasing first those the placement store no longer places here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import hmac
import json
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import httpx

from ardiff.errors import ArdiffError
from ardiff.kv.records import SessionRecord, SessionState, check_name, token_sha256
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.encoding import RAW, MediaType
from ardiff.worker.errors import (
    AtCapacity,
    ChunkOutOfOrder,
    ExportCorrupt,
    ExportIdentityMismatch,
    ExportNoCapacity,
    ForwardFailed,
    InvalidTick,
    MaxChunksReached,
    Misdirected,
    NotReady,
    PlacementRecovering,
    ResetRequired,
    Resuming,
    Rewound,
    SessionClosed,
    SessionEvicted,
    SessionExportError,
    TickInProgress,
    TooManyRequests,
    TransferFailed,
    Unauthorized,
    UnknownSession,
)
from ardiff.worker.host_tier import HostCopy, HostTier, HostTierFull, copy_needed, host_holder
from ardiff.worker.metrics import WorkerMetrics
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.session_book import CachedChunk, SessionBook, SessionStatus
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.shared_tier import ExportKind, SharedTier, direct_source
from ardiff.worker.transfer import (
    PREFETCH_PATH,
    READ_TIMEOUT_SECONDS,
    STALL_AFTER_BYTES,
    BodyReader,
    PieceCollector,
    TransferResult,
    download,
    peer_verify,
    pull_client,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

RuntimeLoader = Callable[[], SessionRuntime]
# Stopping: how often a cancel is repeated, how long background tasks get to end (see cancel_and_wait).
RECANCEL_SECONDS = 0.05
STOP_TIMEOUT_SECONDS = 5.0
RESTART_SECONDS = 1.0  # how soon a failed long-lived task (heartbeat, events, tier sweep) runs again
# Requests of one session (and credential) under way at once: a client has a tick in flight and perhaps a
# retry; more are refused (429) before they cost a Redis read, a wait for a migration or a decode.
MAX_REQUESTS_PER_SESSION = 4
# Threads that decode ticks' pictures (a robot tick's three cameras), off the event loop; at most one tick per
# session gets there (the in-flight check comes first), so the queue is bounded by the sessions placed here.
DECODE_THREADS = 2
# Draining with sessions held for a transfer: how long one still unplaced may wait for its new pod (the
# operator places a migrated session within a round or two; a pod cannot wait longer than its grace period).
HANDOFF_PLACEMENT_SECONDS = 5.0
# A tick for a session migrating off this pod waits this long for its new pod (then 421), polling the store.
MIGRATION_WAIT_SECONDS = 5.0
MIGRATION_POLL_SECONDS = 0.05
# How often a pod holding sessions for a transfer looks for their new pods, and how long an offer may take.
OFFER_POLL_SECONDS = 0.2
OFFER_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class TickOutcome:
    """A tick's chunk and how long its stages took (seconds; zeros for a retried request id)."""

    chunk: CachedChunk
    queue: float = 0.0
    forward: float = 0.0
    decode: float = 0.0

    def timing(self, **more: float) -> dict[str, float]:
        """The stages in milliseconds (`server-timing`, the stream's `timing`)."""
        stages = {"queue": self.queue, "forward": self.forward, "decode": self.decode, **more}
        return {name: round(seconds * 1000, 2) for name, seconds in stages.items()}


@dataclass(frozen=True)
class HeldForTransfer:
    """A migrated session kept in the runner after its export reached the shared tier, until its new pod pulls
    it (docs/contracts.md §4 "Transfer") or `until` (monotonic) passes; it holds no slot."""

    book: SessionBook
    location: str
    until: float


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


@dataclass(frozen=True)
class AdmittedTick:
    """A tick past the checks that need no body (`WorkerService.admitted`): the session's record (None
    standalone) and when the request arrived (`perf_counter`)."""

    session_id: str
    record: SessionRecord | None
    arrived: float


@dataclass(frozen=True)
class TickResponse:
    body: bytes
    media_type: MediaType
    headers: dict[str, str]


def bearer_token_sha256(authorization: str | None) -> str | None:
    """`token_sha256` of the bearer token in an `Authorization` header, or None without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token_sha256(token.strip())


async def cancel_and_wait(
    tasks: list[asyncio.Task[None]], *, grace_seconds: float = STOP_TIMEOUT_SECONDS
) -> None:
    """Cancel `tasks` and wait until they end, cancelling again every `RECANCEL_SECONDS`.

    One `cancel()` is not enough: Python 3.11's `asyncio.wait_for`, which redis-py wraps around every command
    it sends, drops a cancel that arrives in the loop iteration where its inner call completes. The heartbeat
    then carried on into its next sleep, and the worker hung at "Waiting for application shutdown" until it
    was killed. A task still running after `grace_seconds` is left with a warning (asyncio.run ends it).
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + grace_seconds
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    if pending:
        log.warning(
            "background tasks still running after %.1fs: %s",
            grace_seconds,
            sorted(t.get_name() for t in pending),
        )


def supervised(
    name: str,
    run: Callable[[], Awaitable[None]],
    metrics: WorkerMetrics,
    *,
    restart_seconds: float = RESTART_SECONDS,
) -> asyncio.Task[None]:
    """A long-lived task that never dies silently: `run()` again after `restart_seconds` whenever it raises
    (logged with its traceback, counted in `ardiff_background_task_restarts_total`); a return ends it (the
    heartbeat of a fenced pod), and so does a cancel (the worker stopping)."""

    async def forever() -> None:
        while True:
            try:
                await run()
                return
            except Exception:
                log.exception("background task %s failed; restarting it in %.1f s", name, restart_seconds)
                metrics.background_restarts.labels(name).inc()
            await asyncio.sleep(restart_seconds)

    return asyncio.create_task(forever(), name=name)


def settings_family(settings: WorkerSettings) -> Any:
    """The model family of this worker's pipeline (LingBot-World for the fake runtime's, the default)."""
    from ardiff.worker.families import family_for, family_named

    try:
        return family_for(settings.pipeline)
    except ValueError:
        return family_named("lingbot")  # the runtime's load reports the unknown pipeline


def export_kind(location: str) -> str:
    """What an export location holds: `host` (a pod's host-tier copy), a `snapshot` or a `suspend` export in
    the shared tier."""
    if host_holder(location) is not None:
        return "host"
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
    `snapshot` copy), its bytes and the seconds until it was installed, and whether a direct pull failed
    first."""
    direct = pulled.get(location)
    if direct is not None:
        source, size, took = "direct", direct.bytes, direct.seconds
    else:
        source, took = kind, seconds
        size = record.bytes if location == record.location and record.bytes else None
    return {
        "source": source,
        "bytes": size,
        "seconds": round(took, 4),
        "from": host_holder(location) or direct_source(location) or "",
        "to": pod,
        "direct_failed": location in pulled and direct is None,
    }


def _timing_header(stages_ms: dict[str, float]) -> str:
    return ", ".join(f"{name};dur={ms:.2f}" for name, ms in stages_ms.items())


class WorkerService:
    def __init__(
        self,
        settings: WorkerSettings,
        loader: RuntimeLoader,
        *,
        link: Any = None,  # a PodLink in placement mode, None standalone
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.family = settings_family(settings)
        self.link = link
        self.metrics = metrics or WorkerMetrics()
        self.tier = (
            SharedTier(settings.suspend_dir, settings.namespace, settings.pool)
            if settings.suspend_dir
            else None
        )
        # The host tier: suspended sessions' exports in this pod's memory, within a byte budget.
        self.host_tier = (
            HostTier(settings.host_tier_bytes, settings.pod_name) if settings.host_tier_bytes else None
        )
        self._snapshots: dict[str, str] = {}  # session -> the location of its latest snapshot
        self._unreported: dict[str, UnreportedExport] = {}  # suspensions whose report failed, for the retry
        self._held: dict[str, HeldForTransfer] = {}  # migrated sessions its new pod may pull from here
        # Held sessions being pulled right now, with when to stop waiting for them (a response whose body
        # never started would never say it ended).
        self._sending: dict[str, float] = {}
        self._offering: asyncio.Task[None] | None = None  # `_offer_held`, while sessions are held
        self._prefetching: dict[str, asyncio.Task[None]] = {}  # pulls offered by the holder, under way
        self._pull_client: httpx.AsyncClient | None = None  # made at the first pull
        self.runtime: SessionRuntime | None = None
        self.capacity = 0
        self._loader = loader
        self._books: dict[str, SessionBook] = {}
        self._in_flight: set[str] = set()
        self._idle = asyncio.Event()  # set while no tick is in flight (drain waits on it)
        self._idle.set()
        self._forward_lock = asyncio.Lock()  # asyncio.Lock wakes its waiters in arrival order: FIFO fairness
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ardiff-forward")
        self._decoder = ThreadPoolExecutor(max_workers=DECODE_THREADS, thread_name_prefix="ardiff-decode")
        self._requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._load: Future[SessionRuntime] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        self._stopped = asyncio.Event()  # set when the worker must exit on its own (fenced, load failed)
        self.failure: BaseException | None = None

    # ---------------------------------------------------------------- lifecycle

    @property
    def exports_sessions(self) -> bool:
        """A tier to suspend sessions to: evictions and migrations keep them instead of dropping them."""
        return self.tier is not None or self.host_tier is not None

    @property
    def loaded(self) -> bool:
        return self.runtime is not None

    @property
    def ready(self) -> bool:
        registered = self.link is None or self.link.registered
        return self.loaded and registered and not self._draining and not self._stopped.is_set()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def loading(self) -> bool:
        """The runtime is still loading on the forward thread (a load cannot be interrupted)."""
        return self._load is not None and not self._load.done()

    @property
    def stopped(self) -> asyncio.Event:
        return self._stopped

    async def start(self) -> None:
        """Load the runtime and register, in the background: the HTTP server answers /healthz meanwhile."""
        self._tasks.append(asyncio.create_task(self._load_and_register(), name="ardiff-load"))

    async def _load_and_register(self) -> None:
        try:
            self._load = self._executor.submit(self._loader)
            runtime = await asyncio.wrap_future(self._load)
            cap = self.settings.session_capacity
            self.capacity = runtime.capacity if cap is None else min(runtime.capacity, cap)
            self.runtime = runtime
            self.metrics.capacity.set(self.capacity)
            log.info(
                "runtime loaded: capacity=%d (runner %d) frame_size=%s",
                self.capacity,
                runtime.capacity,
                runtime.frame_size,
            )
            if self.link is not None:
                self.link.exports = self.exports_sessions and runtime.supports_export
                await self.link.register(self.capacity)
                link = self.link
                self._tasks.append(
                    supervised("heartbeat", lambda: link.heartbeat_forever(self._fence), self.metrics)
                )
                self._tasks.append(
                    supervised("events", lambda: link.events_forever(self.on_event), self.metrics)
                )
                if self.exports_sessions:
                    self._tasks.append(supervised("tier-sweep", self._sweep_tier_forever, self.metrics))
        except Exception as exc:
            if isinstance(exc, ArdiffError):  # a user error (bad model, bad settings): no traceback
                log.error("worker failed to start: %s", exc)
            else:
                log.exception("worker failed to start")
            self.failure = exc
            self._stopped.set()

    def _fence(self) -> None:
        self.failure = RuntimeError("fenced: a newer incarnation of this pod registered")
        self._stopped.set()

    async def drain(self) -> None:
        """SIGTERM: no new placements, new ticks get 503, the ticks already accepted finish."""
        if self._draining:
            return
        self._draining = True
        log.info("draining: %d tick(s) in flight", len(self._in_flight))
        if self.link is not None and self.link.registered:
            try:
                await self.link.set_draining()
            except Exception as exc:
                log.warning("could not mark pod draining in the placement store: %s", exc)
        await self._idle.wait()
        await self._spill_host_tier()
        await self._await_handoffs()

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        if self.link is not None:
            await self.link.close()
        if self.loading:  # stopped while the model loads: the process exits without waiting (server.serve)
            self._executor.shutdown(wait=False, cancel_futures=True)
            return
        if self.runtime is not None:
            await self._on_forward_thread(self.runtime.shutdown)
        if self._pull_client is not None:
            await self._pull_client.aclose()
        self._decoder.shutdown(wait=True)
        self._executor.shutdown(wait=True)

    async def _on_forward_thread(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args, **kwargs))

    def _require_loaded(self) -> SessionRuntime:
        """The runtime once the model is loaded (close and describe also serve while draining)."""
        if self.runtime is None:
            raise NotReady("worker is not ready (loading)")
        return self.runtime

    def require_ready(self) -> SessionRuntime:
        if not self.ready or self.runtime is None:
            state = "draining" if self._draining else "loading" if not self.loaded else "not registered"
            raise NotReady(f"worker is not ready ({state})")
        return self.runtime

    # ---------------------------------------------------------------- placement checks

    async def _placed_record(self, session_id: str, authorization: str | None, *, any_state: bool = False):
        """The session's record when it may be served here (None standalone); 401/410/421 otherwise.

        Only the session's token learns anything of it: a wrong or missing token, a name without a record
        and a name no session can have are all refused alike (`_refuse`). `any_state` lets a DELETE of an
        evicted or closed session succeed (close is idempotent).
        """
        if self.link is None:
            return None
        try:
            check_name("session", session_id)
        except ValueError:
            await self._refuse()
        try:
            record = await self.link.session(session_id)
        except Exception as exc:
            raise NotReady(f"placement store unavailable: {exc}") from exc
        presented = bearer_token_sha256(authorization)
        if record is None:
            await self._no_record(session_id, presented)
        if presented is None or not hmac.compare_digest(presented, record.token_sha256):
            await self._refuse()
        if not any_state and record.state in (SessionState.SUSPENDED, SessionState.SUSPENDING):
            await self._demand_resume(session_id, record)
        if record.state is SessionState.PLACED and record.pod != self.link.pod:
            endpoint = await self.link.endpoint_of(record.pod)
            raise Misdirected(f"session {session_id!r} lives on pod {record.pod}", endpoint=endpoint)
        if any_state or self.link.is_here(record):
            return record
        if record.state is SessionState.CLOSED:
            raise SessionClosed(f"session {session_id!r} was closed")
        if record.state is SessionState.LOST:
            raise SessionEvicted(f"session {session_id!r} lost its pod; it is re-placed with reset_required")
        if record.state is SessionState.EVICTED:
            raise SessionEvicted(f"session {session_id!r} was evicted to make room; it is re-placed later")
        raise SessionEvicted(f"session {session_id!r} was placed on an earlier incarnation of this pod")

    async def _demand_resume(self, session_id: str, record: SessionRecord) -> NoReturn:
        """A tick for a suspended session is a demand: the operator places it again (contracts §4). A session
        migrating off this pod (a demand already recorded, its export written here or being written) is
        waited for instead, up to `MIGRATION_WAIT_SECONDS`, and the tick told where it went (421): the
        client follows at once rather than after a `Retry-After`."""
        assert self.link is not None
        state = record.state
        if state is SessionState.SUSPENDED:
            try:
                await self.link.request_resume(session_id)
            except Exception as exc:
                raise NotReady(f"placement store unavailable: {exc}") from exc
        migrating_from_here = record.resume_requested_ms > 0 and (
            session_id in self._held or (state is SessionState.SUSPENDING and record.pod == self.link.pod)
        )
        if migrating_from_here:
            endpoint = await self._new_home(session_id)
            if endpoint is not None:
                raise Misdirected(f"session {session_id!r} moved to another pod", endpoint=endpoint)
        raise Resuming(f"session {session_id!r} is {state.value}; it is being resumed, retry")

    async def _new_home(self, session_id: str) -> str | None:
        """The endpoint of the pod a migrating session gets placed on, once it is (None: not within
        `MIGRATION_WAIT_SECONDS`, or placed back here)."""
        assert self.link is not None
        deadline = time.monotonic() + MIGRATION_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                record = await self.link.session(session_id)
            except Exception:
                return None
            if record is None or record.state not in (SessionState.SUSPENDING, SessionState.SUSPENDED):
                if record is not None and record.state is SessionState.PLACED and record.pod != self.link.pod:
                    return await self.link.endpoint_of(record.pod)
                return None
            await asyncio.sleep(MIGRATION_POLL_SECONDS)
        return None

    async def _no_record(self, session_id: str, presented: str | None) -> NoReturn:
        """The store has no record of the session: 503 `placement_recovering` while it may be rebuilt.

        A session this worker holds is alive (its KV is here) whatever the store says: Redis lost its data and
        the operator rebuilds the binding from the session's status within a round; its own client (the token
        it was admitted with) is told to retry. Any other caller is refused as one with a wrong token is
        (`_refuse`): an id the worker never held and the store does not know looks like any other session.
        """
        assert self.link is not None
        book = self._books.get(session_id)
        held = book is not None and book.holds_slot
        if held and presented is not None and hmac.compare_digest(presented, book.token_sha256):
            raise PlacementRecovering(
                f"session {session_id!r} lives on this worker but the placement store has no record of it "
                "(its data was lost and is being rebuilt); retry"
            )
        await self._refuse()

    async def _refuse(self) -> NoReturn:
        """The one answer to a caller who cannot show a session's token — a wrong or missing one, or a name
        without a record (issue 23 item 10): which names exist is never told, not by the status, code or
        message, nor by the error counters. 401 `unauthorized`, or 503 `placement_recovering` while this
        pod's own record is missing too (the store visibly lost its data: the session's own client, whose
        record is not rebuilt yet, retries). Each costs one more Redis read, of the pod's record."""
        assert self.link is not None
        try:
            recovering = await self.link.store_lost_data()
        except Exception as exc:
            raise NotReady(f"placement store unavailable: {exc}") from exc
        if recovering:
            raise PlacementRecovering("the placement store lost its data and is rebuilding it; retry")
        raise Unauthorized("missing or wrong bearer token for this session")

    # ---------------------------------------------------------------- ticks

    @contextlib.contextmanager
    def _counted(self, session_id: str, authorization: str | None) -> Iterator[None]:
        """At most `MAX_REQUESTS_PER_SESSION` requests of a session under way; more are 429 at once. Counted
        per presented credential, so requests with a wrong token (401 after one Redis read) never crowd out
        the session's own client."""
        key = (session_id, bearer_token_sha256(authorization) or "")
        if self._requests[key] >= MAX_REQUESTS_PER_SESSION:
            raise TooManyRequests(
                f"session {session_id!r} has {MAX_REQUESTS_PER_SESSION} requests under way on this worker"
            )
        self._requests[key] += 1
        try:
            yield
        finally:
            self._requests[key] -= 1
            if not self._requests[key]:
                del self._requests[key]

    @contextlib.asynccontextmanager
    async def admitted(self, session_id: str, authorization: str | None) -> AsyncIterator[AdmittedTick]:
        """The checks of a tick that need no body, cheapest first: at most `MAX_REQUESTS_PER_SESSION` under
        way (held until the tick ends), a draining pod's 421, readiness, then placement and token (one Redis
        read). The HTTP tick runs them before its body is read (issue 23 item 10: a body from a caller who
        may not tick costs nothing); `tick` runs them for the stream and OpenPI."""
        arrived = time.perf_counter()
        with self._counted(session_id, authorization):
            if self._draining:
                await self._misdirect_while_draining(session_id, authorization)
            self.require_ready()
            record = await self._placed_record(session_id, authorization)
            yield AdmittedTick(session_id, record, arrived)

    async def tick(
        self,
        session_id: str,
        body: dict[str, Any],
        *,
        authorization: str | None,
        inject_fault: bool = False,
    ) -> TickOutcome:
        """Generate the session's next chunk (or replay the last one for a retried request id); every
        contract of docs/contracts.md §4 is checked here, for the HTTP tick and the stream alike."""
        async with self.admitted(session_id, authorization) as admitted:
            return await self.tick_admitted(admitted, body, inject_fault=inject_fault)

    async def tick_admitted(
        self, admitted: AdmittedTick, body: dict[str, Any], *, inject_fault: bool = False
    ) -> TickOutcome:
        """`tick` once `admitted`: the body's shape, one tick in flight, the chunk order (cheap checks
        first), then the family's decoding (pictures) in the decode pool, then the forward."""
        session_id, record, arrived = admitted.session_id, admitted.record, admitted.arrived
        runtime = self._require_loaded()
        tick = self.family.parse_tick(session_id, body)
        prefetch = self._prefetching.get(session_id)
        if prefetch is not None:  # the session is being pulled here already: its tick waits for that
            await asyncio.shield(prefetch)
        with self._exclusive(session_id):
            book = self._books.get(session_id)
            resumed = (
                record is not None and bool(record.resume_from) and (book is None or not book.holds_slot)
            )
            if resumed:
                book = await self._resume(session_id, record)
            cached = book.retry_of(tick.request_id, tick.chunk_index) if book else None
            if cached is not None:
                return TickOutcome(cached)
            if resumed and not tick.reset and tick.chunk_index > book.next_chunk_index:
                raise Rewound(
                    f"session {session_id!r} resumed from a snapshot at chunk {book.next_chunk_index}; "
                    "continue from there (the same controls give the same frames)",
                    expected_chunk_index=book.next_chunk_index,
                )
            self._check_order(tick, book, record)
            prompt = tick.prompt if tick.prompt is not None else record.prompt if record else ""
            if not prompt.strip():
                raise InvalidTick(
                    "prompt must contain non-empty text (the tick's, else the session's)", param="prompt"
                )
            conditioning = Conditioning(
                seed=record.seed if record else 0, prompt=prompt, image=record.image if record else b""
            )
            loop = asyncio.get_running_loop()
            tick = await loop.run_in_executor(self._decoder, self.family.decode_tick, tick)
            prepared = await asyncio.to_thread(runtime.prepare, tick, conditioning)
            await self._admit(session_id, record)
            async with self._forward_lock:
                queued = time.perf_counter() - arrived
                book = self._books.get(session_id)
                if book is None:
                    raise SessionEvicted(f"session {session_id!r} was released while its tick was queued")
                self._check_order(tick, book, None)
                try:
                    output = await self._on_forward_thread(
                        runtime.forward, prepared, inject_fault=inject_fault
                    )
                except Exception as exc:
                    log.warning(
                        "forward of session %s chunk %d failed: %r", session_id, tick.chunk_index, exc
                    )
                    self._books[session_id] = book.failed()
                    failure: Exception | None = exc
                else:
                    failure = None
                    chunk = CachedChunk(
                        tick.request_id, tick.chunk_index, output.frames, output.metadata, output.actions
                    )
                    self._books[session_id] = book.advanced(chunk, closed=tick.close_session)
            if failure is not None:
                await self._mark_reset_required(session_id)
                raise ForwardFailed(
                    f"the forward of chunk {tick.chunk_index} failed ({type(failure).__name__}); the session "
                    "was closed and needs reset=true, chunk_index=0"
                )
            await self._touch(session_id, chunk_index=tick.chunk_index + 1, reset_done=tick.reset)
            every = self.settings.snapshot_every_chunks
            if every and (tick.chunk_index + 1) % every == 0 and not tick.close_session:
                await self._snapshot(session_id)
            self.metrics.ticks.inc()
            self.metrics.frames.inc(len(output.frames))
            self.metrics.tick_latency.labels("queue").observe(queued)
            self.metrics.tick_latency.labels("forward").observe(output.forward_s)
            self.metrics.tick_latency.labels("total").observe(time.perf_counter() - arrived)
            return TickOutcome(chunk, queue=queued, forward=output.forward_s, decode=output.decode_s)

    @contextlib.contextmanager
    def _exclusive(self, session_id: str) -> Iterator[None]:
        """At most one tick (or reset) per session in flight."""
        if session_id in self._in_flight:
            raise TickInProgress(f"a tick of session {session_id!r} is in flight")
        self._in_flight.add(session_id)
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight.discard(session_id)
            if not self._in_flight:
                self._idle.set()

    @staticmethod
    def _check_order(tick: Any, book: SessionBook | None, record: SessionRecord | None) -> None:
        if book is not None and book.status is SessionStatus.CLOSED:
            raise SessionClosed(f"session {tick.session_id!r} was closed on this worker")
        needs_reset = (book is not None and book.status is SessionStatus.RESET_REQUIRED) or (
            record is not None and record.reset_required
        )
        if tick.reset:
            if tick.chunk_index != 0:
                raise ChunkOutOfOrder(
                    "a reset tick starts the session over at chunk 0", expected_chunk_index=0
                )
        elif needs_reset:
            raise ResetRequired(
                f"session {tick.session_id!r} lost its state; send reset=true with chunk_index=0"
            )
        else:
            expected = book.next_chunk_index if book is not None else 0
            if tick.chunk_index != expected:
                raise ChunkOutOfOrder(
                    f"expected chunk_index {expected}, got {tick.chunk_index}", expected_chunk_index=expected
                )
        if record is not None and record.max_chunks and tick.chunk_index >= record.max_chunks:
            raise MaxChunksReached(
                f"session {tick.session_id!r} is limited to {record.max_chunks} chunks",
                max_chunks=record.max_chunks,
            )

    async def respond(self, outcome: TickOutcome, media_type: MediaType | str) -> TickResponse:
        """The HTTP answer of a tick as `media_type` (the family's encoding: frames, actions), the metadata
        and timings in headers."""
        chunk = outcome.chunk
        started = time.perf_counter()
        if media_type == RAW or chunk.actions is not None:  # a copy or small JSON: not worth a thread hop
            body, shapes = self.family.encode(chunk, media_type)
        else:
            body, shapes = await asyncio.to_thread(self.family.encode, chunk, media_type)
        encode = time.perf_counter() - started
        headers = {
            "ardiff-chunk-metadata": json.dumps(chunk.metadata, ensure_ascii=True, separators=(",", ":")),
            **shapes,
            "server-timing": _timing_header(outcome.timing(encode=encode)),
        }
        return TickResponse(body, media_type, headers)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- continuity (issue 12, contracts §2/§9)

    def _export_to_tier(
        self, session_id: str, book: SessionBook, kind: ExportKind, holder: str | None = None
    ) -> tuple[str, int]:
        """On the forward thread: the session's export written to the shared tier; its location, size."""
        assert self.tier is not None
        assert self.runtime is not None
        runtime = self.runtime
        return self.tier.write(
            session_id, kind, lambda out: runtime.export_session(session_id, out, book=book), holder=holder
        )

    def _export_suspension(
        self, session_id: str, book: SessionBook, holder: str | None
    ) -> tuple[str, str, int]:
        """On the forward thread: a suspended session's export; (tier, location, size). This pod's host memory
        when it fits (no holder: a migration with a shared tier keeps the session in the runner instead),
        else the shared tier; `HostTierFull` when neither takes it."""
        assert self.runtime is not None
        runtime = self.runtime
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
        location, size = self._export_to_tier(session_id, book, "suspend", holder)
        return "shared", location, size

    def _import_from_host(self, location: str) -> SessionBook:
        """On the forward thread: install the export this pod keeps in its host memory at `location`."""
        assert self.runtime is not None
        if self.host_tier is None:
            raise ExportCorrupt(
                f"this worker keeps no host tier (ARDIFF_HOST_TIER_BYTES) to resume {location}"
            )
        return self.runtime.import_session(self.host_tier.get(location).reader())

    def _forget_export(self, location: str) -> None:
        """Remove an export this pod wrote that is no longer needed, in whichever tier it lies."""
        if host_holder(location) is not None:
            if self.host_tier is not None:
                self.host_tier.remove(location)
        elif self.tier is not None:
            self.tier.remove(location)

    def _import_from_tier(self, location: str) -> SessionBook:
        """On the forward thread: install the export at `location`; the book that travelled with it."""
        assert self.tier is not None
        assert self.runtime is not None
        with self.tier.open(location) as source:
            return self.runtime.import_session(source)

    async def _resume(
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
        assert self.link is not None
        await self._drop_held(session_id, "placed back on this pod: it resumes from the shared tier")
        await self._admit(session_id, record)
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
                self._books.pop(session_id, None)
                raise AtCapacity(f"no room to resume session {session_id!r} here: {exc}") from None
            except SessionExportError as exc:
                if direct_only:
                    self._books.pop(session_id, None)
                    raise
                if isinstance(exc, ExportIdentityMismatch) and location == record.location:
                    await self._give_back(session_id, record, exc)  # a refusal: the export itself is fine
                log.warning("session %s could not be resumed from %s: %s", session_id, location, exc)
                failures.append(exc.code)
                continue
            break
        else:
            self._books.pop(session_id, None)
            await self.link.resumed(session_id)  # the exports are of no use: never try them again
            await self._mark_reset_required(session_id)
            raise ResetRequired(
                f"session {session_id!r} could not be resumed ({', '.join(failures)}); "
                "send reset=true with chunk_index=0"
            )
        book = self._books[session_id] = dataclasses.replace(book, token_sha256=record.token_sha256)
        kind = export_kind(location)
        seconds = time.perf_counter() - started
        note = resume_note(record, location, kind, pulled, seconds, pod=self.link.pod)
        await self.link.resumed(session_id, note=json.dumps(note, sort_keys=True))
        if kind != "snapshot":
            self._forget_export(location)
        # The snapshot the session continues with, written here or by the pod it came from: this pod's next
        # snapshot replaces it (and removes it), as it replaces its own.
        adopted = location if kind == "snapshot" else record.snapshot_location
        if adopted:
            self._snapshots[session_id] = adopted
        self.metrics.resumes.labels(note["source"]).inc()
        self.metrics.continuity_seconds.labels("import").observe(seconds)
        log.info("resumed session %s at chunk %d from its %s", session_id, book.next_chunk_index, kind)
        return book

    async def _give_back(self, session_id: str, record: SessionRecord, refusal: Exception) -> NoReturn:
        """This worker cannot import the session's export (another model, resolution, dtype: another
        identity): the session goes back to `suspended` at the same copy, its slot here freed, so a pod that
        can import it resumes it on the next demand. The tick is told to retry (`resuming`)."""
        assert self.link is not None
        self._books.pop(session_id, None)
        try:
            await self.link.mark_suspended(
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
        (`_pull`), and the shared tier's copy is read only when that fails. A host-tier export is read from
        this pod's memory, or pulled from the pod that keeps it (it has no other copy)."""
        assert self.runtime is not None
        source = await self._transfer_source(location)
        holder = host_holder(location)
        direct = None if source is None else await self._pull(session_id, *source, size=size)
        if source is not None:
            pulled[location] = None if direct is None else direct[1]
        async with self._forward_lock:
            if direct is not None:
                book = direct[0]
            elif direct_only:
                raise TransferFailed(f"session {session_id!r} could not be pulled from the pod holding it")
            elif holder is not None and (self.link is None or holder != self.link.pod):
                raise ExportCorrupt(f"the host-tier export {location} could not be pulled from pod {holder}")
            elif holder is not None:
                book = await self._on_forward_thread(self._import_from_host, location)
            elif self.tier is None:
                raise ExportCorrupt("this worker mounts no shared tier (ARDIFF_SUSPEND_DIR) to resume from")
            else:
                book = await self._on_forward_thread(self._import_from_tier, location)
            if book.session_id != session_id:
                await self._on_forward_thread(self.runtime.close, book.session_id)
                raise ExportCorrupt(f"{location} holds session {book.session_id!r}, not {session_id!r}")
        return book

    async def _snapshot(self, session_id: str) -> None:
        """A periodic snapshot to the shared tier; the previous one is replaced. A failure costs nothing but
        the snapshot (logged): the session goes on."""
        assert self.link is not None
        book = self._books.get(session_id)
        if self.tier is None or book is None or book.status is not SessionStatus.ACTIVE:
            return
        started = time.perf_counter()
        try:
            async with self._forward_lock:
                location, size = await self._on_forward_thread(
                    self._export_to_tier, session_id, book, "snapshot"
                )
        except Exception as exc:
            log.warning("snapshot of session %s failed: %s", session_id, exc)
            return
        try:
            await self.link.note_snapshot(session_id, location=location, chunk_index=book.next_chunk_index)
        except Exception as exc:  # nothing points at it: it would stay until the session is closed
            log.warning("snapshot of session %s failed: %s (removed)", session_id, exc)
            self.tier.remove(location)
            return
        previous, self._snapshots[session_id] = self._snapshots.get(session_id), location
        if previous:
            self.tier.remove(previous)
        self.metrics.continuity_bytes.labels("snapshot").inc(size)
        self.metrics.continuity_seconds.labels("snapshot").observe(time.perf_counter() - started)

    async def _suspend(self, session_id: str, reason: str) -> None:
        """A `suspend` event: export the session to the shared tier at a tick boundary, report it, release it.

        The slot stays taken until the store hears of the export (`suspending`), so the runner never holds
        more than its capacity. An export that fails (or a session that never ticked here) is reported with no
        location: the store then evicts it as before (its KV is lost, `reset_required`).
        """
        assert self.link is not None
        assert self.runtime is not None
        # Its tick ends first: exports happen between ticks.
        while session_id in self._in_flight:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        tier, location, size, chunk = "shared", "", 0, 0
        # A migration keeps the session here for its new pod to pull (the pool shares a transfer token); its
        # shared-tier copy is the fallback. Without a shared tier the host tier's copy is what is pulled.
        migrating = reason == "migrate" and self.settings.transfer_token and self.tier is not None
        holder = self.link.pod if migrating else None
        held = False
        started = time.perf_counter()
        with self._exclusive(session_id):
            book = self._books.get(session_id)
            resident = session_id in self.runtime.resident_sessions()
            unreported = self._unreported.pop(session_id, None)
            if unreported is not None and not (book is not None and unreported.fits(book, holder)):
                self._forget_export(unreported.location)  # of another state or kind: no use any more
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
                self.exports_sessions
                and book is not None
                and book.status is SessionStatus.ACTIVE
                and resident
            ):
                try:
                    async with self._forward_lock:
                        tier, location, size = await self._on_forward_thread(
                            self._export_suspension, session_id, book, holder
                        )
                    chunk = book.next_chunk_index
                except (SessionExportError, HostTierFull, OSError) as exc:
                    log.warning("session %s could not be exported (%s): evicted instead", session_id, exc)
            if location:
                self._unreported[session_id] = UnreportedExport(tier, location, size, chunk, holder)
            from ardiff.kv import errors as placement

            try:
                await self.link.mark_suspended(
                    session_id, tier=tier, location=location, size=size, chunk_index=chunk
                )
            except placement.SessionNotHere as exc:  # deleted or moved meanwhile: nothing to report
                log.info("suspend of %s no longer applies (%s)", session_id, exc)
                if location:
                    self._forget_export(location)
            else:
                held = bool(location and holder and book is not None)
            self._unreported.pop(session_id, None)  # reported, or of no use (any other failure keeps it)
        if held:
            assert book is not None
            self._hold_for_transfer(session_id, book, location)
        else:
            await self._release(session_id, reason="suspend")
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

    # ---------------------------------------------------------------- pod-to-pod transfer (contracts §4)

    def _hold_for_transfer(self, session_id: str, book: SessionBook, location: str) -> None:
        """Keep a migrated session's state in the runner (no slot: the store freed it) for its new pod to
        pull; dropped after `transfer_hold_seconds`, when its slot is needed, or when the pod goes."""
        self._books.pop(session_id, None)
        self._snapshots.pop(session_id, None)
        self.metrics.evictions.labels("suspend").inc()
        until = time.monotonic() + self.settings.transfer_hold_seconds
        self._held[session_id] = HeldForTransfer(book, location, until)
        self._tasks = [task for task in self._tasks if not task.done()]
        if self._offering is None or self._offering.done():
            self._offering = supervised("offer-held", self._offer_held, self.metrics)
            self._tasks.append(self._offering)
        self._tasks.append(
            asyncio.create_task(self._drop_held_at(session_id, until), name=f"hold-{session_id}")
        )

    async def _offer_held(self) -> None:
        """While sessions are held here: as soon as the store places one on another pod, ask that pod to pull
        it now (`POST …/prefetch`) rather than at its first tick, so the move does not wait for the client
        and this pod, which is usually going, need not wait either."""
        assert self.link is not None
        offered: set[tuple[str, str]] = set()
        verify = peer_verify(self.settings.tls_ca_file)
        async with httpx.AsyncClient(timeout=OFFER_TIMEOUT_SECONDS, verify=verify) as client:
            while self._held:
                try:
                    bindings = await self.link.bindings(list(self._held))
                except Exception as exc:
                    log.warning("could not check the held sessions' placements: %s", exc)
                    bindings = {}
                for session_id, binding in bindings.items():
                    held = self._held.get(session_id)
                    if held is None or binding is None or binding.resume_from != held.location:
                        continue
                    if binding.pod == self.link.pod or (session_id, binding.pod) in offered:
                        continue
                    offered.add((session_id, binding.pod))
                    await self._offer(client, session_id, binding.pod)
                await asyncio.sleep(OFFER_POLL_SECONDS)

    async def _offer(self, client: httpx.AsyncClient, session_id: str, pod: str) -> None:
        token = self.settings.transfer_token
        try:
            endpoint = await self.link.endpoint_of(pod) if self.link is not None else None
            if endpoint is None or token is None:
                return
            url = endpoint.rstrip("/") + PREFETCH_PATH.format(session_id=session_id)
            answer = await client.post(url, headers={"authorization": f"Bearer {token}"})
            log.info("offered session %s to pod %s: %d", session_id, pod, answer.status_code)
        except Exception as exc:  # it pulls at its first tick instead
            log.info("could not offer session %s to pod %s: %s", session_id, pod, exc)

    def prefetch(self, session_id: str, authorization: str | None) -> None:
        """The pod holding a migrated session placed here offers it: pull it now, in the background."""
        self._check_pool_token(authorization)
        self._tasks = [task for task in self._tasks if not task.done()]
        if session_id in self._prefetching:
            return
        task = asyncio.create_task(self._prefetch(session_id), name=f"prefetch-{session_id}")
        self._prefetching[session_id] = task
        task.add_done_callback(lambda _: self._prefetching.pop(session_id, None))
        self._tasks.append(task)

    async def _prefetch(self, session_id: str) -> None:
        """Import a session placed here from the pod holding it, before its first tick; anything that stands
        in the way (not placed here, a tick already at it, no room, the pull failing) leaves it to that
        tick, which resumes it the usual way."""
        if self.link is None or not self.ready:
            return
        try:
            record = await self.link.session(session_id)
            book = self._books.get(session_id)
            if (
                record is None
                or not record.resume_from
                or not self.link.is_here(record)
                or (book is not None and book.holds_slot)
            ):
                return
            with self._exclusive(session_id):
                await self._resume(session_id, record, direct_only=True)
        except Exception as exc:
            log.info("prefetch of session %s left to its first tick: %s", session_id, exc)

    async def _sweep_tier_forever(self) -> None:
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
        assert self.host_tier is not None
        assert self.link is not None
        copies = self.host_tier.copies()
        bindings = await self.link.bindings([copy.session_id for copy in copies]) if copies else {}
        dropped = []
        for copy in copies:
            if not copy_needed(bindings.get(copy.session_id), copy.location):
                self.host_tier.remove(copy.location)
                dropped.append(copy.session_id)
        if dropped:
            log.info("removed %d host-tier exports nothing points at: %s", len(dropped), dropped[:10])
        return dropped

    async def sweep_tier(self) -> list[str]:
        """One sweep (`_sweep_tier_forever`): the closed sessions whose files it removed."""
        assert self.link is not None
        if self.host_tier is not None:
            await self.sweep_host_tier()
        if self.tier is None:
            return []
        stored = await asyncio.to_thread(self.tier.sessions)
        bindings = await self.link.bindings(stored) if stored else {}
        closed = [
            name for name, binding in bindings.items() if binding and binding.state is SessionState.CLOSED
        ]
        for name in closed:
            await asyncio.to_thread(self.tier.forget_session, name)
        if closed:
            log.info("removed the shared tier's files of %d closed sessions: %s", len(closed), closed[:10])
        return closed

    async def _drop_held_at(self, session_id: str, until: float) -> None:
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        held = self._held.get(session_id)
        if held is not None and held.until <= time.monotonic():
            await self._drop_held(session_id, "not pulled in time")

    async def _drop_held(self, session_id: str, why: str) -> None:
        """Release a held session's state (its shared-tier copy stays: the new pod resumes from that)."""
        if self._held.pop(session_id, None) is None or self.runtime is None:
            return
        async with self._forward_lock:
            await self._on_forward_thread(self.runtime.close, session_id)
        log.info("released session %s held for a transfer (%s)", session_id, why)

    def _check_pool_token(self, authorization: str | None) -> None:
        """401 unless `authorization` carries the pool's transfer token (a worker without one refuses all)."""
        token = self.settings.transfer_token
        scheme, _, presented = (authorization or "").partition(" ")
        if (
            not token
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(presented.strip().encode(), token.encode())
        ):
            raise Unauthorized("missing or wrong pool transfer token")

    async def claim_transfer(self, session_id: str, authorization: str | None) -> HeldForTransfer | HostCopy:
        """The held session (sent once) or host-tier copy (kept until the store no longer points at it) a pull
        asks for (401 without the pool's transfer token, 404 if this pod has neither, or a copy nothing needs
        any more: it is dropped)."""
        self._check_pool_token(authorization)
        held: HeldForTransfer | HostCopy | None = self._held.pop(session_id, None)
        if held is None and self.host_tier is not None:
            held = self.host_tier.copy_of(session_id)
            if held is not None and not await self._copy_still_needed(held):
                held = None
        if held is None:
            raise UnknownSession(f"session {session_id!r} is not held on this pod for a transfer")
        self._sending[session_id] = time.monotonic() + READ_TIMEOUT_SECONDS
        return held

    async def _copy_still_needed(self, copy: HostCopy) -> bool:
        """Whether the store still points at a host-tier copy (`copy_needed`); one it no longer does is
        dropped. A store that cannot be asked is no verdict: the copy stays."""
        assert self.host_tier is not None
        if self.link is None:
            return True
        try:
            binding = (await self.link.bindings([copy.session_id]))[copy.session_id]
        except Exception as exc:
            log.warning("could not check session %s's host-tier copy: %s", copy.session_id, exc)
            return True
        if copy_needed(binding, copy.location):
            return True
        self.host_tier.remove(copy.location)
        log.info("dropped session %s's host-tier copy: nothing points at it any more", copy.session_id)
        return False

    async def _drop_copy_once_resumed(self, copy: HostCopy) -> None:
        """After a pull of a host-tier copy: drop it as soon as the puller reported it resumed (its slot in
        the budget is wanted), looking for `transfer_hold_seconds`; the sweep takes over after that."""
        deadline = time.monotonic() + self.settings.transfer_hold_seconds
        while time.monotonic() < deadline and await self._copy_still_needed(copy):  # noqa: ASYNC110 (the store)
            await asyncio.sleep(OFFER_POLL_SECONDS)

    def send_transfer(self, session_id: str, held: HeldForTransfer | HostCopy) -> AsyncIterator[bytes]:
        """The session's export, the HTTP body of a pull: a host-tier copy as it lies in memory (kept), a held
        session's written into memory first and released (the puller has it, or reads the shared tier's
        copy). No forward lock is held while the body goes out."""
        if isinstance(held, HostCopy):
            return self._send_copy(held)
        return self._send_held(session_id, held)

    async def _send_copy(self, copy: HostCopy) -> AsyncIterator[bytes]:
        async for piece in self._send_pieces(copy.session_id, copy.pieces):
            yield piece
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(
            asyncio.create_task(self._drop_copy_once_resumed(copy), name=f"sent-{copy.session_id}")
        )

    async def _send_held(self, session_id: str, held: HeldForTransfer) -> AsyncIterator[bytes]:
        assert self.runtime is not None
        runtime = self.runtime
        collector = PieceCollector(sys.maxsize)
        try:
            async with self._forward_lock:
                try:
                    await self._on_forward_thread(
                        runtime.export_session, session_id, collector, book=held.book
                    )
                finally:
                    await self._on_forward_thread(runtime.close, session_id)
        except BaseException:
            self._record_sent(session_id, "failed", 0, 0.0)
            raise
        async for piece in self._send_pieces(session_id, collector.finish()):
            yield piece

    async def _send_pieces(self, session_id: str, pieces: tuple[bytes, ...]) -> AsyncIterator[bytes]:
        """Send an export's pieces, counted. The test fault (`ARDIFF_TEST_TRANSFER_STALL_SECONDS`) stops after
        the first `STALL_AFTER_BYTES` for that long: a holder that dies, or stalls, mid-transfer."""
        stall = self.settings.test_transfer_stall_seconds if self.settings.test_faults else 0.0
        started = time.perf_counter()
        sent = 0
        result = "failed"
        self.metrics.transfers_in_progress.labels("out").inc()
        try:
            for piece in pieces:
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

    async def _transfer_source(self, location: str) -> tuple[str, str] | None:
        """(pod, endpoint) of the pod a migration's export names as holding the session, when this worker may
        pull from it; None to read the shared tier instead (no token, no holder, the holder gone)."""
        pod = host_holder(location) or direct_source(location)
        if self.link is None or not self.settings.transfer_token or pod is None or pod == self.link.pod:
            return None
        try:
            endpoint = await self.link.endpoint_of(pod)
        except Exception as exc:
            log.warning("could not look up pod %s for a direct transfer: %s", pod, exc)
            return None
        if endpoint is None:
            log.info("pod %s that held %s is gone: trying the session's other copies", pod, location)
            return None
        return pod, endpoint

    async def _pull(
        self, session_id: str, pod: str, endpoint: str, *, size: int
    ) -> tuple[SessionBook, TransferResult] | None:
        """Download the session's export from the pod that holds it (without the forward lock: a holder that
        stalls holds up nobody else's tick; at most `size` bytes, within the transfer deadline), then import
        it under the lock. None (logged, counted) when that fails, so the caller reads the shared tier's
        copy instead; this worker's refusals (no room, another identity) are raised: no copy would do."""
        assert self.runtime is not None
        token = self.settings.transfer_token
        assert token is not None
        self.metrics.transfers_in_progress.labels("in").inc()
        try:
            if not size:
                raise TransferFailed("the store records no size for the export: nothing bounds the pull")
            if self._pull_client is None:
                self._pull_client = pull_client(peer_verify(self.settings.tls_ca_file))
            pieces, result = await download(self._pull_client, endpoint, session_id, token, size=size)
            async with self._forward_lock:
                book = await self._on_forward_thread(self.runtime.import_session, BodyReader(iter(pieces)))
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
        self.metrics.transfers.labels("in", "ok").inc()
        self.metrics.transfer_bytes.labels("in").inc(result.bytes)
        self.metrics.transfer_seconds.labels("in").observe(result.seconds)
        log.info(
            "pulled session %s from pod %s: %d bytes in %.3f s (%.0f MB/s)",
            session_id,
            pod,
            result.bytes,
            result.seconds,
            result.bytes_per_second / 1e6,
        )
        return book, result

    async def _spill_host_tier(self) -> None:
        """Draining: the host tier's copies die with this pod, so each one the store still points at is copied
        to the shared tier first. Without a shared tier they stay for pulls under way (`_await_handoffs`);
        the others' sessions resume from their snapshot or need a reset (contracts §2)."""
        if self.host_tier is None or self.tier is None or self.link is None:
            return
        tier = self.tier
        for copy in self.host_tier.copies():
            try:
                location, _ = await asyncio.to_thread(tier.write, copy.session_id, "suspend", copy.write_to)
            except OSError as exc:
                log.warning("could not move session %s's host-tier export: %s", copy.session_id, exc)
                continue
            try:
                moved = await self.link.relocate_export(
                    copy.session_id, from_location=copy.location, to_location=location
                )
            except Exception as exc:
                log.warning("could not record session %s's moved export: %s", copy.session_id, exc)
                moved = False
            if moved:
                self.host_tier.remove(copy.location)
                log.info("moved session %s's export from the host tier to %s", copy.session_id, location)
            else:  # resumed or closed meanwhile
                tier.remove(location)

    async def _await_host_pulls(self) -> None:
        """Draining without a shared tier: wait (up to `transfer_hold_seconds`) while host-tier copies are
        about to be pulled by the pods their sessions were placed on, or wait to be placed (a migration)."""
        if self.host_tier is None or self.tier is not None or self.link is None:
            return
        deadline = time.monotonic() + self.settings.transfer_hold_seconds
        while time.monotonic() < deadline and (copies := self.host_tier.copies()):
            try:
                bindings = await self.link.bindings([copy.session_id for copy in copies])
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

    async def _await_handoffs(self) -> None:
        """Draining (the pod goes): keep the held sessions whose new pod is about to pull them, each until its
        hold ends; a session nobody was placed for within `HANDOFF_PLACEMENT_SECONDS` resumes from the shared
        tier. Then wait for the pulls under way."""
        assert self.link is not None or not self._held
        placement_deadline = time.monotonic() + HANDOFF_PLACEMENT_SECONDS
        while self._held:
            now = time.monotonic()
            try:
                bindings = await self.link.bindings(list(self._held))
            except Exception as exc:
                log.warning("could not check the held sessions' placements: %s", exc)
                bindings = {}
            for session_id, held in list(self._held.items()):
                binding = bindings.get(session_id)
                placed = binding is not None and binding.resume_from == held.location
                waiting = binding is not None and binding.state is SessionState.SUSPENDED
                if now >= held.until or not (placed or (waiting and now < placement_deadline)):
                    await self._drop_held(session_id, "the pod is going")
            if self._held:
                await asyncio.sleep(0.1)
        await self._await_host_pulls()
        while self._sending and time.monotonic() < max(self._sending.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def _misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        """A draining worker still points a session's client at the pod it moved to (421), so that a migrated
        session's next tick reaches its new pod, which pulls it from here while this one waits to exit."""
        if self.link is None:
            return
        try:
            record = await self.link.session(session_id)
        except Exception:
            return  # the usual 503 not_ready follows
        presented = bearer_token_sha256(authorization)
        if (
            record is None
            or record.state is not SessionState.PLACED
            or record.pod == self.link.pod
            or presented is None
            or not hmac.compare_digest(presented, record.token_sha256)
        ):
            return
        endpoint = await self.link.endpoint_of(record.pod)
        if endpoint:
            raise Misdirected(f"session {session_id!r} lives on pod {record.pod}", endpoint=endpoint)

    # ---------------------------------------------------------------- admission

    def _admitted(self) -> int:
        return sum(1 for book in self._books.values() if book.holds_slot)

    async def _admit(self, session_id: str, record: SessionRecord | None) -> None:
        """Give the session a slot; never more than `capacity` (the runner would evict silently)."""
        book = self._books.get(session_id)
        if book is not None and book.holds_slot:
            return
        if self._admitted() >= self.capacity:
            await self._release_stale()
            if self._admitted() >= self.capacity:
                raise AtCapacity(f"this worker holds {self.capacity} session(s), its capacity")
        # Sessions held for a transfer are in the runner but hold no slot: they make room (tier copy kept).
        while self._held and self._admitted() + len(self._held) >= self.capacity:
            await self._drop_held(next(iter(self._held)), "its room in the runner is needed")
        self._books[session_id] = SessionBook(session_id, token_sha256=record.token_sha256 if record else "")

    async def _release_stale(self) -> None:
        """Close sessions the store no longer places here (an evict event may not be consumed yet)."""
        if self.link is None:
            return
        candidates = [
            sid for sid, book in self._books.items() if book.holds_slot and sid not in self._in_flight
        ]
        try:
            bindings = await self.link.bindings(candidates)
        except Exception as exc:
            log.warning("could not check for stale sessions: %s", exc)
            return
        for session_id, binding in bindings.items():
            # No record is no verdict: Redis lost its data and the binding is being rebuilt.
            if binding is not None and not self.link.is_here(binding):
                await self._release(session_id, reason="stale")

    async def _release(self, session_id: str, *, reason: str, keep_book: bool = False) -> None:
        """The one teardown path for releases the client did not ask for (events, stale sessions)."""
        assert self.runtime is not None
        self._held.pop(session_id, None)  # closed or moved while held for a transfer: nothing to pull
        async with self._forward_lock:
            held = session_id in self._books or session_id in self.runtime.resident_sessions()
            await self._on_forward_thread(self.runtime.close, session_id)
            book = self._books.get(session_id)
            if keep_book and book is not None and book.status is not SessionStatus.CLOSED:
                self._books[session_id] = book.failed()
            else:
                self._books.pop(session_id, None)
        snapshot = self._snapshots.pop(session_id, None)
        if snapshot and reason != "suspend" and self.tier is not None:  # closed: its snapshot is of no use
            self.tier.remove(snapshot)
        unreported = self._unreported.pop(session_id, None)
        if unreported is not None:  # closed or evicted before its suspension was reported
            self._forget_export(unreported.location)
        if held:
            self.metrics.evictions.labels(reason).inc()
            log.info("released session %s (%s)", session_id, reason)

    async def on_event(self, event: Any) -> None:
        """A `close`/`evict` entry of this pod's stream: release the session's state in the runner."""
        if self.runtime is None:
            return
        if event.kind == "suspend":
            await self._suspend(event.session, event.reason)
            return
        binding = (await self.link.bindings([event.session]))[event.session]
        here = binding is not None and self.link.is_here(binding)
        book = self._books.get(event.session)
        if event.kind == "evict" and here and not binding.reset_required and book is not None:
            # Re-placed here and reset since the eviction: the event is older than the session's state.
            log.info("ignoring stale evict of %s", event.session)
            return
        await self._release(event.session, reason=event.kind, keep_book=here)

    # ---------------------------------------------------------------- Redis writes after a tick

    async def _touch(self, session_id: str, *, chunk_index: int, reset_done: bool) -> None:
        if self.link is None:
            return
        from ardiff.kv import errors as placement

        try:
            await self.link.touch(session_id, chunk_index=chunk_index, reset_done=reset_done)
        except placement.UnknownSession:
            # Redis lost the record during the forward: the chunk stands (the KV and the book are here), the
            # operator rebuilds the binding and the next tick's touch records the progress.
            log.warning("no record of session %s to touch (the store lost its data)", session_id)
        except placement.SessionNotHere:
            await self._release(session_id, reason="evict")
            raise SessionEvicted(f"session {session_id!r} was moved off this pod during its tick") from None
        except placement.PodFenced:
            self._fence()
            raise NotReady("this pod was fenced by a newer incarnation") from None
        except Exception as exc:  # Redis away or not answering: the chunk stands, a retry of it replays it
            log.warning("could not record session %s's tick in the placement store: %s", session_id, exc)
            raise NotReady(
                f"placement store unavailable ({type(exc).__name__}); the chunk is kept: retry the same "
                "request"
            ) from exc

    async def _mark_reset_required(self, session_id: str) -> None:
        if self.link is None:
            return
        try:
            await self.link.mark_reset_required(session_id)
        except Exception as exc:  # the local book already enforces the reset
            log.warning("could not mark %s reset_required in the placement store: %s", session_id, exc)

    # ---------------------------------------------------------------- other routes

    async def close(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        """DELETE: close the session in the runner (idempotent); the operator's release frees the slot.

        A closed book (410 until the operator's `close` event is consumed) is kept only for a session of this
        pod: one it holds a book for, or one placed here. Any other (suspended, evicted, lost, deleted
        through whichever pod its client asked) gets no `close` event here, so its book would outlive it and
        answer 410 to a later session of the same name placed here."""
        runtime = self._require_loaded()
        record = await self._placed_record(session_id, authorization, any_state=True)
        self._held.pop(session_id, None)  # deleted while held for a transfer: nothing to pull
        async with self._forward_lock:
            await self._on_forward_thread(runtime.close, session_id)
            book = self._books.get(session_id) or SessionBook(session_id)
            ours = session_id in self._books or (record is not None and self.link.is_here(record))
            if self.link is not None and ours:
                self._books[session_id] = book.closed()
            else:
                self._books.pop(session_id, None)  # standalone, or not this pod's: the id is free again
        return {**book.closed().describe(), "resident": False}

    async def reset(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        runtime = self.require_ready()
        with self._counted(session_id, authorization):
            record = await self._placed_record(session_id, authorization)
        with self._exclusive(session_id):
            book = self._books.get(session_id)
            if book is None and record is None:
                raise UnknownSession(f"no session {session_id!r} on this worker")
            if book is not None and book.status is SessionStatus.CLOSED:
                raise SessionClosed(f"session {session_id!r} was closed on this worker")
            async with self._forward_lock:
                await self._on_forward_thread(runtime.reset, session_id)
                if book is not None:
                    book = self._books[session_id] = book.after_reset()
            await self._touch(session_id, chunk_index=0, reset_done=True)
        return self._describe(session_id, book)

    async def describe(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        self._require_loaded()
        with self._counted(session_id, authorization):
            record = await self._placed_record(session_id, authorization)
        if session_id not in self._books and record is None:
            raise UnknownSession(f"no session {session_id!r} on this worker")
        return self._view(session_id, record)

    async def open_stream(self, session_id: str, authorization: str | None) -> dict[str, Any]:
        """A stream may open for a session that may tick here (the checks of a tick); its view."""
        self.require_ready()
        with self._counted(session_id, authorization):
            record = await self._placed_record(session_id, authorization)
        return self._view(session_id, record)

    def _view(self, session_id: str, record: SessionRecord | None) -> dict[str, Any]:
        book = self._books.get(session_id)
        view = self._describe(session_id, book)
        if record is not None and record.reset_required and book is None:
            view["state"] = SessionStatus.RESET_REQUIRED.value
        return view

    def _describe(self, session_id: str, book: SessionBook | None) -> dict[str, Any]:
        resident = self.runtime is not None and session_id in self.runtime.resident_sessions()
        view = (book or SessionBook(session_id)).describe()
        return {**view, "resident": resident, "in_flight": session_id in self._in_flight}

    def list_sessions(self, authorization: str | None) -> dict[str, Any]:
        """The pod's capacity and KV blocks for anyone (the numbers `/metrics` serves); the sessions it
        holds only to the pool's transfer token (401 for any other credential; a pool without one lists
        them to nobody), or to anyone standalone, where nothing is authenticated (issue 23 item 10)."""
        named = self.link is None or authorization is not None
        if self.link is not None and authorization is not None:
            self._check_pool_token(authorization)
        blocks = self.runtime.kv_blocks() if self.runtime is not None else None
        return {
            "ready": self.ready,
            "capacity": self.capacity,
            "admitted": self._admitted(),
            "kv_blocks": None if blocks is None else {"free": blocks.free, "total": blocks.total},
            "sessions": [self._describe(sid, book) for sid, book in sorted(self._books.items())]
            if named
            else None,
        }

    def render_metrics(self) -> bytes:
        return self.metrics.render(self.runtime, admitted=self._admitted(), ready=self.ready)
