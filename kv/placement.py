"""The placement store: which pod holds which session, in Redis (DESIGN §3.2, docs/contracts.md §2).

Every mutation is one atomic Lua script (`kv/lua/<operation>.lua`, with `kv/lua/_lib.lua` prepended); Python
never reads, decides and writes back. Server `TIME` is the only clock the scripts use.

Redis Cluster needs every key a script touches in KEYS, but some keys depend on what the script finds (the
pod a session lands on, the victim it evicts, the sessions of a dead pod). Such calls declare a *plan* of the
per-pod and per-session keys they expect to need; a script that finds one missing writes nothing and answers
STALE_PLAN with the names, and the call is repeated with them. `place` remembers the pod (or victim) its
previous reply predicted, so a steady stream of placements takes one round trip each.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from ardiff.kv.errors import (
    CapacityBelowUsed,
    InvalidPlacementArgument,
    InvalidRedisUrl,
    NotReplicated,
    PlacementContention,
    PlacementError,
    PodFenced,
    ScriptStatus,
    SessionNotHere,
    UnknownPod,
    UnknownSession,
)
from ardiff.kv.keys import ANY_POOL_PATTERN, ANY_SESSION_PATTERN, PoolKeys, pool_of_key, resident
from ardiff.kv.records import (
    MAX_PRIORITY,
    Placement,
    PlacementPolicy,
    PlaceResult,
    PodEvent,
    PodRecord,
    PodRegistration,
    PoolId,
    SessionBinding,
    SessionRecord,
    SessionSpec,
    SessionState,
    check_name,
    check_non_negative_int,
    check_priority,
    check_tier,
)

CONSUMER_GROUP = "worker"
DEFAULT_CLOSED_TTL_MS = 3_600_000  # closed records linger so the worker can answer 410, not 404
DEFAULT_STREAM_MAXLEN = 1_000
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379
DEFAULT_WAIT_TIMEOUT_MS = 100
# Every client's sockets (issue 23 item 6): a master that stops answering fails a call after
# SOCKET_TIMEOUT_SECONDS instead of hanging it (the scripts take milliseconds; WAIT at most wait_timeout_ms),
# one that cannot be reached after SOCKET_CONNECT_TIMEOUT_SECONDS; TCP keepalive notices a peer gone silent on
# an idle connection after 10 + 3 x 5 s.
SOCKET_TIMEOUT_SECONDS = 3.0
SOCKET_CONNECT_TIMEOUT_SECONDS = 2.0
TCP_KEEPALIVE = {socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3}
# The longest blocking stream read: well inside the socket timeout, so a block that ends with nothing is never
# taken for a dead master.
MAX_BLOCK_MS = int(SOCKET_TIMEOUT_SECONDS * 1000) // 2
SENTINEL_WAIT_REPLICAS = 1  # the default of redis+sentinel:// URLs (docs/contracts.md §2 "Failover")
# Store options a URL may carry in its query (`?wait_replicas=1&wait_timeout_ms=100`); the rest is Redis'.
URL_OPTIONS = ("wait_replicas", "wait_timeout_ms")
LRU_PRIORITY_SCALE = 1 << 42  # as kv/lua/_lib.lua PRIORITY_SCALE
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
)
# Scripts that never wait for replicas: a read, and a touch (losing one at a failover costs a stale
# last_tick_ms and chunk_index, which the next tick rewrites, docs/contracts.md §2 "Failover"; waiting would
# add a replica round trip to every tick).
UNREPLICATED_SCRIPTS = frozenset({"touch", "read_bindings"})
BINDINGS_BATCH = 1_000  # sessions per read_bindings call: a few ms of Redis time each


def load_script(name: str) -> str:
    """The source of one operation: the shared helpers, then the operation (one atomic script)."""
    lua = importlib.resources.files("ardiff.kv") / "lua"
    return (lua / "_lib.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def build_redis_client(url: str) -> aioredis.Redis | RedisCluster:
    """A `redis.asyncio` client for `redis://`, `rediss://` (TLS),
    `redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]` (the master of `service`), or
    `redis+cluster://[[user]:password@]host:port[,host:port...]/` (`rediss+cluster://` with TLS): a Redis
    Cluster reached through any of the listed nodes (a scheme of ours: redis-py documents none)."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidRedisUrl(f"placement redis url must look like redis://host:port/db, got {url!r}")
    scheme = url.split("://", 1)[0]
    if scheme in ("redis", "rediss"):
        parts = urlsplit(url)
        try:
            parts.port  # noqa: B018 -- raises ValueError on a malformed port
            if not parts.hostname:
                raise ValueError("no host")
            return aioredis.from_url(url, **connection_options())
        except ValueError as exc:
            raise InvalidRedisUrl(f"placement redis url {redact_url(url)} is malformed: {exc}") from None
    if scheme == "redis+sentinel":
        return _sentinel_master(url)
    if scheme in ("redis+cluster", "rediss+cluster"):
        return _cluster(url)
    raise InvalidRedisUrl(
        f"placement redis url scheme must be redis, rediss, redis+sentinel, redis+cluster or rediss+cluster, "
        f"got {scheme!r} in {redact_url(url)}"
    )


def split_url_options(url: str) -> tuple[str, dict[str, int]]:
    """`url` without the store's own query parameters (`URL_OPTIONS`), and those as PlacementStore options."""
    base, question, query = url.partition("?")
    if not question:
        return url, {}
    options: dict[str, int] = {}
    kept: list[tuple[str, str]] = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in URL_OPTIONS:
            kept.append((name, value))
            continue
        try:
            options[name] = int(value)
        except ValueError:
            raise InvalidRedisUrl(
                f"placement redis url {redact_url(url)}: {name} must be an integer, got {value!r}"
            ) from None
    return (f"{base}?{urlencode(kept)}" if kept else base), options


def connection_options() -> dict[str, Any]:
    # A Redis restart leaves every pooled connection dead; reconnect and resend instead of failing the call.
    # A resent script may run twice if only its reply was lost: the scripts are idempotent, except that a
    # repeated register_pod mints one more epoch and a repeated evict_lru evicts one more session. A timeout
    # is not retried: a master that stopped answering would hold each call for every attempt's timeout (four
    # times 5 s with redis-py's defaults), and the caller (a 503, the next round) retries anyway.
    return {
        "retry": Retry(
            ExponentialBackoff(cap=0.5, base=0.02), retries=3, supported_errors=(RedisConnectionError,)
        ),
        "retry_on_error": [RedisConnectionError],
        "socket_timeout": SOCKET_TIMEOUT_SECONDS,
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT_SECONDS,
        "socket_keepalive": True,
        "socket_keepalive_options": TCP_KEEPALIVE,
    }


def redact_url(url: str) -> str:
    """`url` fit for a log line or an error message: the password of its user part, and any `password=` query
    parameter, become `***` (the one helper for every place that prints a Redis URL)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, question, query = rest.partition("?")
    userinfo, at, location = rest.rpartition("@")  # the last @: a password may hold an unencoded / or @
    if at:
        username, colon, _ = userinfo.partition(":")
        rest = f"{username if colon else ''}:***@{location}"
    if question:
        query = "&".join(
            f"{name}=***" if name.lower() == "password" else f"{name}{eq}{value}"
            for name, eq, value in (part.partition("=") for part in query.split("&"))
        )
    return f"{scheme}{sep}{rest}{question}{query}"


def with_user(url: str, username: str, password: str) -> str:
    """`url` with `username` and `password` as its user part instead of any it had (a `username=` or
    `password=` query parameter is dropped too, so nothing of the original credentials is left): the URL the
    operator gives a pool's workers, from its own (docs/contracts.md §1 `<pool>-workers-redis`)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not username or not password:
        raise InvalidRedisUrl(
            f"placement redis url must look like redis://host:port/db, got {redact_url(url)}"
        )
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    hosts = netloc.rpartition("@")[2]  # the last @: a password may hold an unencoded @
    userinfo = f"{quote(username, safe='')}:{quote(password, safe='')}"
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in ("username", "password")]
    query = f"?{urlencode(kept, safe='/')}" if kept else ""
    return f"{scheme}://{userinfo}@{hosts}{slash}{path}{query}"


def sentinel_for(url: str) -> tuple[Sentinel, str, int]:
    """The Sentinel client of a `redis+sentinel://` URL, its service name and database (the user part, if
    any, is the master's and replicas' credential; the Sentinels are asked without one)."""
    try:
        username, password, sentinels, path_parts = _split_hosts(url, DEFAULT_SENTINEL_PORT)
        if not 1 <= len(path_parts) <= 2:
            raise ValueError("expected host:port[,host:port]/service[/db]")
        db = int(path_parts[1]) if len(path_parts) == 2 else 0
    except ValueError as exc:
        raise InvalidRedisUrl(f"placement sentinel url {redact_url(url)} is malformed: {exc}") from None
    sentinel = Sentinel(sentinels, username=username, password=password, **connection_options())
    return sentinel, path_parts[0], db


def _sentinel_master(url: str) -> aioredis.Redis:
    sentinel, service, db = sentinel_for(url)
    return sentinel.master_for(service, db=db)


_Hosts = tuple[str | None, str | None, list[tuple[str, int]], list[str]]


def _split_hosts(url: str, default_port: int) -> _Hosts:
    """(username, password, [(host, port)], path parts) of `scheme://[[user]:password@]h:p[,h:p...]/path`."""
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    if not hosts:
        raise ValueError("no host:port")
    addresses = []
    for host_port in hosts.split(","):
        host, _, port = host_port.rpartition(":") if ":" in host_port else (host_port, "", "")
        if not host:
            raise ValueError(f"empty host in {host_port!r}")
        addresses.append((host, int(port) if port else default_port))
    return unquote(username) or None, unquote(password) or None, addresses, [p for p in path.split("/") if p]


def _cluster(url: str) -> RedisCluster:
    try:
        username, password, nodes, path = _split_hosts(url, DEFAULT_CLUSTER_PORT)
        if path:
            raise ValueError("a cluster has only database 0: nothing may follow the hosts but /")
    except ValueError as exc:
        raise InvalidRedisUrl(f"placement cluster url {redact_url(url)} is malformed: {exc}") from None
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        ssl=url.startswith("rediss+"),
        **connection_options(),
    )


def _positive_int(kind: str, value: object) -> int:
    if check_non_negative_int(kind, value) == 0:
        raise InvalidPlacementArgument(f"placement {kind} must be a positive integer, got {value!r}")
    return value  # type: ignore[return-value]


def _check_pool(pool: object) -> PoolId:
    if not isinstance(pool, PoolId):
        raise InvalidPlacementArgument(f"placement pool must be a PoolId, got {pool!r}")
    return pool


def _check_spec(spec: object) -> SessionSpec:
    if not isinstance(spec, SessionSpec):
        raise InvalidPlacementArgument(f"placement spec must be a SessionSpec, got {spec!r}")
    return spec


def _check_endpoint(endpoint: object) -> str:
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidPlacementArgument(f"placement endpoint must be an http(s) URL, got {endpoint!r}")
    return endpoint  # type: ignore[return-value]


def _check_text(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPlacementArgument(f"placement {kind} must be a non-empty string, got {value!r}")
    return value


def _spec_args(pool: PoolId, spec: SessionSpec) -> list[str | int | bytes]:
    """ARGV[1..9] of place.lua and restore.lua: the session's record fields, as both scripts write them."""
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
    ]


def _event_kind(kind: bytes | None) -> Literal["close", "evict", "suspend"]:
    if kind == b"evict":
        return "evict"
    if kind == b"suspend":
        return "suspend"
    return "close"


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _texts(values: Iterable[bytes]) -> list[str]:
    return [_text(value) for value in values]


@dataclass
class _Plan:
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


class PlacementStore:
    """Async placement store over one Redis (standalone, TLS, Sentinel-managed) or a Redis Cluster (every key
    of a pool shares the pool's hash tag, so each script runs on the one node that owns the pool's slot).

    `wait_replicas` > 0: every write but `touch` is followed, on the same connection and in the same round
    trip, by `WAIT wait_replicas wait_timeout_ms`; fewer acknowledgements raise `NotReplicated` (the write was
    applied; a failover may lose it). Not on a Cluster (its WAIT would reach another node). `from_url` turns
    it on for Sentinel URLs: docs/contracts.md §2 "Failover" has the decision, docs/benchmarks.md its cost."""

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        *,
        closed_ttl_ms: int = DEFAULT_CLOSED_TTL_MS,
        stream_maxlen: int = DEFAULT_STREAM_MAXLEN,
        wait_replicas: int = 0,
        wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS,
    ) -> None:
        self.client = client
        self.closed_ttl_ms = _positive_int("closed_ttl_ms", closed_ttl_ms)
        self.stream_maxlen = _positive_int("stream_maxlen", stream_maxlen)
        self.wait_replicas = check_non_negative_int("wait_replicas", wait_replicas)
        self.wait_timeout_ms = _positive_int("wait_timeout_ms", wait_timeout_ms)
        if self.wait_replicas and isinstance(client, RedisCluster):
            raise InvalidPlacementArgument("placement wait_replicas is not supported on a Redis Cluster")
        self._scripts = {name: client.register_script(load_script(name)) for name in SCRIPTS}
        # place() and evict_lru(): the pods/sessions the previous reply predicted the next call will need.
        self._place_hints: dict[PoolId, _Plan] = {}
        self._evict_hints: dict[PoolId, _Plan] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PlacementStore:
        """A store for `url` (see `build_redis_client`); its query may set `wait_replicas` and
        `wait_timeout_ms` (keyword `options` win). A `redis+sentinel://` URL names a replicated deployment:
        its writes wait for one replica unless the URL says `wait_replicas=0`."""
        redis_url, url_options = split_url_options(url)
        if redis_url.startswith("redis+sentinel://"):
            url_options.setdefault("wait_replicas", SENTINEL_WAIT_REPLICAS)
        return cls(build_redis_client(redis_url), **{**url_options, **options})

    async def close(self) -> None:
        await self.client.aclose()

    async def ping(self) -> None:
        """One round trip to Redis (raises when it cannot be reached)."""
        await self.client.ping()

    async def server_time_ms(self) -> int:
        """Redis server time: the clock the scripts stamp `last_tick_ms` and leases with."""
        seconds, micros = await self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def __aenter__(self) -> PlacementStore:
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
        plan: _Plan | None = None,
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
            plan.add(_texts(reply[1]), _texts(reply[2]))
        raise PlacementContention(
            f"placement {script} still found undeclared keys after {MAX_PLAN_ATTEMPTS} attempts"
        )

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> list[Any]:
        """One script; with `wait_replicas`, pipelined with WAIT on the same connection (WAIT counts the
        writes of its own connection)."""
        script = self._scripts[name]
        if not self.wait_replicas or name in UNREPLICATED_SCRIPTS:
            return await script(keys=keys, args=args)
        for _ in range(2):
            try:
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.wait(self.wait_replicas, self.wait_timeout_ms)
                    reply, acked = await pipe.execute()
            except NoScriptError:  # a new or restarted server: load it, then run it with its WAIT
                script.sha = _text(await self.client.script_load(script.script))
                continue
            if int(reply[0]) != ScriptStatus.STALE_PLAN and int(acked) < self.wait_replicas:
                raise NotReplicated(name, int(acked), self.wait_replicas, self.wait_timeout_ms)
            return reply
        raise PlacementError(f"placement script {name} was flushed from Redis twice in a row")

    # ---- worker side -------------------------------------------------------------------------------------

    async def register_pod(
        self, pool: PoolId, pod: str, *, capacity: int, endpoint: str, lease_ms: int, exports: bool = False
    ) -> PodRegistration:
        """Register a (re)started worker: a new epoch, max(now_ms, previous + 1); the sessions an earlier
        incarnation held become `lost` and are returned. After Redis lost the previous record only the server
        clock orders epochs, so two registrations of one pod must be more than a millisecond apart.
        `exports`: the worker can export sessions (issue 12: its runtime supports it, a tier is configured),
        so eviction and migration suspend its sessions instead of dropping them."""
        return await self._upsert_pod(pool, pod, 0, capacity, endpoint, lease_ms, exports)

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
    ) -> PodRegistration:
        """Renew the lease (and `exports`). Raises `PodFenced` if a newer incarnation registered; re-creates
        the record if it is missing (Redis lost its data) or belongs to an older incarnation
        (`recreated=True`)."""
        return await self._upsert_pod(
            pool, pod, _positive_int("epoch", epoch), capacity, endpoint, lease_ms, exports
        )

    async def _upsert_pod(
        self,
        pool: PoolId,
        pod: str,
        epoch: int,
        capacity: int,
        endpoint: str,
        lease_ms: int,
        exports: bool = False,
    ) -> PodRegistration:
        keys = PoolKeys(_check_pool(pool))
        check_name("pod", pod)
        check_non_negative_int("capacity", capacity)
        _check_endpoint(endpoint)
        _positive_int("lease_ms", lease_ms)
        status, reply = await self._run(
            "register_pod",
            [
                keys.pod(pod),
                keys.events(pod),
                keys.pods,
                keys.open,
                keys.leases,
                keys.draining,
                keys.residents,
                keys.lru,
                keys.suspending,
            ],
            [pod, epoch, capacity, endpoint, lease_ms, int(bool(exports))],
            pool_keys=keys,
            plan=_Plan(),
        )
        if status is ScriptStatus.POD_FENCED:
            raise PodFenced(pod, epoch, int(reply[0]))
        if status is ScriptStatus.CAPACITY_BELOW_USED:
            raise CapacityBelowUsed(pod, capacity, int(reply[0]))
        return PodRegistration(
            epoch=int(reply[0]),
            lost_sessions=tuple(_texts(reply[2])),
            recreated=_text(reply[1]) == "recreated",
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
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        _positive_int("epoch", epoch)
        check_non_negative_int("chunk_index", chunk_index)
        status, reply = await self._run(
            "touch",
            [keys.session(session), keys.pod(pod), keys.lru],
            [session, pod, epoch, chunk_index, int(bool(reset_done))],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)
        return int(reply[0])

    async def mark_reset_required(self, pool: PoolId, session: str, *, pod: str, epoch: int) -> None:
        """A forward failed and the runner freed the session's KV: the next tick must reset at chunk 0."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        _positive_int("epoch", epoch)
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
            state, owner = SessionState(_text(reply[0])), _text(reply[1])
            endpoint = ""
            if state is SessionState.PLACED and owner:
                endpoint = _text(await self.client.hget(keys.pod(owner), "endpoint"))
            return SessionNotHere(session, state, owner, endpoint)
        return PlacementError(f"placement script answered {status.name} for session {session}")

    async def read_events(
        self, pool: PoolId, pod: str, *, block_ms: int = 0, count: int = 100
    ) -> list[PodEvent]:
        """The pod's notifications: first those delivered before but never acknowledged (a restarted worker
        gets them again), then new ones, waiting up to `block_ms` (0: do not wait). Acknowledge them with
        `ack_events`."""
        keys = PoolKeys(_check_pool(pool))
        check_name("pod", pod)
        if check_non_negative_int("block_ms", block_ms) > MAX_BLOCK_MS:
            raise InvalidPlacementArgument(
                f"placement block_ms must be at most {MAX_BLOCK_MS} (inside the socket timeout), "
                f"got {block_ms}"
            )
        _positive_int("count", count)
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
                    id=_text(entry_id),
                    kind=_event_kind(fields.get(b"kind")),
                    session=_text(fields.get(b"session")),
                    reason=_text(fields.get(b"reason")),
                    epoch=int(fields.get(b"epoch") or 0),
                )
            )
        if trimmed:
            await self.client.xack(stream, CONSUMER_GROUP, *trimmed)
        return events

    async def ack_events(self, pool: PoolId, pod: str, ids: Sequence[str]) -> int:
        """Acknowledge handled notifications; returns how many were pending."""
        keys = PoolKeys(_check_pool(pool))
        check_name("pod", pod)
        ids = [_check_text("event id", entry_id) for entry_id in ids]
        if not ids:
            return 0
        return int(await self.client.xack(keys.events(pod), CONSUMER_GROUP, *ids))

    async def set_draining(self, pool: PoolId, pod: str, *, draining: bool = True) -> None:
        """The worker got SIGTERM (or recovered from it): no new placements on this pod, sessions stay."""
        await self._drain(pool, pod, draining=draining, only_if_empty=False)

    async def _drain(self, pool: PoolId, pod: str, *, draining: bool, only_if_empty: bool) -> bool:
        keys = PoolKeys(_check_pool(pool))
        check_name("pod", pod)
        status, reply = await self._run(
            "drain_pod",
            [keys.pod(pod), keys.open, keys.draining],
            [pod, int(bool(draining)), int(bool(only_if_empty))],
        )
        if status is ScriptStatus.UNKNOWN_POD:
            raise UnknownPod(pod)
        return int(reply[0]) == 1

    # ---- operator side -----------------------------------------------------------------------------------

    async def place(
        self,
        pool: PoolId,
        spec: SessionSpec,
        *,
        may_evict: bool = False,
        min_idle_ms: int = 0,
        policy: PlacementPolicy = "least-loaded",
    ) -> PlaceResult:
        """Give `spec.name` a slot, or return its current one (`already_placed=True`).

        Picks a live, non-draining pod with a free slot (`least-loaded` or `pack`). With none, a first
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
        `reset_required` only when it has neither.
        """
        keys = PoolKeys(_check_pool(pool))
        _check_spec(spec)
        check_non_negative_int("min_idle_ms", min_idle_ms)
        if policy not in get_args(PlacementPolicy):
            raise InvalidPlacementArgument(
                f"placement policy must be one of {get_args(PlacementPolicy)}, got {policy!r}"
            )
        hint = self._place_hints.get(pool, _Plan())
        plan = _Plan(list(hint.pods), list(hint.sessions))
        _, reply = await self._run(
            "place",
            [
                keys.session(spec.name),
                keys.open,
                keys.leases,
                keys.draining,
                keys.residents,
                keys.lru,
                keys.suspending,
            ],
            [
                *_spec_args(pool, spec),
                int(bool(may_evict)),
                min_idle_ms,
                policy,
                self.stream_maxlen,
            ],
            pool_keys=keys,
            plan=plan,
        )
        outcome, pod, pod_epoch, endpoint, reset_required, victim = reply[:6]
        hint_pod, hint_victim_pod, hint_victim = reply[6:9]
        if _text(outcome) != "already":  # an idempotent answer predicts nothing about the pool
            self._place_hints[pool] = _Plan(
                [_text(p) for p in (hint_pod, hint_victim_pod) if p],
                [_text(hint_victim)] if hint_victim else [],
            )
        if _text(outcome) == "pending":
            return PlaceResult(placement=None)
        if _text(outcome) == "suspending":
            return PlaceResult(placement=None, victim=_text(victim), suspending=True)
        placement = Placement(
            session=spec.name,
            pod=_text(pod),
            endpoint=_text(endpoint),
            pod_epoch=int(pod_epoch),
            reset_required=int(reset_required) == 1,
            resume_from=_text(reply[9]),
        )
        return PlaceResult(
            placement=placement, victim=_text(victim) or None, already_placed=_text(outcome) == "already"
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
        keys = PoolKeys(_check_pool(pool))
        _check_spec(spec)
        check_name("pod", pod)
        _positive_int("pod_epoch", pod_epoch)
        check_non_negative_int("chunk_index", chunk_index)
        _, reply = await self._run(
            "restore",
            [keys.session(spec.name), keys.pod(pod), keys.open, keys.residents, keys.lru],
            [*_spec_args(pool, spec), pod, pod_epoch, chunk_index, int(bool(reset_required)), "", "", 0],
        )
        if int(reply[0]) != 1:
            return None
        return Placement(
            session=spec.name,
            pod=pod,
            endpoint=_text(reply[1]),
            pod_epoch=pod_epoch,
            reset_required=bool(reset_required),
        )

    async def restore_suspended(
        self, pool: PoolId, spec: SessionSpec, *, tier: str, location: str, size: int, chunk_index: int
    ) -> bool:
        """Rebuild a suspended session's record from its CR's status after Redis lost its data (issue 12): no
        pod, no slot, its export at `location` in `tier` (the shared tier outlives Redis' data), continuing at
        `chunk_index`; it resumes on demand like any suspended session. False when it has a record already."""
        keys = PoolKeys(_check_pool(pool))
        _check_spec(spec)
        check_tier(tier)
        if not location:
            raise InvalidPlacementArgument("placement restore_suspended needs the export's location, got ''")
        check_non_negative_int("size", size)
        check_non_negative_int("chunk_index", chunk_index)
        session_key = keys.session(spec.name)
        _, reply = await self._run(
            "restore",
            # No pod: KEYS[2] is never read, and stays in the pool's slot.
            [session_key, session_key, keys.open, keys.residents, keys.lru],
            [*_spec_args(pool, spec), "", 0, chunk_index, 0, tier, location, size],
        )
        return int(reply[0]) == 1

    async def release(self, pool: PoolId, session: str, *, reason: str) -> SessionState | None:
        """Close a session (idempotent): a placed one frees its slot and its pod gets a `close` event. The
        record stays `closed` for `closed_ttl_ms`. Returns the state before the call (None: no record)."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        _check_text("reason", reason)
        _, reply = await self._run(
            "release",
            [keys.session(session), keys.open, keys.residents, keys.lru, keys.suspending],
            [session, reason, self.closed_ttl_ms, self.stream_maxlen],
            pool_keys=keys,
            plan=_Plan(),
        )
        return SessionState(_text(reply[0])) if reply[0] else None

    async def evict_lru(
        self, pool: PoolId, *, min_idle_ms: int, max_priority: int = MAX_PRIORITY, reason: str = "evicted"
    ) -> str | None:
        """Evict the session `place` would evict first (priority <= `max_priority`, idle >= `min_idle_ms`,
        never `Never`), freeing its slot; returns its name, or None when no session qualifies."""
        keys = PoolKeys(_check_pool(pool))
        check_non_negative_int("min_idle_ms", min_idle_ms)
        check_priority("max_priority", max_priority)
        _check_text("reason", reason)
        hint = self._evict_hints.get(pool, _Plan())
        _, reply = await self._run(
            "evict_lru",
            [keys.open, keys.residents, keys.lru],
            [min_idle_ms, max_priority, reason, self.stream_maxlen],
            pool_keys=keys,
            plan=_Plan(list(hint.pods), list(hint.sessions)),
        )
        victim, hint_pod, hint_session = reply[:3]
        self._evict_hints[pool] = _Plan(
            [_text(hint_pod)] if hint_pod else [], [_text(hint_session)] if hint_session else []
        )
        return _text(victim) or None

    async def drain_pod(self, pool: PoolId, pod: str, *, only_if_empty: bool = True) -> bool:
        """Atomically mark the pod draining (iff it holds no session, if `only_if_empty`); True if marked."""
        return await self._drain(pool, pod, draining=True, only_if_empty=only_if_empty)

    async def remove_pod(self, pool: PoolId, pod: str) -> tuple[str, ...]:
        """The pod is gone (the operator deleted it): forget it; its sessions become `lost`, returned."""
        keys = PoolKeys(_check_pool(pool))
        check_name("pod", pod)
        removed = await self._remove_pods(keys, "named", pod)
        return removed.get(pod, ())

    async def reap_expired(self, pool: PoolId) -> dict[str, tuple[str, ...]]:
        """Forget every pod whose lease expired; returns {pod: its sessions, now `lost`}."""
        return await self._remove_pods(PoolKeys(_check_pool(pool)), "expired", "")

    async def _remove_pods(self, keys: PoolKeys, mode: str, pod: str) -> dict[str, tuple[str, ...]]:
        _, reply = await self._run(
            "remove_pods",
            [keys.pods, keys.open, keys.leases, keys.draining, keys.residents, keys.lru, keys.suspending],
            [mode, pod],
            pool_keys=keys,
            plan=_Plan(),
        )
        removed = reply[0]
        return {_text(removed[i]): tuple(_texts(removed[i + 1])) for i in range(0, len(removed), 2)}

    async def delete_pool(self, pool: PoolId) -> int:
        """Delete every key of the pool; returns how many were deleted."""
        keys = PoolKeys(_check_pool(pool))
        deleted = 0
        batch: list[str] = []
        async for key in self.client.scan_iter(match=keys.pattern, count=500):
            batch.append(_text(key))
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
            if (pool := pool_of_key(_text(key))) is not None:
                pools.add(pool)
        return pools

    async def list_session_names(self) -> dict[PoolId, set[str]]:
        """The names of every session record, closed ones included, by pool: one SCAN over the keyspace for
        all pools (a SCAN visits every key whatever its pattern, so the operator's sweep makes one per period,
        not one per pool)."""
        names: dict[PoolId, set[str]] = {}
        async for key in self.client.scan_iter(match=ANY_SESSION_PATTERN, count=1000):
            text = _text(key)
            if (pool := pool_of_key(text)) is not None:
                names.setdefault(pool, set()).add(text.removeprefix(PoolKeys(pool).session("")))
        return names

    async def _delete_keys(self, batch: list[str]) -> int:
        _, reply = await self._run("delete_pool", batch, [])
        return int(reply[0])

    # ---- suspension, resume, snapshots (issue 12) ---------------------------------------------------------

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
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        _positive_int("epoch", epoch)
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
            ],
            [session, pod, epoch, tier if location else "", location, bytes if location else 0, chunk_index],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def request_resume(self, pool: PoolId, session: str) -> SessionState | None:
        """A tick reached a `suspended` (or `suspending`) session: record the demand to resume it
        (`resume_requested_ms`, server time; idempotent: the first demand's time stays). Returns the
        session's state (None: no record); other states are left alone."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        _, reply = await self._run("request_resume", [keys.session(session)], [session])
        return SessionState(_text(reply[0])) if reply[0] else None

    async def suspend(self, pool: PoolId, session: str, *, reason: str) -> bool:
        """Operator (migration): a `placed` session on a pod that exports becomes `suspending` (it keeps its
        slot) and its pod gets a `suspend` event with `reason`. `reason="migrate"` also records the demand to
        resume it, so it is placed again (elsewhere) as soon as its worker reports the export. True if it is
        suspending now (also when it already was); False if it is not placed or its pod cannot export."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        _check_text("reason", reason)
        _, reply = await self._run(
            "suspend",
            [keys.session(session), keys.lru, keys.suspending],
            [session, reason, self.stream_maxlen],
            pool_keys=keys,
            plan=_Plan(),
        )
        return int(reply[0]) == 1

    async def expire_suspending(self, pool: PoolId, *, timeout_ms: int) -> tuple[str, ...]:
        """Operator: sessions `suspending` for `timeout_ms` or more (their worker never reported the export)
        become `evicted` with `reset_required`, their slots freed and their pods told (`evict`, reason
        `suspend-timeout`); returns them. Without this a silent worker would block the pool's evictions."""
        keys = PoolKeys(_check_pool(pool))
        _positive_int("timeout_ms", timeout_ms)
        _, reply = await self._run(
            "expire_suspending",
            [keys.open, keys.residents, keys.lru, keys.suspending],
            [timeout_ms, self.stream_maxlen],
            pool_keys=keys,
            plan=_Plan(),
        )
        return tuple(_texts(reply[0]))

    async def relocate_export(
        self, pool: PoolId, session: str, *, from_location: str, to_location: str, tier: str
    ) -> bool:
        """A suspended session's export was copied to `tier` at `to_location` (a draining pod moves its host
        tier's copies to the shared tier): the record points there now, if it still pointed at
        `from_location` (its `location`, or the `resume_from` of a placement not imported yet). False: the
        record moved on (resumed, closed) and the caller removes the new copy."""
        keys = PoolKeys(_check_pool(pool))
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
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        _positive_int("epoch", epoch)
        if not isinstance(note, str):
            raise InvalidPlacementArgument(f"placement note must be a string, got {note!r}")
        status, reply = await self._run("resumed", [keys.session(session), keys.pod(pod)], [pod, epoch, note])
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    async def ack_resumed_note(self, pool: PoolId, session: str, note: str) -> bool:
        """The operator reported the session's `resumed_note` (as an Event): forget it, unless a newer one
        replaced it meanwhile. True when cleared."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        _check_text("note", note)
        _, reply = await self._run("ack_resumed_note", [keys.session(session)], [note])
        return int(reply[0]) == 1

    async def note_snapshot(
        self, pool: PoolId, session: str, *, pod: str, epoch: int, location: str, chunk_index: int
    ) -> None:
        """The worker holding the session at `epoch` wrote a periodic snapshot to the shared tier, which
        continues at `chunk_index`: a later pod loss places the session again from it, without
        `reset_required`. Raises `UnknownSession`, `PodFenced`, or `SessionNotHere`."""
        keys = PoolKeys(_check_pool(pool))
        check_name("session", session)
        check_name("pod", pod)
        _positive_int("epoch", epoch)
        _check_text("location", location)
        check_non_negative_int("chunk_index", chunk_index)
        status, reply = await self._run(
            "note_snapshot",
            [keys.session(session), keys.pod(pod)],
            [pod, epoch, location, chunk_index],
        )
        if status is not ScriptStatus.OK:
            raise await self._refusal(keys, status, reply, session=session, pod=pod, epoch=epoch)

    # ---- reads -------------------------------------------------------------------------------------------

    async def get_session(self, pool: PoolId, name: str) -> SessionRecord | None:
        return (await self.get_sessions(pool, [name])).get(name)

    async def get_sessions(self, pool: PoolId, names: Iterable[str]) -> dict[str, SessionRecord]:
        """The records of `names` that exist (one round trip)."""
        keys = PoolKeys(_check_pool(pool))
        names = [check_name("session", name) for name in names]
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(keys.session(name))
            raws = await pipe.execute()
        return {
            name: SessionRecord.from_hash(name, raw) for name, raw in zip(names, raws, strict=True) if raw
        }

    async def get_bindings(self, pool: PoolId, names: Iterable[str]) -> dict[str, SessionBinding]:
        """The bindings of `names` that have a record: state, pod, pod_epoch, reset_required, chunk_index and
        last_tick_ms, never the prompt or the image (`read_bindings`: one script call and one JSON document
        per `BINDINGS_BATCH` sessions)."""
        keys = PoolKeys(_check_pool(pool))
        names = [check_name("session", name) for name in names]
        fields = [field.encode() for field in SessionBinding.FIELDS]
        bindings: dict[str, SessionBinding] = {}
        for start in range(0, len(names), BINDINGS_BATCH):
            batch = names[start : start + BINDINGS_BATCH]
            _, reply = await self._run(
                "read_bindings", [keys.session(name) for name in batch], list(SessionBinding.FIELDS)
            )
            for name, values in zip(batch, json.loads(reply[0]), strict=True):
                if values:  # false: no record
                    raw = {f: v.encode() for f, v in zip(fields, values, strict=True) if v is not False}
                    bindings[name] = SessionBinding.from_hash(name, raw)
        return bindings

    async def get_pod(self, pool: PoolId, pod: str) -> PodRecord | None:
        keys = PoolKeys(_check_pool(pool))
        raw = await self.client.hgetall(keys.pod(check_name("pod", pod)))
        return PodRecord.from_hash(pod, raw) if raw else None

    async def list_pods(self, pool: PoolId) -> list[PodRecord]:
        """Registered pods, by name."""
        keys = PoolKeys(_check_pool(pool))
        names = sorted(_texts(await self.client.smembers(keys.pods)))
        async with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(keys.pod(name))
            raws = await pipe.execute()
        return [PodRecord.from_hash(name, raw) for name, raw in zip(names, raws, strict=True) if raw]

    async def check_invariants(self, pool: PoolId) -> list[str]:
        """Violations of the store's invariants (empty when all hold), read from one consistent snapshot:
        for every pod `used == |sessions placed on it| <= capacity`; every placed session points to a
        registered pod with that pod's epoch; the indexes agree with the records."""
        keys = PoolKeys(_check_pool(pool))
        for _ in range(MAX_PLAN_ATTEMPTS):
            snapshot = await _Snapshot.read(self.client, keys)
            if snapshot is not None:
                return snapshot.violations()
            await asyncio.sleep(0.01)
        raise PlacementContention(f"placement pool {pool} kept changing while its invariants were read")


def _pairs(reply: list[Any]) -> list[tuple[bytes, float]]:
    """`ZRANGE ... WITHSCORES` as (member, score) pairs, whether redis-py paired them already or not."""
    if reply and isinstance(reply[0], list | tuple):
        return [(member, float(score)) for member, score in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]


@dataclass(frozen=True)
class _Snapshot:
    """Everything of one pool, read in one MULTI/EXEC (check_invariants)."""

    pods: dict[str, PodRecord]
    sessions: dict[str, SessionRecord]
    residents: list[str]
    lru: dict[str, float]
    open: dict[str, float]
    leases: dict[str, float]
    draining: set[str]
    suspending: set[str] = field(default_factory=set)

    @classmethod
    async def read(cls, client: aioredis.Redis, keys: PoolKeys) -> _Snapshot | None:
        """None when the pool changed between listing its names and reading them (the caller retries)."""
        pod_names = sorted(_texts(await client.smembers(keys.pods)))
        session_prefix = keys.session("")
        session_names = sorted(
            {_text(key)[len(session_prefix) :] async for key in client.scan_iter(match=f"{session_prefix}*")}
        )
        # Plain commands, scores paired here: redis-py's Cluster transactions hand the `keys=` of its command
        # methods to response callbacks that do not take it.
        async with client.pipeline(transaction=True) as pipe:
            pipe.execute_command("SMEMBERS", keys.pods)
            pipe.execute_command("ZRANGE", keys.residents, 0, -1)
            for scored in (keys.lru, keys.open, keys.leases):
                pipe.execute_command("ZRANGE", scored, 0, -1, "WITHSCORES")
            pipe.execute_command("SMEMBERS", keys.draining)
            pipe.execute_command("ZRANGE", keys.suspending, 0, -1)
            for name in pod_names:
                pipe.execute_command("HGETALL", keys.pod(name))
            for name in session_names:
                pipe.execute_command("HGETALL", keys.session(name))
            (
                pods_now,
                residents,
                lru_flat,
                open_flat,
                leases_flat,
                draining,
                suspending,
                *raws,
            ) = await pipe.execute()
        lru, open_, leases = _pairs(lru_flat), _pairs(open_flat), _pairs(leases_flat)
        resident_members = _texts(residents)
        if (
            sorted(_texts(pods_now)) != pod_names
            or not {member.split("/", 1)[1] for member in resident_members} <= set(session_names)
            or not set(_texts(suspending)) <= set(session_names)
        ):
            return None
        pod_raws, session_raws = raws[: len(pod_names)], raws[len(pod_names) :]
        return cls(
            pods={n: PodRecord.from_hash(n, raw) for n, raw in zip(pod_names, pod_raws, strict=True)},
            sessions={
                n: SessionRecord.from_hash(n, raw)
                for n, raw in zip(session_names, session_raws, strict=True)
                if raw
            },
            residents=resident_members,
            lru={_text(m): score for m, score in lru},
            open={_text(m): score for m, score in open_},
            leases={_text(m): score for m, score in leases},
            draining=set(_texts(draining)),
            suspending=set(_texts(suspending)),
        )

    def violations(self) -> list[str]:
        found: list[str] = []
        on_pod: dict[str, list[str]] = {name: [] for name in self.pods}
        for member in self.residents:
            pod, session = member.split("/", 1)
            on_pod.setdefault(pod, []).append(session)
            record = self.sessions.get(session)
            if record is None or record.state not in _HOLDS_A_SLOT or record.pod != pod:
                found.append(f"resident {member} has no matching placed session record")
        for name, pod in self.pods.items():
            placed = len(on_pod[name])
            if pod.used != placed:
                found.append(f"pod {name} used={pod.used} but {placed} sessions are placed on it")
            if pod.used > pod.capacity:
                found.append(f"pod {name} used={pod.used} exceeds capacity={pod.capacity}")
            if self.leases.get(name) != pod.lease_expires_ms:
                found.append(f"pod {name} lease index disagrees with lease_expires_ms={pod.lease_expires_ms}")
            if (name in self.draining) != pod.draining:
                found.append(f"pod {name} draining index disagrees with draining={int(pod.draining)}")
            accepts = not pod.draining and pod.used < pod.capacity
            if accepts != (name in self.open):
                found.append(
                    f"pod {name} open index disagrees (used={pod.used}, draining={int(pod.draining)})"
                )
        for pod in on_pod.keys() - self.pods.keys():
            found.append(f"sessions {sorted(on_pod[pod])} are placed on unregistered pod {pod}")
        for extra in (self.open.keys() | self.leases.keys() | self.draining) - self.pods.keys():
            found.append(f"index entry for unregistered pod {extra}")
        residents = set(self.residents)
        for name, record in self.sessions.items():
            if (record.state is SessionState.SUSPENDING) != (name in self.suspending):
                found.append(f"session {name} is {record.state} but the suspending index disagrees")
            if record.state is SessionState.SUSPENDED and record.pod:
                found.append(f"suspended session {name} still names pod {record.pod}")
            if record.state not in _HOLDS_A_SLOT:
                continue
            member = resident(record.pod, name)
            pod = self.pods.get(record.pod)
            if pod is None:
                found.append(f"session {name} is placed on unregistered pod {record.pod}")
            elif record.pod_epoch != pod.epoch:
                found.append(
                    f"session {name} has pod_epoch {record.pod_epoch}, pod {record.pod} has {pod.epoch}"
                )
            if member not in residents:
                found.append(f"placed session {name} is missing from the resident index")
            if record.state is SessionState.SUSPENDING:
                if member in self.lru:
                    found.append(f"suspending session {name} is still in the LRU index")
                continue
            expected_lru = record.priority * LRU_PRIORITY_SCALE + record.last_tick_ms
            if record.eviction_policy == "LRU" and self.lru.get(member) != expected_lru:
                found.append(f"session {name} LRU entry {self.lru.get(member)} != {expected_lru}")
            if record.eviction_policy == "Never" and member in self.lru:
                found.append(f"session {name} has evictionPolicy Never but is in the LRU index")
        placed_members = {
            resident(r.pod, n) for n, r in self.sessions.items() if r.state is SessionState.PLACED
        }
        for member in self.lru.keys() - placed_members:
            found.append(f"LRU entry {member} is not a placed session")
        for name in self.suspending - self.sessions.keys():
            found.append(f"suspending index entry {name} has no session record")
        return found


# States that hold a slot on their pod (counted in its `used`, listed in the resident index).
_HOLDS_A_SLOT = (SessionState.PLACED, SessionState.SUSPENDING)
