"""Static checks of charts/ardiff: lint, Kubernetes schemas, values schema, RBAC, security, wiring."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

import kubernetes_validate
import pytest

from ardiff.devcluster.pki import CertificateAuthority
from ardiff.kv.acl import OPERATOR_RULES, OPERATOR_USERNAME, PoolUsers, password_hash
from ardiff.kv.records import PoolId
from ardiff.operator.pods import WORKER_PORT, WORKER_PORT_NAME, pool_labels
from ardiff.worker.net import free_port

# Kinds kubernetes-validate has no schema for. The first three are checked against our CRDs instead
# (test_crds.py); ServiceMonitor belongs to the Prometheus Operator and is checked field by field below.
CUSTOM_KINDS = {"ARDiffusionWorkerPool", "KopfPeering", "ClusterKopfPeering", "ServiceMonitor"}
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest with bundled schemas.
KUBERNETES_VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
CLUSTER_SCOPED_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [obj for obj in by_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {[m['metadata'] for m in matches]}"
    return matches[0]


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj["spec"]["template"] for obj in objects if obj["kind"] in {"StatefulSet", "Deployment"}]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def test_helm_lint_strict(chart, variant):
    result = chart.helm_with_values("lint", variant)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_builtin_manifests_pass_kubernetes_validate_strict(chart, variant, kubernetes_version):
    objects = chart.render(variant, "--kube-version", kubernetes_version)  # as helm renders for it
    builtin = [obj for obj in objects if obj["kind"] not in CUSTOM_KINDS]
    assert len(builtin) >= 7
    for obj in builtin:
        # Raises ValidationError (unknown or mistyped field) or SchemaNotFoundError (a kind not listed above).
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


def test_defaults_render_the_documented_objects(chart):
    kinds = sorted(obj["kind"] for obj in chart.render())
    assert kinds == sorted(
        [
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "KopfPeering",
            "StatefulSet",  # operator
            "Service",  # operator (headless)
            "Secret",  # Redis URL, password, config
            "StatefulSet",  # Redis
            "Service",  # Redis
            "NetworkPolicy",  # workers
            "NetworkPolicy",  # Redis
            "PodDisruptionBudget",  # operator (the workers' budgets are the operator's, one per pool)
            # The pre-delete hook (clean uninstall): its ServiceAccount, rules and Job.
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Job",
            # What a pool may put in its Pods, refused at admission (workerPods; Kubernetes >= 1.30).
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            # The front door (gateway.enabled): its Redis Secret (the operator fills it), Envoy and the
            # picker, their account (no API access), the public Service, the picker's (gRPC, metrics), the
            # budget, the NetworkPolicy.
            "Secret",
            "ServiceAccount",
            "Deployment",
            "Service",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ]
    )
    old_cluster = [obj["kind"] for obj in chart.render({}, "--kube-version", "1.29.0")]
    assert not [kind for kind in old_cluster if kind.startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 0}}, "operator.replicas: Must be greater than or equal to 1"),
        (
            {"operator": {"replicas": "two"}},
            "operator.replicas: Invalid type. Expected: integer, given: string",
        ),
        ({"redis": {"mode": "sentinel"}}, 'redis.mode must be one of the following: "bundled", "external"'),
        (
            {"redis": {"mode": "external"}},
            "redis.external.url: String length must be greater than or equal to 1",
        ),
        (
            {"redis": {"mode": "external", "external": {"url": "http://redis:6379"}}},
            "redis.external.url: Does not match",
        ),
        ({"redis": {"bundled": {"password": "short"}}}, "redis.bundled.password: Does not match pattern"),
        ({"operator": {"podSecurityContext": {"runAsNonRoot": False}}}, "runAsNonRoot does not match: true"),
        (
            {"operator": {"securityContext": {"allowPrivilegeEscalation": True}}},
            "allowPrivilegeEscalation does",
        ),
        (
            {"operator": {"watchNamespaces": ["Not_A_Namespace"]}},
            "operator.watchNamespaces.0: Does not match",
        ),
        ({"operator": {"replica": 2}}, "operator: Additional property replica is not allowed"),
        ({"networkPolicy": {"workerClients": [{}]}}, "networkPolicy.workerClients.0: Must have at least 1"),
        (
            {"podDisruptionBudget": {"workers": {"maxUnavailable": 1}}},
            "podDisruptionBudget: Additional property workers is not allowed",
        ),
        ({"monitoring": {"serviceMonitor": {"interval": "often"}}}, "interval: Does not match pattern"),
        ({"imagePullSecrets": [{"name": "Bad_Name"}]}, "imagePullSecrets.0.name: Does not match pattern"),
        (
            {"redis": {"bundled": {"auth": {"existingSecret": "a", "existingSecretPasswordKey": "a/b"}}}},
            "existingSecretPasswordKey: Does not match pattern",
        ),
        # Cross-field rules that JSON schema would word badly fail in the templates instead.
        (
            {"clusterWide": True, "operator": {"watchNamespaces": ["team-a"]}},
            "operator.watchNamespaces must be empty when clusterWide is true",
        ),
        (
            {"operator": {"serviceAccount": {"create": False}}},
            "operator.serviceAccount.name is required when operator.serviceAccount.create is false",
        ),
        (
            {"redis": {"bundled": {"password": "x" * 20, "auth": {"existingSecret": "team-redis-auth"}}}},
            "redis.bundled.password and redis.bundled.auth.existingSecret are exclusive",
        ),
    ],
)
def test_bad_values_fail_with_a_clear_message(chart, values, message):
    result = chart.helm_with_values("template", values)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert result.stdout == ""


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs, one entry per pair."""
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                rules.setdefault((group, resource), set()).update(rule["verbs"])
    return rules


def _expected_rules(peering: str) -> dict[tuple[str, str], set[str]]:
    """What tests/operator/test_rbac.py sees the operator use (namespaced; cluster-wide adds CRD scanning)."""
    crs = {"list", "watch", "patch"}
    return {
        ("ardiffusion.dev", "ardiffusionworkerpools"): crs,
        ("ardiffusion.dev", "ardiffusionsessions"): crs,
        ("ardiffusion.dev", "ardiffusionworkerpools/status"): {"patch"},
        ("ardiffusion.dev", "ardiffusionsessions/status"): {"patch"},
        ("ardiffusion.dev", "ardiffusionworkerpools/finalizers"): {"update"},
        ("ardiffusion.dev", "ardiffusionsessions/finalizers"): {"update"},
        ("", "pods"): {"create", "delete", "list", "watch", "patch"},
        ("", "services"): {"create"},
        ("", "secrets"): {
            "create",
            "get",
            "patch",
        },  # never list/watch: no bulk read of the namespace's Secrets
        ("", "configmaps"): {"get"},
        ("", "events"): {"create"},
        ("policy", "poddisruptionbudgets"): {"create", "get", "patch"},
        ("kopf.dev", peering): {"list", "watch", "patch"},
    }


def test_rbac_has_no_wildcards(chart, variant):
    roles = [obj for obj in chart.render(variant) if obj["kind"] in {"Role", "ClusterRole"}]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule[field]), (role["metadata"]["name"], rule)


def test_following_drains_adds_one_cluster_scoped_rule_and_the_flag(chart):
    """operator.followDrains (off by default) is the explicit opt-in to `get nodes`: one ClusterRole of that
    rule for the operator's ServiceAccount, and the operator's --follow-drains."""
    operator = f"{chart.fullname}-operator"

    def operator_args(objects: list[dict]) -> list[str]:
        [statefulset] = [s for s in by_kind(objects, "StatefulSet") if s["metadata"]["name"] == operator]
        return statefulset["spec"]["template"]["spec"]["containers"][0]["args"]

    plain = chart.render({})
    assert "--follow-drains" not in operator_args(plain)
    assert not [r for r in by_kind(plain, "ClusterRole") if r["metadata"]["name"] == f"{operator}-nodes"]
    objects = chart.render({"operator": {"followDrains": True}})
    [role] = [r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"] == f"{operator}-nodes"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    [binding] = [
        b for b in by_kind(objects, "ClusterRoleBinding") if b["metadata"]["name"] == f"{operator}-nodes"
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": operator, "namespace": chart.namespace}]
    assert "--follow-drains" in operator_args(objects)


def test_namespaced_mode_is_least_privilege_and_nothing_cluster_scoped(chart):
    values = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
    # The admission policy is cluster-scoped (bound to the served namespaces only); without it, nothing is.
    cluster_scoped = [obj for obj in chart.render(values) if obj["kind"] in CLUSTER_SCOPED_KINDS]
    assert [obj["kind"] for obj in cluster_scoped] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    selector = cluster_scoped[1]["spec"]["matchResources"]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    values["workerPods"] = {"admissionPolicy": False}
    objects = chart.render(values)
    assert not [obj["kind"] for obj in objects if obj["kind"] in CLUSTER_SCOPED_KINDS]
    assert all(obj["metadata"].get("namespace") for obj in objects)
    operator = f"{chart.fullname}-operator"
    roles = [role for role in by_kind(objects, "Role") if role["metadata"]["name"] == operator]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _rules(role) == _expected_rules("kopfpeerings")
    for binding in [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"] == operator]:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": operator,
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": operator, "namespace": chart.namespace}
        ]
    peerings = by_kind(objects, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("team-a", chart.fullname),
        ("team-b", chart.fullname),
    ]
    args = one(objects, "StatefulSet", operator)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [arg for arg in args if arg.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert "--all-namespaces" not in args


def test_cluster_wide_mode_binds_a_cluster_role(chart):
    objects = chart.render({"clusterWide": True})
    assert not by_kind(objects, "Role")
    assert not by_kind(objects, "RoleBinding")
    operator = f"{chart.fullname}-operator"
    assert _rules(one(objects, "ClusterRole", operator)) == {
        **_expected_rules("clusterkopfpeerings"),
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    }
    binding = one(objects, "ClusterRoleBinding", operator)
    assert binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": operator, "namespace": chart.namespace}]
    assert one(objects, "ClusterKopfPeering")["metadata"]["name"] == chart.fullname
    assert not by_kind(objects, "KopfPeering")
    args = one(objects, "StatefulSet", operator)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert not [arg for arg in args if arg.startswith("--namespace")]


def test_operator_runs_the_contract_command_line(chart):
    operator = f"{chart.fullname}-operator"
    statefulset = one(chart.render({"operator": {"replicas": 2}}), "StatefulSet", operator)
    assert statefulset["spec"]["replicas"] == 2
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == operator
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/ardiff/ardiff-operator:0.1.0"
    assert container["command"] == ["ardiff"]
    assert container["args"] == [
        "operator",
        "run",
        f"--namespace={chart.namespace}",
        f"--peering={chart.fullname}",
        "--priority=$(ARDIFF_OPERATOR_PRIORITY)",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics=http://0.0.0.0:9090/metrics",
        f"--gateway-redis-secret={chart.fullname}-gateway-redis",
        "--allowed-volume-types=configMap,csi,downwardAPI,emptyDir,ephemeral,image,persistentVolumeClaim,"
        "projected,secret",
        "--allowed-service-accounts=",
    ]
    service_ports = one(chart.render({}), "Service", operator)["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service_ports] == [
        ("health", 8080, "health"),
        ("metrics", 9090, "metrics"),
    ]
    env = env_of(container)
    # Every replica gets a distinct peering priority (kopf pauses all operators that share the highest one).
    assert env["ARDIFF_OPERATOR_PRIORITY"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    secret_ref = {"secretKeyRef": {"name": f"{chart.fullname}-redis", "key": "url"}}
    assert env["ARDIFF_REDIS_URL"]["valueFrom"] == secret_ref
    assert env["ARDIFF_WORKER_REDIS_URL"]["valueFrom"] == secret_ref
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [
        {"name": "health", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
    ]


def test_every_pod_is_non_root_read_only_and_capability_free(chart, variant):
    templates = pod_templates(chart.render(variant))
    # The operator, the front door, and the bundled Redis unless it is external.
    assert len(templates) == (2 if variant.get("redis", {}).get("mode") == "external" else 3)
    for template in templates:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert "memory" in container["resources"]["limits"]


def test_bundled_redis_has_a_password_kept_out_of_command_lines(chart):
    password = "correct-horse-battery-staple"
    objects = chart.render({"redis": {"bundled": {"password": password}}})
    redis = f"{chart.fullname}-redis"
    secret = one(objects, "Secret", redis)["stringData"]
    assert secret["password"] == password
    assert secret["url"] == f"redis://{OPERATOR_USERNAME}:{password}@{redis}.{chart.namespace}.svc:6379/0"
    config = secret["redis.conf"].splitlines()
    # Issue 23 item 1: the operator logs in as its own user (kv/acl.py's rules), `default` is off, and the
    # config holds the password's SHA-256 only.
    assert operator_user_line(f"#{password_hash(password)}") in config
    assert "user default off resetchannels -@all" in config
    assert not [line for line in config if line.startswith("requirepass")]
    assert password not in secret["redis.conf"]
    assert "maxmemory-policy noeviction" in config
    assert {"appendonly no", 'save ""'} <= set(config)
    service = one(objects, "Service", redis)
    statefulset = one(objects, "StatefulSet", redis)
    assert service["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "redis", "port": 6379, "targetPort": "redis", "protocol": "TCP"}
    ]
    [container] = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["redis-server", "/etc/redis/redis.conf"]
    assert password not in str(statefulset)
    assert statefulset["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] == redis


def test_bundled_redis_password_is_generated_when_not_given(chart):
    secrets = [one(chart.render(), "Secret", f"{chart.fullname}-redis")["stringData"] for _ in range(2)]
    for secret in secrets:
        assert len(secret["password"]) == 40
        assert secret["password"].isalnum()
        assert (
            operator_user_line(f"#{password_hash(secret['password'])}") in secret["redis.conf"].splitlines()
        )
    assert secrets[0]["password"] != secrets[1]["password"]


AUTH_SECRET = {
    "redis": {"bundled": {"auth": {"existingSecret": "team-redis-auth", "existingSecretPasswordKey": "pw"}}}
}


def test_bundled_redis_password_from_an_existing_secret_is_never_rendered(chart):
    """GitOps: with auth.existingSecret every render is the same (no `lookup`, no random password), so no
    sync restarts Redis or the operator; the password is read from the user's Secret by the Pods."""
    renders = [chart.helm_with_values("template", AUTH_SECRET) for _ in range(2)]
    assert [result.returncode for result in renders] == [0, 0], renders[0].stderr
    assert renders[0].stdout == renders[1].stdout
    objects = chart.render(AUTH_SECRET)
    redis = f"{chart.fullname}-redis"
    secret = one(objects, "Secret", redis)["stringData"]
    assert set(secret) == {"redis.conf"}  # no password, no URL
    config = secret["redis.conf"].splitlines()
    assert "include /run/redis-auth/auth.conf" in config
    assert not [line for line in config if line.startswith("requirepass")]
    password_ref = {"secretKeyRef": {"name": "team-redis-auth", "key": "pw"}}
    pod = one(objects, "StatefulSet", redis)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert env_of(container)["REDISCLI_AUTH"]["valueFrom"] == password_ref
    assert container["command"][:2] == ["sh", "-c"]
    assert {"name": "auth", "mountPath": "/run/redis-auth"} in container["volumeMounts"]
    assert {"name": "auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod["volumes"]
    operator = one(objects, "StatefulSet", f"{chart.fullname}-operator")["spec"]["template"]["spec"]
    env = env_of(operator["containers"][0])
    assert env["ARDIFF_REDIS_PASSWORD"]["valueFrom"] == password_ref
    url = f"redis://{OPERATOR_USERNAME}:$(ARDIFF_REDIS_PASSWORD)@{redis}.{chart.namespace}.svc:6379/0"
    assert env["ARDIFF_REDIS_URL"] == {"name": "ARDIFF_REDIS_URL", "value": url}
    assert env["ARDIFF_WORKER_REDIS_URL"] == {"name": "ARDIFF_WORKER_REDIS_URL", "value": url}
    # The kubelet expands $(VAR) only from variables defined earlier in the list.
    names = [entry["name"] for entry in operator["containers"][0]["env"]]
    assert names.index("ARDIFF_REDIS_PASSWORD") < names.index("ARDIFF_REDIS_URL")


def operator_user_line(password: str) -> str:
    """The bundled Redis' `user` line of the operator, as kv/acl.py defines its user."""
    return " ".join(("user", OPERATOR_USERNAME, "on", password, *OPERATOR_RULES))


async def _make_a_pool_user(url: str) -> None:
    pool = PoolId("tenant", "worlds")
    users = PoolUsers.from_url(url)
    try:
        await users.ensure(pool, "a-pool-password-0123456789")
        assert await users.pools() == {pool}
    finally:
        await users.close()


def _start_redis_as_the_chart_does(chart, tmp_path, password: str) -> subprocess.Popen[bytes]:
    """The bundled Redis container's command and config with the container's paths mapped under tmp_path."""
    objects = chart.render(AUTH_SECRET)
    [container] = one(objects, "StatefulSet", f"{chart.fullname}-redis")["spec"]["template"]["spec"][
        "containers"
    ]
    port = free_port()
    auth_dir = tmp_path / "auth"
    auth_dir.mkdir(parents=True, exist_ok=True)
    config = one(objects, "Secret", f"{chart.fullname}-redis")["stringData"]["redis.conf"]
    config = config.replace("/run/redis-auth", str(auth_dir)).replace("dir /data", f"dir {tmp_path}")
    config = config.replace("port 6379", f"port {port}").replace("bind * -::*", "bind 127.0.0.1")
    (tmp_path / "redis.conf").write_text(config)
    script = container["command"][2].replace("/run/redis-auth", str(auth_dir))
    script = script.replace("/etc/redis/redis.conf", str(tmp_path / "redis.conf"))
    process = subprocess.Popen(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": password},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.port = port  # type: ignore[attr-defined]
    return process


def test_bundled_redis_requires_the_password_from_the_existing_secret(chart, tmp_path):
    import redis as redis_client
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    password = "k3y-from.a~secret_0123"
    process = _start_redis_as_the_chart_does(chart, tmp_path, password)
    client = functools.partial(redis_client.Redis, port=process.port, retry=Retry(NoBackoff(), 0))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client(username=OPERATOR_USERNAME, password=password).ping()
                break
            except redis_client.ConnectionError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with pytest.raises(redis_client.AuthenticationError):
            client().set("k", "v")
        with pytest.raises(redis_client.AuthenticationError):  # `default` is off, whatever its password
            client(password=password).set("k", "v")
        # The operator's user makes a pool's user, and may not FLUSHALL (issue 23 item 1).
        operator = client(username=OPERATOR_USERNAME, password=password)
        with pytest.raises(redis_client.exceptions.NoPermissionError):
            operator.flushall()
        asyncio.run(_make_a_pool_user(f"redis://{OPERATOR_USERNAME}:{password}@127.0.0.1:{process.port}/0"))
        assert oct((tmp_path / "auth" / "auth.conf").stat().st_mode & 0o777) == "0o600"
    finally:
        process.terminate()
        process.wait(10)
    for bad, message in (("short-1234", "at least 16"), ("has spaces in it 0123", "only letters")):
        failed = _start_redis_as_the_chart_does(chart, tmp_path / bad.replace(" ", "_"), bad)
        assert failed.wait(10) == 1
        assert message in failed.stderr.read().decode()


def test_image_pull_secrets_reach_the_operator_redis_and_the_default_pool(chart):
    values = {
        "imagePullSecrets": [{"name": "ghcr-pull"}],
        "operator": {"imagePullSecrets": [{"name": "operator-pull"}, {"name": "ghcr-pull"}]},
        "defaultPool": {"enabled": True, "spec": {"imagePullSecrets": [{"name": "pool-pull"}]}},
    }
    objects = chart.render(values)
    operator = one(objects, "StatefulSet", f"{chart.fullname}-operator")["spec"]["template"]["spec"]
    assert operator["imagePullSecrets"] == [{"name": "operator-pull"}, {"name": "ghcr-pull"}]
    redis = one(objects, "StatefulSet", f"{chart.fullname}-redis")["spec"]["template"]["spec"]
    assert redis["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    pool = one(objects, "ARDiffusionWorkerPool")["spec"]
    assert pool["imagePullSecrets"] == [{"name": "pool-pull"}, {"name": "ghcr-pull"}]
    defaults = chart.render({"defaultPool": {"enabled": True}})
    assert not [obj for obj in defaults if "imagePullSecrets" in json.dumps(obj)]


def test_bundled_redis_with_tls_speaks_tls_only_and_the_operator_verifies_its_ca(chart, tmp_path):
    """Issue 23 item 9: with redis.bundled.tls.secretName the bundled Redis serves TLS only (its rendered
    config, run here by a real redis-server with a CA made in the test), its probe speaks TLS, and the
    operator's rediss:// URL verifies the CA, which alone of that Secret is mounted in the operator's Pod."""
    password = "correct-horse-battery-staple"
    objects = chart.render({"redis": {"bundled": {"password": password, "tls": {"secretName": "redis-tls"}}}})
    redis = f"{chart.fullname}-redis"
    host = f"{redis}.{chart.namespace}.svc"
    secret = one(objects, "Secret", redis)["stringData"]
    url = f"rediss://{OPERATOR_USERNAME}:{password}@{host}:6379/0?ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt"
    assert secret["url"] == url
    redis_pod = one(objects, "StatefulSet", redis)["spec"]["template"]["spec"]
    [container] = redis_pod["containers"]
    assert {"name": "tls", "secret": {"secretName": "redis-tls"}} in redis_pod["volumes"]
    assert {"name": "tls", "mountPath": "/etc/redis-tls", "readOnly": True} in container["volumeMounts"]
    operator = one(objects, "StatefulSet", f"{chart.fullname}-operator")["spec"]["template"]["spec"]
    ca_only = {"secretName": "redis-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert {"name": "redis-tls", "secret": ca_only} in operator["volumes"]

    ca = CertificateAuthority(tmp_path / "pki", common_name="redis-ca")
    pair = ca.issue("redis", common_name=host, server=True, dns_names=[host], ip_addresses=["127.0.0.1"])
    files = {"/etc/redis-tls/tls.crt": pair.cert, "/etc/redis-tls/tls.key": pair.key}
    files |= {"/etc/redis-tls/ca.crt": ca.cert_path, "/etc/ardiff/redis-tls/ca.crt": ca.cert_path}
    port = free_port()
    config = (
        secret["redis.conf"]
        .replace("tls-port 6379", f"tls-port {port}")
        .replace("bind * -::*", "bind 127.0.0.1")
    )
    config = config.replace("dir /data", f"dir {tmp_path}")
    probe = container["readinessProbe"]["exec"]["command"][2].replace(
        "-h 127.0.0.1", f"-h 127.0.0.1 -p {port}"
    )
    for path, local in files.items():
        config, probe, url = (text.replace(path, str(local)) for text in (config, probe, url))
    (tmp_path / "redis.conf").write_text(config)
    process = subprocess.Popen([shutil.which("redis-server") or "redis-server", str(tmp_path / "redis.conf")])
    try:
        local_url = url.replace(f"@{host}:6379", f"@127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while subprocess.run(
            ["sh", "-c", probe], env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": password}
        ).returncode:
            assert process.poll() is None
            assert time.monotonic() < deadline, "the readiness probe never passed"
            time.sleep(0.05)
        asyncio.run(_make_a_pool_user(local_url))  # the operator's own calls, over TLS, verifying the CA
        plain = subprocess.run(
            ["redis-cli", "--user", OPERATOR_USERNAME, "-p", str(port), "ping"],
            env={"PATH": os.environ["PATH"], "REDISCLI_AUTH": password},
            capture_output=True,
            text=True,
        )
        assert "PONG" not in plain.stdout  # no plain TCP beside TLS
    finally:
        process.terminate()
        process.wait(10)


def test_redis_persistence_claims_a_volume(chart):
    objects = chart.render({"redis": {"bundled": {"persistence": {"enabled": True, "size": "5Gi"}}}})
    statefulset = one(objects, "StatefulSet", f"{chart.fullname}-redis")
    [claim] = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    redis_conf = one(objects, "Secret", f"{chart.fullname}-redis")["stringData"]["redis.conf"]
    assert "appendonly yes" in redis_conf.splitlines()


def test_external_redis_from_an_existing_secret_with_a_private_ca(chart):
    objects = chart.render(
        {
            "redis": {
                "mode": "external",
                "external": {
                    "existingSecret": "team-redis",
                    "existingSecretKey": "uri",
                    "tls": {"caSecret": "ca"},
                },
            }
        }
    )
    assert [s["metadata"]["name"] for s in by_kind(objects, "Secret")] == [f"{chart.fullname}-gateway-redis"]
    assert [obj["metadata"]["name"] for obj in by_kind(objects, "StatefulSet")] == [
        f"{chart.fullname}-operator"
    ]
    pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    assert env["ARDIFF_REDIS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "team-redis", "key": "uri"}}
    assert {"name": "redis-tls", "secret": {"secretName": "ca"}} in pod["volumes"]
    assert {"name": "redis-tls", "mountPath": "/etc/ardiff/redis-tls", "readOnly": True} in pod["containers"][
        0
    ]["volumeMounts"]


def test_external_redis_url_goes_into_a_secret(chart):
    url = "rediss://:s3cret@redis.example.com:6380/2"
    objects = chart.render({"redis": {"mode": "external", "external": {"url": url}}})
    assert one(objects, "Secret", f"{chart.fullname}-redis")["stringData"] == {"url": url}
    assert url not in str(one(objects, "StatefulSet"))


def test_worker_selectors_match_the_pods_the_operator_creates(chart):
    objects = chart.render(
        {"monitoring": {"serviceMonitor": {"enabled": True}}, "operator": {"watchNamespaces": ["a", "b"]}}
    )
    worker_labels = pool_labels("any-pool")
    workers = [obj for obj in objects if obj["metadata"]["name"] == f"{chart.fullname}-workers"]
    selectors = [obj["spec"]["podSelector"]["matchLabels"] for obj in by_kind(workers, "NetworkPolicy")]
    selectors.append(
        one(objects, "ServiceMonitor", f"{chart.fullname}-workers")["spec"]["selector"]["matchLabels"]
    )
    assert len(selectors) == 3
    for selector in selectors:
        assert selector.items() <= worker_labels.items()
        assert selector  # an empty selector would match every pod


def test_worker_network_policy_admits_the_operator_the_configured_clients_and_other_workers(chart):
    router = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "router"}}}
    objects = chart.render({"networkPolicy": {"workerClients": [router]}})
    policy = one(objects, "NetworkPolicy", f"{chart.fullname}-workers")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [ingress, front_door, workers] = policy["spec"]["ingress"]
    # Worker to worker (issue 12: a migrating session's new pod pulls it), on the worker port, and only from
    # the pods the operator makes as workers (no namespaceSelector: the policy's own namespace).
    [worker_peer] = workers["from"]
    assert worker_peer.keys() == {"podSelector"}
    assert worker_peer["podSelector"]["matchLabels"].items() <= pool_labels("any-pool").items()
    assert worker_peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "worker"
    assert workers["ports"] == [{"port": WORKER_PORT, "protocol": "TCP"}]
    operator_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": chart.namespace}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "ardiff",
                "app.kubernetes.io/instance": chart.release,
                "app.kubernetes.io/component": "operator",
            }
        },
    }
    assert ingress["from"] == [operator_peer, router]
    assert ingress["ports"] == [{"port": WORKER_PORT, "protocol": "TCP"}]
    # The front door forwards each session's requests to its pod (issue 37).
    gateway_peer = {
        "namespaceSelector": operator_peer["namespaceSelector"],
        "podSelector": {
            "matchLabels": {
                **operator_peer["podSelector"]["matchLabels"],
                "app.kubernetes.io/component": "gateway",
            }
        },
    }
    assert front_door == {"from": [gateway_peer], "ports": [{"port": WORKER_PORT, "protocol": "TCP"}]}
    gateway_pod_labels = one(objects, "Deployment", f"{chart.fullname}-gateway")["spec"]["template"][
        "metadata"
    ]["labels"]
    assert gateway_peer["podSelector"]["matchLabels"].items() <= gateway_pod_labels.items()
    no_gateway = chart.render({"gateway": {"enabled": False}})
    assert len(one(no_gateway, "NetworkPolicy", f"{chart.fullname}-workers")["spec"]["ingress"]) == 2
    operator_pod_labels = one(objects, "StatefulSet", f"{chart.fullname}-operator")["spec"]["template"][
        "metadata"
    ]["labels"]
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod_labels.items()

    redis_policy = one(objects, "NetworkPolicy", f"{chart.fullname}-redis")
    [redis_ingress] = redis_policy["spec"]["ingress"]
    assert redis_ingress["from"][:2] == [operator_peer, gateway_peer]  # the picker reads the store
    assert redis_ingress["from"][2]["podSelector"]["matchLabels"].items() <= pool_labels("p").items()
    assert redis_ingress["from"][2]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [chart.namespace]}
    ]
    assert redis_ingress["ports"] == [{"port": 6379, "protocol": "TCP"}]


def test_network_policy_can_be_turned_off(chart):
    assert not by_kind(chart.render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_service_monitor_scrapes_worker_metrics_in_the_watched_namespaces(chart):
    values = {
        "monitoring": {"serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}}}
    }
    objects = chart.render(values)
    monitor = one(objects, "ServiceMonitor", f"{chart.fullname}-workers")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [chart.namespace]}
    assert monitor["spec"]["endpoints"] == [{"port": WORKER_PORT_NAME, "path": "/metrics", "interval": "30s"}]
    cluster_wide = one(
        chart.render({**values, "clusterWide": True}), "ServiceMonitor", f"{chart.fullname}-workers"
    )
    assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}
    # The operator's own metrics (the autoscaling signals): its Service's `metrics` port, in its namespace.
    name = f"{chart.fullname}-operator"
    operator = one(objects, "ServiceMonitor", name)
    assert operator["metadata"]["labels"]["release"] == "prom"
    assert operator["spec"]["namespaceSelector"] == {"matchNames": [chart.namespace]}
    assert operator["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    service = one(objects, "Service", name)
    assert operator["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert not by_kind(chart.render({}), "ServiceMonitor")  # off by default


def test_pod_disruption_budgets(chart):
    objects = chart.render({"operator": {"watchNamespaces": ["a", "b"]}})
    budgets = {obj["metadata"]["name"]: obj["spec"] for obj in by_kind(objects, "PodDisruptionBudget")}
    operator = one(objects, "StatefulSet", f"{chart.fullname}-operator")
    # Only the operator's: a chart budget over worker pods would put busy pods under two budgets (the
    # eviction API refuses such a pod) and, sized from the pool's Scale, let busy pods go.
    gateway = one(objects, "Deployment", f"{chart.fullname}-gateway")
    assert budgets == {
        f"{chart.fullname}-operator": {"maxUnavailable": 1, "selector": operator["spec"]["selector"]},
        f"{chart.fullname}-gateway": {"maxUnavailable": 1, "selector": gateway["spec"]["selector"]},
    }
    rules = [rule for role in by_kind(objects, "Role") for rule in role["rules"]]
    assert {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["create", "get", "patch"],
    } in rules
    off = {"podDisruptionBudget": {"operator": {"enabled": False}}, "gateway": {"enabled": False}}
    assert not by_kind(chart.render(off), "PodDisruptionBudget")


HOOK = {"helm.sh/hook": "pre-delete", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}


def test_uninstall_hook_deletes_the_custom_resources_before_the_operator_goes(chart):
    name = f"{chart.fullname}-uninstall"
    objects = chart.render(
        {"operator": {"watchNamespaces": ["a", "b"]}, "uninstall": {"timeoutSeconds": 300}}
    )
    hooks = [obj for obj in objects if obj["metadata"]["name"] == name]
    assert sorted(obj["kind"] for obj in hooks) == [
        "Job",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "ServiceAccount",
    ]
    for obj in hooks:
        annotations = obj["metadata"]["annotations"]
        # Its ServiceAccount and rules exist before the Job starts (lower weight) and go with it.
        assert annotations == (HOOK if obj["kind"] == "Job" else {**HOOK, "helm.sh/hook-weight": "-10"})
    assert sorted(role["metadata"]["namespace"] for role in by_kind(hooks, "Role")) == ["a", "b"]
    # What `ardiff operator uninstall` calls (recorded in tests/operator/test_rbac.py).
    for role in by_kind(hooks, "Role"):
        assert _rules(role) == {
            ("ardiffusion.dev", "ardiffusionsessions"): {"list", "delete"},
            ("ardiffusion.dev", "ardiffusionworkerpools"): {"list", "delete"},
            ("", "pods"): {"list"},
        }
    job = one(hooks, "Job")
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 420
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/ardiff/ardiff-operator:0.1.0"
    assert [*container["command"], *container["args"]] == [
        "ardiff",
        "operator",
        "uninstall",
        "--namespace=a",
        "--namespace=b",
        "--timeout=300",
    ]
    cluster_wide = [obj for obj in chart.render({"clusterWide": True}) if obj["metadata"]["name"] == name]
    assert sorted(obj["kind"] for obj in cluster_wide) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "ServiceAccount",
    ]
    assert (
        one(cluster_wide, "Job")["spec"]["template"]["spec"]["containers"][0]["args"][2] == "--all-namespaces"
    )
    off = chart.render({"uninstall": {"deleteCustomResources": False}})
    assert not [obj for obj in off if obj["metadata"]["name"] == name]


def test_helm_test_ticks_a_session_on_the_default_pool(chart):
    name = f"{chart.fullname}-test"
    values = {"defaultPool": {"enabled": True, "name": "gpus", "spec": {"startupTimeoutSeconds": 1200}}}
    objects = chart.render(values)
    tests = [obj for obj in objects if obj["metadata"]["name"] == name]
    assert sorted(obj["kind"] for obj in tests) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    test_hook = {**HOOK, "helm.sh/hook": "test"}
    for obj in tests:
        annotations = obj["metadata"]["annotations"]
        assert annotations == (
            test_hook if obj["kind"] == "Pod" else {**test_hook, "helm.sh/hook-weight": "-10"}
        )
    # What `ardiff operator smoke-test` calls (recorded in tests/operator/test_rbac.py).
    assert _rules(one(tests, "Role")) == {
        ("ardiffusion.dev", "ardiffusionsessions"): {"create", "get", "delete"},
        ("ardiffusion.dev", "ardiffusionworkerpools"): {"get"},
        ("", "secrets"): {"get"},
    }
    pod = one(tests, "Pod")
    [container] = pod["spec"]["containers"]
    assert [*container["command"], *container["args"]] == [
        "ardiff",
        "operator",
        "smoke-test",
        f"--namespace={chart.namespace}",
        "--pool=gpus",
        "--timeout=1200",
        f"--gateway-url=http://{chart.fullname}-gateway.{chart.namespace}.svc:80",  # the front door
    ]
    # Without the front door, the workers' NetworkPolicy admits it (its labels), on the worker port only.
    objects = chart.render({**values, "gateway": {"enabled": False}})
    pod = one([obj for obj in objects if obj["metadata"]["name"] == name], "Pod")
    assert pod["spec"]["containers"][0]["args"][-1] == "--timeout=1200"
    policy = one(objects, "NetworkPolicy", f"{chart.fullname}-workers")
    [_, _, test_rule] = policy["spec"]["ingress"]
    [peer] = test_rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert test_rule["ports"] == [{"port": WORKER_PORT, "protocol": "TCP"}]
    assert not [obj for obj in chart.render() if obj["metadata"]["name"] == name]  # no default pool: no test


def test_default_pool_runs_the_worker_image_and_merges_the_users_spec(chart):
    values = {"defaultPool": {"enabled": True, "name": "gpus", "spec": {"replicas": {"max": 4}}}}
    pool = one(chart.render(values), "ARDiffusionWorkerPool")
    assert pool["apiVersion"] == "ardiffusion.dev/v1alpha1"
    assert (pool["metadata"]["name"], pool["metadata"]["namespace"]) == ("gpus", chart.namespace)
    assert pool["spec"] == {
        "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
        "model": {"name": "tiny-lingbot-world"},
        "replicas": {"min": 1, "max": 4},
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    custom = {"defaultPool": {"enabled": True, "spec": {"image": "registry.local/worker:dev"}}}
    assert one(chart.render(custom), "ARDiffusionWorkerPool")["spec"]["image"] == "registry.local/worker:dev"
    assert not by_kind(chart.render(), "ARDiffusionWorkerPool")


def render_notes(chart, tmp_path, values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (helm template skips NOTES; a copy renders it in a ConfigMap)."""
    copy = tmp_path / "ardiff"
    shutil.copytree(chart.path, copy)
    notes = (copy / "templates" / "NOTES.txt").read_text()
    (copy / "templates" / "_notes.tpl").write_text('{{- define "test.notes" -}}' + notes + "{{- end -}}")
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "notes"},
        "data": {"notes": "NOTES"},
    }
    template = json.dumps(configmap).replace('"NOTES"', '{{ include "test.notes" . | quote }}')
    (copy / "templates" / "notes.yaml").write_text(template)
    [configmap] = dataclasses.replace(chart, path=copy).render(values, "--show-only", "templates/notes.yaml")
    return configmap["data"]["notes"]


def test_notes_show_how_to_create_a_pool_and_a_session_and_tick_it(chart, tmp_path):
    notes = render_notes(chart, tmp_path, {})
    assert f"kubectl -n {chart.namespace} apply -f - <<'YAML'" in notes
    assert "kind: ARDiffusionWorkerPool" in notes
    assert "image: ghcr.io/ardiff/ardiff-worker:0.1.0" in notes
    assert "kind: ARDiffusionSession" in notes
    assert "--for=jsonpath='{.status.phase}'=Ready" in notes
    assert "/v1/sessions/my-world/ticks" in notes
    assert "Authorization: Bearer $TOKEN" in notes
    assert f"its URL is in Secret {chart.fullname}-redis (key url)" in notes
    auth = render_notes(chart, tmp_path / "auth", AUTH_SECRET)
    assert "its password is in your Secret team-redis-auth (key pw)" in auth
    assert f"rollout restart statefulset/{chart.fullname}-redis statefulset/{chart.fullname}-operator" in auth
    with_pool = render_notes(chart, tmp_path / "pool", {"defaultPool": {"enabled": True, "name": "gpus"}})
    assert "kind: ARDiffusionWorkerPool" not in with_pool
    assert f"kubectl -n {chart.namespace} get ardiffusionworkerpools gpus" in with_pool
    assert "poolRef: gpus" in with_pool


def test_readme_install_steps_are_the_ones_the_chart_prints(chart, tmp_path):
    readme = (chart.path.parents[1] / "README.md").read_text()
    section = readme.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    install_block = re.findall(r"```bash\n(.*?)```", section, re.S)[1]
    assert "helm install ardiff charts/ardiff -n worlds" in install_block
    notes = render_notes(dataclasses.replace(chart, release="ardiff", namespace="worlds"), tmp_path, {})
    printed = {line.strip() for line in notes.splitlines()}
    steps = [line.strip() for line in install_block.splitlines() if line.strip()]
    assert len(steps) > 30
    for line in steps:
        if not line.startswith("helm install"):
            assert line in printed, f"README step not printed by the chart's NOTES: {line}"
