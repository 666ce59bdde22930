"""Redis users per pool (kv/acl.py, issue 23 item 1) against a real redis-server: what a pool's user may run
and reach, how the operator makes, updates and deletes it, and where it may not."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, ConnectionError, NoPermissionError, ResponseError

from ardiff.cli import main
from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.acl import (
    FORBIDDEN_WORKER_COMMANDS,
    GATEWAY_COMMANDS,
    OPERATOR_RULES,
    WORKER_COMMANDS,
    AclForbidden,
    PoolUsers,
    administrator_acl_line,
    gateway_username,
    password_hash,
    pool_of_username,
    pool_username,
)
from ardiff.kv.connection import with_user
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState, token_sha256

PASSWORD = "a-pool-password-of-forty-characters-ok"
OTHER_PASSWORD = "another-pool-password-forty-characters"
LEASE_MS = 60_000
# Issue 42 item 4: a library is global to a node; only the operator loads one (a worker or the picker that
# could would replace every pool's code), and the scripts' old path is closed too.
FUNCTION_COMMANDS = (
    ("FUNCTION", "LOAD", "#!lua name=evil\nredis.register_function('evil', function() return 1 end)"),
    (
        "FUNCTION",
        "LOAD",
        "REPLACE",
        "#!lua name=evil\nredis.register_function('evil', function() return 1 end)",
    ),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "ardiff_000000000000"),
    ("FUNCTION", "RESTORE", "x"),
    ("EVALSHA", "0" * 40, "0"),
    ("SCRIPT", "LOAD", "return 1"),
)


@pytest.fixture
def pools(unique_pool: str) -> tuple[PoolId, PoolId]:
    return PoolId("acl", f"{unique_pool}-a"), PoolId("acl", f"{unique_pool}-b")


@pytest.fixture
async def users(redis_url: str, pools: tuple[PoolId, PoolId]) -> AsyncIterator[PoolUsers]:
    pool_users = PoolUsers.from_url(redis_url)
    yield pool_users
    for pool in pools:
        await pool_users.delete(pool)
    await pool_users.close()


async def refused(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((NoPermissionError, ResponseError)) as caught:
        await call
    assert "no permissions" in str(caught.value) or "can't access" in str(caught.value), caught.value


def test_no_worker_or_gateway_command_is_one_they_must_never_run() -> None:
    for command in (*WORKER_COMMANDS, *GATEWAY_COMMANDS):
        name = command.split("|")[0]
        assert command not in FORBIDDEN_WORKER_COMMANDS, command
        assert name not in FORBIDDEN_WORKER_COMMANDS, command
    assert {"flushall", "flushdb", "config", "debug", "keys", "acl"} <= set(FORBIDDEN_WORKER_COMMANDS)


def test_a_pool_username_names_its_pool_and_nothing_else_parses_as_one() -> None:
    pool = PoolId("tenant-a", "worlds")
    assert pool_username(pool) == "ardiff-pool.tenant-a.worlds"
    assert pool_of_username(pool_username(pool)) == pool
    for other in ("default", "ardiff-operator", "ardiff-pool.nodot", "ardiff-pool.Bad.Name", "tenant-42"):
        assert pool_of_username(other) is None


async def test_a_pool_user_runs_the_workers_calls_on_its_pool_only(
    redis_url: str, redis_server: RedisServer, users: PoolUsers, pools: tuple[PoolId, PoolId]
) -> None:
    a, b = pools
    await users.ensure(a, PASSWORD)
    async with (
        PlacementStore.from_url(with_user(redis_url, pool_username(a), PASSWORD)) as worker,
        PlacementStore.from_url(redis_url) as operator,
    ):
        # The worker's side of the store, on its own pool.
        registration = await worker.register_pod(
            a, "p1", capacity=2, endpoint="http://p1:8000", lease_ms=LEASE_MS
        )
        await worker.heartbeat(
            a, "p1", epoch=registration.epoch, capacity=2, endpoint="http://p1:8000", lease_ms=LEASE_MS
        )
        assert await worker.read_events(a, "p1") == []
        assert (await worker.get_pod(a, "p1")) is not None
        await worker.set_draining(a, "p1", draining=False)
        # Another pool's records: neither through the store's scripts nor through a plain command.
        await operator.register_pod(b, "p1", capacity=2, endpoint="http://b:8000", lease_ms=LEASE_MS)
        await refused(worker.register_pod(b, "evil", capacity=9, endpoint="http://evil:1", lease_ms=LEASE_MS))
        await refused(worker.get_pod(b, "p1"))
        assert (await operator.get_pod(b, "evil")) is None
    async with aioredis.from_url(with_user(redis_url, pool_username(a), PASSWORD)) as client:
        await refused(client.hgetall(PoolKeys(b).pod("p1")))
        await refused(client.hset(PoolKeys(b).pod("p1"), "endpoint", "http://evil:1"))
        script = client.register_script("return redis.call('HSET', ARGV[1], 'endpoint', 'http://evil:1')")
        await refused(script(keys=[PoolKeys(a).pod("p1")], args=[PoolKeys(b).pod("p1")]))
        for command in (
            ("FLUSHALL",),
            ("CONFIG", "GET", "*"),
            ("KEYS", "*"),
            ("ACL", "WHOAMI"),
            ("SCAN", "0"),
            ("ACL", "SETUSER", "mine", "on", "nopass", "~*", "+@all"),
            *FUNCTION_COMMANDS,
        ):
            await refused(client.execute_command(*command))
    # DEBUG the server refuses anyone here (enable-debug-command): ask the ACL itself.
    dry_run = redis_server.cli("ACL", "DRYRUN", pool_username(a), "DEBUG", "SLEEP", "0")
    assert "no permissions to run the 'debug' command" in dry_run, dry_run


async def test_ensure_sets_the_user_once_keeps_older_passwords_only_while_asked_and_delete_ends_it(
    redis_url: str, redis_server: RedisServer, users: PoolUsers, pools: tuple[PoolId, PoolId]
) -> None:
    a, _ = pools
    first = await users.ensure(a, PASSWORD)
    assert first.changed
    assert not first.unchanged
    again = await users.ensure(a, PASSWORD)
    assert again.unchanged
    assert not again.changed
    # Rotated while older Pods run: both passwords work.
    await users.ensure(a, OTHER_PASSWORD, keep_previous=True)
    [state] = (await users.users(a)).values()
    assert state is not None
    assert set(state["passwords"]) == {
        password_hash(PASSWORD),
        password_hash(OTHER_PASSWORD),
    }
    for password in (PASSWORD, OTHER_PASSWORD):
        async with aioredis.from_url(with_user(redis_url, pool_username(a), password)) as client:
            assert await client.ping()
    # The roll is over: the old one is refused, and Redis never held either in clear.
    async with aioredis.from_url(with_user(redis_url, pool_username(a), PASSWORD)) as held:
        await held.ping()
        await users.ensure(a, OTHER_PASSWORD)
        with pytest.raises(AuthenticationError):
            async with aioredis.from_url(with_user(redis_url, pool_username(a), PASSWORD)) as client:
                await client.ping()
        acl = redis_server.cli("ACL", "LIST")
        assert PASSWORD not in acl
        assert OTHER_PASSWORD not in acl
        assert a in await users.pools()
        assert await users.delete(a) == 1
        with pytest.raises((AuthenticationError, ConnectionError)):  # Redis closed it, and refuses it now
            await held.ping()
    assert a not in await users.pools()
    assert await users.delete(a) == 0  # idempotent


async def test_an_operator_user_that_may_not_run_acl_setuser_gets_acl_forbidden(
    redis_url: str, redis_server: RedisServer, unique_pool: str, pools: tuple[PoolId, PoolId]
) -> None:
    """A managed Redis: the operator's user has everything but `ACL`; the error names the way out."""
    name = f"managed-{unique_pool}"
    grant = [rule for rule in OPERATOR_RULES if not rule.startswith("+acl|")]
    redis_server.cli("ACL", "SETUSER", name, "on", f">{PASSWORD}", *grant)
    managed = PoolUsers.from_url(with_user(redis_url, name, PASSWORD))
    try:
        with pytest.raises(AclForbidden, match="--worker-redis-users administrator"):
            await managed.ensure(pools[0], PASSWORD)
    finally:
        await managed.close()
        redis_server.cli("ACL", "DELUSER", name)
    # What the administrator runs instead makes a user that works like the operator's.
    line = administrator_acl_line(pools[0], "tenant-42").replace(">PASSWORD", f">{PASSWORD}")
    assert line.startswith("ACL SETUSER tenant-42 reset on >")
    redis_server.cli(*line.split())
    try:
        async with PlacementStore.from_url(with_user(redis_url, "tenant-42", PASSWORD)) as worker:
            await worker.register_pod(
                pools[0], "p1", capacity=1, endpoint="http://p1:8000", lease_ms=LEASE_MS
            )
            await refused(
                worker.register_pod(pools[1], "p1", capacity=1, endpoint="http://p:1", lease_ms=LEASE_MS)
            )
    finally:
        redis_server.cli("ACL", "DELUSER", "tenant-42")


async def test_a_server_with_an_aclfile_keeps_the_users_across_a_restart(tmp_path: Path) -> None:
    aclfile = tmp_path / "users.acl"
    aclfile.write_text("user default on nopass ~* &* +@all\n")
    pool = PoolId("acl", "persisted")
    with RedisServer(extra_args=("--aclfile", str(aclfile))) as server:
        users = PoolUsers.from_url(server.url)
        try:
            await users.ensure(pool, PASSWORD)
        finally:
            await users.close()
        saved = aclfile.read_text()
        assert re.search(
            rf"^user {re.escape(pool_username(pool))} on .*#{password_hash(PASSWORD)} ", saved, re.M
        )
        assert PASSWORD not in saved
        server.restart()
        async with aioredis.from_url(with_user(server.url, pool_username(pool), PASSWORD)) as client:
            assert await client.ping()


def test_ardiff_kv_redis_user_prints_the_administrators_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv", "redis-user", "tenant-a", "worlds", "--username", "tenant-42"]) == 0
    expected = administrator_acl_line(PoolId("tenant-a", "worlds"), "tenant-42")
    assert capsys.readouterr().out.strip() == expected
    assert main(["kv", "redis-user", "tenant-a", "worlds"]) == 0
    assert capsys.readouterr().out.startswith("ACL SETUSER ardiff-pool.tenant-a.worlds reset on >PASSWORD ~{")


async def test_the_gateway_user_routes_and_records_demands_in_its_namespaces_and_writes_nothing_else(
    redis_url: str, redis_server: RedisServer, users: PoolUsers, pools: tuple[PoolId, PoolId]
) -> None:
    """Issue 37: the front door's user runs `route` (FCALL_RO) and `request_resume` on the served
    namespaces' pools, reads nothing elsewhere, writes no record but a session's, and runs nothing else."""
    a, _ = pools
    elsewhere = PoolId("acl-other", a.name)
    username = gateway_username("release-ns")
    await users.ensure_gateway("release-ns", ["acl"], PASSWORD)
    try:
        async with (
            PlacementStore.from_url(with_user(redis_url, username, PASSWORD)) as gateway,
            PlacementStore.from_url(redis_url) as operator,
        ):
            for pool in (a, elsewhere):
                await operator.register_pod(
                    pool,
                    "p1",
                    capacity=1,
                    endpoint="http://p1:8000",
                    lease_ms=LEASE_MS,
                    address="10.0.0.1:80",
                    exports=True,
                )
                await operator.place(pool, SessionSpec("s", token_sha256("t")))
            route = await gateway.route(a, "s")
            assert route.served_by_pod
            assert route.pod is not None
            assert route.pod.address == "10.0.0.1:80"
            assert await operator.suspend(a, "s", reason="evicted")
            assert await gateway.request_resume(a, "s") is SessionState.SUSPENDING
            await refused(gateway.route(elsewhere, "s"))
            await refused(gateway.request_resume(elsewhere, "s"))
            await refused(gateway.release(a, "s", reason="deleted"))
            assert (await operator.get_session(a, "s")).state is SessionState.SUSPENDING  # type: ignore[union-attr]
        async with aioredis.from_url(with_user(redis_url, username, PASSWORD)) as client:
            await refused(client.hgetall(PoolKeys(a).session("s")))
            await refused(client.hset(PoolKeys(a).pod("p1"), "address", "10.6.6.6:80"))
            await refused(client.zadd(PoolKeys(a).leases, {"evil": 1e15}))
            await refused(client.hset(PoolKeys(elsewhere).session("s"), "state", "placed"))
            for command in (
                *FUNCTION_COMMANDS,
                ("FLUSHALL",),
                ("KEYS", "*"),
                ("SCAN", "0"),
                ("CONFIG", "GET", "*"),
                ("XADD", "x", "*", "a", "b"),
            ):
                await refused(client.execute_command(*command))
    finally:
        redis_server.cli("ACL", "DELUSER", username)
