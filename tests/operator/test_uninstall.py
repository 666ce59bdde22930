"""`ardiff operator uninstall` (the chart's pre-delete hook) on the dev cluster: it deletes the sessions and
pools and waits until the running operator finalized them; nothing of ours is left, and the hook's Role grants
exactly the calls it makes. tests/chart/test_helm_release.py runs it as helm's hook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ardiff.devcluster.kube_api import write_kubeconfig
from ardiff.devcluster.kubectl import kube_env
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.operator.uninstall import Leftovers
from tests.chart.conftest import Chart
from tests.operator.conftest import Cluster
from tests.operator.test_rbac import role_grants, used_grants
from tests.waiting import wait_until


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


def test_uninstall_deletes_everything_through_the_operator(
    cluster: Cluster, operator_process: OperatorProcess, tmp_path: Path
) -> None:
    token = f"uninstall-{cluster.namespace}"  # the hook's own client: its calls are recorded
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.api.url, token=token)
    log = cluster.api.api.request_log
    log.follow(token)
    cluster.ticked_session("s")
    cluster.create_session("t")
    cluster.wait_phase("t", "Ready")
    before = ours(cluster)
    assert set(before) >= {"pods", "services", "secrets", "poddisruptionbudgets", "ardiffusionsessions"}

    done = run_uninstall(cluster, 60, kubeconfig)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"no session, pool or worker pod is left in {cluster.namespace}" in done.stdout
    # Owned objects (token and workers' Secrets, the budget) follow through garbage collection.
    wait_until(lambda: not ours(cluster), timeout=10, what=f"nothing of ours left, still {ours(cluster)}")

    # The hook's Role grants exactly what the command calls.
    requests = log.forget(token)
    assert {request.namespace for request in requests} == {cluster.namespace}
    chart = Chart(namespace=cluster.namespace)
    [role] = [
        obj
        for obj in chart.render()
        if obj["kind"] == "Role" and obj["metadata"]["name"] == f"{chart.fullname}-uninstall"
    ]
    assert used_grants(requests) == role_grants(role["rules"])


def test_what_is_left_at_the_timeout_is_named() -> None:
    left = Leftovers("worlds", sessions=("a", "b"), pods=("p-1",))
    assert left
    assert left.describe() == "worlds: sessions a, b; worker pods p-1"
    assert not Leftovers("worlds")
