"""The placement store's calls both callers make: the reads, and two writes worker and operator share.

The worker reads its session and pod records and bindings; the operator reads bindings, pods and the server
clock. `set_draining` is the worker's on SIGTERM and the operator's for a pod it scales down, rolls or finds
on a cordoned node; `mark_reset_required` the worker's after a failed forward and the operator's for a session
it placed again after Redis lost its binding to a pod that is gone. `_refusal` turns a script's refusal of a
session call into its typed error (the worker's calls use it too). `check_invariants` is for tests and the
failover harness.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ardiff.kv.errors import (
    PlacementError,
    PodFenced,
    ScriptStatus,
    SessionNotHere,
    UnknownPod,
    UnknownSession,
)
from ardiff.kv.invariants import read_violations
from ardiff.kv.keys import PoolKeys
from ardiff.kv.records import (
    SESSION_FIELDS_BUT_IMAGE,
    PodRecord,
    PoolId,
    SessionBinding,
    SessionRecord,
    SessionState,
    check_name,
    check_pool,
    check_positive_int,
)
from ardiff.kv.scripts import ScriptRunner, as_text, as_texts

# A session record's states while a pod holds the session (`get_session_image`).
_BOUND_STATES = frozenset(state.value.encode() for state in (SessionState.PLACED, SessionState.SUSPENDING))
BINDINGS_BATCH = 1_000  # sessions per read_bindings call: a few ms of Redis time each


class PlacementShared(ScriptRunner):
    """Reads, the drain flag and the reset mark, over the runner's client (see the module docstring)."""

    async def ping(self) -> None:
        """One round trip to Redis (raises when it cannot be reached)."""
        await self.client.ping()

    async def server_time_ms(self) -> int:
        """Redis server time: the clock the scripts stamp `last_tick_ms` and leases with."""
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def mark_reset_required(self, pool: PoolId, session: str, *, pod: str, epoch: int) -> None:
        """A forward failed and the runner freed the session's KV: the next tick must reset at chunk 0."""
        keys = PoolKeys(check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        check_positive_int("epoch", epoch)
        status, reply = await self._run(
            "mark_reset_required", [keys.session(session), keys.pod(pod)], [pod, epoch]
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def _refusal(
        self, keys: PoolKeys, status: ScriptStatus, reply: list[Any], *, session: str, pod: str, epoch: int
    ) -> PlacementError:
        if status is ScriptStatus.UNKNOWN_SESSION:
            return UnknownSession(session)
        if status is ScriptStatus.POD_FENCED:
            return PodFenced(pod, epoch, int(reply[0]))
        if status is ScriptStatus.SESSION_NOT_HERE:
            state, owner = SessionState(as_text(reply[0])), as_text(reply[1])
            endpoint = ""
            if state is SessionState.PLACED and owner:
                endpoint = as_text(await self.client.hget(keys.pod(owner), "endpoint"))
            return SessionNotHere(session, state, owner, endpoint)
        return PlacementError(f"placement script answered {status.name} for session {session}")

    async def set_draining(self, pool: PoolId, pod: str, *, draining: bool = True) -> None:
        """The worker got SIGTERM (or recovered from it): no new placements on this pod, sessions stay."""
        await self._drain(pool, pod, draining=draining, only_if_empty=False)

    async def _drain(self, pool: PoolId, pod: str, *, draining: bool, only_if_empty: bool) -> bool:
        keys = PoolKeys(check_pool(pool))
        check_name("pod", pod)
        status, reply = await self._run(
            "drain_pod",
            [keys.pod(pod), keys.open, keys.draining, keys.headroom],
            [pod, int(bool(draining)), int(bool(only_if_empty))],
        )
        if status is ScriptStatus.UNKNOWN_POD:
            raise UnknownPod(pod)
        return int(reply[0]) == 1

    async def get_session(self, pool: PoolId, name: str, *, image: bool = True) -> SessionRecord | None:
        return (await self.get_sessions(pool, [name], image=image)).get(name)

    async def get_sessions(
        self, pool: PoolId, names: Iterable[str], *, image: bool = True
    ) -> dict[str, SessionRecord]:
        """The records of `names` that exist (one round trip); `image=False` leaves out the image (a worker's
        read on every tick: `SESSION_FIELDS_BUT_IMAGE`, its `image` empty)."""
        keys = PoolKeys(check_pool(pool))
        names = [check_name("session", name) for name in names]
        fields = SESSION_FIELDS_BUT_IMAGE
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                if image:
                    pipe.hgetall(keys.session(name))
                else:
                    pipe.hmget(keys.session(name), fields)
            replies = await pipe.execute()
        if not image:
            keys_but_image = [field.encode() for field in fields]
            replies = [
                {key: value for key, value in zip(keys_but_image, got, strict=True) if value is not None}
                for got in replies
            ]
        return {
            name: SessionRecord.from_hash(name, raw) for name, raw in zip(names, replies, strict=True) if raw
        }

    async def get_session_image(self, pool: PoolId, name: str) -> bytes | None:
        """The session's first image (PNG/JPEG, up to 1 MiB; empty: it has none); None when the session is
        not bound to a pod any more (a release drops the image: what was read before is stale)."""
        keys = PoolKeys(check_pool(pool))
        key = keys.session(check_name("session", name))
        state, image = await self.client.hmget(key, ["state", "image"])
        if state not in _BOUND_STATES:
            return None
        return image or b""

    async def get_bindings(self, pool: PoolId, names: Iterable[str]) -> dict[str, SessionBinding]:
        """The bindings of `names` that have a record: state, pod, pod_epoch, reset_required, chunk_index and
        last_tick_ms, never the prompt or the image (`read_bindings`: one script call and one JSON document
        per `BINDINGS_BATCH` sessions)."""
        keys = PoolKeys(check_pool(pool))
        names = [check_name("session", name) for name in names]
        bindings: dict[str, SessionBinding] = {}
        for start in range(0, len(names), BINDINGS_BATCH):
            batch = names[start : start + BINDINGS_BATCH]
            _, reply = await self._run("read_bindings", [keys.session(name) for name in batch], [])
            for name, values in zip(batch, json.loads(reply[0]), strict=True):
                binding = SessionBinding.from_values(name, values or ())  # false: no record
                if binding is not None:
                    bindings[name] = binding
        return bindings

    async def get_pod(self, pool: PoolId, pod: str) -> PodRecord | None:
        keys = PoolKeys(check_pool(pool))
        raw = await self.client.hgetall(keys.pod(check_name("pod", pod)))
        return PodRecord.from_hash(pod, raw) if raw else None

    async def list_pods(self, pool: PoolId) -> list[PodRecord]:
        """Registered pods, by name."""
        keys = PoolKeys(check_pool(pool))
        names = sorted(as_texts(await self.client.smembers(keys.pods)))
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(keys.pod(name))
            raws = await pipe.execute()
        return [PodRecord.from_hash(name, raw) for name, raw in zip(names, raws, strict=True) if raw]

    async def check_invariants(self, pool: PoolId) -> list[str]:
        """Violations of the store's invariants (empty when all hold), read from one consistent snapshot:
        for every pod `used == |sessions placed on it| <= capacity`; every placed session points to a
        registered pod with that pod's epoch; the indexes agree with the records."""
        return await read_violations(self.client, check_pool(pool))
