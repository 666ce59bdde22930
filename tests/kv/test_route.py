"""The front door's read of the placement store (issue 37, `kv/placement_gateway.py`, `kv/lua/route.lua`) and
the pod record's `address`, against the shared real redis-server, one pool per test."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import pytest
import redis.asyncio as aioredis

from ardiff.kv.errors import InvalidPlacementArgument
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRecord, PoolId, SessionState
from tests.kv.test_placement import TOKEN, spec

LEASE_MS = 60_000
CA = "-----BEGIN CERTIFICATE-----\nMIIB...\n-----END CERTIFICATE-----\n"


@pytest.fixture
def pool(unique_pool: str) -> PoolId:
    return PoolId("default", unique_pool)


async def register(store: PlacementStore, pool: PoolId, pod: str, *, lease_ms: int = LEASE_MS, **fields):
    return await store.register_pod(
        pool,
        pod,
        capacity=2,
        endpoint=f"https://{pod}.workers.default.svc:8000",
        lease_ms=lease_ms,
        **fields,
    )


async def evalsha_ro_calls(redis_url: str) -> int:
    """How many FCALL_RO calls the server has run (`INFO commandstats`): round trips of `route`."""
    async with aioredis.from_url(redis_url) as client:
        stats = await client.info("commandstats")
    return int(stats.get("cmdstat_fcall_ro", {}).get("calls", 0))


async def test_a_pod_registers_its_address_and_a_heartbeat_renews_it(store: PlacementStore, pool) -> None:
    reg = await register(store, pool, "w-a", address="10.1.2.3:8000")
    (pod,) = await store.list_pods(pool)
    assert (pod.address, pod.endpoint) == ("10.1.2.3:8000", "https://w-a.workers.default.svc:8000")
    await store.heartbeat(
        pool,
        "w-a",
        epoch=reg.epoch,
        capacity=2,
        endpoint=pod.endpoint,
        lease_ms=LEASE_MS,
        address="[fd00::7]:8001",
    )
    assert (await store.get_pod(pool, "w-a")).address == "[fd00::7]:8001"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "address", ["w-a:8000", "10.1.2.3", "10.1.2.3:0", "10.1.2.3:65536", "fd00::7:8000", "[10.1.2.3]:80", 7]
)
async def test_an_address_is_an_ip_and_a_port(store: PlacementStore, pool, address) -> None:
    with pytest.raises(InvalidPlacementArgument, match="address must be <ip>:<port>"):
        await register(store, pool, "w-a", address=address)
    assert await store.list_pods(pool) == []


async def test_a_placed_session_routes_to_its_pod_in_one_round_trip_when_the_pod_is_expected(
    store: PlacementStore, pool, redis_url: str
) -> None:
    reg = await register(store, pool, "w-a", address="10.1.2.3:8000")
    await store.place(pool, spec("s"))
    await store.route(pool, "warm-up")  # a warm connection
    before = await evalsha_ro_calls(redis_url)
    first = await store.route(pool, "s")  # no pod expected: the script names it, the call is repeated
    after_first = await evalsha_ro_calls(redis_url)
    again = await store.route(pool, "s", expected_pod="w-a")
    assert (after_first - before, await evalsha_ro_calls(redis_url) - after_first) == (2, 1)
    assert dataclasses.replace(first, now_ms=0) == dataclasses.replace(again, now_ms=0)
    assert (again.state, again.bound_pod, again.pod_epoch, again.token_sha256) == (
        SessionState.PLACED,
        "w-a",
        reg.epoch,
        TOKEN,
    )
    assert isinstance(again.pod, PodRecord)
    assert (again.pod.name, again.pod.address, again.pod.epoch) == ("w-a", "10.1.2.3:8000", reg.epoch)
    assert again.served_by_pod
    assert not again.pool_known  # no operator wrote the pool record here
    assert abs(again.now_ms - await store.server_time_ms()) < 5_000


async def test_a_wrong_expected_pod_costs_one_more_round_trip_and_reads_the_right_one(
    store: PlacementStore, pool
) -> None:
    await register(store, pool, "w-a", address="10.1.2.3:8000")
    await register(store, pool, "w-b", address="10.1.2.4:8000")
    await store.place(pool, spec("s"), prefer_pod="w-b")
    route = await store.route(pool, "s", expected_pod="w-a")
    assert route.pod is not None
    assert (route.pod.name, route.pod.address) == ("w-b", "10.1.2.4:8000")


async def test_an_unknown_session_has_no_state_and_the_pool_record_tells_whether_the_store_knows_the_pool(
    store: PlacementStore, pool
) -> None:
    await register(store, pool, "w-a", address="10.1.2.3:8000")
    empty = await store.route(pool, "nobody")
    assert (empty.state, empty.pod, empty.pool_known, empty.served_by_pod) == (None, None, False, False)
    await store.write_pool(pool)
    known = await store.route(pool, "nobody")
    assert (known.state, known.pod, known.pool_ca_sha256, known.token_sha256) == (None, None, "", "")
    await store.write_pool(pool, tls_ca=CA)
    tls = await store.route(pool, "nobody")
    assert tls.pool_ca_sha256 == hashlib.sha256(CA.encode()).hexdigest()
    assert await store.pool_ca(pool) == CA
    await store.write_pool(pool)
    assert await store.pool_ca(pool) == ""
    assert (await store.route(pool, "nobody")).pool_ca_sha256 == ""


async def test_a_session_without_a_live_pod_is_not_served_and_any_live_reads_a_live_pod(
    store: PlacementStore, pool
) -> None:
    await register(store, pool, "w-old", address="10.1.2.3:8000", lease_ms=50)
    await store.place(pool, spec("s"))
    await asyncio.sleep(0.1)  # w-old's lease lapses; nobody has reaped it yet
    await register(store, pool, "w-new", address="10.1.2.9:8000")
    lapsed = await store.route(pool, "s")
    assert lapsed.state is SessionState.PLACED
    assert lapsed.pod is not None
    assert (lapsed.pod.name, lapsed.pod_live, lapsed.served_by_pod) == ("w-old", False, False)
    other = await store.route(pool, "s", any_live=True)
    assert other.pod is not None
    assert (other.pod.name, other.pod_live, other.served_by_pod) == (
        "w-new",
        True,
        False,
    )
    assert other.bound_pod == "w-old"


async def test_a_released_session_reads_no_pod_unless_any_live_is_asked(store: PlacementStore, pool) -> None:
    await register(store, pool, "w-a", address="10.1.2.3:8000")
    await store.place(pool, spec("s"))
    await store.release(pool, "s", reason="deleted")
    closed = await store.route(pool, "s")
    assert (closed.state, closed.pod) == (SessionState.CLOSED, None)
    anywhere = await store.route(pool, "s", any_live=True)
    assert anywhere.pod is not None
    assert anywhere.pod.name == "w-a"
    assert not anywhere.served_by_pod


async def test_route_is_read_only(store: PlacementStore, pool, redis_url: str) -> None:
    await register(store, pool, "w-a", address="10.1.2.3:8000")
    await store.place(pool, spec("s"))
    async with aioredis.from_url(redis_url) as client:
        before = {key: await client.dump(key) for key in sorted(await client.keys(f"{pool.tag}:*"))}
        await store.route(pool, "s", any_live=True)
        await store.route(pool, "missing", any_live=True)
        after = {key: await client.dump(key) for key in sorted(await client.keys(f"{pool.tag}:*"))}
    assert before == after
