"""The composed local stack: API process, Redis, pod runner and the real operator, driven with kubectl."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from ardiff.devcluster.cluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
SESSION = """
apiVersion: ardiffusion.dev/v1alpha1
kind: ARDiffusionSession
metadata: {name: walk}
spec: {poolRef: fake-pool, prompt: a walk, seed: 4}
"""


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_output(cluster: DevCluster, args: list[str], expected: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    output = ""
    while time.monotonic() < deadline:
        output = cluster.kubectl(*args).stdout
        if expected in output:
            return output
        time.sleep(0.2)
    raise AssertionError(f"kubectl {' '.join(args)} never showed {expected!r}; last output:\n{output}")


@pytest.mark.slow
def test_dev_cluster_runs_a_fake_pool_session_end_to_end(tmp_path: Path) -> None:
    cluster = DevCluster(
        tmp_path / "dev",
        operator_command=["ardiff", "operator", "run", "--standalone"],
        namespace="demo",
        operator_env={"ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5", "ARDIFF_OPERATOR_MIRROR_SECONDS": "1"},
    )
    with cluster:
        assert cluster.api is not None
        assert cluster.redis is not None
        api_port, redis_port = cluster.api.port, cluster.redis.port
        cluster.kubectl("apply", "-f", str(REPO / "tests" / "manifests" / "pool-fake.yaml"))
        cluster.kubectl("apply", "-f", "-", stdin=SESSION)
        sessions = wait_for_output(cluster, ["get", "adsession"], "Ready")
        assert sessions.split()[:6] == ["NAME", "PHASE", "POOL", "POD", "CHUNK", "AGE"]
        pod = cluster.kubectl("get", "adsession", "walk", "-o", "jsonpath={.status.pod}").stdout
        assert pod.startswith("fake-pool-")
        assert cluster.runner is not None
        info = cluster.runner.info(pod, "demo")
        assert info is not None
        assert info.ready
        assert (cluster.logs_dir / "pods" / f"demo_{pod}.log").exists()
        assert "demo" in (cluster.logs_dir / "operator.log").read_text()  # it watched our namespace
    assert cluster.api is None
    assert cluster.runner is None
    assert not listening(api_port)
    assert not listening(redis_port)
    assert not listening(info.port)
