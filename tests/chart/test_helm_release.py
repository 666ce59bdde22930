"""The real `helm install`, `upgrade`, `test` and `uninstall` on the dev cluster: nothing of ours is left.

helm keeps its release in PostgreSQL (`HELM_DRIVER=sql`, `ardiff.devcluster.postgres_server`), since the
emulated API cannot store helm's protobuf Secrets; everything else is helm talking to the emulated API.
Nothing there runs StatefulSets or Jobs, so the test does their part: the operator runs as the dev cluster's
`OperatorProcess` (the chart's own command line is covered by test_devcluster_install.py), and the
hooks' containers (the pre-delete Job's, the `helm test` Pod's) run as local processes with their rendered
commands and arguments, their status then written the way the Job controller or the kubelet would, which is
what helm waits for.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ardiff.devcluster.cluster import OPERATOR_COMMAND, DevCluster
from ardiff.devcluster.crd import load_manifests
from ardiff.devcluster.kubectl import kube_env
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.pod_runner import resolve_executable
from ardiff.devcluster.postgres_server import PostgresServer
from ardiff.devcluster.waiting import wait_until

pytestmark = pytest.mark.slow

GROUP = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}"
FAKE_POOL = {
    "enabled": True,
    "name": "fake-pool",
    "spec": {
        "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
        "env": [{"name": "ARDIFF_RUNTIME", "value": "fake"}, {"name": "ARDIFF_FAKE_CAPACITY", "value": "2"}],
        "replicas": {"min": 1, "max": 1},
    },
}


class HookRunner(threading.Thread):
    """The Job controller and the kubelet for helm's hooks: runs the container of each new hook Job and of
    each `helm test` Pod as a local process (the dev cluster's executables, its kubeconfig), then writes the
    status their controllers would (a Job's Complete/Failed condition, a Pod's Succeeded/Failed phase)."""

    def __init__(self, api: str, namespace: str, kubeconfig: Path) -> None:
        super().__init__(daemon=True, name="hook-runner")
        self.api, self.namespace, self.kubeconfig = api, namespace, kubeconfig
        self.finished: dict[str, subprocess.CompletedProcess[str]] = {}  # by object name
        self.stopped = threading.Event()

    def run(self) -> None:
        jobs = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
        pods = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=app.kubernetes.io/component%3Dtest"
        with httpx.Client(base_url=self.api, timeout=10) as client:
            while not self.stopped.wait(0.2):
                for path, spec in (
                    (jobs, lambda o: o["spec"]["template"]["spec"]),
                    (pods, lambda o: o["spec"]),
                ):
                    for obj in client.get(path).json()["items"]:
                        if obj["metadata"]["uid"] not in self.finished:
                            self._run(client, path.split("?")[0], obj, spec(obj))

    def _run(self, client: httpx.Client, path: str, obj: dict[str, Any], pod_spec: dict[str, Any]) -> None:
        [container] = pod_spec["containers"]
        command = [*container.get("command", []), *container.get("args", [])]
        argv = [*resolve_executable(command[0]), *command[1:]]
        result = subprocess.run(
            argv, env=kube_env(self.kubeconfig), capture_output=True, text=True, timeout=300, check=False
        )
        self.finished[obj["metadata"]["uid"]] = result
        ok = result.returncode == 0
        if obj["kind"] == "Job":
            condition = {"type": "Complete" if ok else "Failed", "status": "True"}
            status = {"conditions": [condition], "succeeded" if ok else "failed": 1}
        else:
            status = {"phase": "Succeeded" if ok else "Failed"}
        client.patch(
            f"{path}/{obj['metadata']['name']}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )

    def output(self, name_suffix: str) -> subprocess.CompletedProcess[str]:
        [result] = [r for r in self.finished.values() if r.args[-1:] and name_suffix in " ".join(r.args)]
        return result


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def helm(
    chart, postgres: PostgresServer, cluster: DevCluster, *args: str
) -> subprocess.CompletedProcess[str]:
    home = cluster.workdir / "helm"
    env = {
        **kube_env(cluster.kubeconfig),
        **postgres.helm_env(),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(chart.helm_binary), *args, "--namespace", chart.namespace],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_readme_upgrade_steps_are_the_ones_tested_here(chart) -> None:
    readme = (chart.path.parents[1] / "README.md").read_text()
    block = readme.split("Upgrade, test, uninstall.", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == [
        "kubectl apply -f charts/ardiff/crds/",
        "helm upgrade ardiff charts/ardiff -n worlds --reuse-values",
        "helm test ardiff -n worlds",
        "helm uninstall ardiff -n worlds",
    ]


def ours(api: str, namespace: str) -> dict[str, list[str]]:
    """Every object left in the namespace, by kind (its plural), besides what the cluster itself keeps."""
    paths = {
        "pods": f"/api/v1/namespaces/{namespace}/pods",
        "services": f"/api/v1/namespaces/{namespace}/services",
        "secrets": f"/api/v1/namespaces/{namespace}/secrets",
        "serviceaccounts": f"/api/v1/namespaces/{namespace}/serviceaccounts",
        "statefulsets": f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
        "jobs": f"/apis/batch/v1/namespaces/{namespace}/jobs",
        "roles": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        "poddisruptionbudgets": f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        "ardiffusionsessions": GROUP.format(ns=namespace) + "/ardiffusionsessions",
        "ardiffusionworkerpools": GROUP.format(ns=namespace) + "/ardiffusionworkerpools",
        "kopfpeerings": f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings",
    }
    found = {kind: httpx.get(api + path, timeout=10).json()["items"] for kind, path in paths.items()}
    return {kind: [item["metadata"]["name"] for item in items] for kind, items in found.items() if items}


def test_helm_install_upgrade_test_then_uninstall_leaves_nothing_behind(
    chart, postgres, tmp_path: Path
) -> None:
    with DevCluster(tmp_path / "cluster", namespace=chart.namespace, install_crds=False) as cluster:
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({"defaultPool": FAKE_POOL, "uninstall": {"timeoutSeconds": 60}}))
        installed = helm(
            chart, postgres, cluster, "install", chart.release, str(chart.path), "-f", str(values)
        )
        assert installed.returncode == 0, installed.stderr
        listed = helm(chart, postgres, cluster, "list", "-q")
        assert listed.stdout.split() == [chart.release]

        # The operator (its StatefulSet's part) brings the default pool up and a session to Ready.
        cluster.operator = OperatorProcess(
            OPERATOR_COMMAND,
            kubeconfig=cluster.kubeconfig,
            redis_url=cluster.redis_url,
            namespace=chart.namespace,
            log_path=cluster.logs_dir / "operator.log",
            env={"ARDIFF_OPERATOR_CANCELLATION_POLLING_SECONDS": "0.5"},
        ).start()
        cluster.operator.wait_ready()
        sessions = cluster.api_url + GROUP.format(ns=chart.namespace) + "/ardiffusionsessions"
        session = {"metadata": {"name": "s"}, "spec": {"poolRef": "fake-pool", "prompt": "a forest"}}
        assert httpx.post(sessions, json=session, timeout=10).status_code == 201
        wait_until(
            lambda: (
                (httpx.get(f"{sessions}/s", timeout=10).json().get("status") or {}).get("phase") == "Ready"
            ),
            timeout=60,
            what="session s Ready",
        )
        # helm upgrade: the pool follows the new values; the generated Redis password is kept (`lookup`).
        redis = f"{cluster.api_url}/api/v1/namespaces/{chart.namespace}/secrets/{chart.fullname}-redis"
        password = httpx.get(redis, timeout=10).json()["data"]["password"]
        pool = {**FAKE_POOL, "spec": {**FAKE_POOL["spec"], "replicas": {"min": 1, "max": 2}}}
        values.write_text(yaml.safe_dump({"defaultPool": pool, "uninstall": {"timeoutSeconds": 60}}))
        # The README's upgrade: the chart's CRDs first (helm never upgrades crds/), applied over helm's own.
        crds = cluster.kubectl("apply", "-f", str(chart.path / "crds"), check=False)
        assert crds.returncode == 0, crds.stderr
        assert sorted(crds.stdout.splitlines()) == sorted(
            f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']} configured"
            for crd in load_manifests(chart.path / "crds")
        )
        upgraded = helm(
            chart,
            postgres,
            cluster,
            "upgrade",
            chart.release,
            str(chart.path),
            "--reuse-values",
            "-f",
            str(values),
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert "REVISION: 2" in upgraded.stdout
        pools = cluster.api_url + GROUP.format(ns=chart.namespace) + "/ardiffusionworkerpools"
        assert httpx.get(f"{pools}/fake-pool", timeout=10).json()["spec"]["replicas"] == {"min": 1, "max": 2}
        assert httpx.get(redis, timeout=10).json()["data"]["password"] == password

        before = ours(cluster.api_url, chart.namespace)
        assert {
            "pods",
            "secrets",
            "poddisruptionbudgets",
            "ardiffusionsessions",
            "ardiffusionworkerpools",
        } <= set(before)

        hooks = HookRunner(cluster.api_url, chart.namespace, cluster.kubeconfig)
        hooks.start()
        try:
            # helm test: a session on the default pool, Ready, ticked once, deleted.
            tested = helm(chart, postgres, cluster, "test", chart.release, "--timeout", "120s")
            smoke = hooks.output("smoke-test")
            assert smoke.returncode == 0, smoke.stdout + smoke.stderr
            assert tested.returncode == 0, tested.stderr
            assert f"{chart.fullname}-test" in tested.stdout
            assert "Succeeded" in tested.stdout
            assert "tick 0 of helm-test-" in smoke.stdout
            assert ": HTTP 200," in smoke.stdout
            uninstalled = helm(chart, postgres, cluster, "uninstall", chart.release, "--timeout", "120s")
        finally:
            hooks.stopped.set()
            hooks.join(10)
        hook = hooks.output("uninstall")
        assert hook.returncode == 0, hook.stdout + hook.stderr
        assert uninstalled.returncode == 0, uninstalled.stderr + cluster.operator.log()[-5000:]
        assert f"no session, pool or worker pod is left in {chart.namespace}" in hook.stdout
        assert helm(chart, postgres, cluster, "list", "-q").stdout.split() == []
        # Owned objects (token and workers' Secrets, the busy budget) go through garbage collection.
        wait_until(
            lambda: not ours(cluster.api_url, chart.namespace),
            timeout=15,
            what=f"nothing of ours left, still {ours(cluster.api_url, chart.namespace)}",
        )
