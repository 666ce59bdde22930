"""The real `helm install`, `upgrade`, `test` and `uninstall` on the session's real cluster, with helm's own
release storage (Secrets).

Everything is the cluster's own doing: the StatefulSet controller makes the operator's Pod, which runs
the operator image (a non-editable install of the checkout) under the chart's ServiceAccount and Role,
so every call it makes is judged by the real RBAC authorizer; the bundled Redis runs as its StatefulSet's
Pod and the operator reaches it by its Service's DNS name; the Job controller runs the pre-delete hook;
the `helm test` Pod and the worker Pods run on the process kubelets. The release namespace enforces
PodSecurity `restricted` (the real admission plugin): every Pod the chart and the operator make passes it.
"""

from __future__ import annotations

import base64
import itertools
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ardiff.devcluster.cluster import DevCluster, load_manifests
from ardiff.devcluster.images import OPERATOR_IMAGE, WORKER_IMAGE, ImageTable
from ardiff.devcluster.pki import CertificateAuthority
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.acl import OPERATOR_USERNAME
from tests.chart.conftest import Chart
from tests.operator.test_tls import tls_secret

pytestmark = pytest.mark.slow

GROUP = "/apis/ardiffusion.dev/v1alpha1/namespaces/{ns}"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
FAKE_POOL = {
    "enabled": True,
    "name": "fake-pool",
    "spec": {
        "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
        "env": [{"name": "ARDIFF_RUNTIME", "value": "fake"}, {"name": "ARDIFF_FAKE_CAPACITY", "value": "2"}],
        "replicas": {"min": 1, "max": 1},
    },
}
# A worker Pod of the fake runtime is Ready within seconds; the operator's own Pod imports kopf first.
READY_SECONDS = 180
_release_counter = itertools.count()


class Release:
    """One release of the chart in a namespace of its own on the session's cluster."""

    def __init__(self, cluster: DevCluster, workdir: Path, *, labels: dict[str, str] | None = None) -> None:
        self.cluster = cluster
        self.namespace = f"helm-{next(_release_counter)}"
        self.chart = Chart(namespace=self.namespace, release="ardiff")
        self.home = workdir / "helm"
        self.http = cluster.admin.client(timeout=15)
        body = {"metadata": {"name": self.namespace, "labels": labels or {}}}
        self.http.post("/api/v1/namespaces", json=body).raise_for_status()

    def helm(self, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run(
            [str(self.chart.helm_binary), *args, "--namespace", self.namespace],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def get(self, path: str) -> dict[str, Any] | None:
        reply = self.http.get(path)
        if reply.status_code == 404:
            return None
        reply.raise_for_status()
        return reply.json()

    def items(self, path: str) -> list[dict[str, Any]]:
        found = self.get(path)
        return [] if found is None else found["items"]

    def pods(self) -> list[dict[str, Any]]:
        return self.items(f"/api/v1/namespaces/{self.namespace}/pods")

    def operator_pod(self) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{self.namespace}/pods/{self.chart.fullname}-operator-0")

    def ready_session(self, name: str = "s") -> dict[str, Any]:
        """A session of the default pool, created here; its status once it is Ready."""
        sessions = GROUP.format(ns=self.namespace) + "/ardiffusionsessions"
        session = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionSession",
            "metadata": {"name": name},
            "spec": {"poolRef": "fake-pool", "prompt": "a forest"},
        }
        assert self.http.post(sessions, json=session).status_code == 201
        return wait_until(
            lambda: (
                (s := (self.get(f"{sessions}/{name}") or {}).get("status") or {}).get("phase") == "Ready"
                and s
            ),
            timeout=READY_SECONDS,
            what=f"session {name} Ready",
        )

    def log(self, pod: str, *, previous: bool = False) -> str:
        reply = self.http.get(
            f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log", params={"previous": str(previous).lower()}
        )
        return reply.text if reply.status_code == 200 else ""

    def ours(self) -> dict[str, list[str]]:
        """Every object left in the namespace, by kind, besides what the cluster itself keeps there (the
        default ServiceAccount and the root CA ConfigMap)."""
        ns = self.namespace
        paths = {
            "pods": f"/api/v1/namespaces/{ns}/pods",
            "services": f"/api/v1/namespaces/{ns}/services",
            "secrets": f"/api/v1/namespaces/{ns}/secrets",
            "configmaps": f"/api/v1/namespaces/{ns}/configmaps",
            "persistentvolumeclaims": f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            "serviceaccounts": f"/api/v1/namespaces/{ns}/serviceaccounts",
            "statefulsets": f"/apis/apps/v1/namespaces/{ns}/statefulsets",
            "jobs": f"/apis/batch/v1/namespaces/{ns}/jobs",
            "roles": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
            "rolebindings": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
            "networkpolicies": f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
            "poddisruptionbudgets": f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
            "ardiffusionsessions": GROUP.format(ns=ns) + "/ardiffusionsessions",
            "ardiffusionworkerpools": GROUP.format(ns=ns) + "/ardiffusionworkerpools",
            "kopfpeerings": f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings",
        }
        kept = {("serviceaccounts", "default"), ("configmaps", "kube-root-ca.crt")}
        left = {
            kind: [
                i["metadata"]["name"] for i in self.items(path) if (kind, i["metadata"]["name"]) not in kept
            ]
            for kind, path in paths.items()
        }
        return {kind: names for kind, names in left.items() if names}

    def delete_namespace(self) -> None:
        self.http.delete(f"/api/v1/namespaces/{self.namespace}")

    def diagnostics(self) -> str:
        """The namespace's Events, Pods and their logs (printed when a test fails)."""
        events = self.items(f"/api/v1/namespaces/{self.namespace}/events")
        parts = [
            f"{e.get('type')} {e['involvedObject']['name']} {e.get('reason')}: {e.get('message')}"
            for e in events
        ]
        for pod in self.pods():
            name = pod["metadata"]["name"]
            parts += [f"----- pod {name}: {pod.get('status', {}).get('phase')}", self.log(name)[-4000:]]
        return "\n".join(parts)


@pytest.fixture
def releases(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Callable[..., Release]]:
    """`releases(labels=...)`: a Release in a namespace of its own; their diagnostics are printed at the end
    (pytest shows them for a failed test)."""
    made: list[Release] = []

    def make(*, labels: dict[str, str] | None = None) -> Release:
        made.append(Release(dev_cluster, tmp_path / f"release-{len(made)}", labels=labels))
        return made[-1]

    yield make
    for release in made:
        print(f"===== {release.namespace}\n{release.diagnostics()}")
        release.http.close()


def operator_running(release: Release) -> dict[str, Any] | None:
    pod = release.operator_pod()
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return pod if statuses and statuses[0].get("ready") else None


def test_helm_install_upgrade_test_then_uninstall_leaves_nothing_behind(
    dev_cluster: DevCluster, releases: Callable[..., Release], tmp_path: Path
) -> None:
    release = releases(labels=RESTRICTED)
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"defaultPool": FAKE_POOL, "uninstall": {"timeoutSeconds": 120}}))
    installed = release.helm("install", "ardiff", str(release.chart.path), "-f", str(values), "--wait")
    assert installed.returncode == 0, installed.stderr
    assert release.helm("list", "-q").stdout.split() == ["ardiff"]
    # helm's own storage: the release is a Secret of type helm.sh/release.v1 (no SQL driver any more).
    [stored] = [
        s
        for s in release.items(f"/api/v1/namespaces/{release.namespace}/secrets")
        if s["type"] == "helm.sh/release.v1"
    ]
    assert stored["metadata"]["labels"]["name"] == "ardiff"

    # The operator is the StatefulSet's Pod, on a node the scheduler chose, running as the chart says.
    pod = wait_until(lambda: operator_running(release), timeout=READY_SECONDS, what="the operator Pod Ready")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert pod["spec"]["nodeName"] in {"node-1", "node-2"}
    assert pod["spec"]["serviceAccountName"] == f"{release.chart.fullname}-operator"

    # It brings the default pool up and a session to Ready: its calls pass the real authorizer, its worker
    # Pods pass PodSecurity `restricted`.
    release.ready_session()

    # Issue 23 item 1: the operator logs in as the bundled Redis' `ardiff-operator` (its rules let it make
    # users), and the pool's workers as the pool's own user.
    redis = release.get(f"/api/v1/namespaces/{release.namespace}/secrets/{release.chart.fullname}-redis")
    assert redis is not None
    operator_url = base64.b64decode(redis["data"]["url"]).decode()
    assert operator_url.startswith(f"redis://{OPERATOR_USERNAME}:")
    workers = release.get(f"/api/v1/namespaces/{release.namespace}/secrets/fake-pool-workers-redis")
    assert workers is not None
    workers_url = base64.b64decode(workers["data"]["url"]).decode()
    assert workers_url.startswith(f"redis://ardiff-pool.{release.namespace}.fake-pool:")
    assert base64.b64decode(redis["data"]["password"]).decode() not in workers_url

    # helm upgrade to a changed chart: the CRDs first (the README's step: helm never upgrades crds/), then
    # the release; the pool follows the new values and the generated Redis password is kept (`lookup`).
    secret = release.get(f"/api/v1/namespaces/{release.namespace}/secrets/{release.chart.fullname}-redis")
    assert secret is not None
    crds = dev_cluster.kubectl("apply", "-f", str(release.chart.path / "crds"), check=False)
    assert crds.returncode == 0, crds.stderr
    assert sorted(crds.stdout.splitlines()) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{crd['metadata']['name']} configured"
        for crd in load_manifests(release.chart.path / "crds")
    )
    pool = {**FAKE_POOL, "spec": {**FAKE_POOL["spec"], "replicas": {"min": 1, "max": 2}}}
    values.write_text(yaml.safe_dump({"defaultPool": pool, "uninstall": {"timeoutSeconds": 120}}))
    upgraded = release.helm("upgrade", "ardiff", str(release.chart.path), "--reuse-values", "-f", str(values))
    assert upgraded.returncode == 0, upgraded.stderr
    assert "REVISION: 2" in upgraded.stdout
    pools = GROUP.format(ns=release.namespace) + "/ardiffusionworkerpools"
    assert (release.get(f"{pools}/fake-pool") or {})["spec"]["replicas"] == {"min": 1, "max": 2}
    again = release.get(f"/api/v1/namespaces/{release.namespace}/secrets/{release.chart.fullname}-redis")
    assert again is not None
    assert again["data"]["password"] == secret["data"]["password"]

    # helm test: its Pod (the operator image) creates a session on the default pool, waits for Ready, ticks it
    # once and deletes it; the Pod is deleted once it succeeded (hook-succeeded): the operator's log shows it.
    tested = release.helm("test", "ardiff", "--timeout", "300s")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "Phase:          Succeeded" in tested.stdout
    operator_log = release.log(f"{release.chart.fullname}-operator-0")
    assert re.search(r"session helm-test-[a-z0-9]+ released", operator_log), operator_log[-3000:]

    # helm uninstall: the pre-delete Job (the Job controller runs it) deletes sessions and pools while the
    # operator still runs; then helm deletes the release; garbage collection takes what they owned.
    uninstalled = release.helm("uninstall", "ardiff", "--wait", "--timeout", "300s")
    assert uninstalled.returncode == 0, uninstalled.stderr
    assert release.helm("list", "-q").stdout.split() == []
    wait_until(lambda: not release.ours(), timeout=120, what=f"nothing of ours left: {release.ours()}")
    assert not [p for p in release.pods() if p["metadata"].get("deletionTimestamp")]
    # Nothing stuck: the namespace itself goes (no finalizer of ours holds anything in it).
    release.delete_namespace()
    wait_until(
        lambda: release.get(f"/api/v1/namespaces/{release.namespace}") is None,
        timeout=120,
        what=f"namespace {release.namespace} deleted",
    )


def test_an_operator_without_a_permission_names_it_and_does_not_start(
    releases: Callable[..., Release],
) -> None:
    """kopf would retry a 403 quietly (a hang): the operator checks its rights at start. One rule taken out
    of the chart's Role: the operator's Pod exits naming exactly that permission, and restarts (CrashLoop)."""
    release = releases()
    installed = release.helm("install", "ardiff", str(release.chart.path), "--wait")
    assert installed.returncode == 0, installed.stderr
    wait_until(lambda: operator_running(release), timeout=READY_SECONDS, what="the operator Pod Ready")

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{release.namespace}"
    role_path = f"{rbac}/roles/{release.chart.fullname}-operator"
    role = release.get(role_path)
    assert role is not None
    kept = [r for r in role["rules"] if r["resources"] != ["configmaps"]]
    assert len(kept) == len(role["rules"]) - 1
    release.http.put(role_path, json={**role, "rules": kept}).raise_for_status()
    release.http.delete(f"/api/v1/namespaces/{release.namespace}/pods/{release.chart.fullname}-operator-0")

    def refused() -> str | None:
        pod = release.operator_pod()
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
        if not statuses or not statuses[0]["restartCount"]:
            return None
        return release.log(pod["metadata"]["name"], previous=True) or None

    log = wait_until(refused, timeout=READY_SECONDS, what="the operator to exit for a missing permission")
    assert (
        f"the operator's service account may not: get configmaps (core) in namespace {release.namespace}"
        in log
    )
    assert "Traceback" not in log.split("may not:")[0][-2000:]
    uninstalled = release.helm("uninstall", "ardiff", "--no-hooks", "--wait", "--timeout", "120s")
    assert uninstalled.returncode == 0, uninstalled.stderr
    release.delete_namespace()


def test_a_release_on_a_tls_redis_serves_a_tls_pool(releases: Callable[..., Release], tmp_path: Path) -> None:
    """Issue 23 item 9, the chart's part: with certificates of a CA made here (as cert-manager would write
    them), the bundled Redis speaks TLS only; the operator's Pod reaches it by its Service's DNS name over
    rediss:// verifying the CA, the default pool's workers too (the CA copied into their Secret), and they
    serve https at their DNS names: a session is Ready at such an endpoint."""
    release = releases(labels=RESTRICTED)
    ns, fullname = release.namespace, release.chart.fullname
    ca = CertificateAuthority(tmp_path / "ca", common_name="test-ca")
    names = {
        "redis-tls": f"{fullname}-redis.{ns}.svc",
        "pool-tls": f"*.fake-pool-workers.{ns}.svc.cluster.local",
    }
    for name, dns_name in names.items():
        created = release.http.post(f"/api/v1/namespaces/{ns}/secrets", json=tls_secret(name, ca, [dns_name]))
        assert created.status_code == 201, created.text
    pool = {**FAKE_POOL, "spec": {**FAKE_POOL["spec"], "tls": {"secretName": "pool-tls"}}}
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump({"defaultPool": pool, "redis": {"bundled": {"tls": {"secretName": "redis-tls"}}}})
    )
    installed = release.helm("install", "ardiff", str(release.chart.path), "-f", str(values), "--wait")
    assert installed.returncode == 0, installed.stderr
    status = release.ready_session()
    assert status["endpoint"] == f"https://{status['pod']}.fake-pool-workers.{ns}.svc.cluster.local:8000"
    for secret, user in ((f"{fullname}-redis", OPERATOR_USERNAME), ("fake-pool-workers-redis", None)):
        found = release.get(f"/api/v1/namespaces/{ns}/secrets/{secret}")
        assert found is not None
        url = base64.b64decode(found["data"]["url"]).decode()
        assert url.startswith(f"rediss://{user or f'ardiff-pool.{ns}.fake-pool'}:"), url.split(":")[0]
        assert url.endswith("?ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt")
    # helm test: its Pod ticks a session of the pool over https, verifying the pool's CA.
    tested = release.helm("test", "ardiff", "--timeout", "300s")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    uninstalled = release.helm("uninstall", "ardiff", "--wait", "--timeout", "300s")
    assert uninstalled.returncode == 0, uninstalled.stderr
    release.delete_namespace()


def test_the_readme_upgrade_steps_are_the_ones_tested_here(chart) -> None:
    readme = (chart.path.parents[1] / "README.md").read_text()
    block = readme.split("Upgrade, test, uninstall.", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == [
        "kubectl apply -f charts/ardiff/crds/",
        "helm upgrade ardiff charts/ardiff -n worlds --reuse-values",
        "helm test ardiff -n worlds",
        "helm uninstall ardiff -n worlds",
    ]


def test_the_images_run_the_installed_package_not_the_checkout(dev_cluster: DevCluster) -> None:
    """The images the cluster runs are non-editable installs (as the Dockerfiles make them): their `ardiff`
    package, every subpackage included, lives in the image's venv, not in the checkout."""
    table = ImageTable.from_json((dev_cluster.workdir / "images.json").read_text())
    probe = "import ardiff, ardiff.worker.families, ardiff.kv, ardiff.operator; print(ardiff.__file__)"
    for image in (OPERATOR_IMAGE, WORKER_IMAGE):
        bin_dir = Path(table.resolve(image).env["PATH"].split(":")[0])
        done = subprocess.run(
            [str(bin_dir / "python"), "-I", "-c", probe], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(str(bin_dir.parent)), done.stdout
