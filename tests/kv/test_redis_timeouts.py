"""Timeouts on every Redis client (issue 23 item 6): a master that stops answering (SIGSTOP: it accepts
connections and never replies) costs a call a few seconds, not a hang; a blocking stream read keeps a socket
timeout longer than its block. A `redis-server` of the test's own (the shared one is never stopped)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.connection import (
    MAX_BLOCK_MS,
    SOCKET_CONNECT_TIMEOUT_SECONDS,
    SOCKET_TIMEOUT_SECONDS,
    build_redis_client,
)
from ardiff.kv.errors import InvalidPlacementArgument
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

POOL = PoolId("timeouts", "pool")


def connection_settings(client) -> dict:
    """What a connection the client makes is set up with (the cluster's from its node manager)."""
    kwargs = client.nodes_manager.connection_kwargs if hasattr(client, "nodes_manager") else None
    if kwargs is None:
        connection = client.connection_pool.make_connection()
        kwargs = {name: getattr(connection, name) for name in ("socket_timeout", "socket_connect_timeout")}
        kwargs |= {"socket_keepalive": connection.socket_keepalive}
        kwargs |= {"socket_keepalive_options": connection.socket_keepalive_options}
        kwargs |= {"retry_on_error": connection.retry_on_error}
    return kwargs


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6390/0",
        "rediss://127.0.0.1:6390/0",
        "redis+sentinel://127.0.0.1:26390/ardiff",
        "redis+cluster://127.0.0.1:7390/",
    ],
)
def test_every_client_has_socket_and_connect_timeouts_and_tcp_keepalive(url: str) -> None:
    settings = connection_settings(build_redis_client(url))
    assert settings["socket_timeout"] == SOCKET_TIMEOUT_SECONDS
    assert settings["socket_connect_timeout"] == SOCKET_CONNECT_TIMEOUT_SECONDS
    assert settings["socket_keepalive"] is True
    assert settings["socket_keepalive_options"] == {
        socket.TCP_KEEPIDLE: 10,
        socket.TCP_KEEPINTVL: 5,
        socket.TCP_KEEPCNT: 3,
    }
    assert RedisTimeoutError not in settings.get("retry_on_error", [])  # a timeout is not retried


def test_the_sentinels_themselves_are_asked_with_the_same_timeouts() -> None:
    master = build_redis_client("redis+sentinel://127.0.0.1:26390/ardiff")
    sentinel = master.connection_pool.sentinel_manager.sentinels[0]
    assert connection_settings(sentinel)["socket_timeout"] == SOCKET_TIMEOUT_SECONDS


async def test_a_master_that_stops_answering_fails_calls_within_seconds() -> None:
    """Before: redis-py's default 5 s timeout, retried three times, kept a call for 20 s."""
    with RedisServer() as server:
        store = PlacementStore.from_url(server.url)
        try:
            assert await store.get_session(POOL, "s-1") is None
            server.process.send_signal(signal.SIGSTOP)
            try:
                for call in (
                    store.get_session(POOL, "s-1"),
                    store.read_events(POOL, "p-0", block_ms=MAX_BLOCK_MS),
                ):
                    started = time.monotonic()
                    with pytest.raises(RedisTimeoutError):
                        await asyncio.wait_for(call, 60)
                    assert time.monotonic() - started < SOCKET_TIMEOUT_SECONDS + 1.5
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert await store.get_session(POOL, "s-1") is None  # answering again: the store goes on
            assert (
                await store.read_events(POOL, "p-0", block_ms=MAX_BLOCK_MS) == []
            )  # a whole block, no error
        finally:
            await store.close()


async def test_a_block_longer_than_the_socket_timeout_allows_is_refused() -> None:
    store = PlacementStore.from_url("redis://127.0.0.1:6390/0")
    assert MAX_BLOCK_MS < SOCKET_TIMEOUT_SECONDS * 1000
    with pytest.raises(InvalidPlacementArgument, match="block_ms"):
        await store.read_events(POOL, "p-0", block_ms=MAX_BLOCK_MS + 1)
    await store.close()


def test_replies_are_parsed_by_hiredis() -> None:
    """The `hiredis` extra comes with the operator and the worker, and redis-py picks it: replies are parsed
    in C (a place's reply in about half the client CPU of redis-py's Python parser, docs/benchmarks.md)."""
    connection = build_redis_client("redis://127.0.0.1:6390/0").connection_pool.make_connection()
    assert type(connection._parser).__name__ == "_AsyncHiredisParser"
