"""Connecting to the placement store's Redis: what a URL names, and the client built for it.

The URL forms (`redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`, `rediss+cluster://`), the
store's own query options (`wait_replicas`, `wait_timeout_ms`), the socket timeouts and reconnect policy every
client gets, and redaction for logs and error messages. Nothing here runs a script or reads a record.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from ardiff.kv.errors import InvalidRedisUrl

DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379
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


CLUSTER_TLS_OPTIONS = ("ssl_ca_certs",)  # a rediss+cluster URL's query may name the CA to verify with


def _cluster(url: str) -> RedisCluster:
    hosts, _, query = url.partition("?")
    tls = url.startswith("rediss+")
    try:
        username, password, nodes, path = _split_hosts(hosts, DEFAULT_CLUSTER_PORT)
        if path:
            raise ValueError("a cluster has only database 0: nothing may follow the hosts but /")
        options = dict(parse_qsl(query, keep_blank_values=True))
        if unknown := sorted(set(options) - set(CLUSTER_TLS_OPTIONS if tls else ())):
            raise ValueError(f"unknown option {unknown[0]!r} (a rediss+cluster url may name ssl_ca_certs)")
    except ValueError as exc:
        raise InvalidRedisUrl(f"placement cluster url {redact_url(url)} is malformed: {exc}") from None
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        ssl=tls,
        **options,
        **connection_options(),
    )
