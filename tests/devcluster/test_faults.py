"""The fault injector (issue 40 item 1; `ardiff/devcluster/faults.py`) on real parts: a partition between a
node's namespace and the session's Redis drops that pair's traffic only and heals; a paused Redis answers
nothing until resumed; each fault is recorded with its start and end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.faults import RULE_COMMENT, FaultInjector
from ardiff.devcluster.redis_server import RedisServer


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
