"""The placement store when Redis loses its data, and its connection URLs (password, Sentinel, TLS).

Each data-loss test starts its own `RedisServer`: the shared test server must never be flushed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio.connection import SSLConnection
from redis.exceptions import AuthenticationError, ResponseError

from ardiff.devcluster.redis_server import RedisSentinel, RedisServer
from ardiff.kv.connection import build_redis_client, redact_url
from ardiff.kv.errors import InvalidRedisUrl, NotReplicated, PodFenced, UnknownSession
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRegistration, PoolId, SessionSpec, SessionState

TOKEN = hashlib.sha256(b"token").hexdigest()
POOL = PoolId("worlds", "gpu")
LEASE_MS = 60_000


def spec(name: str) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, prompt=f"prompt of {name}")


@pytest.fixture
async def server() -> AsyncIterator[RedisServer]:
    with RedisServer() as own_server:
        yield own_server


async def heartbeat(store: PlacementStore, pod: str, registration: PodRegistration) -> PodRegistration:
    return await store.heartbeat(
        POOL, pod, epoch=registration.epoch, capacity=2, endpoint=f"http://{pod}:8000", lease_ms=LEASE_MS
    )


async def lose_data_and_recover(store: PlacementStore, lose_data: Callable[[], Awaitable[None]]) -> None:
    """Two pods, three sessions; Redis loses everything; heartbeats heal the pods, `restore` the bindings."""
    pods = {
        pod: await store.register_pod(POOL, pod, capacity=2, endpoint=f"http://{pod}:8000", lease_ms=LEASE_MS)
        for pod in ("w-a", "w-b")
    }
    status = {}  # what the session CRs' status holds: pod, epoch, chunk index
    for name in ("s1", "s2", "s3"):
        placement = (await store.place(POOL, spec(name))).placement
        assert placement is not None
        await store.touch(POOL, name, pod=placement.pod, epoch=placement.pod_epoch, chunk_index=4)
        status[name] = (placement.pod, placement.pod_epoch, 4)

    await lose_data()
    assert await store.list_pods(POOL) == []
    with pytest.raises(UnknownSession):  # the worker answers 404 until the operator restores the binding
        await store.touch(POOL, "s1", pod=status["s1"][0], epoch=status["s1"][1], chunk_index=5)
    # Not restorable before the pod's heartbeat re-created its record.
    assert (
        await store.restore(
            POOL,
            spec("s1"),
            pod=status["s1"][0],
            pod_epoch=status["s1"][1],
            chunk_index=4,
            reset_required=False,
        )
        is None
    )

    for pod, registration in pods.items():
        healed = await heartbeat(store, pod, registration)
        assert healed == PodRegistration(epoch=registration.epoch, recreated=True)
    assert [(p.name, p.epoch, p.used) for p in await store.list_pods(POOL)] == [
        ("w-a", pods["w-a"].epoch, 0),
        ("w-b", pods["w-b"].epoch, 0),
    ]
    for name, (pod, epoch, chunk_index) in status.items():
        restored = await store.restore(
            POOL, spec(name), pod=pod, pod_epoch=epoch, chunk_index=chunk_index, reset_required=False
        )
        assert restored is not None
        assert (restored.pod, restored.pod_epoch, restored.endpoint) == (pod, epoch, f"http://{pod}:8000")
    # A second restore of a bound session, or one with a stale epoch, is refused.
    pod, epoch, _ = status["s1"]
    assert (
        await store.restore(POOL, spec("s1"), pod=pod, pod_epoch=epoch, chunk_index=4, reset_required=False)
        is None
    )
    assert (
        await store.restore(
            POOL, spec("s9"), pod=pod, pod_epoch=epoch - 1, chunk_index=0, reset_required=False
        )
        is None
    )

    records = await store.get_sessions(POOL, list(status))
    assert {n: (r.state, r.pod, r.pod_epoch, r.chunk_index, r.prompt) for n, r in records.items()} == {
        n: ("placed", pod, epoch, 4, f"prompt of {n}") for n, (pod, epoch, _) in status.items()
    }
    # The workers tick on with their old epochs; the store is consistent again.
    for name, (pod, epoch, _) in status.items():
        await store.touch(POOL, name, pod=pod, epoch=epoch, chunk_index=5)
    assert await store.check_invariants(POOL) == []
    # The notification streams are back too: the consumer group is re-created on demand.
    await store.release(POOL, "s1", reason="deleted")
    events = await store.read_events(POOL, status["s1"][0])
    assert [(e.kind, e.session, e.epoch) for e in events] == [("close", "s1", status["s1"][1])]


async def test_flushall_mid_run_heals_through_heartbeats_and_restore(server: RedisServer) -> None:
    async with PlacementStore.from_url(server.url) as store:

        async def flushall() -> None:
            await store.client.flushall()

        await lose_data_and_recover(store, flushall)


async def test_redis_restart_without_persistence_heals_the_same_way(server: RedisServer) -> None:
    async with PlacementStore.from_url(server.url) as store:

        async def restart() -> None:
            server.restart()
            await store.load_library()  # the library went with the data: the operator's round loads it again

        await lose_data_and_recover(store, restart)


async def test_restore_refuses_a_full_pod(server: RedisServer) -> None:
    async with PlacementStore.from_url(server.url) as store:
        reg = await store.register_pod(POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=LEASE_MS)
        await store.place(POOL, spec("s1"))
        assert (
            await store.restore(
                POOL, spec("s2"), pod="w-a", pod_epoch=reg.epoch, chunk_index=0, reset_required=True
            )
            is None
        )
        assert await store.get_session(POOL, "s2") is None
        assert await store.check_invariants(POOL) == []


async def test_epochs_stay_monotonic_after_data_loss(server: RedisServer) -> None:
    async with PlacementStore.from_url(server.url) as store:
        before = await store.register_pod(
            POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=LEASE_MS
        )
        await store.client.flushall()
        await asyncio.sleep(0.005)  # the clock is the only memory left: its resolution is 1 ms
        after = await store.register_pod(
            POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=LEASE_MS
        )
        assert after.epoch > before.epoch  # seeded from the server clock, not from the lost record


async def test_password_protected_server() -> None:
    with RedisServer(password="s3cr3t") as server:
        assert ":s3cr3t@" in server.url
        async with PlacementStore.from_url(server.url) as store:
            await store.register_pod(POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=LEASE_MS)
            assert (await store.place(POOL, spec("s1"))).placement is not None
        async with PlacementStore.from_url(f"redis://127.0.0.1:{server.port}/0") as anonymous:
            with pytest.raises((AuthenticationError, ResponseError), match=r"(?i)auth"):
                await anonymous.list_pods(POOL)
        async with PlacementStore.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0") as wrong:
            with pytest.raises((AuthenticationError, ResponseError)):
                await wrong.list_pods(POOL)


async def test_sentinel_url_reaches_the_master() -> None:
    with RedisServer(password="pw") as master, RedisSentinel(master, service_name="placement") as sentinel:
        assert sentinel.url.startswith("redis+sentinel://:pw@127.0.0.1:")
        async with PlacementStore.from_url(sentinel.url) as replicated:  # waits for a replica by default
            with pytest.raises(NotReplicated):  # there is none: the write is applied, and reported
                await replicated.register_pod(POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=1)
        async with PlacementStore.from_url(sentinel.url + "?wait_replicas=0") as store:
            reg = await store.register_pod(
                POOL, "w-a", capacity=1, endpoint="http://w-a:8000", lease_ms=LEASE_MS
            )
            placed = await store.place(POOL, spec("s1"))
            assert placed.placement is not None
            assert placed.placement.pod_epoch == reg.epoch
        # The writes landed on the master the sentinel monitors.
        async with PlacementStore.from_url(master.url) as direct:
            record = await direct.get_session(POOL, "s1")
            assert record is not None
            assert record.state is SessionState.PLACED


@pytest.mark.parametrize(
    "url",
    [
        "",
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport/0",
        "redis:///0",
        "redis+sentinel://",
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/svc/0/extra",
        "redis+sentinel://127.0.0.1:port/svc",
        "redis+sentinel://127.0.0.1:26379/svc/db",
        "redis+sentinel://:pw@:26379/svc",
    ],
)
def test_bad_urls_are_rejected_clearly(url: str) -> None:
    with pytest.raises(InvalidRedisUrl) as raised:
        build_redis_client(url)
    assert raised.value.code == "invalid_redis_url"
    assert "pw" not in str(raised.value)  # passwords are redacted from messages


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://app:s3cret@redis.example:6380/2", "rediss://app:***@redis.example:6380/2"),
        ("redis://s3cret@redis/0", "redis://:***@redis/0"),  # a lone user part may be a password
        ("redis://:s3/cr@et@redis/0", "redis://:***@redis/0"),  # unencoded / and @ in the password
        ("redis+sentinel://:s3cret@s1:26379,s2/main/1", "redis+sentinel://:***@s1:26379,s2/main/1"),
        (
            "rediss://redis/0?ssl_ca_certs=/ca.crt&password=s3cret",
            "rediss://redis/0?ssl_ca_certs=/ca.crt&password=***",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_hides_every_password(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    assert "s3" not in redacted


def test_rediss_url_uses_tls() -> None:
    client = build_redis_client("rediss://:pw@redis.example:6380/2")
    assert client.connection_pool.connection_class is SSLConnection
    assert client.connection_pool.connection_kwargs["password"] == "pw"
    assert client.connection_pool.connection_kwargs["db"] == 2


def test_sentinel_url_lists_every_sentinel() -> None:
    client = build_redis_client("redis+sentinel://user:pw@s1:26379,s2,s3:26380/mymaster/3")
    sentinels = client.connection_pool.sentinel_manager.sentinels
    addresses = [s.connection_pool.connection_kwargs for s in sentinels]
    assert [(a["host"], a["port"]) for a in addresses] == [("s1", 26379), ("s2", 26379), ("s3", 26380)]
    assert client.connection_pool.service_name == "mymaster"
    assert client.connection_pool.connection_kwargs["db"] == 3
    assert client.connection_pool.connection_kwargs["password"] == "pw"


async def test_a_newer_incarnation_takes_over_a_record_an_older_one_re_created(server: RedisServer) -> None:
    """After data loss a stale incarnation's heartbeat may re-create the record first; the newer one wins."""
    async with PlacementStore.from_url(server.url) as store:
        older = await store.register_pod(
            POOL, "w-a", capacity=2, endpoint="http://w-a:8000", lease_ms=LEASE_MS
        )
        await asyncio.sleep(0.002)
        newer = await store.register_pod(
            POOL, "w-a", capacity=2, endpoint="http://w-a:8000", lease_ms=LEASE_MS
        )
        await store.client.flushall()
        assert (await heartbeat(store, "w-a", older)).recreated  # the stale one heals the record first
        restored = await store.restore(
            POOL, spec("s1"), pod="w-a", pod_epoch=older.epoch, chunk_index=0, reset_required=False
        )
        assert restored is not None

        takeover = await heartbeat(store, "w-a", newer)
        assert takeover == PodRegistration(epoch=newer.epoch, lost_sessions=("s1",), recreated=True)
        with pytest.raises(PodFenced):
            await heartbeat(store, "w-a", older)
        assert (await store.get_session(POOL, "s1")).state is SessionState.LOST  # type: ignore[union-attr]
        assert await store.check_invariants(POOL) == []
