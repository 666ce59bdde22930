"""`ardiff up` / `ardiff down`: the local cluster (a development harness) in a background process.

`up` starts `python -m ardiff.devcluster.daemon --state-dir DIR` in its own session. That process runs a
`DevCluster` (a real control plane, two process nodes, Redis, the real operator; workers as the operator
creates Pods) and writes `DIR/cluster.json` once all of it serves; then, every second, it records there every
process the cluster runs (pid and start time, so a reused pid is never mistaken for ours) and its network
slot. `up` returns when the file exists. `down` sends SIGTERM to that process, which stops the cluster in
order, then kills whatever the file still lists and removes the slot's namespaces and links (the daemon itself
may have died): nothing is left behind. Both are idempotent and hold `DIR/.lock` while they work. Namespaces
and bridges need root: both say so when they do not run as root.

Layout of DIR (default `.ardiff-dev/`): `cluster.json`, `kubeconfig`, `kubectl-cache/`, `logs/cluster.log`
(this process), `logs/kubelet-<node>.log`, `control-plane/logs/` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler), `nodes/<node>/pods/<namespace>_<pod>_<uid>/logs/` (each container's
output, what `kubectl logs` reads).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ardiff.devcluster.cluster import INTERACTIVE_OPERATOR_ENV, DevCluster
from ardiff.devcluster.network import NetworkError, reclaim, require_root
from ardiff.errors import ArdiffError

STATE_FILE = "cluster.json"
# A first start builds the image venvs (a minute or two); later ones start in about half a minute.
UP_TIMEOUT_SECONDS = 600.0
DOWN_TIMEOUT_SECONDS = 60.0


class DevClusterError(ArdiffError):
    code = "dev_cluster"


@dataclass(frozen=True)
class ProcessRef:
    """A process, by pid and kernel start time (`/proc/<pid>/stat` field 22): a reused pid does not match."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        return cls(pid, process_start(pid))

    def alive(self) -> bool:
        start = process_start(self.pid)
        if start is None:
            return False
        return self.start is None or start == self.start

    def signal(self, sig: int, *, group: bool = False) -> None:
        """Signal the process if it still runs; with `group`, its whole process group when it leads one."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)


def process_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live, non-zombie process; None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after `(comm)`, which may contain spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


@dataclass(frozen=True)
class ClusterState:
    """`cluster.json`: what `up` prints and `down` stops."""

    daemon: ProcessRef
    api_url: str
    redis_url: str
    kubeconfig: str
    namespace: str
    network_slot: int
    front_door_url: str  # the chart's gateway NodePort: sessions' status.url starts with it
    processes: tuple[ProcessRef, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        return cls(
            daemon=ProcessRef(**data["daemon"]),
            api_url=data["api_url"],
            redis_url=data["redis_url"],
            kubeconfig=data["kubeconfig"],
            namespace=data["namespace"],
            network_slot=data["network_slot"],
            front_door_url=data["front_door_url"],
            processes=tuple(ProcessRef(**p) for p in data["processes"]),
        )


def read_state(state_dir: Path) -> ClusterState | None:
    try:
        return ClusterState.from_json((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_state(state_dir: Path, state: ClusterState) -> None:
    staging = state_dir / f".{STATE_FILE}.tmp"
    staging.write_text(state.to_json())
    staging.replace(state_dir / STATE_FILE)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ------------------------------------------------------------------------------------------- the daemon


def serve(state_dir: Path, namespace: str) -> None:
    """Run the cluster until SIGTERM/SIGINT, keeping `cluster.json` current; remove it when stopped."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    # The operator and its Redis are the chart's: `helm install` as a user runs it (its CRDs included).
    cluster = DevCluster(
        state_dir, chart=True, install_crds=False, namespace=namespace, operator_env=INTERACTIVE_OPERATOR_ENV
    )
    try:
        with cluster:
            daemon = ProcessRef.of(os.getpid())
            recorded: tuple[ProcessRef, ...] | None = None
            while not stopping.is_set():
                current = tuple(ProcessRef.of(pid) for pid in cluster.processes())
                if current != recorded:
                    state = ClusterState(
                        daemon=daemon,
                        api_url=cluster.admin.server,
                        redis_url=cluster.redis_url,
                        kubeconfig=str(cluster.kubeconfig.resolve()),
                        namespace=namespace,
                        network_slot=cluster.network.index if cluster.network else -1,
                        front_door_url=cluster.front_door_url,
                        processes=current,
                    )
                    write_state(state_dir, state)
                    recorded = current
                stopping.wait(1.0)
            print("stopping the dev cluster", flush=True)
    finally:
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    print("the dev cluster stopped", flush=True)


# ------------------------------------------------------------------------------------------------ up/down


def up(state_dir: Path, namespace: str = "default") -> tuple[ClusterState, bool]:
    """Start the cluster unless it runs; returns its state and whether this call started it."""
    try:
        require_root("ardiff up")
    except NetworkError as exc:
        raise DevClusterError(str(exc)) from None
    state_dir = state_dir.resolve()
    with locked(state_dir):
        state = read_state(state_dir)
        if state is not None and state.daemon.alive():
            return state, False
        if state is not None:  # the daemon died: clean up after it first
            _stop(state_dir, state)
        log_path = state_dir / "logs" / "cluster.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            argv = [sys.executable, "-m", "ardiff.devcluster.daemon", "--state-dir", str(state_dir)]
            daemon = subprocess.Popen(
                [*argv, "--namespace", namespace],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the shell that ran `up` must not reach it
            )
        deadline = time.monotonic() + UP_TIMEOUT_SECONDS
        while True:
            state = read_state(state_dir)
            if state is not None and state.daemon.pid == daemon.pid:
                return state, True
            if daemon.poll() is not None:
                raise DevClusterError(
                    f"the dev cluster failed to start (exit {daemon.returncode}):\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                daemon.terminate()
                daemon.wait(DOWN_TIMEOUT_SECONDS)
                raise DevClusterError(
                    f"the dev cluster was not up within {UP_TIMEOUT_SECONDS:.0f}s:\n{_tail(log_path)}"
                )
            time.sleep(0.2)


def down(state_dir: Path) -> ClusterState | None:
    """Stop the cluster and every process it ran; the state it had, or None when none was running."""
    state_dir = state_dir.resolve()
    with locked(state_dir):
        state = read_state(state_dir)
        if state is not None:
            _stop(state_dir, state)
        return state


def _stop(state_dir: Path, state: ClusterState) -> None:
    state.daemon.signal(signal.SIGTERM)  # it stops the operator, the workers, Redis and the API in order
    deadline = time.monotonic() + DOWN_TIMEOUT_SECONDS
    while state.daemon.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    # Only what still runs: what a daemon that died (or hung) left behind. Worker Pods lead their own groups.
    for process in (state.daemon, *state.processes):
        process.signal(signal.SIGKILL, group=True)
    if state.network_slot >= 0:
        reclaim(state.network_slot)  # the namespaces, links and what still runs in them
    (state_dir / STATE_FILE).unlink(missing_ok=True)


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no log at {path})"


def usage(state: ClusterState, started: bool) -> str:
    """What `ardiff up` prints: where things are and how to use them."""
    root = Path(state.kubeconfig).parent
    bin_dir = Path(sys.executable).parent
    kubectl, ardiff = bin_dir / "kubectl", bin_dir / "ardiff"
    return "\n".join(
        [
            f"ardiff dev cluster {'is up' if started else 'was already up'} (a development harness: a real "
            "Kubernetes control plane, process kubelets, real Redis, operator and workers)",
            f"  API {state.api_url}; the chart's operator (StatefulSet ardiff-operator) and Redis in "
            f"namespace {state.namespace}, which the operator watches",
            f"  the front door (the chart's Envoy and endpoint picker): {state.front_door_url}; a session's "
            "base URL, status.url, is <front door>/pools/<namespace>/<pool>",
            f"  state and logs: {root} (logs/, control-plane/logs/; kubectl logs works for every Pod)",
            "",
            f"  export KUBECONFIG={state.kubeconfig}",
            f"  {kubectl} apply -f examples/",
            f"  {kubectl} get ardiffusionsessions -w",
            f"  {ardiff} session tick forest-walk --chunks 8 --out forest-walk.mp4",
            f"  {ardiff} down",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Run the ardiff dev cluster until SIGTERM (see `ardiff up`)."
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--namespace", default="default")
    args = parser.parse_args(argv)
    serve(args.state_dir, args.namespace)


if __name__ == "__main__":
    main()
