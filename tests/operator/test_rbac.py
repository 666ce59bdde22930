"""The chart's Roles are derived from the code: the real operator runs a scenario on the session's cluster
as a ServiceAccount bound to the Role that `helm template` renders (so the real RBAC authorizer judges every
call), the API server's audit log records every request it makes (`ControlPlane.audit_log`: each service
account's requests outside kube-system), and the Role must grant exactly those: nothing missing, nothing
extra.

The scenario reaches every call the operator has: a pool with a Pod and its Service, Secret and budget; a
session placed (token Secret, busy label, budget raised), ticked, deleted; a session whose image ConfigMap is
missing (ConfigMap read, a Failed Event); an operator restart under a busy pod with a changed workers' Redis
URL (the budget and the Secret exist: read, then patched); `ardiff operator smoke-test` (the chart's `helm
test`, as its own ServiceAccount) creates, ticks and deletes a session; then `ardiff operator uninstall` (the
chart's pre-delete hook, as a ServiceAccount of its own) deletes the sessions and the pool (slots released,
Pods and Service deleted) and nothing of ours is left. kopf adds its watches, the removal of an earlier
version's finalizer from a pool and a session (its patches of our objects: it writes progress annotations only
for a retried handler) and its peering keepalives. The hooks' own calls are compared with their Roles the
same way.

Two kinds of permission are not in the comparison's audit records as calls of the Role: what every
authenticated identity may do whatever its Roles (the default `system:basic-user` ClusterRole: the operator's
SelfSubjectAccessReviews at start, `operator/permissions.py`; `system:discovery`: non-resource URLs), and the
`update` of an owner's `finalizers` that OwnerReferencesPermissionEnforcement (enabled on this API server)
demands of a create whose ownerReferences block the owner's deletion: an authorization check inside admission,
not a request, so it is derived from the objects the operator created.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.kubectl import kube_env
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.connection import with_user
from ardiff.operator.permissions import required
from ardiff.operator.pods import worker_redis_secret_name
from tests.chart.conftest import Chart
from tests.operator.conftest import POOL_FINALIZE_SECONDS, Cluster
from tests.operator.test_uninstall import ours, run_uninstall

Grants = dict[tuple[str, str], set[str]]  # (apiGroup, resource[/subresource]) -> verbs
# Granted to every authenticated identity by the default ClusterRole `system:basic-user`, never by ours: the
# operator's permission check at start (one SelfSubjectAccessReview per rule).
EVERY_IDENTITY: Grants = {("authorization.k8s.io", "selfsubjectaccessreviews"): {"create"}}
# Owners' kinds the operator's children name in their ownerReferences, and their resources.
OWNER_RESOURCES = {
    ("ardiffusion.dev", "ARDiffusionWorkerPool"): "ardiffusionworkerpools",
    ("ardiffusion.dev", "ARDiffusionSession"): "ardiffusionsessions",
}


@dataclass(frozen=True)
class Call:
    """One request of the audit log (stage ResponseComplete): the RBAC attributes the authorizer judged."""

    group: str
    resource: str  # resource[/subresource]
    verb: str
    namespace: str
    name: str
    code: int


def audited_calls(audit_log: Path, user: str) -> list[Call]:
    """Every resource request `user` made, in order (non-resource URLs are every identity's: left out)."""
    calls = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef")
        if event["user"]["username"] != user or event.get("stage") != "ResponseComplete" or ref is None:
            continue
        subresource = f"/{ref['subresource']}" if ref.get("subresource") else ""
        calls.append(
            Call(
                group=ref.get("apiGroup", ""),
                resource=ref["resource"] + subresource,
                verb=event["verb"],
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=(event.get("responseStatus") or {}).get("code", 0),
            )
        )
    return calls


def role_grants(rules: Iterable[dict]) -> Grants:
    grants: Grants = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def used_grants(calls: Iterable[Call]) -> Grants:
    used: Grants = {}
    for call in calls:
        used.setdefault((call.group, call.resource), set()).add(call.verb)
    return used


def without(grants: Grants, granted_anyway: Grants) -> Grants:
    left = {key: verbs - granted_anyway.get(key, set()) for key, verbs in grants.items()}
    return {key: verbs for key, verbs in left.items() if verbs}


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


def chart_cluster_role() -> list[dict]:
    """The rules of the operator's ClusterRole `helm template` renders for `clusterWide: true`."""
    chart = Chart()
    [cluster_role] = [
        obj
        for obj in chart.render({"clusterWide": True})
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == f"{chart.fullname}-operator"
    ]
    return cluster_role["rules"]


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount of the test's namespace: a token of it, and a kubeconfig with that token."""

    credentials: Credentials
    kubeconfig: Path

    @property
    def user(self) -> str:
        return self.credentials.user


def service_account(cluster: Cluster, name: str, rules: Sequence[dict], directory: Path) -> Identity:
    """ServiceAccount `name` bound to a Role `name` of `rules` (none: no Role), as the chart binds its own."""
    ns = cluster.namespace
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    objects: list[tuple[str, dict[str, Any]]] = [
        (
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
    ]
    if rules:
        objects += [
            (
                f"{rbac}/roles",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": name},
                    "rules": list(rules),
                },
            ),
            (
                f"{rbac}/rolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
                },
            ),
        ]
    for path, body in objects:
        reply = cluster.http.post(path, json=body)
        assert reply.status_code == 201, reply.text
    assert cluster.kube.control_plane is not None
    credentials = cluster.kube.control_plane.service_account_credentials(ns, name)
    return Identity(credentials, credentials.write_kubeconfig(directory / f"{name}.kubeconfig", ns))


def wait_admission_maps_our_kinds(cluster: Cluster, directory: Path) -> None:
    """Until OwnerReferencesPermissionEnforcement resolves our kinds. It maps an ownerReference's kind with a
    discovery RESTMapper the API server refreshes every 30 s, so for a while after our CRDs are installed (as
    the session's cluster starts) a create that blocks the deletion of a pool or session is refused (403,
    "cannot find RESTMapping") to any identity that may not update every resource's finalizers. The operator
    retries such calls; waiting here keeps the scenario that of a settled cluster. The probe is a dry-run
    create by a ServiceAccount of its own: none of its calls is the operator's."""
    rules = [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": ["ardiffusion.dev"],
            "resources": ["ardiffusionworkerpools/finalizers", "ardiffusionsessions/finalizers"],
            "verbs": ["update"],
        },
    ]
    probe = service_account(cluster, "admission-probe", rules, directory)
    owners = [
        {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": kind,
            "name": "probe",
            "uid": "00000000-0000-0000-0000-000000000000",
            "blockOwnerDeletion": True,
        }
        for kind in ("ARDiffusionWorkerPool", "ARDiffusionSession")
    ]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe", "ownerReferences": owners}}
    path = f"/api/v1/namespaces/{cluster.namespace}/secrets"
    with probe.credentials.client() as http:

        def mapped() -> bool:
            reply = http.post(path, params={"dryRun": "All"}, json=secret)
            assert reply.status_code in (201, 403), reply.text
            return reply.status_code == 201

        wait_until(mapped, timeout=45, poll=1, what="admission to resolve our kinds")


def blocking_owners(cluster: Cluster) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """{(resource, name): the (apiGroup, `<owner>/finalizers`) its ownerReferences block the deletion of} for
    the namespace's Pods, Services, Secrets and budgets that have such references."""
    budgets = cluster.http.get(f"/apis/policy/v1/namespaces/{cluster.namespace}/poddisruptionbudgets")
    budgets.raise_for_status()
    objects = [
        *(("pods", o) for o in cluster.items("pods", core=True)),
        *(("services", o) for o in cluster.items("services", core=True)),
        *(("secrets", o) for o in cluster.items("secrets", core=True)),
        *(("poddisruptionbudgets", o) for o in budgets.json()["items"]),
    ]
    found: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for resource, obj in objects:
        for owner in obj["metadata"].get("ownerReferences") or []:
            if owner.get("blockOwnerDeletion"):
                group = owner["apiVersion"].rpartition("/")[0]
                finalizers = (group, f"{OWNER_RESOURCES[(group, owner['kind'])]}/finalizers")
                found.setdefault((resource, obj["metadata"]["name"]), set()).add(finalizers)
    return found


def wait_audited(cluster: Cluster, marker: Identity) -> None:
    """Until the audit log holds every request made so far: a request of `marker` made now is in it (the API
    server writes its batches in the order requests complete)."""
    assert cluster.kube.control_plane is not None
    audit_log = cluster.kube.control_plane.audit_log
    with marker.credentials.client() as http:
        assert http.get(f"/api/v1/namespaces/{cluster.namespace}/pods").status_code == 403  # it has no Role
    wait_until(lambda: audited_calls(audit_log, marker.user), what="the marker request in the audit log")


def test_the_chart_role_grants_exactly_the_calls_the_operator_makes(
    cluster: Cluster, redis_url: str, tmp_path: Path
) -> None:
    ns = cluster.namespace
    assert cluster.kube.control_plane is not None
    audit_log = cluster.kube.control_plane.audit_log
    operator_sa = service_account(cluster, "operator", chart_role(ns), tmp_path)
    hook_sa = service_account(cluster, "uninstall", chart_role(ns, "uninstall"), tmp_path)
    test_sa = service_account(
        cluster, "smoke-test", chart_role(ns, "test", {"defaultPool": {"enabled": True}}), tmp_path
    )
    marker = service_account(cluster, "audit-marker", (), tmp_path)
    wait_admission_maps_our_kinds(cluster, tmp_path)
    # As the chart runs it: peering on a namespaced KopfPeering (the chart creates it).
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "ardiff"}}
    assert (
        cluster.http.post(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings", json=peering).status_code == 201
    )
    process = cluster.operator(
        redis_url,
        tmp_path / "operator.log",
        ("ardiff", "operator", "run", "--peering", "ardiff", "--priority", "0"),
        kubeconfig=operator_sa.kubeconfig,
    ).start()
    try:
        process.wait_ready()
        # A pool from an earlier version carries the operator's old finalizer: kopf removes it.
        # Room for a second pod: the changed workers' URL below rolls the pool (issue 23 item 12).
        cluster.create_pool(finalizers=["ardiffusion.dev/finalizer"], replicas={"min": 1, "max": 2})
        wait_until(
            lambda: not cluster.get("ardiffusionworkerpools", "pool")["metadata"].get("finalizers"),
            what="the old finalizer to be removed",
        )
        # So does a session's (kopf's only PATCH of a session now: admission writes its token Secret and its
        # status, and kopf writes progress annotations only for a retried handler).
        cluster.create_session("s", finalizers=["ardiffusion.dev/finalizer"])
        cluster.wait_phase("s", "Ready")
        assert not cluster.session("s")["metadata"].get("finalizers")
        assert cluster.tick("s", 0).status_code == 200
        # The pool's Pod, Service, workers' Secret and budget, the session's token Secret: the operator's
        # children, made with ownerReferences that block their owner's deletion.
        owned = blocking_owners(cluster)
        cluster.create_session("pic", image={"configMapKeyRef": {"name": "missing", "key": "png"}})
        cluster.wait_phase("pic", "Failed", reason="ImageNotFound")

        # A restart under a busy pod, with the workers' URL changed (an equivalent one).
        process.stop()
        worker_url = cluster.kube.redis_url_for_pods(redis_url) + "?health_check_interval=30"
        process.env = {**process.env, "ARDIFF_WORKER_REDIS_URL": worker_url}
        process.start().wait_ready()
        secret = worker_redis_secret_name("pool")
        data = cluster.get("secrets", secret, core=True)["data"]
        user = [base64.b64decode(data[k]).decode() for k in ("redis-username", "redis-password")]
        wait_until(  # with the pool's own Redis user in it (issue 23 item 1)
            lambda: (
                cluster.get("secrets", secret, core=True)["data"]["url"] == _b64(with_user(worker_url, *user))
            ),
            what="the workers' Redis Secret to follow the new URL",
        )
        wait_until(
            lambda: any(
                c.verb == "get" and c.resource == "poddisruptionbudgets"
                for c in audited_calls(audit_log, operator_sa.user)
            ),
            what="the restarted operator to read the existing budget",
        )
        assert cluster.tick("s", 1).status_code == 200  # on its pod, made with the old Secret: it stays
        cluster.wait_pods(2)  # the pool's new pod, made with the new Secret, takes the next session

        # The chart's `helm test` (its own ServiceAccount): a session created, Ready, ticked once, deleted.
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
            env=kube_env(test_sa.kubeconfig),
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

        # The chart's pre-delete hook (its own ServiceAccount) deletes the sessions, then the pool, through
        # this operator.
        done = run_uninstall(cluster, POOL_FINALIZE_SECONDS, hook_sa.kubeconfig)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"no session, pool or worker pod is left in {ns}" in done.stdout
        # Owned objects (token and workers' Secrets, the budget) follow through garbage collection.
        wait_until(lambda: not ours(cluster), what="nothing of ours left")
    finally:
        process.stop()
        sys.stdout.write(f"\n----- operator log -----\n{process.log()[-20000:]}\n")
    wait_audited(cluster, marker)
    requests = audited_calls(audit_log, operator_sa.user)
    hook_requests = audited_calls(audit_log, hook_sa.user)
    test_requests = audited_calls(audit_log, test_sa.user)

    # What OwnerReferencesPermissionEnforcement asked of the operator's creates of its children.
    implied: Grants = {}
    for (resource, name), owners in owned.items():
        assert any(c.verb == "create" and (c.resource, c.name) == (resource, name) for c in requests), name
        for key in owners:
            implied.setdefault(key, set()).add("update")
    pools, sessions = (
        ("ardiffusion.dev", "ardiffusionworkerpools/finalizers"),
        (
            "ardiffusion.dev",
            "ardiffusionsessions/finalizers",
        ),
    )
    assert sorted((resource, sorted(o)) for (resource, _), o in owned.items()) == sorted(
        [
            ("pods", [pools]),
            ("services", [pools]),
            ("secrets", [pools]),  # the workers' Redis Secret
            ("poddisruptionbudgets", [pools]),
            ("secrets", [sessions]),  # the session's token Secret
        ]
    )
    assert implied == {pools: {"update"}, sessions: {"update"}}

    # Its permission check at start is every identity's; the rest is the Role's.
    assert used_grants(c for c in requests if (c.group, c.resource) in EVERY_IDENTITY) == EVERY_IDENTITY
    calls = [c for c in requests if (c.group, c.resource) not in EVERY_IDENTITY]
    # Namespaced mode needs nothing cluster-scoped and nothing outside the namespace it watches.
    assert {call.namespace for call in calls} == {ns}
    used = used_grants(calls)
    for key, verbs in implied.items():
        used.setdefault(key, set()).update(verbs)
    granted = role_grants(chart_role(ns))
    assert without(used, granted) == {}, "calls the Role does not grant"
    assert without(granted, used) == {}, "grants no call of the scenario uses"
    # The real authorizer (and admission) refused none of them.
    assert [c for c in requests if c.code == 403] == []
    # The hook's Role grants exactly what `ardiff operator uninstall` calls.
    assert {call.namespace for call in hook_requests} == {ns}
    assert used_grants(hook_requests) == role_grants(chart_role(ns, "uninstall"))
    assert {call.namespace for call in test_requests} == {ns}
    assert used_grants(test_requests) == role_grants(
        chart_role(ns, "test", {"defaultPool": {"enabled": True}})
    )
    assert [c for c in [*hook_requests, *test_requests] if c.code == 403] == []


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def permission_set(rules: Iterable[dict]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_operators_permission_check_asks_for_exactly_the_chart_roles_rules() -> None:
    """`operator/permissions.py` (checked at start, SelfSubjectAccessReview per permission) lists what the
    chart grants: the Role of namespaced mode, the ClusterRole of `clusterWide: true`."""
    for rules, cluster_wide in ((chart_role("worlds"), False), (chart_cluster_role(), True)):
        listed = required(cluster_wide=cluster_wide)
        assert len(set(listed)) == len(listed)
        assert {(p.group, p.resource, p.verb) for p in listed} == permission_set(rules), cluster_wide


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
    expected = {key: verbs for key, verbs in namespaced.items() if key != ("kopf.dev", "kopfpeerings")}
    expected |= {key: verbs for key, (verbs, _reason) in CLUSTER_WIDE_ONLY.items()}
    assert role_grants(chart_cluster_role()) == expected
