"""The placement store's operations the operator calls (`ardiff.operator`: admission, the round, the sweep).

Admission (`place`, `release`, `evict_lru`), rebuilding bindings after Redis lost its data (`restore`,
`restore_suspended`), a pool's pods (`drain_pod` on scale-down, `remove_pod`, `reap_expired`), migration and
its time-out (`suspend`, `expire_suspending`), the resumed-note Event (`ack_resumed_note`), and the sweep of
deleted pools (`list_pools`, `list_session_names`, `delete_pool`). `place` and `evict_lru` remember the keys
their previous reply predicted (the plan hints), so a steady stream of placements takes one round trip each.
The operations the operator shares with the worker are in `placement_shared`.
"""

from __future__ import annotations

import hashlib
from typing import Any, get_args

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ardiff.kv.errors import InvalidPlacementArgument, ScriptStatus, UnknownSession
from ardiff.kv.keys import ANY_POOL_PATTERN, ANY_SESSION_PATTERN, PoolKeys, pool_of_key
from ardiff.kv.placement_shared import PlacementShared
from ardiff.kv.records import (
    MAX_PRIORITY,
    EvictionPolicy,
    Placement,
    PlacementPolicy,
    PlaceObservation,
    PlaceResult,
    PoolId,
    SessionSpec,
    SessionState,
    check_eviction_policy,
    check_name,
    check_non_negative_int,
    check_pool,
    check_positive_int,
    check_priority,
    check_spec,
    check_text,
    check_tier,
    decimal_text,
)
from ardiff.kv.scripts import Plan, as_text, as_texts

DEFAULT_CLOSED_TTL_MS = 3_600_000  # closed records linger so the worker can answer 410, not 404
DEFAULT_STREAM_MAXLEN = 1_000
PLACEMENT_POLICIES: tuple[PlacementPolicy, ...] = get_args(PlacementPolicy)


def _spec_args(pool: PoolId, spec: SessionSpec) -> list[str | int | bytes]:
    """ARGV[1..13] of place.lua and restore.lua: the session's record fields, as both scripts write them."""
    return [
        spec.name,
        pool.name,
        spec.token_sha256,
        spec.seed,
        spec.prompt,
        spec.image,
        spec.max_chunks,
        spec.priority,
        spec.eviction_policy,
        decimal_text(spec.playout_fps),
        spec.playout_buffer_chunks,
        spec.history_keep_chunks,
        spec.fork_from,
    ]


class OperatorPlacement(PlacementShared):
    """The operator's side of the store (see the module docstring). `closed_ttl_ms`: how long a closed record
    lingers; `stream_maxlen`: the length each pod's event stream is trimmed to."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        closed_ttl_ms: int = DEFAULT_CLOSED_TTL_MS,
        stream_maxlen: int = DEFAULT_STREAM_MAXLEN,
        **runner_options: Any,
    ) -> None:
        self.closed_ttl_ms = check_positive_int("closed_ttl_ms", closed_ttl_ms)
        self.stream_maxlen = check_positive_int("stream_maxlen", stream_maxlen)
        super().__init__(client, **runner_options)
        # place() and evict_lru(): the pods/sessions the previous reply predicted the next call will need.
        self._place_hints: dict[PoolId, Plan] = {}
        self._evict_hints: dict[PoolId, Plan] = {}

    async def place(
        self,
        pool: PoolId,
        spec: SessionSpec,
        *,
        may_evict: bool = False,
        min_idle_ms: int = 0,
        policy: PlacementPolicy = "least-loaded",
        prefer_pod: str = "",
    ) -> PlaceResult:
        """Give `spec.name` a slot, or return its current one (`already_placed=True`).

        Picks a live, non-draining pod with a free slot (`least-loaded` or `pack`) and, where its compute is
        limited (issue 25), compute for `spec.playout_fps`: demand_fps + playout_fps <= compute_fps (the
        session's playout_fps joins the pod's demand_fps with its slot). With none, a first
        admission (no record, or `closed`) or a `lost` session (its pod died under it) called with
        `may_evict=True` evicts the session with the lowest priority (<= its own), then the least recently
        ticked, idle >= `min_idle_ms`, never `evictionPolicy: Never`, and takes its slot (`victim`).
        `evicted` sessions take free slots only (a victim never evicts in turn); `evicted`/`lost` sessions
        come back with `reset_required`. `placement` is None when nothing fits (the caller decides whether
        the pool grows).

        Issue 12: a victim on a pod that exports becomes `suspending` instead (it keeps its slot until
        `mark_suspended`) and this session is not placed (`placement=None, victim=..., suspending=True`);
        while any session of the pool is suspending nobody is evicted. A `suspended` session may evict like a
        first admission and comes back with `resume_from` (its export) and `reset_required=False`; a `lost`
        one comes back from the export it had not imported yet, else from its latest snapshot, and with
        `reset_required` only when it has neither. A pending result says why (`pending_reason`).

        Issue 26: `prefer_pod` (a fork's parent's pod; "" = none) is taken when it takes the session by every
        rule above (live, not draining, a free slot, compute), else the policy's choice (never an eviction for
        it). A first admission with `spec.fork_from` comes back with `resume_from = fork_from`, `chunk_index`
        its chunk and no `reset_required`: its worker imports the kept chunk before the first tick.
        """
        keys = PoolKeys(check_pool(pool))
        check_spec(spec)
        check_non_negative_int("min_idle_ms", min_idle_ms)
        if policy not in PLACEMENT_POLICIES:
            raise InvalidPlacementArgument(
                f"placement policy must be one of {PLACEMENT_POLICIES}, got {policy!r}"
            )
        if prefer_pod:
            check_name("prefer_pod", prefer_pod)
        hint = self._place_hints.get(pool, Plan())
        plan = Plan(list(hint.pods), list(hint.sessions))
        plan.add([prefer_pod] if prefer_pod else [], [])
        _, reply = await self._run(
            "place",
            [keys.session(spec.name), *keys.indexes],
            [
                *_spec_args(pool, spec),
                int(bool(may_evict)),
                min_idle_ms,
                policy,
                self.stream_maxlen,
                prefer_pod,
            ],
            pool_keys=keys,
            plan=plan,
        )
        outcome, pod, pod_epoch, endpoint, reset_required, victim = reply[:6]
        outcome, victim = as_text(outcome), as_text(victim)
        hint_pod, hint_victim_pod, hint_victim = reply[6:9]
        if outcome != "already":  # an idempotent answer predicts nothing about the pool
            self._place_hints[pool] = Plan(
                [as_text(p) for p in (hint_pod, hint_victim_pod) if p],
                [as_text(hint_victim)] if hint_victim else [],
            )
        after = PlaceObservation.from_reply(spec.name, reply[11:14])
        if outcome == "pending":
            reason = "compute" if as_text(reply[10]) == "compute" else "capacity"
            return PlaceResult(placement=None, pending_reason=reason, observed=after)
        if outcome == "suspending":
            return PlaceResult(placement=None, victim=victim, suspending=True, observed=after)
        placement = Placement(
            session=spec.name,
            pod=as_text(pod),
            endpoint=as_text(endpoint),
            pod_epoch=int(pod_epoch),
            reset_required=int(reset_required) == 1,
            resume_from=as_text(reply[9]),
        )
        return PlaceResult(
            placement=placement, victim=victim or None, already_placed=outcome == "already", observed=after
        )

    async def restore(
        self,
        pool: PoolId,
        spec: SessionSpec,
        *,
        pod: str,
        pod_epoch: int,
        chunk_index: int,
        reset_required: bool,
    ) -> Placement | None:
        """Rebuild a binding from the session CR's status after Redis lost its data.

        Succeeds only if the session has no record and the pod's record exists with `pod_epoch` (its heartbeat
        re-created it) with a free slot; otherwise returns None and the operator re-places the session."""
        keys = PoolKeys(check_pool(pool))
        check_spec(spec)
        check_name("pod", pod)
        check_positive_int("pod_epoch", pod_epoch)
        check_non_negative_int("chunk_index", chunk_index)
        _, reply = await self._run(
            "restore",
            [keys.session(spec.name), keys.pod(pod), keys.open, keys.residents, keys.lru, keys.headroom],
            [*_spec_args(pool, spec), pod, pod_epoch, chunk_index, int(bool(reset_required)), "", "", 0],
        )
        if int(reply[0]) != 1:
            return None
        return Placement(
            session=spec.name,
            pod=pod,
            endpoint=as_text(reply[1]),
            pod_epoch=pod_epoch,
            reset_required=bool(reset_required),
        )

    async def restore_suspended(
        self, pool: PoolId, spec: SessionSpec, *, tier: str, location: str, size: int, chunk_index: int
    ) -> bool:
        """Rebuild a suspended session's record from its CR's status after Redis lost its data (issue 12): no
        pod, no slot, its export at `location` in `tier` (the shared tier outlives Redis' data), continuing at
        `chunk_index`; it resumes on demand like any suspended session. False when it has a record already."""
        keys = PoolKeys(check_pool(pool))
        check_spec(spec)
        check_tier(tier)
        if not location:
            raise InvalidPlacementArgument("placement restore_suspended needs the export's location, got ''")
        check_non_negative_int("size", size)
        check_non_negative_int("chunk_index", chunk_index)
        session_key = keys.session(spec.name)
        _, reply = await self._run(
            "restore",
            # No pod: KEYS[2] is never read, and stays in the pool's slot.
            [session_key, session_key, keys.open, keys.residents, keys.lru, keys.headroom],
            [*_spec_args(pool, spec), "", 0, chunk_index, 0, tier, location, size],
        )
        return int(reply[0]) == 1

    async def set_eviction(
        self, pool: PoolId, session: str, *, priority: int, eviction_policy: EvictionPolicy
    ) -> bool:
        """Apply a session's changed `priority` and `eviction_policy` (its spec's) to its record and, where it
        is placed, to the LRU index; False when the record held them already. UnknownSession without one."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_priority("priority", priority)
        check_eviction_policy(eviction_policy)
        status, reply = await self._run(
            "set_eviction", [keys.session(session), keys.lru], [session, priority, eviction_policy]
        )
        if status is ScriptStatus.UNKNOWN_SESSION:
            raise UnknownSession(session)
        return bool(int(reply[0]))

    async def release(self, pool: PoolId, session: str, *, reason: str) -> SessionState | None:
        """Close a session (idempotent): a placed one frees its slot and its pod gets a `close` event. The
        record stays `closed` for `closed_ttl_ms`. Returns the state before the call (None: no record)."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_text("reason", reason)
        _, reply = await self._run(
            "release",
            [keys.session(session), keys.open, keys.residents, keys.lru, keys.suspending, keys.headroom],
            [session, reason, self.closed_ttl_ms, self.stream_maxlen],
            pool_keys=keys,
            plan=Plan(),
        )
        return SessionState(as_text(reply[0])) if reply[0] else None

    async def evict_lru(
        self, pool: PoolId, *, min_idle_ms: int, max_priority: int = MAX_PRIORITY, reason: str = "evicted"
    ) -> str | None:
        """Evict the session `place` would evict first (priority <= `max_priority`, idle >= `min_idle_ms`,
        never `Never`), freeing its slot; returns its name, or None when no session qualifies."""
        keys = PoolKeys(check_pool(pool))
        check_non_negative_int("min_idle_ms", min_idle_ms)
        check_priority("max_priority", max_priority)
        check_text("reason", reason)
        hint = self._evict_hints.get(pool, Plan())
        _, reply = await self._run(
            "evict_lru",
            [keys.open, keys.residents, keys.lru, keys.headroom],
            [min_idle_ms, max_priority, reason, self.stream_maxlen],
            pool_keys=keys,
            plan=Plan(list(hint.pods), list(hint.sessions)),
        )
        victim, hint_pod, hint_session = reply[:3]
        self._evict_hints[pool] = Plan(
            [as_text(hint_pod)] if hint_pod else [], [as_text(hint_session)] if hint_session else []
        )
        return as_text(victim) or None

    async def drain_pod(self, pool: PoolId, pod: str, *, only_if_empty: bool = True) -> bool:
        """Atomically mark the pod draining (iff it holds no session, if `only_if_empty`); True if marked."""
        return await self._drain(pool, pod, draining=True, only_if_empty=only_if_empty)

    async def remove_pod(self, pool: PoolId, pod: str) -> tuple[str, ...]:
        """The pod is gone (the operator deleted it): forget it; its sessions become `lost`, returned."""
        keys = PoolKeys(check_pool(pool))
        check_name("pod", pod)
        removed = await self._remove_pods(keys, "named", pod)
        return removed.get(pod, ())

    async def reap_expired(self, pool: PoolId) -> dict[str, tuple[str, ...]]:
        """Forget every pod whose lease expired; returns {pod: its sessions, now `lost`}."""
        return await self._remove_pods(PoolKeys(check_pool(pool)), "expired", "")

    async def _remove_pods(self, keys: PoolKeys, mode: str, pod: str) -> dict[str, tuple[str, ...]]:
        _, reply = await self._run(
            "remove_pods",
            [keys.pods, *keys.indexes, keys.reaped],
            [mode, pod],
            pool_keys=keys,
            plan=Plan(),
        )
        removed = reply[0]
        return {as_text(removed[i]): tuple(as_texts(removed[i + 1])) for i in range(0, len(removed), 2)}

    async def write_pool(self, pool: PoolId, *, tls_ca: str = "") -> None:
        """The pool's record (issue 37), at the end of each round: what the front door reads of the pool (the
        PEM bundle verifying its pods over https, '' for a plain pool). Its absence tells the front door that
        the store lost its data, so a round writes it after the round's restores."""
        keys = PoolKeys(check_pool(pool))
        if not isinstance(tls_ca, str):
            raise InvalidPlacementArgument(f"placement tls_ca must be a string, got {type(tls_ca).__name__}")
        digest = hashlib.sha256(tls_ca.encode()).hexdigest() if tls_ca else ""
        await self._run("write_pool", [keys.pool_record], [tls_ca, digest])

    async def delete_pool(self, pool: PoolId) -> int:
        """Delete every key of the pool; returns how many were deleted."""
        keys = PoolKeys(check_pool(pool))
        deleted = 0
        batch: list[str] = []
        async for key in self.client.scan_iter(match=keys.pattern, count=500):
            batch.append(as_text(key))
            if len(batch) == 500:
                deleted += await self._delete_keys(batch)
                batch = []
        if batch:
            deleted += await self._delete_keys(batch)
        self._place_hints.pop(pool, None)
        self._evict_hints.pop(pool, None)
        return deleted

    async def list_pools(self) -> set[PoolId]:
        """Every pool that has a key in this store (SCAN over the keyspace: for the operator's periodic sweep
        of pools deleted while it was away, never on a hot path)."""
        pools: set[PoolId] = set()
        async for key in self.client.scan_iter(match=ANY_POOL_PATTERN, count=1000):
            if (pool := pool_of_key(as_text(key))) is not None:
                pools.add(pool)
        return pools

    async def list_session_names(self) -> dict[PoolId, set[str]]:
        """The names of every session record, closed ones included, by pool: one SCAN over the keyspace for
        all pools (a SCAN visits every key whatever its pattern, so the operator's sweep makes one per period,
        not one per pool)."""
        names: dict[PoolId, set[str]] = {}
        async for key in self.client.scan_iter(match=ANY_SESSION_PATTERN, count=1000):
            text = as_text(key)
            if (pool := pool_of_key(text)) is not None:
                names.setdefault(pool, set()).add(text.removeprefix(PoolKeys(pool).session("")))
        return names

    async def _delete_keys(self, batch: list[str]) -> int:
        _, reply = await self._run("delete_pool", batch, [])
        return int(reply[0])

    async def suspend(self, pool: PoolId, session: str, *, reason: str) -> bool:
        """Operator (migration): a `placed` session on a pod that exports becomes `suspending` (it keeps its
        slot) and its pod gets a `suspend` event with `reason`. `reason="migrate"` also records the demand to
        resume it, so it is placed again (elsewhere) as soon as its worker reports the export. True if it is
        suspending now (also when it already was); False if it is not placed or its pod cannot export."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_text("reason", reason)
        _, reply = await self._run(
            "suspend",
            [keys.session(session), keys.lru, keys.suspending],
            [session, reason, self.stream_maxlen],
            pool_keys=keys,
            plan=Plan(),
        )
        return int(reply[0]) == 1

    async def expire_suspending(self, pool: PoolId, *, timeout_ms: int) -> tuple[str, ...]:
        """Operator: sessions `suspending` for `timeout_ms` or more (their worker never reported the export)
        become `evicted` with `reset_required`, their slots freed and their pods told (`evict`, reason
        `suspend-timeout`); returns them. Without this a silent worker would block the pool's evictions."""
        keys = PoolKeys(check_pool(pool))
        check_positive_int("timeout_ms", timeout_ms)
        _, reply = await self._run(
            "expire_suspending",
            [keys.open, keys.residents, keys.lru, keys.suspending, keys.headroom],
            [timeout_ms, self.stream_maxlen],
            pool_keys=keys,
            plan=Plan(),
        )
        return tuple(as_texts(reply[0]))

    async def ack_resumed_note(self, pool: PoolId, session: str, note: str) -> bool:
        """The operator reported the session's `resumed_note` (as an Event): forget it, unless a newer one
        replaced it meanwhile. True when cleared."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_text("note", note)
        _, reply = await self._run("ack_resumed_note", [keys.session(session)], [note])
        return int(reply[0]) == 1
