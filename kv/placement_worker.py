"""The placement store's operations the worker calls (`ardiff.worker.pod_link.PodLink`, docs/contracts.md §2).

A pod's registration and lease, a tick's `touch`, the pod's event stream (read and acknowledge), and the
continuity reports of issue 12: an export written (`mark_suspended`), a suspended session ticked
(`request_resume`), an export moved (`relocate_export`) or imported (`resumed`), a periodic snapshot
(`note_snapshot`), and the chunks it keeps or was rewound to (`note_history`, issue 26). Every call names the
pod's incarnation (`epoch`); a newer one fences it (`PodFenced`). The operations the worker shares with the
operator are in `placement_shared`; kv/acl.py's `WORKER_SCRIPTS` lists the scripts this side runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from redis.exceptions import ResponseError

from ardiff.kv.connection import MAX_BLOCK_MS
from ardiff.kv.errors import (
    CapacityBelowUsed,
    InvalidPlacementArgument,
    PlacementError,
    PodFenced,
    ScriptStatus,
)
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement_shared import PlacementShared
from ardiff.kv.records import (
    PodEvent,
    PodRegistration,
    PoolId,
    SessionState,
    check_address,
    check_endpoint,
    check_name,
    check_non_negative_float,
    check_non_negative_int,
    check_pool,
    check_positive_int,
    check_text,
    check_tier,
    decimal_text,
    kept_chunks_text,
)
from ardiff.kv.scripts import Plan, as_text, as_texts

CONSUMER_GROUP = "worker"


def _event_kind(kind: bytes | None) -> Literal["close", "evict", "suspend"]:
    if kind == b"evict":
        return "evict"
    if kind == b"suspend":
        return "suspend"
    return "close"


class WorkerPlacement(PlacementShared):
    """The worker's side of the store (see the module docstring)."""

    async def register_pod(
        self,
        pool: PoolId,
        pod: str,
        *,
        capacity: int,
        endpoint: str,
        lease_ms: int,
        exports: bool = False,
        compute_fps: float = 0.0,
        tick_ms: float = 0.0,
        address: str = "",
    ) -> PodRegistration:
        """Register a (re)started worker: a new epoch, max(now_ms, previous + 1); the sessions an earlier
        incarnation held become `lost` and are returned. After Redis lost the previous record only the server
        clock orders epochs, so two registrations of one pod must be more than a millisecond apart.
        `exports`: the worker can export sessions (issue 12: its runtime supports it, a tier is configured),
        so eviction and migration suspend its sessions instead of dropping them. `compute_fps` (issue 25): the
        frames/s the pod may be asked for (its pool's utilisation bound x its measured throughput; 0 = not
        limited: admission by KV slots only); `tick_ms`: its measured forward time per full chunk. `address`
        (issue 37): `<ip>:<port>` where the front door reaches the pod."""
        return await self._upsert_pod(
            pool,
            pod,
            0,
            capacity,
            endpoint,
            lease_ms,
            exports,
            compute_fps=compute_fps,
            tick_ms=tick_ms,
            address=address,
        )

    async def heartbeat(
        self,
        pool: PoolId,
        pod: str,
        *,
        epoch: int,
        capacity: int,
        endpoint: str,
        lease_ms: int,
        exports: bool = False,
        compute_fps: float = 0.0,
        tick_ms: float = 0.0,
        address: str = "",
    ) -> PodRegistration:
        """Renew the lease (and `exports`, `compute_fps`, `tick_ms`, `address`). Raises `PodFenced` if a newer
        incarnation registered, or if this one's lease lapsed and the operator reaped its record (its
        sessions were placed elsewhere); re-creates the record if it is missing otherwise (Redis lost its
        data) or belongs to an older incarnation (`recreated=True`)."""
        return await self._upsert_pod(
            pool,
            pod,
            check_positive_int("epoch", epoch),
            capacity,
            endpoint,
            lease_ms,
            exports,
            compute_fps=compute_fps,
            tick_ms=tick_ms,
            address=address,
        )

    async def _upsert_pod(
        self,
        pool: PoolId,
        pod: str,
        epoch: int,
        capacity: int,
        endpoint: str,
        lease_ms: int,
        exports: bool,
        *,
        compute_fps: float,
        tick_ms: float,
        address: str,
    ) -> PodRegistration:
        keys = PoolKeys(check_pool(pool))
        check_name("pod", pod)
        check_non_negative_int("capacity", capacity)
        check_endpoint(endpoint)
        check_address(address)
        check_positive_int("lease_ms", lease_ms)
        compute_fps = check_non_negative_float("compute_fps", compute_fps)
        tick_ms = check_non_negative_float("tick_ms", tick_ms)
        status, reply = await self._run(
            "register_pod",
            [keys.pod(pod), keys.events(pod), keys.pods, *keys.indexes, keys.reaped],
            [
                pod,
                epoch,
                capacity,
                endpoint,
                lease_ms,
                int(bool(exports)),
                decimal_text(compute_fps),
                decimal_text(tick_ms),
                address,
            ],
            pool_keys=keys,
            plan=Plan(),
        )
        if status is ScriptStatus.POD_FENCED:
            raise PodFenced(pod, epoch, int(reply[0]))
        if status is ScriptStatus.CAPACITY_BELOW_USED:
            raise CapacityBelowUsed(pod, capacity, int(reply[0]))
        return PodRegistration(
            epoch=int(reply[0]),
            lost_sessions=tuple(as_texts(reply[2])),
            recreated=as_text(reply[1]) == "recreated",
        )

    async def touch(
        self,
        pool: PoolId,
        session: str,
        *,
        pod: str,
        epoch: int,
        chunk_index: int,
        reset_done: bool = False,
    ) -> int:
        """Record a tick (one round trip): chunk_index, last_tick_ms (server time, returned), LRU order.

        Raises `UnknownSession`, `PodFenced`, or `SessionNotHere` (its `state`, owning `pod` and `endpoint`).
        """
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        check_non_negative_int("chunk_index", chunk_index)
        status, reply = await self._run(
            "touch",
            [keys.session(session), keys.pod(pod), keys.lru],
            [session, pod, epoch, chunk_index, int(bool(reset_done))],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)
        return int(reply[0])

    async def read_events(
        self, pool: PoolId, pod: str, *, block_ms: int = 0, count: int = 100
    ) -> list[PodEvent]:
        """The pod's notifications: first those delivered before but never acknowledged (a restarted worker
        gets them again), then new ones, waiting up to `block_ms` (0: do not wait). Acknowledge them with
        `ack_events`."""
        keys = PoolKeys(check_pool(pool))
        check_name("pod", pod)
        if check_non_negative_int("block_ms", block_ms) > MAX_BLOCK_MS:
            raise InvalidPlacementArgument(
                f"placement block_ms must be at most {MAX_BLOCK_MS} (inside the socket timeout), "
                f"got {block_ms}"
            )
        check_positive_int("count", count)
        stream = keys.events(pod)
        for _ in range(2):
            try:
                pending = await self._events(stream, await self._read_stream(stream, pod, "0", count, None))
                if pending:
                    return pending
                fresh = await self._read_stream(stream, pod, ">", count, block_ms or None)
                return await self._events(stream, fresh)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._create_group(stream)
        raise PlacementError(f"placement event stream {stream} lost its consumer group twice in a row")

    async def _read_stream(
        self, stream: str, consumer: str, start: str, count: int, block: int | None
    ) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
        reply = await self.client.xreadgroup(
            CONSUMER_GROUP, consumer, {stream: start}, count=count, block=block
        )
        return [entry for _, entries in reply for entry in entries] if reply else []

    async def _create_group(self, stream: str) -> None:
        try:
            await self.client.xgroup_create(stream, CONSUMER_GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _events(
        self, stream: str, entries: list[tuple[bytes, dict[bytes, bytes] | None]]
    ) -> list[PodEvent]:
        events, trimmed = [], []
        for entry_id, fields in entries:
            if not fields:  # trimmed (MAXLEN) while pending: nothing left to deliver
                trimmed.append(entry_id)
                continue
            events.append(
                PodEvent(
                    id=as_text(entry_id),
                    kind=_event_kind(fields.get(b"kind")),
                    session=as_text(fields.get(b"session")),
                    reason=as_text(fields.get(b"reason")),
                    epoch=int(fields.get(b"epoch") or 0),
                )
            )
        if trimmed:
            await self.client.xack(stream, CONSUMER_GROUP, *trimmed)
        return events

    async def ack_events(self, pool: PoolId, pod: str, ids: Sequence[str]) -> int:
        """Acknowledge handled notifications; returns how many were pending."""
        keys = PoolKeys(check_pool(pool))
        check_name("pod", pod)
        ids = [check_text("event id", entry_id) for entry_id in ids]
        if not ids:
            return 0
        return int(await self.client.xack(keys.events(pod), CONSUMER_GROUP, *ids))

    async def mark_suspended(
        self,
        pool: PoolId,
        session: str,
        *,
        pod: str,
        epoch: int,
        tier: str,
        location: str,
        bytes: int,  # the record's field name (docs/contracts.md §2)
        chunk_index: int,
    ) -> None:
        """The worker wrote the export of a `suspending` (or `placed`) session it holds at `epoch`: the
        session becomes `suspended` (no pod, no slot) with `tier`, `location`, `bytes` and
        `suspended_chunk=chunk_index`. A demand to resume recorded while it was suspending (migration, or a
        tick meanwhile) is kept, so the operator places it again at once; otherwise it waits for a tick.
        `location=""` reports a failed export: the session becomes `evicted` with `reset_required` (the worker
        drops its KV). Repeating a report of the same location is a no-op.

        Raises `UnknownSession`, `PodFenced`, or `SessionNotHere` (not suspending/placed on this pod)."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        check_non_negative_int("bytes", bytes)
        check_non_negative_int("chunk_index", chunk_index)
        if not isinstance(location, str):
            raise InvalidPlacementArgument(f"placement location must be a string, got {location!r}")
        if location:
            check_tier(tier)
        status, reply = await self._run(
            "mark_suspended",
            [
                keys.session(session),
                keys.pod(pod),
                keys.open,
                keys.residents,
                keys.lru,
                keys.suspending,
                keys.headroom,
            ],
            [session, pod, epoch, tier if location else "", location, bytes if location else 0, chunk_index],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def request_resume(self, pool: PoolId, session: str) -> SessionState | None:
        """A tick reached a `suspended` (or `suspending`) session: record the demand to resume it
        (`resume_requested_ms`, server time; idempotent: the first demand's time stays). Returns the
        session's state (None: no record); other states are left alone."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        _, reply = await self._run("request_resume", [keys.session(session)], [session])
        return SessionState(as_text(reply[0])) if reply[0] else None

    async def relocate_export(
        self, pool: PoolId, session: str, *, from_location: str, to_location: str, tier: str
    ) -> bool:
        """A suspended session's export was copied to `tier` at `to_location` (a draining pod moves its host
        tier's copies to the shared tier): the record points there now, if it still pointed at
        `from_location` (its `location`, or the `resume_from` of a placement not imported yet). False: the
        record moved on (resumed, closed) and the caller removes the new copy."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_tier(tier)
        for name, value in (("from_location", from_location), ("to_location", to_location)):
            if not isinstance(value, str) or not value:
                raise InvalidPlacementArgument(f"placement {name} must be a non-empty string, got {value!r}")
        _, reply = await self._run(
            "relocate_export", [keys.session(session)], [from_location, to_location, tier]
        )
        return int(reply[0]) == 1

    async def resumed(self, pool: PoolId, session: str, *, pod: str, epoch: int, note: str = "") -> None:
        """The worker holding the session at `epoch` imported its `resume_from`: clear it. `note` (JSON: how
        the export came, its bytes and seconds) waits in `resumed_note` for the operator's Event.

        Raises `UnknownSession`, `PodFenced`, or `SessionNotHere`."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        if not isinstance(note, str):
            raise InvalidPlacementArgument(f"placement note must be a string, got {note!r}")
        status, reply = await self._run("resumed", [keys.session(session), keys.pod(pod)], [pod, epoch, note])
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def note_snapshot(
        self, pool: PoolId, session: str, *, pod: str, epoch: int, location: str, chunk_index: int
    ) -> None:
        """The worker holding the session at `epoch` wrote a periodic snapshot to the shared tier, which
        continues at `chunk_index`: a later pod loss places the session again from it, without
        `reset_required`. Raises `UnknownSession`, `PodFenced`, or `SessionNotHere`."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        check_text("location", location)
        check_non_negative_int("chunk_index", chunk_index)
        status, reply = await self._run(
            "note_snapshot",
            [keys.session(session), keys.pod(pod)],
            [pod, epoch, location, chunk_index],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def note_history(
        self,
        pool: PoolId,
        session: str,
        *,
        pod: str,
        epoch: int,
        kept: Sequence[int],
        chunk_index: int | None = None,
    ) -> None:
        """The worker holding the session at `epoch` keeps the chunk boundaries `kept` now (ascending,
        distinct, each >= 1, at most MAX_KEEP_CHUNKS): the record's `kept_chunks`, what a fork may start
        from. `chunk_index` (a rewind: the kept chunk the session continues at) also sets the record's
        `chunk_index`, atomically, and forgets a periodic snapshot taken after it; `kept` must then hold no
        chunk after it. Raises `UnknownSession`, `PodFenced`, or `SessionNotHere`."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        text = kept_chunks_text(kept)
        if chunk_index is not None:
            check_positive_int("chunk_index", chunk_index)
            if kept and kept[-1] > chunk_index:
                raise InvalidPlacementArgument(
                    f"placement rewind to chunk {chunk_index} keeps no later chunk, got kept={list(kept)!r}"
                )
        status, reply = await self._run(
            "note_history",
            [keys.session(session), keys.pod(pod)],
            [pod, epoch, text, "" if chunk_index is None else chunk_index],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)
