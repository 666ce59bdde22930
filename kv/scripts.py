"""Running the placement store's Lua scripts: loading them, declaring their keys, waiting for replicas.

Every mutation is one atomic Lua script (`kv/lua/<operation>.lua`, with `kv/lua/_lib.lua` prepended); Python
never reads, decides and writes back. Server `TIME` is the only clock the scripts use.

Redis Cluster needs every key a script touches in KEYS, but some keys depend on what the script finds (the
pod a session lands on, the victim it evicts, the sessions of a dead pod). Such calls declare a *plan* of the
per-pod and per-session keys they expect to need; a script that finds one missing writes nothing and answers
STALE_PLAN with the names, and the call is repeated with them. With `wait_replicas`, a write is followed by
`WAIT` on the same connection. This module knows no operation: `ScriptRunner` is the base of the store's
operation classes (`placement_worker`, `placement_operator`, `placement_shared`).
"""

from __future__ import annotations

import hashlib
import importlib.resources
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ardiff.kv.errors import (
    InvalidPlacementArgument,
    NotReplicated,
    PlacementContention,
    PlacementError,
    ScriptStatus,
)
from ardiff.kv.keys import PoolKeys
from ardiff.kv.records import PodRecord, SessionBinding, check_non_negative_int, check_positive_int

DEFAULT_WAIT_TIMEOUT_MS = 100
MAX_PLAN_ATTEMPTS = 16
SCRIPTS = (
    "register_pod",
    "touch",
    "mark_reset_required",
    "drain_pod",
    "place",
    "restore",
    "release",
    "evict_lru",
    "remove_pods",
    "delete_pool",
    "read_bindings",
    # issue 12: suspension, resume and snapshots
    "mark_suspended",
    "request_resume",
    "suspend",
    "resumed",
    "note_snapshot",
    "ack_resumed_note",
    "expire_suspending",
    "relocate_export",
    # issue 26: kept chunks (fork, rewind)
    "note_history",
    # issue 37: the front door's read, and the pool record it reads
    "route",
    "write_pool",
)
# Scripts that never wait for replicas: a read, and a touch (losing one at a failover costs a stale
# last_tick_ms and chunk_index, which the next tick rewrites, docs/contracts.md §2 "Failover"; waiting would
# add a replica round trip to every tick).
UNREPLICATED_SCRIPTS = frozenset({"touch", "read_bindings", "route"})
# Scripts run with EVALSHA_RO: reads that Redis itself keeps from writing (the front door's, issue 37).
READ_ONLY_SCRIPTS = frozenset({"route"})


def record_fields_lua() -> str:
    """`BINDING_FIELDS` and `POD_FIELDS`, Lua tables of `SessionBinding.FIELDS` and `PodRecord.FIELDS`
    (declared there, once): the fields place.lua answers with and read_bindings.lua reads, in the order the
    records read them. Part of every script's source rather than sent with each call: the binding's 19 names
    were a third of a place call's arguments for redis-py to encode and Redis to parse."""
    return "\n".join(
        f"local {table} = {{" + ", ".join(f"'{name}'" for name in fields) + "}"
        for table, fields in (("BINDING_FIELDS", SessionBinding.FIELDS), ("POD_FIELDS", PodRecord.FIELDS))
    )


def load_script(name: str) -> str:
    """The source of one operation: the record field tables, the shared helpers, then the operation (one
    atomic script)."""
    lua = importlib.resources.files("ardiff.kv") / "lua"
    return "\n".join((record_fields_lua(), (lua / "_lib.lua").read_text(), (lua / f"{name}.lua").read_text()))


@dataclass(frozen=True)
class Script:
    """One operation's source and the SHA1 that EVALSHA names it by."""

    name: str
    source: str
    sha: str

    @classmethod
    def named(cls, name: str) -> Script:
        source = load_script(name)
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


def as_text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def as_texts(values: Iterable[bytes]) -> list[str]:
    return [as_text(value) for value in values]


@dataclass
class Plan:
    """Per-pod and per-session keys a call declares up front (see the module docstring)."""

    pods: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    def add(self, pods: Iterable[str], sessions: Iterable[str]) -> None:
        self.pods += [pod for pod in pods if pod not in self.pods]
        self.sessions += [session for session in sessions if session not in self.sessions]

    def keys(self, keys: PoolKeys) -> list[str]:
        pod_keys = [key for pod in self.pods for key in (keys.pod(pod), keys.events(pod))]
        return pod_keys + [keys.session(session) for session in self.sessions]

    def args(self, *, retry: bool) -> list[str | int]:
        return [int(retry), len(self.pods), len(self.sessions), *self.pods, *self.sessions]


class ScriptRunner:
    """The store's client and its scripts: `_run` one with its plan, `_call` it with WAIT when asked.

    `wait_replicas` > 0: every write but the `UNREPLICATED_SCRIPTS` is followed, on the same connection and
    in the same round trip, by `WAIT wait_replicas wait_timeout_ms`; fewer acknowledgements raise
    `NotReplicated` (the write was applied; a failover may lose it). Not on a Cluster (its WAIT would reach
    another node)."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        self.client = client
        self.wait_replicas = check_non_negative_int("wait_replicas", wait_replicas)
        self.wait_timeout_ms = check_positive_int("wait_timeout_ms", wait_timeout_ms)
        if self.wait_replicas and isinstance(client, RedisCluster):
            raise InvalidPlacementArgument("placement wait_replicas is not supported on a Redis Cluster")
        self._scripts = {name: Script.named(name) for name in SCRIPTS}

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(
        self,
        script: str,
        keys: list[str],
        args: list[Any],
        *,
        pool_keys: PoolKeys | None = None,
        plan: Plan | None = None,
    ) -> tuple[ScriptStatus, list[Any]]:
        """Run one script; with a plan, repeat it with every key it reports missing."""
        for attempt in range(MAX_PLAN_ATTEMPTS):
            call_keys, call_args = keys, args
            if plan is not None and pool_keys is not None:
                call_keys, call_args = keys + plan.keys(pool_keys), args + plan.args(retry=attempt > 0)
            reply = await self._call(script, call_keys, call_args)
            status = ScriptStatus(int(reply[0]))
            if status is not ScriptStatus.STALE_PLAN:
                return status, reply[1:]
            if plan is None:
                raise PlacementError(f"placement script {script} asked for a plan it was not given")
            plan.add(as_texts(reply[1]), as_texts(reply[2]))
        raise PlacementContention(
            f"placement {script} still found undeclared keys after {MAX_PLAN_ATTEMPTS} attempts"
        )

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """One script by its SHA1, loaded first where the server lacks it (a new, restarted or flushed
        server); with `wait_replicas`, pipelined with WAIT on the same connection (WAIT counts the writes of
        its own connection). EVALSHA straight from the client: redis-py's Script wrapper costs more."""
        script = self._scripts[name]
        wait = self.wait_replicas > 0 and name not in UNREPLICATED_SCRIPTS
        command = "EVALSHA_RO" if name in READ_ONLY_SCRIPTS else "EVALSHA"
        for _ in range(2):
            try:
                if not wait:
                    return await self.client.execute_command(command, script.sha, len(keys), *keys, *args)
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.wait(self.wait_replicas, self.wait_timeout_ms)
                    reply, acked = await pipe.execute()
            except NoScriptError:
                await self.client.script_load(script.source)
                continue
            if int(reply[0]) != ScriptStatus.STALE_PLAN and int(acked) < self.wait_replicas:
                raise NotReplicated(name, int(acked), self.wait_replicas, self.wait_timeout_ms)
            return reply
        raise PlacementError(f"placement script {name} was flushed from Redis twice in a row")
