"""Redis users per pool (issue 23 item 1; docs/contracts.md §2 "Users", §10 "Security model").

Each pool's workers log in as a user of their own, `ardiff-pool.<namespace>.<pool>`, that reaches only the
pool's keys (`~{ardiff:<namespace>/<pool>}:*`, `PoolKeys.pattern`) and runs only the commands the worker's
side of the store issues (`WORKER_COMMANDS`: FCALL of the library's functions, the event stream reads, two
hash reads; no `FLUSH*`, `CONFIG`, `DEBUG`, `KEYS`, `SCAN`, `ACL`, `MONITOR`, `INFO`, no `FUNCTION` (a library
is global to a node: a user who may load one could replace every pool's code; only the operator loads it,
kv/scripts.py), no Pub/Sub channels). Redis checks every command a function calls, and every key it touches,
against the caller's user, so a worker's call cannot reach another pool; but ACLs cannot tell our functions'
commands from any other, so within its own pool a worker can write anything (the pool is the trust boundary).

The operator makes and updates these users (`PoolUsers`): ACLs are not replicated, so on every node the store
uses (the server; a Sentinel-managed master and each replica the Sentinels list; every Cluster node), and
saved with `ACL SAVE` where the server has an aclfile. Passwords travel as their SHA-256 (`#<hex>`): Redis
never receives a pool's password, and neither does its MONITOR stream, slow log or aclfile.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoPermissionError, RedisError, ResponseError

from ardiff.errors import ArdiffError
from ardiff.kv.connection import (
    build_redis_client,
    connection_options,
    redact_url,
    sentinel_for,
    split_url_options,
)
from ardiff.kv.keys import ANY_POOL_PATTERN, PoolKeys, namespace_pattern
from ardiff.kv.records import PoolId, check_name

# The user the chart's bundled Redis gives the operator (charts/ardiff/templates/_helpers.tpl
# `ardiff.redisOperatorUser`, with OPERATOR_RULES; tests/chart/test_chart.py checks they agree); an external
# Redis names its own in the operator's URL (docs/contracts.md §2 "Users").
OPERATOR_USERNAME = "ardiff-operator"
POOL_USER_PREFIX = "ardiff-pool."
# The scripts the worker's side of the store runs (`ardiff.worker.pod_link.PodLink`'s calls).
WORKER_SCRIPTS = (
    "register_pod",
    "touch",
    "mark_reset_required",
    "drain_pod",
    "read_bindings",
    "mark_suspended",
    "request_resume",
    "resumed",
    "note_snapshot",
    "relocate_export",
    "note_history",
)
# What the worker sends besides the functions' own commands: FCALL (never FUNCTION LOAD: a library missing is
# `FunctionsNotLoaded`, a 503 until the operator loads it; never EVAL), WAIT after a write when its URL asks
# for replicas, the event stream (its consumer group made on first read), a session record (on each tick all
# but its image, HMGET; the image once per session, HGET), a pod record or
# its endpoint, PING (a URL's health_check_interval), SELECT (a URL naming a database but 0; the key patterns
# hold in every database), and what redis-py's cluster client asks any node it connects to.
WORKER_CALLS = (
    "fcall",
    "wait",
    "xreadgroup",
    "xgroup|create",
    "xack",
    "hgetall",
    "hmget",
    "hget",
    "ping",
    "select",
    "cluster|slots",
    "command",
)
# The front door's endpoint picker (issue 37): its read of a session's route, and the resume demand a request
# for a suspended session records (as a tick at a worker does). Its commands are listed, not derived from the
# scripts' sources as the worker's are (every _lib.lua helper would count, writes included): FCALL_RO
# (route), FCALL (the demand), what any client of the store sends (PING, SELECT, the cluster
# client's questions), what the two scripts call (tests/kv/test_acl.py runs both as the user) and HGET (a
# pool's CA, `GatewayPlacement.pool_ca`).
GATEWAY_SCRIPTS = ("route", "request_resume")
GATEWAY_COMMANDS = (
    "fcall_ro",
    "fcall",
    "ping",
    "select",
    "cluster|slots",
    "command",
    "time",
    "hmget",
    "hget",
    "zscore",
    "zrangebyscore",
    "hset",
)
GATEWAY_USER_PREFIX = "ardiff-gateway."
# Never for a worker or the picker (issue 23 item 1): a test checks WORKER_COMMANDS and GATEWAY_COMMANDS
# hold none of them, nor a subcommand.
FORBIDDEN_WORKER_COMMANDS = (
    "flushall",
    "flushdb",
    "config",
    "debug",
    "keys",
    "scan",
    "acl",
    "monitor",
    "info",
    "client",
    "eval",
    "evalsha",
    "script",
    "script|flush",
    "script|kill",
    "function",
    "shutdown",
    "publish",
    "subscribe",
)
# The operator's own user where the chart bundles Redis (its redis.conf's aclfile line), and what an
# administrator grants it on an external Redis: every pool's keys, everything but the dangerous commands, and
# the ACL commands it manages the pools' users with. ACL SETUSER lets a user make any user: the operator's
# credential is the store's administrator credential, and it is in the operator's Pod alone.
OPERATOR_RULES = (
    f"~{ANY_POOL_PATTERN}",
    "resetchannels",
    "+@all",
    "-@dangerous",
    "+acl|setuser",
    "+acl|deluser",
    "+acl|getuser",
    "+acl|users",
    "+acl|save",
)
MIN_PASSWORD_LENGTH = 16
# How long the list of a Sentinel group's or a Cluster's nodes is reused before it is asked for again.
NODES_REFRESH_SECONDS = 5.0
_NO_ACLFILE = "not configured to use an ACL file"
_CALL = re.compile(r"""redis\.p?call\(\s*['"]([A-Za-z]+)['"]""")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class PoolUserError(ArdiffError):
    """The pool's user could not be made, updated or deleted on some node (named in the message); the nodes
    that answered are done (every step is idempotent: the next round repeats it)."""

    code = "redis_user_failed"


class AclForbidden(PoolUserError):
    """The operator's Redis user may not run `ACL SETUSER`/`DELUSER` (a managed Redis that keeps ACLs to its
    own console): run the operator with `--worker-redis-users administrator` and make each pool's user as
    the administrator (docs/contracts.md §2 "Users")."""

    code = "redis_acl_forbidden"


class InvalidPoolUser(ArdiffError, ValueError):
    code = "invalid_redis_user"


def script_commands(names: Iterable[str]) -> set[str]:
    """Every command the scripts `names` may call, lower case: their own and kv/lua/_lib.lua's (prepended
    to each; which helpers a script calls is not worked out, so all of them count)."""
    lua = importlib.resources.files("ardiff.kv") / "lua"
    sources = [(lua / "_lib.lua").read_text(), *((lua / f"{name}.lua").read_text() for name in names)]
    return {command.lower() for source in sources for command in _CALL.findall(source)}


WORKER_COMMANDS = tuple(sorted(set(WORKER_CALLS) | script_commands(WORKER_SCRIPTS)))


def pool_username(pool: PoolId) -> str:
    """`ardiff-pool.<namespace>.<pool>`: names are DNS labels (no dot), so no two pools share one, and it
    needs no escaping in a URL."""
    return f"{POOL_USER_PREFIX}{pool.namespace}.{pool.name}"


def pool_of_username(username: str) -> PoolId | None:
    """The pool a user made by `pool_username` serves (None for any other user)."""
    namespace, dot, name = username.removeprefix(POOL_USER_PREFIX).partition(".")
    if not username.startswith(POOL_USER_PREFIX) or not dot:
        return None
    try:
        return PoolId(namespace, name)
    except ValueError:
        return None


def password_hash(password: str) -> str:
    """The SHA-256 hex Redis keeps of a password (what `#<hex>` gives `ACL SETUSER`)."""
    return hashlib.sha256(password.encode()).hexdigest()


def check_password(password: object) -> str:
    """A pool user's password as the operator makes them: at least 16 characters, none of them blank."""
    if not isinstance(password, str):
        raise InvalidPoolUser(f"redis user password must be a string, got {type(password).__name__}")
    if len(password) < MIN_PASSWORD_LENGTH or not password.isprintable():
        raise InvalidPoolUser(
            f"redis user password must be at least {MIN_PASSWORD_LENGTH} printable characters, got a "
            f"{len(password)}-character one"
        )
    if any(ch.isspace() for ch in password):
        raise InvalidPoolUser("redis user password must hold no whitespace")
    return password


def user_rules(password_hashes: Sequence[str], grants: Sequence[str]) -> tuple[str, ...]:
    """The `ACL SETUSER <username>` arguments of a user that accepts `password_hashes` (SHA-256 hex, the
    current one first; more while its clients roll from an older password to it) and has `grants`: `reset`
    first, so the user is exactly this whatever it was (one command: never half-made); a connection logged in
    as it keeps working meanwhile."""
    if not password_hashes or not all(isinstance(h, str) and _HEX64.match(h) for h in password_hashes):
        raise InvalidPoolUser(
            f"redis user password_hashes must be SHA-256 hex digests, at least one, got "
            f"{len(password_hashes)} of which some are not"
        )
    if len(set(password_hashes)) != len(password_hashes):
        raise InvalidPoolUser("redis user password_hashes must be distinct")
    return ("reset", "on", *(f"#{h}" for h in password_hashes), *grants)


@dataclass(frozen=True)
class PoolUser:
    """The user of one pool's workers: the passwords it accepts, as SHA-256 hex (the current one first; more
    while the pool rolls from an older password to it)."""

    pool: PoolId
    password_hashes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.pool, PoolId):
            raise InvalidPoolUser(f"redis user pool must be a PoolId, got {self.pool!r}")
        self.rules()

    @property
    def username(self) -> str:
        return pool_username(self.pool)

    def rules(self) -> tuple[str, ...]:
        """The `ACL SETUSER <username>` arguments (`user_rules`)."""
        return user_rules(self.password_hashes, pool_rules(self.pool))


def pool_rules(pool: PoolId) -> tuple[str, ...]:
    """What a pool's user reaches and runs (the rules after its passwords): the pool's keys, no channel,
    WORKER_COMMANDS and nothing else."""
    return (
        f"~{PoolKeys(pool).pattern}",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in WORKER_COMMANDS),
    )


def gateway_username(namespace: str) -> str:
    """`ardiff-gateway.<namespace>`: the picker of the release installed in `namespace` (one per release)."""
    return f"{GATEWAY_USER_PREFIX}{check_name('namespace', namespace)}"


def gateway_rules(namespaces: Sequence[str] | None) -> tuple[str, ...]:
    """What the front door's user reaches and runs (the rules after its passwords): it reads the keys of
    every pool of the served `namespaces` (None: of every namespace, a cluster-wide operator's) and writes
    only their session records (the demand), no channel, GATEWAY_COMMANDS and nothing else."""
    patterns = (
        [ANY_POOL_PATTERN]
        if namespaces is None
        else [namespace_pattern(check_name("namespace", namespace)) for namespace in namespaces]
    )
    return (
        *(f"%R~{pattern}" for pattern in patterns),
        # Read and write (`~`): FCALL declares its keys read-write; Redis wants one pattern granting both.
        *(f"~{pattern.removesuffix('*')}session:*" for pattern in patterns),
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in GATEWAY_COMMANDS),
    )


def administrator_acl_line(pool: PoolId, username: str) -> str:
    """The `ACL SETUSER` command an administrator runs to make the pool's user where the operator may not
    (`--worker-redis-users administrator`, docs/contracts.md §2 "Users"), its password left to fill in."""
    return " ".join(("ACL", "SETUSER", username, "reset", "on", ">PASSWORD", *pool_rules(pool)))


def _text(value: Any) -> Any:
    """A reply made plain: bytes decoded, maps and RESP2 pair lists both as dicts, recursively."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {_text(k): _text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return value


def _user_state(reply: Any) -> dict[str, Any] | None:
    """`ACL GETUSER`'s reply as a dict (RESP3 sends a map, RESP2 a flat list of pairs), or None."""
    if reply is None:
        return None
    plain = _text(reply)
    if isinstance(plain, list):
        plain = dict(zip(plain[::2], plain[1::2], strict=True))
    return plain


@dataclass
class _Node:
    """One Redis server the store uses, and how to send it a command."""

    address: str
    client: aioredis.Redis | None = None  # a server of its own (standalone, Sentinel-managed)
    cluster: RedisCluster | None = None  # or a node of a Redis Cluster, through the cluster client
    cluster_node: ClusterNode | None = None

    async def call(self, *args: Any) -> Any:
        if self.cluster is not None:
            return await self.cluster.execute_command(*args, target_nodes=self.cluster_node)
        assert self.client is not None
        return await self.client.execute_command(*args)


@dataclass
class RedisNodes:
    """Every node of the store the operator's URL names: the server itself; or the master and the replicas a
    Sentinel group lists (each may be promoted, and ACLs are not replicated); or every node of a Cluster
    (`CLUSTER SLOTS`: masters and replicas). Re-read at most every `NODES_REFRESH_SECONDS`."""

    url: str
    _single: aioredis.Redis | None = None
    _sentinel: Any = None
    _service: str = ""
    _db: int = 0
    _cluster: RedisCluster | None = None
    _clients: dict[str, aioredis.Redis] = field(default_factory=dict)
    _nodes: list[_Node] = field(default_factory=list)
    _read_at: float = float("-inf")

    @classmethod
    def from_url(cls, url: str) -> RedisNodes:
        redis_url, _ = split_url_options(url)  # wait_replicas & co. are the store's, not redis-py's
        nodes = cls(url=redis_url)
        if redis_url.startswith("redis+sentinel://"):
            nodes._sentinel, nodes._service, nodes._db = sentinel_for(redis_url)
        else:
            client = build_redis_client(redis_url)
            if isinstance(client, RedisCluster):
                nodes._cluster = client
            else:
                nodes._single = client
        return nodes

    async def nodes(self) -> list[_Node]:
        if self._single is not None:
            return [_Node(redact_url(self.url), client=self._single)]
        if time.monotonic() - self._read_at < NODES_REFRESH_SECONDS and self._nodes:
            return self._nodes
        if self._cluster is not None:
            await self._cluster.initialize()
            self._nodes = [
                _Node(node.name, cluster=self._cluster, cluster_node=node)
                for node in sorted(self._cluster.get_nodes(), key=lambda n: n.name)
            ]
        else:
            master = await self._sentinel.discover_master(self._service)
            replicas = await self._sentinel.discover_slaves(self._service)
            self._nodes = [self._sentinel_node(host, int(port)) for host, port in [master, *replicas]]
        self._read_at = time.monotonic()
        return self._nodes

    def _sentinel_node(self, host: str, port: int) -> _Node:
        address = f"{host}:{port}"
        if address not in self._clients:
            credentials = {k: self._sentinel.connection_kwargs.get(k) for k in ("username", "password")}
            self._clients[address] = aioredis.Redis(
                host=host, port=port, db=self._db, **credentials, **connection_options()
            )
        return _Node(address, client=self._clients[address])

    async def close(self) -> None:
        for client in [self._single, self._cluster, *self._clients.values()]:
            if client is not None:
                await client.aclose()
        if self._sentinel is not None:
            for sentinel in self._sentinel.sentinels:
                await sentinel.aclose()


@dataclass(frozen=True)
class UserSync:
    """What `PoolUsers.ensure` did: the nodes where the user was made or changed, and those already right."""

    changed: tuple[str, ...]
    unchanged: tuple[str, ...]


class PoolUsers:
    """The operator's hand on the pools' users, on every node (`RedisNodes`).

    `ensure` costs one `ACL GETUSER` per node when nothing changed since this process last set the user (its
    state then is remembered); otherwise `ACL SETUSER`, `ACL GETUSER`, and `ACL SAVE` if that changed it and
    the server has an aclfile. A node that restarted without one, or an administrator's edit, is noticed by
    the next `ensure` and undone."""

    def __init__(self, nodes: RedisNodes) -> None:
        self.nodes = nodes
        # (node address, username) -> (the rules last set there, the user's state read right after).
        self._set: dict[tuple[str, str], tuple[tuple[str, ...], dict[str, Any]]] = {}

    @classmethod
    def from_url(cls, url: str) -> PoolUsers:
        return cls(RedisNodes.from_url(url))

    async def close(self) -> None:
        await self.nodes.close()

    async def ensure(self, pool: PoolId, password: str, *, keep_previous: bool = False) -> UserSync:
        """Make the pool's user accept `password` (and, with `keep_previous`, every password it accepted
        before on that node: the pool's older Pods still log in with one) on every node."""
        return await self._ensure(pool_username(pool), pool_rules(pool), password, keep_previous)

    async def ensure_gateway(
        self, namespace: str, served: Sequence[str] | None, password: str, *, keep_previous: bool = False
    ) -> UserSync:
        """Make the front door's user of the release in `namespace` (`gateway_username`) accept `password`
        (`keep_previous` as `ensure`), reaching the pools of the `served` namespaces (None: every one)."""
        return await self._ensure(gateway_username(namespace), gateway_rules(served), password, keep_previous)

    async def _ensure(
        self, username: str, grants: Sequence[str], password: str, keep_previous: bool
    ) -> UserSync:
        current = password_hash(check_password(password))
        changed, unchanged, failures = [], [], []
        for node in await self.nodes.nodes():
            try:
                before = _user_state(await node.call("ACL", "GETUSER", username))
                hashes = tuple((before or {}).get("passwords") or ())
                kept = [h for h in hashes if h != current] if keep_previous else []
                rules = user_rules((current, *kept), grants)
                if before is not None and self._set.get((node.address, username)) == (rules, before):
                    unchanged.append(node.address)
                    continue
                await node.call("ACL", "SETUSER", username, *rules)
                after = _user_state(await node.call("ACL", "GETUSER", username))
                assert after is not None
                self._set[(node.address, username)] = (rules, after)
                if after == before:
                    unchanged.append(node.address)
                    continue
                await self._save(node)
                changed.append(node.address)
            except RedisError as exc:
                failures.append((node.address, exc))
        self._raise(f"making redis user {username}", failures)
        return UserSync(tuple(changed), tuple(unchanged))

    async def delete(self, pool: PoolId) -> int:
        """Delete the pool's user on every node (Redis closes the connections logged in as it); the number of
        nodes that had it."""
        username = pool_username(pool)
        deleted, failures = 0, []
        for node in await self.nodes.nodes():
            try:
                if int(await node.call("ACL", "DELUSER", username)):
                    deleted += 1
                    await self._save(node)
                self._set.pop((node.address, username), None)
            except RedisError as exc:
                failures.append((node.address, exc))
        self._raise(f"deleting redis user {username}", failures)
        return deleted

    async def pools(self) -> set[PoolId]:
        """The pools that have a user on some node (the operator's sweep deletes those whose pool is gone)."""
        found: set[PoolId] = set()
        failures = []
        for node in await self.nodes.nodes():
            try:
                names = _text(await node.call("ACL", "USERS"))
            except RedisError as exc:
                failures.append((node.address, exc))
                continue
            found |= {pool for name in names if (pool := pool_of_username(name)) is not None}
        self._raise("listing redis users", failures)
        return found

    async def users(self, pool: PoolId) -> dict[str, dict[str, Any] | None]:
        """The pool's user as each node has it (None: not there); for tests and diagnostics."""
        username = pool_username(pool)
        return {
            node.address: _user_state(await node.call("ACL", "GETUSER", username))
            for node in await self.nodes.nodes()
        }

    async def _save(self, node: _Node) -> None:
        """`ACL SAVE` where the server has an aclfile (without one, users live until it restarts; the
        operator's next round makes them again)."""
        try:
            await node.call("ACL", "SAVE")
        except ResponseError as exc:
            if _NO_ACLFILE not in str(exc):
                raise

    @staticmethod
    def _raise(what: str, failures: Sequence[tuple[str, RedisError]]) -> None:
        if not failures:
            return
        detail = "; ".join(f"{address}: {exc}" for address, exc in failures)
        if any(isinstance(exc, NoPermissionError) for _, exc in failures):
            raise AclForbidden(
                f"{what}: the operator's redis user may not manage users ({detail}); grant it "
                f"{' '.join(OPERATOR_RULES)}, or run the operator with --worker-redis-users administrator"
            )
        raise PoolUserError(f"{what} failed on {len(failures)} node(s): {detail}")
