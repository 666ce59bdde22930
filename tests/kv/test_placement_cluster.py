"""The placement store on a real 3-master Redis Cluster (`redis+cluster://`): every operation, pools spread
over the nodes by their hash tag, scripts run (and are reloaded) on the node that owns the pool's slot."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis.asyncio.connection import SSLConnection

from ardiff.devcluster.redis_server import RedisCluster, RedisServer
from ardiff.kv.connection import build_redis_client
from ardiff.kv.errors import FunctionsNotLoaded, InvalidRedisUrl, SessionNotHere
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState

TOKEN = hashlib.sha256(b"token").hexdigest()
# Their hash tags fall into the three slot ranges `redis-cli --cluster create` assigns to three masters
# (0-5460, 5461-10922, 10923-16383): worlds/gpu on the first, worlds/cpu and robots/cpu on the second,
# robots/gpu on the third.
POOLS = {
    PoolId("worlds", "gpu"): 1557,
    PoolId("worlds", "cpu"): 6869,
    PoolId("robots", "gpu"): 15319,
    PoolId("robots", "cpu"): 10007,
}


def spec(name: str, priority: int = 0) -> SessionSpec:
    return SessionSpec(name=name, token_sha256=TOKEN, prompt=f"prompt of {name}", priority=priority)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3, password="pw") as running:
        yield running


@pytest.fixture
async def store(cluster: RedisCluster) -> AsyncIterator[PlacementStore]:
    async with PlacementStore.from_url(cluster.url) as opened:
        yield opened
        for pool in POOLS:
            await opened.delete_pool(pool)


def test_cluster_urls() -> None:
    client = build_redis_client("redis+cluster://user:p%40ss@n1:7000,n2,n3:7002/")
    assert isinstance(client, ClusterClient)
    assert [(n.host, n.port) for n in client.startup_nodes] == [
        ("n1", 7000),
        ("n2", 6379),
        ("n3", 7002),
    ]
    kwargs = client.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("user", "p@ss")
    tls = build_redis_client("rediss+cluster://n1:7000").connection_kwargs["connection_class"]
    assert tls is SSLConnection
    # The CA a cluster's TLS is verified with, as the chart's operator URL names it (issue 23 item 9).
    verified = build_redis_client("rediss+cluster://n1:7000/?ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt")
    assert verified.connection_kwargs["ssl_ca_certs"] == "/etc/ardiff/redis-tls/ca.crt"
    for bad in (
        "redis+cluster://",
        "redis+cluster://n1:7000/0",
        "redis+cluster://n1:port/",
        "redis+cluster://:pw@/",
        "rediss+cluster://n1:7000/?ssl_cert_reqs=none",  # verification is not switched off by a URL
        "redis+cluster://n1:7000/?ssl_ca_certs=/ca.crt",  # no TLS to verify
    ):
        with pytest.raises(InvalidRedisUrl, match="placement cluster url"):
            build_redis_client(bad)


def test_pools_spread_over_the_nodes_by_their_hash_tag(cluster: RedisCluster) -> None:
    assert {pool: cluster.keyslot(pool.tag) for pool in POOLS} == POOLS
    owners = {pool: cluster.node_of_slot(slot).port for pool, slot in POOLS.items()}
    assert len(set(owners.values())) == 3
    assert owners[PoolId("worlds", "cpu")] == owners[PoolId("robots", "cpu")]


async def test_every_operation_on_a_cluster(store: PlacementStore) -> None:
    for pool in POOLS:
        epochs = {}
        for pod in ("w-a", "w-b"):
            registration = await store.register_pod(
                pool, pod, capacity=2, endpoint=f"http://{pod}:8000", lease_ms=60_000
            )
            epochs[pod] = registration.epoch
        placed = {}
        for name in ("s1", "s2", "s3", "s4"):
            placement = (await store.place(pool, spec(name))).placement
            assert placement is not None
            placed[name] = placement
            await store.touch(pool, name, pod=placement.pod, epoch=placement.pod_epoch, chunk_index=2)
            await asyncio.sleep(0.002)  # distinct tick times: a strict LRU order
        assert sorted(p.pod for p in placed.values()) == ["w-a", "w-a", "w-b", "w-b"]
        assert (await store.place(pool, spec("s1"))).already_placed
        full = await store.place(pool, spec("s5", priority=1), may_evict=True)  # s1 ticked first
        assert (full.victim, full.placement is not None) == ("s1", True)
        s1 = placed["s1"]
        with pytest.raises(SessionNotHere):
            await store.touch(pool, "s1", pod=s1.pod, epoch=s1.pod_epoch, chunk_index=3)
        assert await store.evict_lru(pool, min_idle_ms=0) == "s2"
        assert await store.release(pool, "s3", reason="closed") is SessionState.PLACED
        events = await store.read_events(pool, placed["s3"].pod)
        assert [(e.kind, e.session) for e in events][-1] == ("close", "s3")
        assert await store.ack_events(pool, placed["s3"].pod, [e.id for e in events]) == len(events)
        bindings = await store.get_bindings(pool, ["s1", "s4", "s5", "nope"])
        assert {n: b.state for n, b in bindings.items()} == {
            "s1": SessionState.EVICTED,
            "s4": SessionState.PLACED,
            "s5": SessionState.PLACED,
        }
        renewed = await store.heartbeat(
            pool, "w-a", epoch=epochs["w-a"], capacity=2, endpoint="http://w-a:8000", lease_ms=60_000
        )
        assert renewed.epoch == epochs["w-a"]
        assert [p.name for p in await store.list_pods(pool)] == ["w-a", "w-b"]
        assert await store.check_invariants(pool) == []
        on_b = {n for n in ("s4", "s5") if bindings[n].pod == "w-b"}
        assert set(await store.remove_pod(pool, "w-b")) == on_b
        assert {n: r.state for n, r in (await store.get_sessions(pool, sorted(on_b))).items()} == {
            n: SessionState.LOST for n in on_b
        }
        assert await store.drain_pod(pool, "w-a", only_if_empty=False)
        assert await store.check_invariants(pool) == []
        assert await store.delete_pool(pool) > 0
        assert await store.list_pods(pool) == []


async def test_scripts_run_on_the_node_of_the_pool(store: PlacementStore, cluster: RedisCluster) -> None:
    """redis-py routes FCALL by its first key, and our keys all carry the pool's tag: each pool's functions
    run on its own node only. A node that lost its library (FUNCTION FLUSH, a restart) makes a worker's call
    `FunctionsNotLoaded` until the operator's store loads it again there (issue 42 item 4)."""
    pool = PoolId("robots", "gpu")
    owner = cluster.node_of_slot(POOLS[pool])
    others = [node for node in cluster.nodes if node is not owner]

    def evalsha_calls(node: RedisServer) -> int:
        stats = node.info("commandstats").get("cmdstat_fcall", "calls=0")
        return int(stats.split(",")[0].removeprefix("calls="))

    before = {node.port: evalsha_calls(node) for node in cluster.nodes}
    await store.register_pod(pool, "w-a", capacity=4, endpoint="http://w-a:8000", lease_ms=60_000)
    for name in ("s1", "s2"):
        assert (await store.place(pool, spec(name))).placement is not None
    assert evalsha_calls(owner) - before[owner.port] >= 3
    assert [evalsha_calls(node) - before[node.port] for node in others] == [0, 0]
    assert owner.cli("EXISTS", f"{pool.tag}:session:s1").strip() == "1"
    assert [node.cli("DBSIZE").strip() for node in others] == ["0", "0"]

    owner.cli("FUNCTION", "FLUSH")
    with pytest.raises(FunctionsNotLoaded):
        await store.place(pool, spec("s3"))
    async with PlacementStore.from_url(cluster.url, loads_library=True) as operator:
        placed = (await operator.place(pool, spec("s3"))).placement  # loads it where it is missing
        assert placed is not None
        assert await operator.load_library() == []  # on every primary now: nothing more to load
    assert (await store.place(pool, spec("s3"))).already_placed
    assert await store.check_invariants(pool) == []


async def test_the_operator_loads_the_library_on_every_primary(cluster: RedisCluster) -> None:
    """Functions are per node and not propagated between shards: `load_library` loads on each primary that
    lacks it, whichever pools it serves, and only there."""
    for node in cluster.nodes:
        node.cli("FUNCTION", "FLUSH")
    async with PlacementStore.from_url(cluster.url, loads_library=True) as operator:
        loaded = await operator.load_library()
        assert sorted(loaded) == sorted(f"127.0.0.1:{node.port}" for node in cluster.nodes)
        cluster.nodes[1].cli("FUNCTION", "FLUSH")
        assert await operator.load_library() == [f"127.0.0.1:{cluster.nodes[1].port}"]
        name = operator.library.name
    for node in cluster.nodes:
        assert name in node.cli("FUNCTION", "LIST", "LIBRARYNAME", name)
