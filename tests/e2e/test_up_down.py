"""`ardiff up` / `ardiff down` as a user runs them: a background dev cluster (its own control plane, two
process nodes, the chart helm-installed) that real kubectl reaches through the printed KUBECONFIG, idempotent
commands, and no process, network namespace or link left behind — also when the background process itself
was killed. Worker Pods run the real worker app over the fake runtime here (the demo test and
test_real_cluster.py run the real model)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ardiff.devcluster.binaries import KUBERNETES_VERSION
from ardiff.devcluster.daemon import ClusterState, read_state
from ardiff.devcluster.kubectl import run_kubectl
from ardiff.devcluster.network import ClusterNetwork, namespaces
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.slow

FAKE_POOL = REPO / "tests" / "manifests" / "pool-fake.yaml"


def ardiff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ardiff.cli", *args], capture_output=True, text=True, timeout=900, check=False
    )


def all_pids(state: ClusterState) -> list[int]:
    return [state.daemon.pid, *(p.pid for p in state.processes)]


def running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rpartition(")")[2].split()[0] not in ("Z", "X"):
            alive.append(pid)
    return alive


# The control plane (etcd, kube-apiserver, controller-manager, scheduler), two kubelets and the provisioner.
CLUSTER_PROCESSES = 7


def slot_left(state: ClusterState) -> list[str]:
    """The network namespaces of the cluster's slot that still exist."""
    prefix = ClusterNetwork(state.network_slot).prefix + "-"
    return [ns for ns in namespaces() if ns.startswith(prefix)]


def up_with_a_worker(state_dir: Path) -> ClusterState:
    """`ardiff up`, checked as a user would, then a fake pool applied with kubectl; returns the state once its
    worker Pod runs."""
    started = ardiff("up", "--state-dir", str(state_dir), "--namespace", "default")
    assert started.returncode == 0, started.stderr
    kubeconfig = state_dir.resolve() / "kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in started.stdout
    assert "is up" in started.stdout
    state = read_state(state_dir.resolve())
    assert state is not None
    front_door = f"the front door (the chart's Envoy and endpoint picker): {state.front_door_url};"
    assert front_door in started.stdout
    kubectl = lambda *args: run_kubectl(list(args), kubeconfig=kubeconfig).stdout  # noqa: E731
    assert f"Server Version: {KUBERNETES_VERSION}" in kubectl("version")
    assert kubectl("get", "--raw", "/readyz") == "ok"
    nodes = kubectl(
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=='Ready')].status} {end}",
    )
    assert nodes.split() == ["node-1=True", "node-2=True"]
    operator = kubectl(
        "get",
        "pod",
        "ardiff-operator-0",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind} {.status.phase}",
    )
    assert operator == "StatefulSet Running"
    kubectl("apply", "-f", str(FAKE_POOL))

    def with_worker() -> str | None:
        phases = kubectl(
            "get", "pods", "-l", "ardiffusion.dev/pool", "-o", "jsonpath={.items[*].status.phase}"
        )
        return phases if phases == "Running" else None

    wait_until(with_worker, timeout=120, what="the fake pool's worker Pod running")
    state = read_state(state_dir.resolve())
    assert state is not None
    assert len(running([p.pid for p in state.processes])) == CLUSTER_PROCESSES
    assert slot_left(state)
    return state


def test_up_twice_then_down_twice_leaves_nothing_running(tmp_path: Path) -> None:
    state_dir = tmp_path / "dev"
    nothing = ardiff("down", "--state-dir", str(state_dir))
    assert nothing.returncode == 0
    assert "no dev cluster runs" in nothing.stdout

    state = up_with_a_worker(state_dir)
    pids = all_pids(state)

    again = ardiff("up", "--state-dir", str(state_dir))
    assert again.returncode == 0, again.stderr
    assert "was already up" in again.stdout
    again_state = read_state(state_dir.resolve())
    assert again_state is not None
    assert again_state.daemon == state.daemon

    stopped = ardiff("down", "--state-dir", str(state_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert "the dev cluster is down" in stopped.stdout
    assert running(pids) == []
    assert slot_left(state) == []
    assert read_state(state_dir.resolve()) is None
    assert "the dev cluster stopped" in (state_dir / "logs" / "cluster.log").read_text()
    assert ardiff("down", "--state-dir", str(state_dir)).stdout.startswith("no dev cluster runs")


def test_down_cleans_up_after_a_killed_background_process(tmp_path: Path) -> None:
    state_dir = tmp_path / "dev"
    state = up_with_a_worker(state_dir)
    os.kill(state.daemon.pid, signal.SIGKILL)
    wait_until(lambda: not running([state.daemon.pid]), timeout=10, what="the background process to die")
    orphans = running([p.pid for p in state.processes])
    assert len(orphans) == CLUSTER_PROCESSES  # the control plane and the kubelets outlive it

    stopped = ardiff("down", "--state-dir", str(state_dir))
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: running(orphans) == [], timeout=10, what="the orphans to be killed")
    assert slot_left(state) == []  # the Pods' and nodes' namespaces (and what ran in them) are gone too

    restarted = ardiff("up", "--state-dir", str(state_dir))  # a fresh cluster in the same directory
    assert restarted.returncode == 0, restarted.stderr
    assert "is up" in restarted.stdout
    assert ardiff("down", "--state-dir", str(state_dir)).returncode == 0
