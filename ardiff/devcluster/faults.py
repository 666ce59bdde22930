"""The dev cluster's fault injector (issue 40 item 1), for tests and benchmarks: faults between the cluster's
parts, each recorded with its start and end (`FaultInjector.faults`, and a JSON line per fault in `log_path`
when given), so that a history checker can line them up with what clients saw.

- `partition(namespace, peer, port)`: drop every packet between a network namespace the dev cluster made (a
  Pod's, a node's, the control plane's) and an address (with `port`: only TCP to and from that port of it),
  both ways, with iptables in that namespace: the peer's packets vanish, as in a partition (no reset, no
  ICMP), while the namespace's other traffic flows. A namespace gone meanwhile (its Pod deleted) ends it.
- `paused(pid)`: SIGSTOP, then SIGCONT (a GC pause, a stalled node: connections stay open, nothing answers).
- `kill(pid)`: SIGKILL (a crash: nothing is flushed).

Not yet (issue 40 item 1's rest): delays, an etcd restart, cutting the operator's watches, a stale API server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ardiff.devcluster.network import namespaces

# Marks this module's rules, so that they are told from the kubelet's and kube-proxy's in the same tables.
RULE_COMMENT = "ardiff-fault"


class FaultError(RuntimeError):
    """A fault could not be injected or lifted (the command and its output are in the message)."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, on what, and when (`time.time()`; a kill ends as it starts)."""

    kind: str
    target: str
    started: float
    ended: float


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
