"""`ardiff operator uninstall` (the chart's pre-delete hook): helpers the dev-cluster scenarios share, and
what it says at its timeout. tests/operator/test_rbac.py runs it through the operator (everything goes, its
Role is exactly its calls); tests/chart/test_helm_release.py runs it as helm's hook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ardiff.devcluster.kubectl import kube_env
from ardiff.operator.uninstall import Leftovers
from tests.operator.conftest import Cluster


def run_uninstall(cluster: Cluster, timeout: float, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ardiff.cli",
            "operator",
            "uninstall",
            "-n",
            cluster.namespace,
            "--timeout",
            str(timeout),
        ],
        env=kube_env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        check=False,
    )


def ours(cluster: Cluster) -> dict[str, list[str]]:
    """Every object of ours in the namespace: Pods, Services, Secrets, budgets, sessions, pools."""
    found = {
        plural: [item["metadata"]["name"] for item in cluster.items(plural, core=True)]
        for plural in ("pods", "services", "secrets")
    }
    budgets = cluster.http.get(f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets")
    found["poddisruptionbudgets"] = [item["metadata"]["name"] for item in budgets.json()["items"]]
    for plural in ("ardiffusionsessions", "ardiffusionworkerpools"):
        found[plural] = [item["metadata"]["name"] for item in cluster.items(plural)]
    return {plural: names for plural, names in found.items() if names}


def test_what_is_left_at_the_timeout_is_named() -> None:
    left = Leftovers("worlds", sessions=("a", "b"), pods=("p-1",))
    assert left
    assert left.describe() == "worlds: sessions a, b; worker pods p-1"
    assert not Leftovers("worlds")
