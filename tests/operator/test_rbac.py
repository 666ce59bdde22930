"""The chart's Role is derived from the code: the real operator runs a scenario against the dev cluster, which
records every API call it makes (`KubeAPI.request_log`, by the operator's own token), and the Role that
`helm template` renders must grant exactly those: nothing missing, nothing extra.

The scenario reaches every call the operator has: a pool with a Pod and its Service, Secret and budget; a
session placed (token Secret, busy label, budget raised), ticked, deleted; a session whose image ConfigMap is
missing (ConfigMap read, a Failed Event); an operator restart under a busy pod with a changed workers' Redis
URL (the budget and the Secret exist: read, then patched); `ardiff operator smoke-test` (the chart's `helm
test`, its own token) creates, ticks and deletes a session; then `ardiff operator uninstall` (the chart's pre-
delete hook, with a token of its own) deletes the sessions and the pool (slots released, Pods and Service
deleted) and nothing of ours is left. kopf adds its watches, finalizer and progress patches and its peering
keepalives. The hooks' own calls are compared with their Roles the same way.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ardiff.devcluster.kube_api import write_kubeconfig
from ardiff.devcluster.kubectl import kube_env
from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.request_log import OWNER_REFERENCES_PERMISSION_ENFORCEMENT, ApiRequest
from ardiff.devcluster.waiting import wait_until
from ardiff.operator.pods import worker_redis_secret_name
from tests.chart.conftest import Chart
from tests.operator.conftest import OPERATOR_ENV, POOL_FINALIZE_SECONDS, Cluster
from tests.operator.test_uninstall import ours, run_uninstall

Grants = dict[tuple[str, str], set[str]]  # (apiGroup, resource[/subresource]) -> verbs


def role_grants(rules: Iterable[dict]) -> Grants:
    grants: Grants = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def used_grants(requests: Iterable[ApiRequest]) -> Grants:
    used: Grants = {}
    for request in requests:
        used.setdefault((request.group, request.rbac_resource), set()).add(request.verb)
    return used


def chart_role(namespace: str, component: str = "operator", values: dict | None = None) -> list[dict]:
    """The rules of the Role `helm template` renders for a namespaced install watching `namespace`: the
    operator's, the uninstall hook's or the `helm test` Pod's."""
    chart = Chart(namespace=namespace)
    objects = chart.render(values)
    [role] = [
        obj
        for obj in objects
        if obj["kind"] == "Role" and obj["metadata"]["name"] == f"{chart.fullname}-{component}"
    ]
    return role["rules"]


def test_the_chart_role_grants_exactly_the_calls_the_operator_makes(
    cluster: Cluster, redis_url: str, tmp_path: Path
) -> None:
    ns = cluster.namespace
    token = f"operator-{ns}"  # the dev cluster has no authentication: the token names the client
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.api.url, token=token)
    # As the chart runs it: peering on a namespaced KopfPeering (the chart creates it).
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "ardiff"}}
    assert (
        cluster.http.post(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings", json=peering).status_code == 201
    )
    log = cluster.api.api.request_log
    log.follow(token)
    process = OperatorProcess(
        ("ardiff", "operator", "run", "--peering", "ardiff", "--priority", "0"),
        kubeconfig=kubeconfig,
        redis_url=redis_url,
        namespace=ns,
        log_path=tmp_path / "operator.log",
        env=OPERATOR_ENV,
    ).start()
    try:
        process.wait_ready()
        # A pool from an earlier version carries the operator's old finalizer: kopf removes it.
        cluster.create_pool(finalizers=["ardiffusion.dev/finalizer"])
        wait_until(
            lambda: not cluster.get("ardiffusionworkerpools", "pool")["metadata"].get("finalizers"),
            what="the old finalizer to be removed",
        )
        cluster.create_session("s")
        cluster.wait_phase("s", "Ready")
        assert cluster.tick("s", 0).status_code == 200
        cluster.create_session("pic", image={"configMapKeyRef": {"name": "missing", "key": "png"}})
        cluster.wait_phase("pic", "Failed", reason="ImageNotFound")

        # A restart under a busy pod, with the workers' URL changed (an equivalent one).
        process.stop()
        worker_url = redis_url + "?health_check_interval=30"
        process.env = {**OPERATOR_ENV, "ARDIFF_WORKER_REDIS_URL": worker_url}
        process.start().wait_ready()
        secret = worker_redis_secret_name("pool")
        wait_until(
            lambda: cluster.get("secrets", secret, core=True)["data"]["url"] == _b64(worker_url),
            what="the workers' Redis Secret to follow the new URL",
        )
        wait_until(
            lambda: any(
                r.verb == "get" and r.resource == "poddisruptionbudgets" for r in log.requests(token)
            ),
            what="the restarted operator to read the existing budget",
        )
        assert cluster.tick("s", 1).status_code == 200

        # The chart's `helm test` (its own token): a session created, Ready, ticked once, deleted.
        test_token = f"smoke-test-{ns}"
        log.follow(test_token)
        test_kubeconfig = write_kubeconfig(tmp_path / "test-kubeconfig", cluster.api.url, token=test_token)
        smoke = subprocess.run(
            [
                sys.executable,
                "-m",
                "ardiff.cli",
                "operator",
                "smoke-test",
                "-n",
                ns,
                "--pool",
                "pool",
                "--timeout",
                "30",
            ],
            env=kube_env(test_kubeconfig),
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        assert ": HTTP 200," in smoke.stdout

        # The session ends and the pool may go to zero: the operator deletes its empty pod.
        cluster.delete("ardiffusionsessions", "s")
        cluster.patch_pool_spec({"replicas": {"min": 0, "max": 1}})
        wait_until(lambda: not cluster.pod_names(), what="the empty pod to be deleted")

        # The chart's pre-delete hook deletes the sessions, then the pool, through this operator.
        hook_token = f"uninstall-{ns}"
        log.follow(hook_token)
        hook_kubeconfig = write_kubeconfig(tmp_path / "hook-kubeconfig", cluster.api.url, token=hook_token)
        done = run_uninstall(cluster, POOL_FINALIZE_SECONDS, hook_kubeconfig)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"no session, pool or worker pod is left in {ns}" in done.stdout
        # Owned objects (token and workers' Secrets, the budget) follow through garbage collection.
        wait_until(lambda: not ours(cluster), timeout=10, what="nothing of ours left")
    finally:
        process.stop()
        requests = log.forget(token)
        hook_requests = log.forget(f"uninstall-{ns}")
        test_requests = log.forget(f"smoke-test-{ns}")
        sys.stdout.write(f"\n----- operator log -----\n{process.log()[-20000:]}\n")

    # Namespaced mode needs nothing cluster-scoped and nothing outside the namespace it watches.
    assert {request.namespace for request in requests} == {ns}
    used = used_grants(requests)
    granted = role_grants(chart_role(ns))
    missing = {key: verbs - granted.get(key, set()) for key, verbs in used.items()}
    extra = {key: verbs - used.get(key, set()) for key, verbs in granted.items()}
    assert {key: verbs for key, verbs in missing.items() if verbs} == {}, "calls the Role does not grant"
    assert {key: verbs for key, verbs in extra.items() if verbs} == {}, "grants no call of the scenario uses"
    # The hook's Role grants exactly what `ardiff operator uninstall` calls.
    assert {request.namespace for request in hook_requests} == {ns}
    assert used_grants(hook_requests) == role_grants(chart_role(ns, "uninstall"))
    assert {request.namespace for request in test_requests} == {ns}
    assert used_grants(test_requests) == role_grants(
        chart_role(ns, "test", {"defaultPool": {"enabled": True}})
    )
    # The finalizers rule comes from admission, not from a call: children are adopted with blockOwnerDeletion.
    implied = {
        (r.group, r.rbac_resource)
        for r in requests
        if r.implied_by == OWNER_REFERENCES_PERMISSION_ENFORCEMENT
    }
    assert implied == {
        ("ardiffusion.dev", "ardiffusionworkerpools/finalizers"),  # Pods, Service, Secret, budget
        ("ardiffusion.dev", "ardiffusionsessions/finalizers"),  # token Secret
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# Granted in cluster-wide mode beyond what the namespaced scenario above uses, and why it cannot reach them:
# an operator for every namespace would act on every other test's objects in the shared dev cluster.
CLUSTER_WIDE_ONLY: dict[tuple[str, str], tuple[set[str], str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): (
        {"list", "watch"},
        "kopf's resource scanning, on in cluster-wide mode (it notices our CRDs being reinstalled)",
    ),
    ("kopf.dev", "clusterkopfpeerings"): (
        {"list", "watch", "patch"},
        "the peering kind of cluster-wide mode",
    ),
}


def test_the_cluster_role_is_the_role_plus_what_cluster_wide_mode_needs() -> None:
    namespaced = role_grants(chart_role("worlds"))
    chart = Chart()
    [cluster_role] = [
        obj
        for obj in chart.render({"clusterWide": True})
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == f"{chart.fullname}-operator"
    ]
    expected = {key: verbs for key, verbs in namespaced.items() if key != ("kopf.dev", "kopfpeerings")}
    expected |= {key: verbs for key, (verbs, _reason) in CLUSTER_WIDE_ONLY.items()}
    assert role_grants(cluster_role["rules"]) == expected
