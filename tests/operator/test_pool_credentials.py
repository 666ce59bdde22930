"""Issue 23 items 1 and 12 through the real operator, real worker Pods and a real redis-server with ACLs: each
pool's workers log in as the pool's own Redis user, which reaches only that pool's keys and none of the
commands that could harm the rest of the store; the user goes with its pool; a Redis that forbids `ACL
SETUSER` is served with users the administrator made; and a changed credential rolls the pool's Pods
without cutting a live session."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.acl import OPERATOR_RULES, PoolUser, password_hash
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from tests.operator.conftest import FAKE_WORKER_ENV, MERGE, Cluster, SharedTier

pytestmark = pytest.mark.slow

OPERATOR_PASSWORD = "the-operators-own-password"


def secret_data(cluster: Cluster, pool: str) -> dict[str, str]:
    secret = cluster.get("secrets", f"{pool}-workers-redis", core=True)
    assert secret is not None, f"pool {pool} has no workers' Redis Secret"
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def on_loopback(cluster: Cluster, url: str) -> str:
    """A workers' URL (the cluster address Pods reach) as this machine reaches the same server."""
    assert cluster.kube.network is not None
    return url.replace(f"@{cluster.kube.network.host_ip}:", "@127.0.0.1:")


def clients_by_user(redis: RedisServer) -> dict[str, set[str]]:
    """`CLIENT LIST`: the addresses each user is logged in from."""
    found: dict[str, set[str]] = {}
    for line in redis.cli("CLIENT", "LIST").splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        found.setdefault(fields["user"], set()).add(fields["addr"].rsplit(":", 1)[0])
    return found


def pod_ips(cluster: Cluster, pool: str) -> set[str]:
    return {p["status"]["podIP"] for p in cluster.pods(pool) if (p.get("status") or {}).get("podIP")}


async def refused(call) -> Exception:  # type: ignore[no-untyped-def]
    """The error Redis answers `call` with (a NOPERM, as a script's or a command's refusal)."""
    with pytest.raises((NoPermissionError, ResponseError)) as caught:
        await call
    assert "no permissions" in str(caught.value) or "can't" in str(caught.value), caught.value
    return caught.value


async def test_each_pools_workers_reach_only_their_own_pools_keys(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace
    with cluster.redis_server(password=OPERATOR_PASSWORD) as redis:
        operator = cluster.operator(redis.url, tmp_path / "operator.log").start()
        try:
            operator.wait_ready()
            for name in ("a", "b"):
                cluster.create_pool(name)
                cluster.create_session(f"s-{name}", pool=name)
            ready = {name: cluster.wait_phase(f"s-{name}", "Ready") for name in ("a", "b")}
            assert cluster.tick("s-a", 0).status_code == 200
            a, b = PoolKeys(PoolId(ns, "a")), PoolKeys(PoolId(ns, "b"))
            pod_b = ready["b"]["pod"]

            # What pool a's workers hold: try it on pool b, as a compromised worker of a would.
            data = secret_data(cluster, "a")
            stolen = on_loopback(cluster, data["url"])
            async with aioredis.from_url(stolen) as worker_a, PlacementStore.from_url(redis.url) as store:
                b_pod_before = await store.get_pod(PoolId(ns, "b"), pod_b)
                b_token_before = (await store.get_session(PoolId(ns, "b"), "s-b")).token_sha256  # type: ignore[union-attr]
                await refused(worker_a.hgetall(b.pod(pod_b)))  # read another pool's records
                await refused(worker_a.hgetall(b.session("s-b")))
                forged = hashlib.sha256(b"the attacker's token").hexdigest()
                await refused(worker_a.hset(b.session("s-b"), "token_sha256", forged))  # forge a token hash
                await refused(
                    worker_a.hset(b.pod("evil"), mapping={"endpoint": "http://evil:1", "capacity": 9})
                )
                await refused(worker_a.xreadgroup("worker", "evil", {b.events(pod_b): "0"}))
                # ... nor through a script of its own that declares a key of its pool and writes b's
                script = worker_a.register_script(
                    "return redis.call('HSET', ARGV[1], 'token_sha256', ARGV[2])"
                )
                await refused(script(keys=[a.session("s-a")], args=[b.session("s-b"), forged]))
                # ... nor through the store's own scripts (a pod record forged in pool b)
                async with PlacementStore.from_url(stolen) as forger:
                    await refused(
                        forger.register_pod(
                            PoolId(ns, "b"), "evil", capacity=9, endpoint="http://evil:1", lease_ms=60_000
                        )
                    )
                for command in (
                    ("FLUSHALL",),
                    ("FLUSHDB",),
                    ("CONFIG", "GET", "*"),
                    ("CONFIG", "SET", "maxmemory", "1"),
                    ("KEYS", "*"),
                    ("SCAN", "0"),
                    ("ACL", "LIST"),
                    ("ACL", "SETUSER", "mine", "on", "nopass", "~*", "+@all"),
                    ("INFO",),
                    ("CLIENT", "LIST"),
                    ("EVAL", "return 1", "0"),
                    ("SCRIPT", "FLUSH"),
                    ("PUBLISH", "anything", "x"),
                ):
                    await refused(worker_a.execute_command(*command))
                # Pool b is as its workers left it, and its session still ticks.
                assert await store.get_pod(PoolId(ns, "b"), pod_b) == b_pod_before
                assert (await store.get_session(PoolId(ns, "b"), "s-b")).token_sha256 == b_token_before  # type: ignore[union-attr]
                assert await store.get_pod(PoolId(ns, "b"), "evil") is None
                # Its own pool's records it reads (a worker checks tokens and bindings there).
                assert await worker_a.hget(a.session("s-a"), "state") == b"placed"
            assert cluster.tick("s-b", 0).status_code == 200

            # The credential is the pool's own: its user, a password the operator made, not the operator's.
            parts = urlsplit(data["url"])
            assert unquote(parts.username or "") == data["redis-username"] == f"ardiff-pool.{ns}.a"
            assert unquote(parts.password or "") == data["redis-password"]
            assert len(data["redis-password"]) >= 40
            assert OPERATOR_PASSWORD not in data["url"]
            assert data["redis-password"] != secret_data(cluster, "b")["redis-password"]
            # Redis' own view: every connection from pool a's Pods is logged in as a's user, b's as b's.
            users = clients_by_user(redis)
            for name in ("a", "b"):
                ips = pod_ips(cluster, name)
                assert ips, f"pool {name} has no Pod IP"
                assert ips <= users.get(f"ardiff-pool.{ns}.{name}", set()), users
                assert not ips & users.get("default", set()), users
            # Redis keeps only the password's hash.
            [line] = [
                u for u in redis.cli("ACL", "LIST").splitlines() if u.startswith(f"user ardiff-pool.{ns}.a ")
            ]
            assert f"#{password_hash(data['redis-password'])}" in line
            assert data["redis-password"] not in line
            assert data["redis-password"] not in operator.log()

            # Deleted with its pool: the credential stops working, pool b's goes on.
            cluster.delete("ardiffusionworkerpools", "a")
            wait_until(
                lambda: redis.cli("ACL", "GETUSER", f"ardiff-pool.{ns}.a").strip() == "",
                timeout=60,
                what="pool a's Redis user deleted",
            )
            with pytest.raises(AuthenticationError):
                async with aioredis.from_url(stolen) as gone:
                    await gone.ping()
            assert cluster.tick("s-b", 1).status_code == 200
        finally:
            try:
                cluster.delete_all()
            finally:
                operator.stop()


async def test_a_rotated_password_rolls_the_pool_without_cutting_the_session(
    cluster: Cluster, operator_process: OperatorProcess, redis_server: RedisServer
) -> None:
    """Item 12: the administrator removes the pool's Redis password from its Secret; the operator makes a new
    one, the pool's user accepts both while Pods made with the old one run, those Pods roll (the session moves
    to a new Pod at a tick boundary and continues), and then only the new password works."""
    tier: SharedTier = cluster.shared_tier()
    cluster.create_pool(replicas={"min": 1, "max": 2}, env=[*FAKE_WORKER_ENV, tier.env], **tier.pool_spec)
    cluster.create_session("live")
    before = cluster.wait_phase("live", "Ready")
    assert cluster.tick("live", 0).status_code == 200
    old_pod, old = before["pod"], secret_data(cluster, "pool")
    old_hash = secret_hash(cluster, old_pod)

    response = cluster.http.patch(
        f"/api/v1/namespaces/{cluster.namespace}/secrets/pool-workers-redis",
        json={"data": {"redis-password": None}},
        headers=MERGE,
    )
    assert response.status_code == 200, response.text
    moved = wait_until(
        lambda: (s := cluster.status("live")).get("phase") == "Ready" and s.get("pod") != old_pod and s,
        timeout=90,
        what="the session Ready on a pod made with the new password",
    )
    assert moved["resetRequired"] is False
    wait_until(lambda: old_pod not in cluster.pod_names(), timeout=60, what=f"{old_pod} deleted")
    new = secret_data(cluster, "pool")
    assert new["redis-password"] != old["redis-password"]
    assert len(new["redis-password"]) >= 40
    assert new["transfer-token"] == old["transfer-token"]  # only what was rotated changed
    # The session's new Pod was made from the changed Secret (the old one may still be listed, terminating).
    assert secret_hash(cluster, moved["pod"]) not in ("", old_hash)
    answer = cluster.tick("live", 1)
    assert answer.status_code == 200, answer.text  # continues at chunk 1: nothing was cut
    assert not cluster.events("Lost")

    # Once no Pod logs in with it, the old password is refused; the new one works.
    def old_refused() -> bool:
        return "WRONGPASS" in redis_server.cli(
            "AUTH", f"ardiff-pool.{cluster.namespace}.pool", old["redis-password"]
        ) or _auth_fails(redis_server, cluster, old["redis-password"])

    wait_until(old_refused, timeout=30, what="the old password refused")
    async with aioredis.from_url(on_loopback(cluster, new["url"])) as client:
        assert await client.ping()


def secret_hash(cluster: Cluster, pod: str) -> str:
    found = cluster.get("pods", pod, core=True)
    assert found is not None, pod
    return found["metadata"]["annotations"]["ardiffusion.dev/secret-hash"]


def _auth_fails(redis: RedisServer, cluster: Cluster, password: str) -> bool:
    try:
        redis.cli("AUTH", f"ardiff-pool.{cluster.namespace}.pool", password)
    except Exception:
        return True
    return False


async def test_where_acl_setuser_is_forbidden_pools_use_the_users_the_administrator_made(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A managed Redis keeps ACLs to its own console: the operator's user may do everything the store needs
    but `ACL`. The operator says so on the pool and starts no Pod; run with `--worker-redis-users
    administrator`, it waits for the administrator's user in the pool's Secret and then uses it."""
    ns = cluster.namespace
    operator_password = "managed-operator-password"
    with cluster.redis_server(password=OPERATOR_PASSWORD) as redis:
        grant = [rule for rule in OPERATOR_RULES if not rule.startswith("+acl|")]
        redis.cli("ACL", "SETUSER", "managed-operator", "on", f">{operator_password}", *grant)
        url = f"redis://managed-operator:{operator_password}@127.0.0.1:{redis.port}/0"
        operator = cluster.operator(url, tmp_path / "operator.log").start()
        try:
            operator.wait_ready()
            cluster.create_pool()
            cluster.create_session("s")
            condition = wait_until(
                lambda: (
                    (c := cluster.pool_condition("Progressing")).get("reason") == "RedisAclForbidden" and c
                ),
                what="the pool to report that ACL SETUSER is forbidden",
            )
            assert "--worker-redis-users administrator" in condition["message"]
            assert cluster.events("RedisAclForbidden")
            assert cluster.pods() == []  # no Pod that could not log in

            operator.stop()
            redis.cli("CONFIG", "RESETSTAT")  # from here on, count the ACL commands anyone sends
            operator.env = {**operator.env, "ARDIFF_WORKER_REDIS_USERS": "administrator"}
            operator.start().wait_ready()
            condition = wait_until(
                lambda: (
                    (c := cluster.pool_condition("Progressing")).get("reason") == "RedisCredentialsMissing"
                    and c
                ),
                what="the pool to wait for the administrator's user",
            )
            assert "redis-username" in condition["message"]
            assert "redis-password" in condition["message"]
            assert "url" not in secret_data(cluster, "pool")  # no URL a Pod could start with
            assert cluster.pods() == []

            # The administrator makes the pool's user (the rules `ardiff kv redis-user` prints) and names it.
            password = "the-administrators-pool-password"
            user = PoolUser(PoolId(ns, "pool"), (password_hash(password),))
            redis.cli("ACL", "SETUSER", "tenant-42", *user.rules())
            response = cluster.http.patch(
                f"/api/v1/namespaces/{ns}/secrets/pool-workers-redis",
                json={"stringData": {"redis-username": "tenant-42", "redis-password": password}},
                headers=MERGE,
            )
            assert response.status_code == 200, response.text
            cluster.wait_phase("s", "Ready")
            assert cluster.tick("s", 0).status_code == 200
            parts = urlsplit(secret_data(cluster, "pool")["url"])
            assert (parts.username, parts.password) == ("tenant-42", password)
            assert pod_ips(cluster, "pool") <= clients_by_user(redis).get("tenant-42", set())
            # The only ACL command since the restart is the administrator's: the operator sent none.
            stats = redis.cli("INFO", "commandstats").splitlines()
            assert [line.split(",")[0] for line in stats if line.startswith("cmdstat_acl")] == [
                "cmdstat_acl|setuser:calls=1"
            ]
        finally:
            try:
                cluster.delete_all()
            finally:
                operator.stop()
