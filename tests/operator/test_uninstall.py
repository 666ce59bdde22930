"""`ardiff operator uninstall` (the chart's pre-delete hook) on the dev cluster: it deletes the sessions and
pools and waits until the running operator finalized them; nothing of ours is left. Without an operator it
cannot finish (the finalizers are its), which is why the hook runs before helm deletes the operator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ardiff.devcluster.kube_api import write_kubeconfig
from ardiff.devcluster.kubectl import kube_env
from ardiff.devcluster.operator_process import OperatorProcess
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


def test_uninstall_waits_for_the_operator_to_finalize_everything(
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

    # Without the operator, nothing can remove the finalizers: the command says what is left and fails.
    operator_process.stop()
    stuck = run_uninstall(cluster, 2, kubeconfig)
    assert stuck.returncode == 1, stuck.stdout + stuck.stderr
    assert (
        f"still there after 2 s: {cluster.namespace}: sessions s, t; pools pool; worker pods " in stuck.stdout
    )

    # With it (the hook runs before helm deletes anything), everything goes.
    operator_process.start()
    operator_process.wait_ready()
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
