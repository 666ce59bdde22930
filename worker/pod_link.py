"""This worker's side of the placement store (`ardiff.kv.placement`, docs/contracts.md §2).

It registers the pod with the runner's capacity, keeps the lease alive (a heartbeat re-creates a record Redis
lost), reads the pod's event stream, and answers the per-tick questions: is this session placed here, by this
incarnation of the pod, and where does it live otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from ardiff.kv.errors import PodFenced
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodEvent, PoolId, SessionBinding, SessionRecord, SessionState
from ardiff.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

EventHandler = Callable[[PodEvent], Awaitable[None]]
# How long one blocking read of the event stream waits; also bounds how late a stop is noticed.
EVENT_BLOCK_MS = 1000
RETRY_SECONDS = 1.0


class PodLink:
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

    @classmethod
    def connect(cls, settings: WorkerSettings) -> PodLink:
        assert settings.redis_url is not None
        return cls(PlacementStore.from_url(settings.redis_url), settings)

    @property
    def registered(self) -> bool:
        return self.epoch is not None

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
            except PodFenced:
                log.error("pod %s epoch %s was fenced by a newer incarnation; stopping", self.pod, self.epoch)
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
        return await self.store.get_session(self.pool, session)

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
        await self.store.set_draining(self.pool, self.pod, draining=True)

    async def close(self) -> None:
        await self.store.close()
