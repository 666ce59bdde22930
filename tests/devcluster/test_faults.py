"""The fault injector (issue 40 item 1; `ardiff/devcluster/faults.py`) on real parts: a partition between a
node's namespace and the session's Redis drops that pair's traffic only and heals; a paused Redis answers
nothing until resumed; a link delays what it carries and a cut resets its connections; a second API server
behind a slow link to etcd sees the cluster late, nothing while that link is cut, and catches up, also
across an etcd restart; each fault is recorded with its start and end."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.faults import RULE_COMMENT, FaultInjector
from ardiff.devcluster.link_proxy import LinkProxy
from ardiff.devcluster.redis_server import RedisServer
from tests.devcluster.conftest import Watcher


def _ping_from(namespace: str, server: RedisServer, host: str) -> bool:
    """Whether redis-cli in network namespace `namespace` gets PONG from `server` at `host` within 3 s."""
    argv = ["ip", "netns", "exec", namespace, "timeout", "3", "redis-cli", "-h", host, "-p", str(server.port)]
    env = {**os.environ, "REDISCLI_AUTH": server.password or ""}
    done = subprocess.run([*argv, "ping"], capture_output=True, text=True, env=env, check=False)
    return done.stdout.strip() == "PONG"


def _rules(namespace: str) -> str:
    listed = subprocess.run(
        ["ip", "netns", "exec", namespace, "iptables", "-S"], capture_output=True, text=True, check=True
    )
    return listed.stdout


@pytest.mark.slow
def test_a_partition_drops_one_pairs_traffic_both_ways_and_heals(
    dev_cluster: DevCluster, redis_server: RedisServer, tmp_path: Path
) -> None:
    assert dev_cluster.network is not None
    network = dev_cluster.network
    cut, other, host = network.node_namespace(1), network.node_namespace(2), network.host_ip
    assert _ping_from(cut, redis_server, host)
    assert _ping_from(other, redis_server, host)
    faults = FaultInjector(tmp_path / "faults.jsonl")
    with faults.partition(cut, host):
        assert RULE_COMMENT in _rules(cut)
        assert not _ping_from(cut, redis_server, host)
        assert _ping_from(other, redis_server, host)  # only that pair is cut
    assert RULE_COMMENT not in _rules(cut)
    assert _ping_from(cut, redis_server, host)
    (fault,) = faults.faults
    assert (fault.kind, fault.target) == ("partition", f"{cut} x {host}")
    assert fault.started < fault.ended
    logged = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert logged == [
        {"kind": "partition", "target": f"{cut} x {host}", "started": fault.started, "ended": fault.ended}
    ]


def test_a_paused_process_answers_nothing_until_resumed_and_a_killed_one_is_gone() -> None:
    faults = FaultInjector()
    with RedisServer() as server:
        assert server.process is not None
        client = redis.Redis.from_url(server.url, socket_timeout=1)
        assert client.ping()
        with faults.paused(server.process.pid, "redis"), pytest.raises(RedisTimeoutError):
            client.ping()
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        assert client.ping()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    faults.kill(sleeper.pid, "sleeper")
    assert sleeper.wait(timeout=10) == -9
    assert [(f.kind, f.target) for f in faults.faults] == [("pause", "redis"), ("kill", "sleeper")]
    pause, kill = faults.faults
    assert pause.ended - pause.started >= 1.0 > kill.ended - kill.started >= 0
    assert kill.started < time.time()


@contextlib.contextmanager
def _echo_server() -> Iterator[socket.socket]:
    """A loopback server that echoes every connection's bytes back until its end (on threads). Its accepting
    thread is woken and joined on the way out: a thread left blocked in accept() on a closed descriptor could
    take the connections of whatever socket reuses that number."""
    server = socket.create_server(("127.0.0.1", 0))

    def echo(connection: socket.socket) -> None:
        with connection, contextlib.suppress(ConnectionResetError):  # a cut resets this end too
            while data := connection.recv(1 << 16):
                connection.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):  # shut down: the test is over
            while True:
                connection, _ = server.accept()
                threading.Thread(target=echo, args=(connection,), daemon=True).start()

    accepting = threading.Thread(target=accept, daemon=True)
    accepting.start()
    try:
        yield server
    finally:
        server.shutdown(socket.SHUT_RDWR)
        accepting.join(timeout=5)
        server.close()
        assert not accepting.is_alive()


def test_a_link_delays_what_it_carries_and_a_cut_resets_its_connections() -> None:
    faults = FaultInjector()
    with _echo_server() as server:
        link = LinkProxy("127.0.0.1", server.getsockname(), delay_ms=200).start()
        try:
            with socket.create_connection(("127.0.0.1", link.port), timeout=5) as first:
                started = time.monotonic()
                first.sendall(b"ping")
                assert first.recv(16) == b"ping"
                assert time.monotonic() - started >= 0.4  # 200 ms each way
                assert faults.cut(link, "echo") == 1
                with pytest.raises(ConnectionResetError):
                    first.recv(16)
            with socket.create_connection(("127.0.0.1", link.port), timeout=5) as second:
                payload = os.urandom(3 << 20)  # in order and whole, across many chunks
                second.sendall(payload)
                echoed = bytearray()
                while len(echoed) < len(payload):
                    echoed += second.recv(1 << 20)
                assert echoed == payload
                second.shutdown(socket.SHUT_WR)
                assert second.recv(16) == b""  # the end of stream crosses the link too
        finally:
            link.stop()
    assert [(f.kind, f.target) for f in faults.faults] == [("cut", "echo (1 connections)")]


def _arrival(watcher: Watcher, name: str, timeout: float) -> float | None:
    """When (monotonic) `watcher` has an ADDED event of config map `name`; None if not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["type"] == "ADDED" and e["object"]["metadata"]["name"] == name for e in watcher.events):
            return time.monotonic()
        time.sleep(0.01)
    return None


@pytest.mark.slow
def test_a_stale_api_server_sees_the_cluster_late_nothing_while_cut_from_etcd_and_catches_up(
    dev_cluster: DevCluster, kube_namespace: str, tmp_path: Path
) -> None:
    assert dev_cluster.control_plane is not None
    control_plane = dev_cluster.control_plane
    url = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    faults = FaultInjector(tmp_path / "faults.jsonl")
    with (
        faults.stale_api_server(control_plane, delay_ms=500) as stale,
        dev_cluster.admin.client() as admin,
        stale.credentials(dev_cluster.admin).client(timeout=5) as stale_client,
    ):
        fresh, lagging = (
            Watcher(c, url, timeoutSeconds="120")
            for c in (dev_cluster.admin, stale.credentials(dev_cluster.admin))
        )

        def create(name: str) -> float:
            reply = admin.post(url, json={"metadata": {"name": name}, "data": {"k": name}})
            assert reply.status_code == 201, reply.text
            return time.monotonic()

        created = create("seen-late")
        seen_fresh, seen_stale = _arrival(fresh, "seen-late", 10), _arrival(lagging, "seen-late", 10)
        assert seen_fresh is not None
        assert seen_stale is not None
        assert seen_stale - created >= 0.5 > seen_fresh - created  # at least the link's one way
        with faults.cut_from_etcd(stale):
            create("while-cut")
            assert _arrival(fresh, "while-cut", 10) is not None
            assert _arrival(lagging, "while-cut", 3) is None  # its watch goes quiet, its connection stays
            with pytest.raises(httpx.TimeoutException):  # a write waits for etcd
                stale_client.post(url, json={"metadata": {"name": "through-stale"}}, timeout=3)
        assert _arrival(lagging, "while-cut", 30) is not None  # healed: it catches up, in order
        faults.restart_etcd(control_plane)
        create("after-restart")
        assert _arrival(lagging, "after-restart", 30) is not None
        assert _arrival(fresh, "after-restart", 30) is not None
    kinds = [(f.kind, f.target) for f in faults.faults]
    assert kinds == [
        ("partition", f"{stale.namespace} x 127.0.0.1:{stale.etcd_link.port}"),
        ("restart", "etcd"),
        ("lag", "kube-apiserver :6444 (etcd 500 ms away)"),
    ]
    assert stale.process.process is None  # stopped with the block
