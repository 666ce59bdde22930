"""The dev cluster's fault injector (issue 40 item 1), for tests and benchmarks: faults between the cluster's
parts, each recorded with its start and end (`FaultInjector.faults`, and a JSON line per fault in `log_path`
when given), so that a history checker can line them up with what clients saw.

- `partition(namespace, peer, port)`: drop every packet between a network namespace the dev cluster made (a
  Pod's, a node's, the control plane's) and an address (with `port`: only TCP to and from that port of it),
  both ways, with iptables in that namespace: the peer's packets vanish, as in a partition (no reset, no
  ICMP), while the namespace's other traffic flows. A namespace gone meanwhile (its Pod deleted) ends it.
- `paused(pid)`: SIGSTOP, then SIGCONT (a GC pause, a stalled node: connections stay open, nothing answers).
- `kill(pid)`: SIGKILL (a crash: nothing is flushed).
- `cut(link)`: reset every connection open through a link (`link_proxy.LinkProxy`, a TCP forwarder that can
  also delay what it carries): a client's watches end at once, as when an API server or a load balancer drops
  them, and the client lists and watches again.
- `restart_etcd(control_plane)`: etcd killed (SIGKILL) and started again on its data; API servers reconnect.
- `stale_api_server(control_plane, delay_ms)`: Sieve's *stale view*, with a real server: a second
  kube-apiserver on the same etcd, reached through a link `delay_ms` each way, so that its watch cache (what
  its lists and watches answer) lags behind the first server's; a client pointed at it
  (`StaleApiServer.credentials`) sees the cluster late. `cut_from_etcd(stale)` partitions that link: the
  server keeps its clients' connections and answers nothing new (its watches go quiet; a write or a
  consistent list waits and fails) until it heals.
  A paused server (`paused`) is a different fault: it answers nothing at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ardiff.devcluster.controlplane import ETCD_PORT, ComponentProcess, ControlPlane
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.link_proxy import LinkProxy
from ardiff.devcluster.network import namespaces

# Marks this module's rules, so that they are told from the kubelet's and kube-proxy's in the same tables.
RULE_COMMENT = "ardiff-fault"
# Where a stale API server serves, on the control plane's address (the first one serves on 6443).
STALE_API_PORT = 6444


class FaultError(RuntimeError):
    """A fault could not be injected or lifted (the command and its output are in the message)."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, on what, and when (`time.time()`; a kill ends as it starts)."""

    kind: str
    target: str
    started: float
    ended: float


@dataclass
class StaleApiServer:
    """A second API server (see `FaultInjector.stale_api_server`) at `address` (host, port), `etcd_link` the
    link between it and etcd (in the control plane's network namespace `namespace`)."""

    address: tuple[str, int]
    etcd_link: LinkProxy
    namespace: str
    process: ComponentProcess

    @property
    def server(self) -> str:
        return f"https://{self.address[0]}:{self.address[1]}"

    def credentials(self, of: Credentials) -> Credentials:
        """`of`'s identity at this server (its certificate names the control plane's address)."""
        return dataclasses.replace(of, server=self.server)


def _iptables(namespace: str, *args: str) -> None:
    argv = ["ip", "netns", "exec", namespace, "iptables", "-w", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FaultError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def _partition_rules(peer: str, port: int | None) -> list[list[str]]:
    marked = ["-m", "comment", "--comment", RULE_COMMENT, "-j", "DROP"]
    to_port = ["-p", "tcp", "--dport", str(port)] if port else []
    from_port = ["-p", "tcp", "--sport", str(port)] if port else []
    return [["OUTPUT", "-d", peer, *to_port, *marked], ["INPUT", "-s", peer, *from_port, *marked]]


@dataclass
class FaultInjector:
    """Injects faults and records them (see the module docstring)."""

    log_path: Path | None = None
    faults: list[Fault] = field(default_factory=list)

    def _record(self, kind: str, target: str, started: float) -> None:
        fault = Fault(kind, target, started, time.time())
        self.faults.append(fault)
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(json.dumps(asdict(fault)) + "\n")

    @contextlib.contextmanager
    def partition(self, namespace: str, peer: str, port: int | None = None) -> Iterator[None]:
        """No packet between network namespace `namespace` and address `peer` (TCP port `port` of it) while
        the block runs."""
        rules = _partition_rules(peer, port)
        started = time.time()
        added: list[list[str]] = []
        try:
            for rule in rules:
                _iptables(namespace, "-I", *rule[:1], "1", *rule[1:])
                added.append(rule)
            yield
        finally:
            if namespace in namespaces():
                for rule in added:
                    _iptables(namespace, "-D", *rule)
            self._record("partition", f"{namespace} x {peer}{f':{port}' if port else ''}", started)

    @contextlib.contextmanager
    def paused(self, pid: int, what: str = "") -> Iterator[None]:
        """Process `pid` stopped while the block runs (SIGSTOP, then SIGCONT)."""
        started = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile: nothing to resume
                os.kill(pid, signal.SIGCONT)
            self._record("pause", what or str(pid), started)

    def kill(self, pid: int, what: str = "") -> None:
        """SIGKILL process `pid`."""
        started = time.time()
        os.kill(pid, signal.SIGKILL)
        self._record("kill", what or str(pid), started)

    def cut(self, link: LinkProxy, what: str = "") -> int:
        """Reset every connection open through `link`; how many there were."""
        started = time.time()
        count = link.cut()
        self._record("cut", f"{what or link.address} ({count} connections)", started)
        return count

    def restart_etcd(self, control_plane: ControlPlane) -> None:
        """Kill the cluster's etcd and start it again; returns once the first API server is ready on it."""
        started = time.time()
        control_plane.restart_etcd()
        self._record("restart", "etcd", started)

    @contextlib.contextmanager
    def stale_api_server(
        self, control_plane: ControlPlane, *, delay_ms: int, port: int = STALE_API_PORT
    ) -> Iterator[StaleApiServer]:
        """A second API server lagging `delay_ms` behind etcd each way while the block runs (see the module
        docstring)."""
        started = time.time()
        namespace = control_plane.network.control_plane_namespace
        etcd = ("127.0.0.1", ETCD_PORT)
        link = LinkProxy("127.0.0.1", etcd, namespace=namespace).start()
        try:
            process = control_plane.start_api_server(
                "kube-apiserver-stale", etcd=f"http://{link.address}", port=port
            )
            try:
                link.set_delay(delay_ms)  # once started: its start is a round trip per resource
                address = (control_plane.network.control_plane_ip, port)
                yield StaleApiServer(address, link, namespace, process)
            finally:
                process.stop()
        finally:
            link.stop()
            self._record("lag", f"kube-apiserver :{port} (etcd {delay_ms} ms away)", started)

    @contextlib.contextmanager
    def cut_from_etcd(self, stale: StaleApiServer) -> Iterator[None]:
        """`stale`'s link to etcd dropped while the block runs (a partition on its port)."""
        with self.partition(stale.namespace, "127.0.0.1", stale.etcd_link.port):
            yield
