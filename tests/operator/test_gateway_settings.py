"""The operator's part of the front door (issue 37), through the real operator, the session's cluster (its
simulated node: registered worker Pods without a process) and a real redis-server of the module's own with
ACLs: sessions' `status.url` (and `kubectl get -o wide`), each pool's record with its CA (back after Redis
loses its data), and the gateway's Redis Secret and user (it routes in the operator's namespaces only, keeps
its password, rotates it on request), made by the administrator instead where the operator may not."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pki import CertificateAuthority
from ardiff.devcluster.redis_server import RedisServer
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.acl import gateway_username
from ardiff.kv.errors import FunctionsNotLoaded
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, token_sha256
from ardiff.operator.gateway_credentials import ROTATED_AT_ANNOTATION, administrator_command
from ardiff.operator.worker_credentials import CREDENTIALS_MISSING
from tests.conftest import fresh_namespace
from tests.operator.conftest import MERGE, SIMULATED_PLACEMENT, Cluster, serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_URL = "https://worlds.example.com/ardiff"
SECRET = "gateway-redis"
OPERATOR_PASSWORD = "the-operators-own-password"
SIMULATED_POOL = {**SIMULATED_PLACEMENT, "env": [{"name": "ARDIFF_RUNTIME", "value": "fake"}]}


@pytest.fixture(scope="module")
def namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """The module's namespace: the operator's own and the one it watches."""
    with fresh_namespace(dev_cluster, request) as name:
        yield name


@pytest.fixture(scope="module")
def front(dev_cluster: DevCluster, namespace: str) -> Iterator[Cluster]:
    client = Cluster(dev_cluster, namespace)
    yield client
    client.http.close()


@pytest.fixture(scope="module")
def redis(front: Cluster) -> Iterator[RedisServer]:
    with front.redis_server(password=OPERATOR_PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def operator(front: Cluster, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The operator with the front door's settings, serving the module's namespace from within it."""
    env = {
        "ARDIFF_GATEWAY_PUBLIC_URL": PUBLIC_URL,
        "ARDIFF_GATEWAY_REDIS_SECRET": SECRET,
        "ARDIFF_OPERATOR_NAMESPACE": front.namespace,
    }
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    with serving(front, front.operator(redis.url, log_path, env=env)):
        yield


def secret_data(cluster: Cluster, name: str = SECRET) -> dict[str, str]:
    secret = cluster.get("secrets", name, core=True) or {}
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


def gateway_url(cluster: Cluster) -> str:
    """The gateway Secret's URL once the operator wrote it."""
    return wait_until(lambda: secret_data(cluster).get("url"), timeout=30, what="the gateway Secret's url")


async def pool_records(url: str, pools: list[PoolId]) -> dict[str, tuple[str | None, str]]:
    """What the front door reads of each pool, as the gateway's user: its record's CA digest (None: no record)
    and its CA."""
    async with PlacementStore.from_url(url) as gateway:
        return {
            pool.name: ((await gateway.route(pool, "nobody")).pool_ca_sha256, await gateway.pool_ca(pool))
            for pool in pools
        }


async def wait_for_records(url: str, pools: list[PoolId], expected: dict, what: str) -> None:
    found: object = None
    for _ in range(150):
        try:
            found = await pool_records(url, pools)
        # A restarted server has no gateway user yet, then no library until the operator's next pool round.
        except (AuthenticationError, ResponseError, FunctionsNotLoaded) as exc:
            found = exc
        if found == expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: {found!r}")


async def refused(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((NoPermissionError, ResponseError)) as caught:
        await call
    assert "no permissions" in str(caught.value), caught.value


def test_a_ready_sessions_status_carries_its_front_door_url(front: Cluster, operator: None) -> None:
    front.create_pool("plain", replicas={"min": 1, "max": 1}, **SIMULATED_POOL)
    front.create_session("s1", pool="plain")
    status = front.wait_phase("s1", "Ready")
    url = f"{PUBLIC_URL}/pools/{front.namespace}/plain"
    assert status["url"] == url
    assert status["message"] == "placed; tick at status.url (status.endpoint inside the cluster)"
    shown = subprocess.run(
        [str(ROOT / ".venv/bin/kubectl"), "get", "adsession", "s1", "-n", front.namespace, "-o", "wide"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = shown.splitlines()
    assert header.split()[:7] == ["NAME", "PHASE", "POOL", "POD", "CHUNK", "REASON", "URL"]
    assert row.split()[6] == url


async def test_pool_records_carry_their_ca_and_come_back_after_redis_loses_its_data(
    front: Cluster, redis: RedisServer, operator: None, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    pair = ca.issue("pool", common_name="secure", server=True, dns_names=["*.secure-workers"])
    pem = ca.cert_path.read_text()
    files = {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert_path}
    tls = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "secure-tls"},
        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()},
    }
    response = front.http.post(f"/api/v1/namespaces/{front.namespace}/secrets", json=tls)
    assert response.status_code == 201, response.text
    front.create_pool("secure", replicas={"min": 0, "max": 1}, tls={"secretName": "secure-tls"})
    pools = [PoolId(front.namespace, "plain"), PoolId(front.namespace, "secure")]
    expected = {"plain": ("", ""), "secure": (hashlib.sha256(pem.encode()).hexdigest(), pem)}
    url = on_loopback(front, gateway_url(front))
    await wait_for_records(url, pools, expected, "each pool's record as the gateway reads it")
    redis.restart()  # no persistence: every key and every user is gone; the operator's rounds make them again
    await wait_for_records(
        url, pools, expected, "the records and the gateway's user back after Redis lost all"
    )
    async with PlacementStore.from_url(url) as gateway:  # a record back means its pool's bindings are back
        assert (await gateway.route(pools[0], "s1")).served_by_pod
    assert front.status("s1")["url"] == f"{PUBLIC_URL}/pools/{front.namespace}/plain"


def on_loopback(cluster: Cluster, url: str) -> str:
    """A URL the operator wrote (the cluster address Pods reach) as this machine reaches the same server."""
    assert cluster.kube.network is not None
    return url.replace(f"@{cluster.kube.network.host_ip}:", "@127.0.0.1:")


async def logs_in(url: str) -> bool:
    """Whether `url`'s user and password are accepted."""
    try:
        async with aioredis.from_url(url) as client:
            return bool(await client.ping())
    except AuthenticationError:
        return False


async def test_the_gateway_user_routes_in_the_served_namespaces_only_and_keeps_its_password_until_rotated(
    front: Cluster, redis: RedisServer, operator: None
) -> None:
    ns = front.namespace
    data = secret_data(front)
    parts = urlsplit(data["url"])
    assert unquote(parts.username or "") == data["redis-username"] == gateway_username(ns)
    assert unquote(parts.password or "") == data["redis-password"]
    assert len(data["redis-password"]) >= 40
    assert OPERATOR_PASSWORD not in data["url"]
    assert set(data) == {"url", "redis-username", "redis-password"}  # no CA: a plain Redis URL
    url = on_loopback(front, data["url"])
    elsewhere = PoolId("elsewhere", "plain")  # a namespace this operator does not serve
    async with PlacementStore.from_url(redis.url) as admin, PlacementStore.from_url(url) as gateway:
        await admin.register_pod(
            elsewhere, "p1", capacity=1, endpoint="http://p1:8000", lease_ms=60_000, address="10.0.0.1:80"
        )
        await admin.place(elsewhere, SessionSpec("s1", token_sha256("t")))
        route = await gateway.route(PoolId(ns, "plain"), "s1")
        assert route.served_by_pod, route
        assert route.pod is not None
        assert route.pod.name == front.status("s1")["pod"]
        await refused(gateway.route(elsewhere, "s1"))

    # Kept: rounds go by and write nothing.
    before = front.get("secrets", SECRET, core=True)
    await asyncio.sleep(1.5)  # three rounds
    assert front.get("secrets", SECRET, core=True) == before

    # Rotated by removing the key: a new password, the old one accepted for a grace period, then not.
    old = data["redis-password"]
    response = front.http.patch(
        f"/api/v1/namespaces/{ns}/secrets/{SECRET}", json={"data": {"redis-password": None}}, headers=MERGE
    )
    assert response.status_code == 200, response.text
    rotated = wait_until(
        lambda: (
            (d := secret_data(front)).get("redis-password") not in (None, old)
            and unquote(urlsplit(d["url"]).password or "") == d["redis-password"]
            and d
        ),
        timeout=30,
        what="a new gateway password in the Secret and its url",
    )
    new_url = on_loopback(front, rotated["url"])
    assert await logs_in(new_url)
    assert await logs_in(url)  # within the grace period: the gateway's Pods pick up the new one meanwhile
    secret = front.get("secrets", SECRET, core=True) or {}
    assert ROTATED_AT_ANNOTATION in secret["metadata"]["annotations"]
    long_ago = {"metadata": {"annotations": {ROTATED_AT_ANNOTATION: "2000-01-01T00:00:00.000Z"}}}
    response = front.http.patch(f"/api/v1/namespaces/{ns}/secrets/{SECRET}", json=long_ago, headers=MERGE)
    assert response.status_code == 200, response.text
    for _ in range(100):
        if not await logs_in(url):
            break
        await asyncio.sleep(0.1)
    assert not await logs_in(url), "the old password is still accepted after its grace period"
    assert await logs_in(new_url)
    assert secret_data(front)["redis-password"] == rotated["redis-password"]


async def test_with_users_the_administrator_makes_the_operator_sends_no_acl_command(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`--worker-redis-users administrator`: the operator says once that the gateway's user is missing (and
    how to make it), sends no ACL command, and fills in the url once the administrator wrote the user into the
    Secret."""
    ns = cluster.namespace
    env = {
        "ARDIFF_WORKER_REDIS_USERS": "administrator",
        "ARDIFF_GATEWAY_REDIS_SECRET": SECRET,
        "ARDIFF_OPERATOR_NAMESPACE": ns,
    }
    path = f"/api/v1/namespaces/{ns}/secrets"
    with cluster.redis_server(password=OPERATOR_PASSWORD) as server:
        # The administrator has named the user, and not written its password yet.
        named = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET},
            "stringData": {"redis-username": gateway_username(ns)},
        }
        assert cluster.http.post(path, json=named).status_code == 201
        process = cluster.operator(server.url, tmp_path / "operator.log", env=env).start()
        try:
            process.wait_ready()
            wait_until(lambda: CREDENTIALS_MISSING in process.log(), timeout=30, what="the missing user")
            await asyncio.sleep(1.5)  # three rounds: reported once, with the command that makes the user
            assert process.log().count(CREDENTIALS_MISSING) == 1, process.log()
            assert f"ACL SETUSER {gateway_username(ns)} reset on >PASSWORD %R~" in process.log()
            assert "url" not in secret_data(cluster)

            password = "the-administrators-gateway-password"
            server.cli(*administrator_command(ns, (ns,)).replace(">PASSWORD", f">{password}").split())
            written = {"stringData": {"redis-password": password}}
            assert cluster.http.patch(f"{path}/{SECRET}", json=written, headers=MERGE).status_code == 200
            url = on_loopback(cluster, gateway_url(cluster))
            assert unquote(urlsplit(url).password or "") == password
            async with PlacementStore.from_url(url) as gateway:
                assert (await gateway.route(PoolId(ns, "any"), "s1")).state is None
            acl = {k: v for k, v in server.info("commandstats").items() if k.startswith("cmdstat_acl")}
            assert list(acl) == ["cmdstat_acl|setuser"], acl  # the administrator's own, and nothing else
            assert acl["cmdstat_acl|setuser"].startswith("calls=1,"), acl
        finally:
            process.stop()
            sys.stdout.write(f"\n----- operator log -----\n{process.log()[-20000:]}\n")
