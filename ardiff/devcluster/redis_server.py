"""A real `redis-server` (and optionally a replica, Sentinels in front of them, or a Redis Cluster) on free
loopback ports.

Used by the tests, the benchmarks and the dev cluster. Nothing is persisted: a restart loses the data,
which is exactly the failure the placement store must survive.
"""

from __future__ import annotations

import abc
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from ardiff.worker.net import free_port


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.01)
    raise TimeoutError(f"redis did not listen on 127.0.0.1:{port} within {timeout}s")


def redis_server_binary() -> str:
    return _binary("redis-server")


def redis_cli_binary() -> str:
    return _binary("redis-cli")


def _binary(name: str) -> str:
    binary = shutil.which(name)
    if binary is None:
        raise FileNotFoundError(f"{name} is not installed (make setup installs it with apt-get)")
    return binary


class _ServerProcess(abc.ABC):
    """The lifecycle both servers share: `start()` (each its own), `stop()`, use as a context manager."""

    process: subprocess.Popen[bytes] | None

    @abc.abstractmethod
    def start(self) -> Self:
        """Launch the process and return once it listens."""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class ServerTls:
    """A TLS server's files (PEM): its certificate and key, and the CA clients verify it with."""

    cert: Path
    key: Path
    ca: Path


@dataclass
class RedisServer(_ServerProcess):
    """One `redis-server` process. `restart()` keeps the port and loses every key.

    `replica_of`: the port of a master on 127.0.0.1 this server replicates (a replica started with
    `--replicaof`); `cluster`: a Redis Cluster node (`--cluster-enabled yes`, see `RedisCluster`);
    `extra_args`: more `--name value` settings; `bind`: the addresses it listens on (loopback by default; the
    dev cluster adds the root namespace's cluster address, where Pods reach it: `url_at`); `tls`: TLS only on
    `port` (no plain port; clients need no certificate of their own), its URLs `rediss://` naming the CA.

    `functions`: a master's first start loads the placement store's function library (kv/scripts.py), as the
    operator does at its startup, so a test or a benchmark without an operator finds it; a replica gets it by
    replication, a Cluster's nodes from `RedisCluster`. `restart()` loses it with the keys (as a Redis Pod
    restarted without persistence does): the operator, or the test in its place, loads it again."""

    port: int = field(default_factory=free_port)
    password: str | None = None
    process: subprocess.Popen[bytes] | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ardiff-redis-")))
    replica_of: int | None = None
    cluster: bool = False
    cluster_port: int = field(default_factory=free_port)  # the bus; port + 10000 may not exist
    extra_args: Sequence[str] = ()
    bind: Sequence[str] = ("127.0.0.1",)
    tls: ServerTls | None = None
    functions: bool = True
    _started: bool = False

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, host: str) -> str:
        """The URL through another of the addresses it binds."""
        if host not in self.bind:
            raise ValueError(f"redis server binds {list(self.bind)}, not {host}")
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            return f"rediss://{auth}{host}:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://{auth}{host}:{self.port}/0"

    def start(self) -> Self:
        args = [
            redis_server_binary(),
            "--bind",
            *self.bind,
            # Without a password Redis only answers loopback clients; the other addresses it binds are the dev
            # cluster's (its Pods'), which nothing outside this machine routes to.
            "--protected-mode",
            "yes" if set(self.bind) <= {"127.0.0.1", "::1"} else "no",
            "--port",
            str(self.port) if self.tls is None else "0",  # with TLS: no plain port
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--repl-diskless-sync-delay",  # a replica syncs at once, not 5 s later
            "0",
        ]
        if self.password:
            # masterauth too: a replica, or a master that Sentinel turns into one, authenticates upstream
            args += ["--requirepass", self.password, "--masterauth", self.password]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        if self.tls is not None:
            args += [
                *("--tls-port", str(self.port)),
                *("--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)),
                *("--tls-ca-cert-file", str(self.tls.ca), "--tls-auth-clients", "no"),
            ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(self.cluster_port),
                "--cluster-config-file",
                str(self.workdir / f"nodes-{self.port}.conf"),
                "--cluster-node-timeout",
                "2000",
            ]
        args += list(self.extra_args)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_port(self.port, timeout=10)
        if self.functions and not self._started and self.replica_of is None and not self.cluster:
            self.load_functions()
        self._started = True
        return self

    def load_functions(self) -> None:
        """`FUNCTION LOAD` of this checkout's placement library (what the operator's `load_library` does)."""
        from ardiff.kv.scripts import Library

        library = Library.current()
        reply = self.cli("FUNCTION", "LOAD", library.source).strip()
        if reply != library.name:
            raise RuntimeError(f"redis-server :{self.port} refused the placement library: {reply}")

    def cli(self, *command: str) -> str:
        """One command through `redis-cli` (its raw reply as text)."""
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        tls = [] if self.tls is None else ["--tls", "--cacert", str(self.tls.ca)]
        return subprocess.run(
            [redis_cli_binary(), "-h", "127.0.0.1", "-p", str(self.port), *auth, *tls, *command],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout

    def info(self, section: str) -> dict[str, str]:
        """`INFO <section>` as {field: value}."""
        lines = self.cli("INFO", section).splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line and not line.startswith("#"))

    def kill(self) -> None:
        """kill -9: a crash (nothing flushed, no goodbye to replicas, clients or Sentinels)."""
        self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop (with `sig`; SIGKILL for a crash) and start on the same port: like a Redis pod restarted
        without persistence."""
        self.stop(sig)
        self.start()


@dataclass
class RedisSentinel(_ServerProcess):
    """A `redis-server --sentinel` monitoring `master` under `service_name`."""

    master: RedisServer
    service_name: str = "ardiff"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    quorum: int = 1
    down_after_ms: int = 5000
    failover_timeout_ms: int = 180_000
    myid: str = field(default_factory=lambda: secrets.token_hex(20))
    # Known up front, so that no hello round (2 s each) is needed before a failover can be elected.
    peers: Sequence[RedisSentinel] = ()
    replica_ports: Sequence[int] = ()

    @property
    def url(self) -> str:
        auth = f":{self.master.password}@" if self.master.password else ""
        return f"redis+sentinel://{auth}127.0.0.1:{self.port}/{self.service_name}/0"

    def start(self) -> Self:
        conf = self.master.workdir / f"sentinel-{self.port}.conf"
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"dir {self.master.workdir}",
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.master.port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.service_name} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service_name} {self.failover_timeout_ms}",
            f"sentinel myid {self.myid}",
        ]
        lines += [f"sentinel known-replica {self.service_name} 127.0.0.1 {p}" for p in self.replica_ports]
        lines += [
            f"sentinel known-sentinel {self.service_name} 127.0.0.1 {peer.port} {peer.myid}"
            for peer in self.peers
            if peer is not self
        ]
        if self.master.password:
            lines.append(f"sentinel auth-pass {self.service_name} {self.master.password}")
        conf.write_text("\n".join(lines) + "\n")
        self.process = subprocess.Popen(
            [redis_server_binary(), str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, timeout=10)
        return self


def _wait_for(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} within {timeout}s")


@dataclass
class SentinelGroup:
    """A master, a replica of it, and `sentinels` Sentinels (quorum: a majority) that fail over fast: the
    master is down after `down_after_ms` without an answer. `start()` returns once the replica is in sync and
    every Sentinel knows the replica and the other Sentinels, so a failover can be elected at once."""

    service_name: str = "ardiff"
    password: str | None = None
    sentinels: int = 3
    down_after_ms: int = 500
    failover_timeout_ms: int = 2000
    master: RedisServer = field(init=False)
    replica: RedisServer = field(init=False)
    monitors: list[RedisSentinel] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.master = RedisServer(password=self.password)
        self.replica = RedisServer(password=self.password, replica_of=self.master.port)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.monitors)
        return f"redis+sentinel://{auth}{hosts}/{self.service_name}/0"

    @property
    def servers(self) -> tuple[RedisServer, RedisServer]:
        return self.master, self.replica

    def start(self) -> Self:
        self.master.start()
        self.replica.start()
        _wait_for(self._replica_acks, "the replica to sync with its master and acknowledge", timeout=20)
        self.monitors = [
            RedisSentinel(
                self.master,
                service_name=self.service_name,
                quorum=self.sentinels // 2 + 1,
                down_after_ms=self.down_after_ms,
                failover_timeout_ms=self.failover_timeout_ms,
                replica_ports=(self.replica.port,),
            )
            for _ in range(self.sentinels)
        ]
        for monitor in self.monitors:
            monitor.peers = self.monitors
            monitor.start()
        _wait_for(self._discovered, "every Sentinel to know the replica and the other Sentinels", timeout=30)
        return self

    def _replica_acks(self) -> bool:
        """The replica is online and has acknowledged an offset (until then a WAIT for it times out); a
        PUBLISH moves the offset (else only the master's first PING would, 10 s later)."""
        self.master.cli("PUBLISH", "ardiff-replica-sync", "1")
        replica = dict(
            item.split("=", 1)
            for item in self.master.info("replication").get("slave0", "").split(",")
            if item
        )
        return replica.get("state") == "online" and int(replica.get("offset", "0")) > 0

    def sentinel_cli(self, *command: str) -> str:
        """A command to the first Sentinel that answers (some may be stopped)."""
        for monitor in self.monitors:
            if monitor.process is None:
                continue
            result = subprocess.run(
                [redis_cli_binary(), "-p", str(monitor.port), *command],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if result.returncode == 0 and result.stdout:
                return result.stdout
        raise ConnectionError("no Sentinel answered")

    def master_port(self) -> int:
        """The port of the master the Sentinels currently name."""
        return int(self.sentinel_cli("SENTINEL", "get-master-addr-by-name", self.service_name).split()[1])

    def _discovered(self) -> bool:
        for monitor in self.monitors:
            ask = [redis_cli_binary(), "-p", str(monitor.port), "SENTINEL"]
            others = subprocess.run([*ask, "sentinels", self.service_name], capture_output=True, text=True)
            replicas = subprocess.run([*ask, "replicas", self.service_name], capture_output=True, text=True)
            if others.stdout.count("runid") != self.sentinels - 1 or replicas.stdout.count("runid") != 1:
                return False
        return True

    def stop(self) -> None:
        for process in (*self.monitors, self.replica, self.master):
            process.stop(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RedisCluster:
    """A Redis Cluster of `masters` nodes (no replicas) on loopback, slots spread by `redis-cli --cluster
    create`. `url` is the placement store's `redis+cluster://` URL."""

    masters: int = 3
    password: str | None = None
    functions: bool = True  # each master loads the placement library once the cluster is formed
    nodes: list[RedisServer] = field(init=False, default_factory=list)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis+cluster://{auth}" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes) + "/"

    def start(self) -> Self:
        self.nodes = [RedisServer(password=self.password, cluster=True).start() for _ in range(self.masters)]
        auth = ["--no-auth-warning", "-a", self.password] if self.password else []
        subprocess.run(
            [
                redis_cli_binary(),
                *auth,
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _wait_for(self._converged, "every cluster node to see all slots served", timeout=30)
        if self.functions:
            for node in self.nodes:
                node.load_functions()
        return self

    def _converged(self) -> bool:
        for node in self.nodes:
            info = dict(
                line.split(":", 1) for line in node.cli("CLUSTER", "INFO").splitlines() if ":" in line
            )
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(self.masters):
                return False
        return True

    def node_of_slot(self, slot: int) -> RedisServer:
        """The node that serves `slot` (from `CLUSTER NODES`)."""
        for line in self.nodes[0].cli("CLUSTER", "NODES").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for served in fields[8:]:
                low, _, high = served.partition("-")
                if not low.startswith("[") and int(low) <= slot <= int(high or low):
                    return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no node serves slot {slot}")

    def keyslot(self, key: str) -> int:
        return int(self.nodes[0].cli("CLUSTER", "KEYSLOT", key))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
