"""Running the placement store's Lua: one Redis 7 function library, loaded by the operator, called by all.

Every mutation is one atomic Lua function (`kv/lua/<operation>.lua`, over the helpers of `kv/lua/_lib.lua`);
Python never reads, decides and writes back. Server `TIME` is the only clock the functions use.

*The library* (issue 42 item 4; docs/contracts.md §2 "Function library"). All operations are one library
(`Library`): the record field tables and the shared helpers are defined once, when the library is loaded
(`FUNCTION LOAD`), and each operation is registered as a function called with `FCALL` (`FCALL_RO` for the
`READ_ONLY_SCRIPTS`, registered `no-writes`). Before it, each operation was a script of its own that
redefined the 356 lines of helpers on every call (15-17% of a place's Redis time, docs/benchmarks.md). The
library's name is `ardiff_<12 hex of its source's SHA-256>` and each function's `<library>_<operation>`: two
versions of the code (a rolling update of the operator or of a pool's workers) are two libraries side by side,
each client calls its own version's functions, and no load ever replaces code that another version's clients
call (no `FUNCTION LOAD REPLACE`). Old versions are left in place (~60 KiB of source each); `FUNCTION DELETE`
one once no Pod runs it. A worker of another version than the operator's finds no library of its own once
Redis restarts empty: a pool's image must carry the operator's ardiff version (docs/contracts.md §2).

*Who loads it.* Libraries are global to a node, and a user allowed `FUNCTION LOAD` could replace any pool's
code, so only the operator loads (`ScriptRunner(loads_library=True)`; its user has `+@all -@dangerous`, which
includes `FUNCTION`): `load_library` at startup and in every pool round (one `FUNCTION LIST LIBRARYNAME` per
primary when nothing is missing), and again when a call of its own meets a node without it. It goes to every
primary of a Redis Cluster (functions are per node, not per slot, and not propagated between shards) and to a
Sentinel group's master (replicas get it by replication, and it is saved in the RDB with the data). A worker's
or the front door's user may run `FCALL`/`FCALL_RO` only (kv/acl.py); Redis still checks each command a
function calls, and each key it touches, against the caller's user. When such a call finds the library
missing (a node restarted empty, a failover to a node that never had it), it raises `FunctionsNotLoaded`,
which the worker and the front door answer as their retryable 503 until the operator's next round loads it.

*Plans.* Redis Cluster needs every key a function touches in KEYS, but some keys depend on what the function
finds (the pod a session lands on, the victim it evicts, the sessions of a dead pod). Such calls declare a
*plan* of the per-pod and per-session keys they expect to need; a function that finds one missing writes
nothing and answers STALE_PLAN with the names, and the call is repeated with them. With `wait_replicas`, a
write is followed by `WAIT` on the same connection. This module knows no operation: `ScriptRunner` is the base
of the store's operation classes (`placement_worker`, `placement_operator`, `placement_shared`).
"""

from __future__ import annotations

import hashlib
import importlib.resources
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from ardiff import crash_points
from ardiff.kv.errors import (
    FunctionsNotLoaded,
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
    # issue 40 item 4: a placed session's changed priority and eviction policy
    "set_eviction",
)
# Scripts that never wait for replicas: a read, and a touch (losing one at a failover costs a stale
# last_tick_ms and chunk_index, which the next tick rewrites, docs/contracts.md §2 "Failover"; waiting would
# add a replica round trip to every tick).
UNREPLICATED_SCRIPTS = frozenset({"touch", "read_bindings", "route"})
# Functions registered `no-writes` and called with FCALL_RO: reads that Redis itself keeps from writing (the
# front door's, issue 37).
READ_ONLY_SCRIPTS = frozenset({"route"})
LIBRARY_PREFIX = "ardiff_"
_NAME_PLACEHOLDER = "__ARDIFF_LIBRARY__"
# Redis' answer to an FCALL of a function no library on the node registers.
_FUNCTION_NOT_FOUND = "Function not found"
_LIBRARY_EXISTS = "already exists"


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
    """The text of one operation's file (`kv/lua/<name>.lua`)."""
    return (importlib.resources.files("ardiff.kv") / "lua" / f"{name}.lua").read_text()


def library_source(name: str = _NAME_PLACEHOLDER) -> str:
    """The library's source, named `name`: the record field tables and `_lib.lua` once, then each operation's
    file as the body of a local function, registered as `<name>_<operation>` by a callback that hands it the
    call's keys and arguments as KEYS and ARGV (the names the helpers and operations read, as scripts did).
    Redis runs one function at a time to its end and a function cannot call another, so the two upvalues are
    never shared by two calls."""
    lua = importlib.resources.files("ardiff.kv") / "lua"
    parts = [
        f"#!lua name={name}",
        "-- The placement store's function library, generated by kv/scripts.py `library_source`.",
        record_fields_lua(),
        "-- The running function's keys and arguments, set by its callback (see `register` below).",
        "local KEYS, ARGV",
        (lua / "_lib.lua").read_text(),
    ]
    for operation in SCRIPTS:
        parts += [f"local function op_{operation}()", load_script(operation), "end"]
    parts.append("local function register(name, operation, flags)")
    parts.append(
        "  redis.register_function{function_name = name, flags = flags, callback = function(keys, args)"
    )
    parts.append("    KEYS, ARGV = keys, args")
    parts.append("    return operation()")
    parts.append("  end}")
    parts.append("end")
    for operation in SCRIPTS:
        flags = "{'no-writes'}" if operation in READ_ONLY_SCRIPTS else "{}"
        parts.append(f"register('{name}_{operation}', op_{operation}, {flags})")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Library:
    """This version's function library: its name (`ardiff_<12 hex>` of the SHA-256 of its source, written
    with a placeholder for the name), its source, and each operation's function name."""

    name: str
    source: str
    functions: dict[str, str]

    @classmethod
    def current(cls) -> Library:
        template = library_source()
        name = LIBRARY_PREFIX + hashlib.sha256(template.encode()).hexdigest()[:12]
        return cls(
            name,
            template.replace(_NAME_PLACEHOLDER, name),
            {operation: f"{name}_{operation}" for operation in SCRIPTS},
        )


def function_missing(exc: ResponseError) -> bool:
    """Redis' answer to FCALL of a function it does not have (also inside a pipeline's error)."""
    return _FUNCTION_NOT_FOUND in str(exc)


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
    """The store's client and its functions: `_run` one with its plan, `_call` it with WAIT when asked.

    `loads_library`: the operator's store (see the module docstring): `load_library` puts this version's
    library on every primary where it is missing, and a call that finds it missing loads it and is repeated.
    Every other store raises `FunctionsNotLoaded` there (its user may not load it).

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
        loads_library: bool = False,
    ) -> None:
        self.client = client
        self.wait_replicas = check_non_negative_int("wait_replicas", wait_replicas)
        self.wait_timeout_ms = check_positive_int("wait_timeout_ms", wait_timeout_ms)
        if self.wait_replicas and isinstance(client, RedisCluster):
            raise InvalidPlacementArgument("placement wait_replicas is not supported on a Redis Cluster")
        self.loads_library = loads_library
        self.library = Library.current()

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
        """One function of this version's library (FCALL, or FCALL_RO for a read); with `wait_replicas`,
        pipelined with WAIT on the same connection (WAIT counts the writes of its own connection). Where the
        node lacks the library: loaded and called again by the operator's store, `FunctionsNotLoaded` for
        every other one."""
        function = self.library.functions[name]
        wait = self.wait_replicas > 0 and name not in UNREPLICATED_SCRIPTS
        command = "FCALL_RO" if name in READ_ONLY_SCRIPTS else "FCALL"
        for attempt in range(2):
            try:
                if not wait:
                    reply = await self.client.execute_command(command, function, len(keys), *keys, *args)
                else:
                    async with self.client.pipeline(transaction=False) as pipe:
                        pipe.execute_command(command, function, len(keys), *keys, *args)
                        pipe.wait(self.wait_replicas, self.wait_timeout_ms)
                        reply, acked = await pipe.execute()
            except ResponseError as exc:
                if not function_missing(exc):
                    raise
                if not self.loads_library or attempt:
                    raise FunctionsNotLoaded(self.library.name, name) from None
                await self.load_library()
                continue
            wrote = int(reply[0]) != ScriptStatus.STALE_PLAN  # a stale plan wrote nothing (it is repeated)
            if wait and wrote and int(acked) < self.wait_replicas:
                raise NotReplicated(name, int(acked), self.wait_replicas, self.wait_timeout_ms)
            if wrote and command == "FCALL" and crash_points.CRASH_POINTS.on:
                crash_points.passed(f"redis:{name}")
            return reply
        raise PlacementError(f"placement {name}: unreachable")  # the loop returns or raises

    async def load_library(self) -> list[str]:
        """Load this version's library on every primary that lacks it (the server; a Sentinel group's
        master; each primary of a Cluster): one `FUNCTION LIST LIBRARYNAME` per primary, and `FUNCTION LOAD`
        where it is missing (never REPLACE: a library of that name is this very source). The primaries where
        it was loaded ('' for the one server of a non-Cluster client). The operator's: its user may run
        FUNCTION, a pool's or the front door's may not."""
        loaded = []
        for node in await self._primaries():
            target = {} if node is None else {"target_nodes": node}
            name = self.library.name
            if await self.client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", name, **target):
                continue
            try:
                await self.client.execute_command("FUNCTION", "LOAD", self.library.source, **target)
            except ResponseError as exc:
                if _LIBRARY_EXISTS not in str(exc):  # else: loaded meanwhile (another operator replica)
                    raise
            loaded.append("" if node is None else node.name)
        return loaded

    async def _primaries(self) -> list[Any]:
        """The Cluster's primaries (as redis-py's `target_nodes`), or [None]: the one server the client
        reaches (a Sentinel group's master is the one its client asks)."""
        if not isinstance(self.client, RedisCluster):
            return [None]
        await self.client.initialize()
        return self.client.get_primaries()
