"""This worker's side of the placement store (`ardiff.kv.placement`, docs/contracts.md §2): `PodLink`, the
placement port (worker/placement_port.py) of a pod in a pool.

It registers the pod with the runner's capacity, keeps the lease alive (a heartbeat re-creates a record Redis
lost), reads the pod's event stream, and answers the per-tick questions: is this session placed here, by this
incarnation of the pod, with this token, and where does it live otherwise (`placed_record`: one Redis read; a
refusal never tells which names exist).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Iterable
from typing import NoReturn

from ardiff.kv.errors import PodFenced
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionBinding, SessionRecord, SessionState, check_name
from ardiff.wire import ServedBy
from ardiff.worker.errors import (
    Misdirected,
    NotReady,
    PlacementRecovering,
    Resuming,
    SessionClosed,
    SessionEvicted,
    Unauthorized,
)
from ardiff.worker.placement_port import EventHandler, LocalSessions, Membership, bearer_token_sha256
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.transfer import check_pool_token

log = logging.getLogger(__name__)

# How long one blocking read of the event stream waits; also bounds how late a stop is noticed.
EVENT_BLOCK_MS = 1000
RETRY_SECONDS = 1.0
# A tick for a session migrating off this pod waits this long for its new pod (then 421), polling the store.
MIGRATION_WAIT_SECONDS = 5.0
MIGRATION_POLL_SECONDS = 0.05


class PodLink:
    """The placement port of a pod in a pool (`PlacementPort`), over the pool's placement store."""

    def __init__(self, store: PlacementStore, settings: WorkerSettings) -> None:
        self.store = store
        self.pool = PoolId(settings.namespace, settings.pool)
        self.pod = settings.pod_name
        self.endpoint = settings.advertised_endpoint
        self.address = settings.advertised_address
        self.lease_ms = int(settings.lease_seconds * 1000)
        self.heartbeat_seconds = settings.heartbeat_seconds
        self.capacity = 0
        self.exports = False  # the runtime can export and a shared tier is mounted: evictions suspend
        # Issue 25, set by the worker service: the frames/s this pod may be asked for (0 = not limited) and
        # its measured forward time per full chunk; reported at register and with every heartbeat.
        self.compute_fps = 0.0
        self.tick_ms = 0.0
        self.epoch: int | None = None
        self.transfer_token = settings.transfer_token

    @classmethod
    def connect(cls, settings: WorkerSettings) -> PodLink:
        assert settings.redis_url is not None
        return cls(PlacementStore.from_url(settings.redis_url), settings)

    @property
    def registered(self) -> bool:
        return self.epoch is not None

    @property
    def served_by(self) -> ServedBy:
        return ServedBy(self.pod, self.epoch or 0)

    async def register(self, capacity: int) -> None:
        self.capacity = capacity
        registration = await self.store.register_pod(
            self.pool,
            self.pod,
            capacity=capacity,
            endpoint=self.endpoint,
            lease_ms=self.lease_ms,
            exports=self.exports,
            compute_fps=self.compute_fps,
            tick_ms=self.tick_ms,
            address=self.address,
        )
        self.epoch = registration.epoch
        log.info(
            "registered pod %s in %s: epoch=%d capacity=%d endpoint=%s (sessions of the previous "
            "incarnation now lost: %s)",
            self.pod,
            self.pool,
            self.epoch,
            capacity,
            self.endpoint,
            list(registration.lost_sessions) or "none",
        )

    async def join(self, membership: Membership) -> None:
        """Register, then heartbeat, consume the event stream and sweep the tiers, in the membership's tasks
        (supervised)."""
        self.exports = membership.exports
        await self.register(membership.capacity)
        tasks = membership.tasks
        tasks.supervise("heartbeat", lambda: self.heartbeat_forever(membership.on_fenced))
        tasks.supervise("events", lambda: self.events_forever(membership.on_event))
        if membership.sweep is not None:
            tasks.supervise("tier-sweep", membership.sweep)

    def report_compute(self, compute_fps: float, tick_ms: float) -> None:
        """Reported at the next register or heartbeat."""
        self.compute_fps = compute_fps
        self.tick_ms = tick_ms

    async def heartbeat_forever(self, on_fenced: Callable[[], None]) -> None:
        """Renew the lease until cancelled; a fenced pod (a newer incarnation exists) stops serving."""
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await self.store.heartbeat(
                    self.pool,
                    self.pod,
                    epoch=self.epoch,
                    capacity=self.capacity,
                    endpoint=self.endpoint,
                    lease_ms=self.lease_ms,
                    exports=self.exports,
                    compute_fps=self.compute_fps,
                    tick_ms=self.tick_ms,
                    address=self.address,
                )
            except PodFenced as fenced:  # a newer incarnation, or this one's lapsed lease was reaped
                log.error("%s; stopping", fenced)
                on_fenced()
                return
            except Exception as exc:  # Redis away: keep trying, the lease decides when the pod counts as dead
                log.warning("heartbeat of pod %s failed: %s", self.pod, exc)

    async def events_forever(self, handle: EventHandler) -> None:
        """Consume the pod's close/evict stream until cancelled; an entry is acked once it was handled. No
        Redis error ends it: an ack that fails leaves its entries pending, so they are delivered again (the
        handlers are idempotent)."""
        while True:
            try:
                events = await self.store.read_events(self.pool, self.pod, block_ms=EVENT_BLOCK_MS, count=32)
            except Exception as exc:
                log.warning("reading the event stream of pod %s failed: %s", self.pod, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            handled: list[str] = []
            for event in events:
                if event.epoch == self.epoch:
                    try:
                        await handle(event)
                    except Exception:
                        log.exception(
                            "handling %s of session %s failed; retried later", event.kind, event.session
                        )
                        continue
                else:  # meant for an earlier incarnation of this pod, whose sessions are already lost
                    log.info(
                        "ignoring %s of %s for epoch %d (ours %s)",
                        event.kind,
                        event.session,
                        event.epoch,
                        self.epoch,
                    )
                handled.append(event.id)
            try:
                if handled:
                    await self.store.ack_events(self.pool, self.pod, handled)
            except Exception as exc:
                log.warning("acknowledging %d event(s) of pod %s failed: %s", len(handled), self.pod, exc)
                handled = []
            if len(handled) < len(events):
                await asyncio.sleep(RETRY_SECONDS)

    async def placed_record(
        self, session_id: str, authorization: str | None, local: LocalSessions, *, any_state: bool = False
    ) -> SessionRecord | None:
        """The session's record when it may be served here; 401/410/421/503 otherwise.

        Only the session's token learns anything of it: a wrong or missing token, a name without a record
        and a name no session can have are all refused alike (`_refuse`). `any_state` lets a DELETE of an
        evicted or closed session succeed (close is idempotent).
        """
        try:
            check_name("session", session_id)
        except ValueError:
            await self._refuse()
        try:
            record = await self.session(session_id)
        except Exception as exc:
            raise NotReady(f"placement store unavailable: {exc}") from exc
        presented = bearer_token_sha256(authorization)
        if record is None:
            await self._no_record(session_id, presented, local)
        if presented is None or not hmac.compare_digest(presented, record.token_sha256):
            await self._refuse()
        if not any_state and record.state in (SessionState.SUSPENDED, SessionState.SUSPENDING):
            await self._demand_resume(session_id, record, local)
        if record.state is SessionState.PLACED and record.pod != self.pod:
            endpoint = await self.endpoint_of(record.pod)
            raise Misdirected(f"session {session_id!r} lives on pod {record.pod}", endpoint=endpoint)
        if any_state or self.is_here(record):
            return record
        if record.state is SessionState.CLOSED:
            raise SessionClosed(f"session {session_id!r} was closed")
        if record.state is SessionState.LOST:
            raise SessionEvicted(f"session {session_id!r} lost its pod; it is re-placed with reset_required")
        if record.state is SessionState.EVICTED:
            raise SessionEvicted(f"session {session_id!r} was evicted to make room; it is re-placed later")
        raise SessionEvicted(f"session {session_id!r} was placed on an earlier incarnation of this pod")

    async def _demand_resume(self, session_id: str, record: SessionRecord, local: LocalSessions) -> NoReturn:
        """A tick for a suspended session is a demand: the operator places it again (contracts §4). A session
        migrating off this pod (a demand already recorded, its export written here or being written) is
        waited for instead, up to `MIGRATION_WAIT_SECONDS`, and the tick told where it went (421): the
        client follows at once rather than after a `Retry-After`."""
        state = record.state
        if state is SessionState.SUSPENDED:
            try:
                await self.request_resume(session_id)
            except Exception as exc:
                raise NotReady(f"placement store unavailable: {exc}") from exc
        migrating_from_here = record.resume_requested_ms > 0 and (
            local.held_for_transfer(session_id)
            or (state is SessionState.SUSPENDING and record.pod == self.pod)
        )
        if migrating_from_here:
            endpoint = await self._new_home(session_id)
            if endpoint is not None:
                raise Misdirected(f"session {session_id!r} moved to another pod", endpoint=endpoint)
        raise Resuming(f"session {session_id!r} is {state.value}; it is being resumed, retry")

    async def _new_home(self, session_id: str) -> str | None:
        """The endpoint of the pod a migrating session gets placed on, once it is (None: not within
        `MIGRATION_WAIT_SECONDS`, or placed back here)."""
        deadline = time.monotonic() + MIGRATION_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                record = await self.session(session_id)
            except Exception:
                return None
            if record is None or record.state not in (SessionState.SUSPENDING, SessionState.SUSPENDED):
                if record is not None and record.state is SessionState.PLACED and record.pod != self.pod:
                    return await self.endpoint_of(record.pod)
                return None
            await asyncio.sleep(MIGRATION_POLL_SECONDS)
        return None

    async def _no_record(self, session_id: str, presented: str | None, local: LocalSessions) -> NoReturn:
        """The store has no record of the session: 503 `placement_recovering` while it may be rebuilt.

        A session this worker holds is alive (its KV is here) whatever the store says: Redis lost its data and
        the operator rebuilds the binding from the session's status within a round; its own client (the token
        it was admitted with) is told to retry. Any other caller is refused as one with a wrong token is
        (`_refuse`): an id the worker never held and the store does not know looks like any other session.
        """
        admitted = local.slot_token(session_id)
        if admitted is not None and presented is not None and hmac.compare_digest(presented, admitted):
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
        try:
            recovering = await self.store_lost_data()
        except Exception as exc:
            raise NotReady(f"placement store unavailable: {exc}") from exc
        if recovering:
            raise PlacementRecovering("the placement store lost its data and is rebuilding it; retry")
        raise Unauthorized("missing or wrong bearer token for this session")

    async def misdirect_while_draining(self, session_id: str, authorization: str | None) -> None:
        """A draining worker still points a session's client at the pod it moved to (421), so that a migrated
        session's next tick reaches its new pod, which pulls it from here while this one waits to exit."""
        try:
            record = await self.session(session_id)
        except Exception:
            return  # the usual 503 not_ready follows
        presented = bearer_token_sha256(authorization)
        if (
            record is None
            or record.state is not SessionState.PLACED
            or record.pod == self.pod
            or presented is None
            or not hmac.compare_digest(presented, record.token_sha256)
        ):
            return
        endpoint = await self.endpoint_of(record.pod)
        if endpoint:
            raise Misdirected(f"session {session_id!r} lives on pod {record.pod}", endpoint=endpoint)

    async def moved_away(self, session_ids: list[str]) -> list[str]:
        """Those of `session_ids` the store now binds elsewhere; none when it cannot be asked (logged). No
        record is no verdict: Redis lost its data and the binding is being rebuilt."""
        try:
            bindings = await self.bindings(session_ids)
        except Exception as exc:
            log.warning("could not check for stale sessions: %s", exc)
            return []
        return [sid for sid, binding in bindings.items() if binding is not None and not self.is_here(binding)]

    def may_list_sessions(self, authorization: str | None) -> bool:
        """The sessions are listed only to the pool's transfer token (401 for any other credential; a pool
        without one lists them to nobody); a request without a credential gets the numbers only."""
        if authorization is None:
            return False
        check_pool_token(self.transfer_token, authorization)
        return True

    def keeps_closed_book(self, held_here: bool, record: SessionRecord | None) -> bool:
        """Only a session of this pod (one it holds a book for, or one placed here) gets the `close` event
        that drops its closed book; any other's would outlive it."""
        return held_here or (record is not None and self.is_here(record))

    async def store_lost_data(self) -> bool:
        """Whether the store lost its data and has not healed yet: this pod's own record is missing (only a
        data loss removes the record of a registered, unfenced pod, until its heartbeat re-creates it)."""
        return await self.store.get_pod(self.pool, self.pod) is None

    def is_here(self, record: SessionRecord | SessionBinding) -> bool:
        """Placed on this pod by this incarnation (a session of an earlier epoch lost its state), or being
        suspended from it (its state is still here until the export is written)."""
        bound = record.state in (SessionState.PLACED, SessionState.SUSPENDING)
        return bound and record.pod == self.pod and record.pod_epoch == self.epoch

    async def session(self, session: str) -> SessionRecord | None:
        return await self.store.get_session(self.pool, session, image=False)

    async def session_image(self, session: str) -> bytes | None:
        try:
            return await self.store.get_session_image(self.pool, session)
        except Exception as exc:
            raise NotReady(f"placement store unavailable: {exc}") from exc

    async def bindings(self, sessions: Iterable[str]) -> dict[str, SessionBinding | None]:
        """Where each session is placed (its binding only: no prompt, image or token hash to read)."""
        names = list(sessions)
        bindings = await self.store.get_bindings(self.pool, names)
        return {name: bindings.get(name) for name in names}

    async def endpoint_of(self, pod: str) -> str | None:
        record = await self.store.get_pod(self.pool, pod)
        return record.endpoint if record is not None else None

    async def touch(self, session: str, *, chunk_index: int, reset_done: bool) -> None:
        await self.store.touch(
            self.pool, session, pod=self.pod, epoch=self.epoch, chunk_index=chunk_index, reset_done=reset_done
        )

    async def mark_reset_required(self, session: str) -> None:
        await self.store.mark_reset_required(self.pool, session, pod=self.pod, epoch=self.epoch)

    async def mark_suspended(
        self, session: str, *, tier: str, location: str, size: int, chunk_index: int
    ) -> None:
        """The session's export is in `tier` (`location` ""= the export failed: it is evicted)."""
        await self.store.mark_suspended(
            self.pool,
            session,
            pod=self.pod,
            epoch=self.epoch,
            tier=tier,
            location=location,
            bytes=size,
            chunk_index=chunk_index,
        )

    async def relocate_export(self, session: str, *, from_location: str, to_location: str) -> bool:
        """A host-tier copy now lies in the shared tier too (this pod is going); False: no longer needed."""
        return await self.store.relocate_export(
            self.pool, session, from_location=from_location, to_location=to_location, tier="shared"
        )

    async def request_resume(self, session: str) -> None:
        await self.store.request_resume(self.pool, session)

    async def resumed(self, session: str, *, note: str = "") -> None:
        await self.store.resumed(self.pool, session, pod=self.pod, epoch=self.epoch, note=note)

    async def note_snapshot(self, session: str, *, location: str, chunk_index: int) -> None:
        await self.store.note_snapshot(
            self.pool, session, pod=self.pod, epoch=self.epoch, location=location, chunk_index=chunk_index
        )

    async def note_history(self, session: str, *, kept: list[int], chunk_index: int | None = None) -> None:
        await self.store.note_history(
            self.pool, session, pod=self.pod, epoch=self.epoch, kept=kept, chunk_index=chunk_index
        )

    async def set_draining(self) -> None:
        if not self.registered:
            return  # not placed on yet: nothing to stop
        await self.store.set_draining(self.pool, self.pod, draining=True)

    async def close(self) -> None:
        await self.store.close()
