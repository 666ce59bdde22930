"""Admission of built-in kinds (`ardiff.devcluster.core_validation`): what kube-apiserver refuses, and where.

The cases follow upstream's tables (`pkg/apis/core/validation/validation_test.go`: TestValidateLabels,
TestValidateAnnotations, TestValidateEnv, TestValidateTolerations, TestValidateResourceRequirements,
TestValidateContainers, TestValidateConfigMap, TestValidateSecret; `pkg/apis/policy/validation`:
TestValidateMinAvailablePodDisruptionBudgetSpec): input → the field path and message upstream rejects it with.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from typing import Any

import httpx
import pytest

from ardiff.devcluster import core_validation
from ardiff.devcluster.core_validation import MAX_SECRET_SIZE, TOTAL_ANNOTATION_SIZE_LIMIT, validate
from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.kubectl import run_kubectl
from ardiff.operator.pods import build_pool_service, build_worker_pod, build_worker_redis_secret
from ardiff.operator.specs import WorkerPoolSpec

GPU = "nvidia.com/gpu"


def pod(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "img", **container}]},
    }


def with_spec(**spec: Any) -> dict[str, Any]:
    body = pod()
    body["spec"].update(spec)
    return body


def with_meta(**meta: Any) -> dict[str, Any]:
    body = pod()
    body["metadata"].update(meta)
    return body


def errors(kind: str, obj: dict[str, Any]) -> list[str]:
    return [str(e) for e in validate(kind, obj)]


C0 = "spec.containers[0]"
POD_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    # TestValidateResourceRequirements / extended resources
    (
        "gpu request without limit",
        pod(resources={"requests": {GPU: "1"}}),
        [f"{C0}.resources.limits: Required value: Limit must be set for non overcommitable resources"],
    ),
    (
        "gpu request != limit",
        pod(resources={"requests": {GPU: "1"}, "limits": {GPU: "2"}}),
        [f'{C0}.resources.requests: Invalid value: "1": must be equal to {GPU} limit of 2'],
    ),
    (
        "fractional gpu",
        pod(resources={"limits": {GPU: "0.5"}}),
        [f'{C0}.resources.limits[{GPU}]: Invalid value: "500m": must be an integer'],
    ),
    (
        "negative cpu",
        pod(resources={"limits": {"cpu": "-1"}}),
        [f'{C0}.resources.limits[cpu]: Invalid value: "-1": must be greater than or equal to 0'],
    ),
    (
        "cpu request above limit",
        pod(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}),
        [f'{C0}.resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1500m'],
    ),
    (
        "unknown standard resource",
        pod(resources={"limits": {"gpus": "1"}}),
        [f'{C0}.resources.limits[gpus]: Invalid value: "gpus": must be a standard resource for containers'],
    ),
    # TestValidateEnv (the 1.28 rule)
    ("env name empty", pod(env=[{"name": "", "value": "x"}]), [f"{C0}.env[0].name: Required value"]),
    (
        "env name with '='",
        pod(env=[{"name": "A=B", "value": "x"}]),
        [
            f'{C0}.env[0].name: Invalid value: "A=B": a valid environment variable name must consist of '
            "alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. "
            "'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is "
            "'[-._a-zA-Z][-._a-zA-Z0-9]*')"
        ],
    ),
    ("env name starting with a digit", pod(env=[{"name": "1FOO"}]), [f"{C0}.env[0].name"]),
    (
        "env name '..'",
        pod(env=[{"name": ".."}]),
        [f"{C0}.env[0].name: Invalid value: \"..\": must not be '..'"],
    ),
    (
        "env value and valueFrom",
        pod(env=[{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]),
        [f'{C0}.env[0].valueFrom: Invalid value: "": may not be specified when `value` is not empty'],
    ),
    (
        "env fieldRef not supported",
        pod(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]),
        [f'{C0}.env[0].valueFrom.fieldRef.fieldPath: Unsupported value: "spec.containers"'],
    ),
    # TestValidateContainers
    (
        "container name not a DNS label",
        pod(name="Worker_1"),
        [f'{C0}.name: Invalid value: "Worker_1": a lowercase RFC 1123 label must consist of'],
    ),
    ("container image missing", pod(image=""), [f"{C0}.image: Required value"]),
    (
        "duplicate container names",
        with_spec(containers=[{"name": "c", "image": "a"}, {"name": "c", "image": "b"}]),
        ['spec.containers[1].name: Duplicate value: "c"'],
    ),
    ("no containers", with_spec(containers=[]), ["spec.containers: Required value"]),
    (
        "container port out of range",
        pod(ports=[{"containerPort": 70000}]),
        [f"{C0}.ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"],
    ),
    (
        "port name too long",
        pod(ports=[{"name": "a-very-long-port-name", "containerPort": 80}]),
        [f'{C0}.ports[0].name: Invalid value: "a-very-long-port-name": must be no more than 15 characters'],
    ),
    (
        "duplicate port names",
        pod(ports=[{"name": "http", "containerPort": 80}, {"name": "http", "containerPort": 81}]),
        [f'{C0}.ports[1].name: Duplicate value: "http"'],
    ),
    (
        "port protocol",
        pod(ports=[{"containerPort": 80, "protocol": "HTTP"}]),
        [f'{C0}.ports[0].protocol: Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP"'],
    ),
    # TestValidateTolerations
    (
        "Exists with a value",
        with_spec(tolerations=[{"key": GPU, "operator": "Exists", "value": "yes"}]),
        ["spec.tolerations[0].operator: Invalid value: ", "value must be empty when `operator` is 'Exists'"],
    ),
    (
        "tolerationSeconds without NoExecute",
        with_spec(tolerations=[{"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 10}]),
        [
            "spec.tolerations[0].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute' when "
            "`tolerationSeconds` is set"
        ],
    ),
    (
        "empty key needs Exists",
        with_spec(tolerations=[{"operator": "Equal", "value": "v"}]),
        ['spec.tolerations[0].operator: Invalid value: "Equal": operator must be Exists when `key` is empty'],
    ),
    (
        "toleration key",
        with_spec(tolerations=[{"key": "nospecialchars^=@", "operator": "Exists"}]),
        ['spec.tolerations[0].key: Invalid value: "nospecialchars^=@": name part must consist of'],
    ),
    (
        "toleration effect",
        with_spec(tolerations=[{"key": "k", "operator": "Exists", "effect": "Never"}]),
        ['spec.tolerations[0].effect: Unsupported value: "Never"'],
    ),
    # TestValidateLabels / TestValidateAnnotations
    (
        "label value of 64 characters",
        with_meta(labels={"a": "x" * 64}),
        [f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters'],
    ),
    (
        "label value starting with a dash",
        with_meta(labels={"a": "-starts-with-dash"}),
        ['metadata.labels: Invalid value: "-starts-with-dash": a valid label must be an empty string or'],
    ),
    (
        "label key with two slashes",
        with_meta(labels={"only/one/slash": "v"}),
        ['metadata.labels: Invalid value: "only/one/slash": a qualified name must consist of'],
    ),
    (
        "label key with an upper-case prefix",
        with_meta(labels={"Example.com/abc": "v"}),
        ['metadata.labels: Invalid value: "Example.com/abc": prefix part a lowercase RFC 1123 subdomain'],
    ),
    (
        "label key name part of 64 characters",
        with_meta(labels={"a" * 64: "v"}),
        [f'metadata.labels: Invalid value: "{"a" * 64}": name part must be no more than 63 characters'],
    ),
    (
        "annotation key",
        with_meta(annotations={"cantendwithadash-": "v"}),
        ['metadata.annotations: Invalid value: "cantendwithadash-": name part must consist of'],
    ),
    (
        "annotations over 256 KiB",
        with_meta(annotations={"a": "x" * TOTAL_ANNOTATION_SIZE_LIMIT}),
        ["metadata.annotations: Too long: must have at most 262144 bytes"],
    ),
    (
        "nodeSelector value",
        with_spec(nodeSelector={"gpu": "a b"}),
        ['spec.nodeSelector: Invalid value: "a b": a valid label must be'],
    ),
    (
        "subdomain",
        with_spec(subdomain="Pool.Workers"),
        ['spec.subdomain: Invalid value: "Pool.Workers": a lowercase RFC 1123 label'],
    ),
    (
        "restartPolicy",
        with_spec(restartPolicy="Sometimes"),
        [
            'spec.restartPolicy: Unsupported value: "Sometimes": '
            'supported values: "Always", "Never", "OnFailure"'
        ],
    ),
]


@pytest.mark.parametrize(("case", "obj", "expected"), POD_CASES, ids=[c[0] for c in POD_CASES])
def test_pods_are_refused_where_the_apiserver_refuses_them(
    case: str, obj: dict[str, Any], expected: list[str]
) -> None:
    found = errors("pods", obj)
    assert len(found) == 1, found
    for fragment in expected:
        assert fragment in found[0]


@pytest.mark.parametrize(
    "obj",
    [
        pod(resources={"limits": {GPU: "1"}}),  # the request defaults to the limit
        pod(resources={"requests": {GPU: 2}, "limits": {GPU: "2"}}),
        pod(resources={"requests": {"cpu": "500m", "memory": "1Gi"}}),  # native resources may overcommit
        pod(resources={"requests": {"cpu": "0.5"}, "limits": {"cpu": "1"}}),
        pod(env=[{"name": "my.env-name"}, {"name": "MY_ENV.NAME"}, {"name": "_x-1"}]),
        with_spec(
            tolerations=[
                {"operator": "Exists"},
                {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
            ]
        ),
        with_meta(
            labels={"example.com/MyName": "my_value", "k": ""}, annotations={"A.B/C_D": "anything at all"}
        ),
    ],
)
def test_valid_pods_pass(obj: dict[str, Any]) -> None:
    assert validate("pods", obj) == []


def test_the_operators_own_objects_pass() -> None:
    spec = WorkerPoolSpec.from_resource(
        {
            "model": {"name": "tiny-lingbot-world"},
            "image": "ghcr.io/ardiff/ardiff-worker:test",
            "resources": {"limits": {GPU: 1, "memory": "32Gi"}, "requests": {"cpu": "4"}},
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "env": [{"name": "ARDIFF_RUNTIME", "value": "fake"}],
        }
    )
    assert validate("pods", build_worker_pod("ns", "pool", spec, pod_name="pool-x7k2p")) == []
    assert validate("services", build_pool_service("ns", "pool")) == []
    assert validate("secrets", build_worker_redis_secret("ns", "pool", "redis://:pw@redis:6379/0")) == []


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        ("configmaps", {"data": {"a*b": "v"}}, 'data[a*b]: Invalid value: "a*b": a valid config key must'),
        ("configmaps", {"data": {"..a": "v"}}, "data[..a]: Invalid value: \"..a\": must not start with '..'"),
        (
            "configmaps",
            {"data": {"k": "v"}, "binaryData": {"k": b64(b"v")}},
            'data[k]: Invalid value: "k": duplicate of key present in binaryData',
        ),
        (
            "configmaps",
            {"binaryData": {"image.png": b64(b"x" * (MAX_SECRET_SIZE + 1))}},
            ": Too long: must have at most 1048576 bytes",
        ),
        ("secrets", {"data": {"a*b": b64(b"v")}}, 'data[a*b]: Invalid value: "a*b"'),
        (
            "secrets",
            {"data": {"a": b64(b"x" * MAX_SECRET_SIZE), "b": b64(b"x")}},
            "data: Too long: must have at most 1048576 bytes",
        ),
        (
            "poddisruptionbudgets.policy",
            {"spec": {"minAvailable": 1, "maxUnavailable": 1}},
            "minAvailable and maxUnavailable cannot be both set",
        ),
        (
            "poddisruptionbudgets.policy",
            {"spec": {"minAvailable": "101%"}},
            'spec.minAvailable: Invalid value: "101%": must not be greater than 100%',
        ),
        ("services", {"metadata": {"name": "1st"}, "spec": {"ports": [{"port": 80}]}}, "metadata.name"),
        ("services", {"spec": {"ports": []}}, "spec.ports: Required value"),
        (
            "services",
            {"spec": {"ports": [{"name": "a", "port": 80}, {"port": 81}]}},
            "spec.ports[1].name: Required value",
        ),
        (
            "events",
            {
                "eventTime": "2024-01-01T00:00:00.000000Z",
                "reportingComponent": "op",
                "reportingInstance": "i",
                "action": "A",
                "reason": "R",
                "message": "m" * 1025,
                "involvedObject": {"namespace": "ns"},
            },
            'message: Invalid value: "": can have at most 1024 characters',
        ),
    ],
)
def test_other_kinds_are_refused_where_the_apiserver_refuses_them(
    kind: str, obj: dict[str, Any], expected: str
) -> None:
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).setdefault("name", "obj")
    obj["metadata"]["namespace"] = "ns"
    found = errors(kind, obj)
    assert len(found) == 1, found
    assert expected in found[0]


def test_the_largest_config_map_fits() -> None:
    full = {"metadata": {"name": "m"}, "binaryData": {"image.png": b64(b"x" * MAX_SECRET_SIZE)}}
    assert validate("configmaps", full) == []


def test_quantities_print_in_canonical_form() -> None:
    canonical = [core_validation.parse_quantity(q)[1] for q in ("0.5", "1.5Gi", "2000", "1e3", 2, "100m")]
    assert canonical == ["500m", "1536Mi", "2k", "1k", "2", "100m"]
    with pytest.raises(core_validation.Undecodable, match="quantities must match the regular expression"):
        core_validation.parse_quantity("one")


# --- through the HTTP API and kubectl -----------------------------------------------------------------------


@pytest.fixture
def client(kube_api: KubeAPIThread) -> httpx.Client:
    return httpx.Client(base_url=kube_api.url, timeout=10)


def test_an_invalid_pod_is_a_422_invalid_status_like_the_apiservers(
    client: httpx.Client, kube_namespace: str
) -> None:
    body = pod(resources={"requests": {GPU: "1"}}, env=[{"name": "BAD NAME", "value": "x"}])
    body["metadata"] = {"name": "gpu-pod"}
    response = client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=body)
    assert response.status_code == 422
    status = response.json()
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Invalid", 422)
    assert status["message"].startswith('Pod "gpu-pod" is invalid: [spec.containers[0].env[0].name: Invalid')
    assert (status["details"]["name"], status["details"]["kind"]) == ("gpu-pod", "Pod")
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [
        ("spec.containers[0].env[0].name", "FieldValueInvalid"),
        ("spec.containers[0].resources.limits", "FieldValueRequired"),
    ]
    assert client.get(f"/api/v1/namespaces/{kube_namespace}/pods/gpu-pod").status_code == 404


def test_an_update_is_validated_too(client: httpx.Client, kube_namespace: str) -> None:
    path = f"/api/v1/namespaces/{kube_namespace}/configmaps"
    assert client.post(path, json={"metadata": {"name": "m"}, "data": {"k": "v"}}).status_code == 201
    patch = {"metadata": {"labels": {"tier": "x" * 64}}}
    response = client.patch(
        f"{path}/m", content=json.dumps(patch), headers={"Content-Type": "application/merge-patch+json"}
    )
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "metadata.labels"


def test_an_undecodable_quantity_is_a_400(client: httpx.Client, kube_namespace: str) -> None:
    body = pod(resources={"limits": {"cpu": "lots"}})
    body["metadata"] = {"name": "p"}
    response = client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=body)
    assert response.status_code == 400
    assert "quantities must match the regular expression" in response.json()["message"]


def config_map_manifest(size: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "picture"},
            "binaryData": {"image.png": b64(b"x" * size)},
        }
    )


def test_kubectl_apply_of_a_large_object_fails_on_its_last_applied_annotation(
    kube_api: KubeAPIThread, kube_namespace: str
) -> None:
    """Client-side apply copies the object into an annotation: over 256 KiB it is refused, like on a real
    server; `kubectl create` of the same object stores it (a ConfigMap holds up to 1 MiB, not a byte more)."""
    assert kube_api.kubeconfig is not None

    def kubectl(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return run_kubectl(
            ["-n", kube_namespace, *args], kubeconfig=kube_api.kubeconfig, stdin=stdin, check=False
        )

    applied = kubectl("apply", "-f", "-", stdin=config_map_manifest(300 << 10))
    assert applied.returncode == 1
    assert (
        'ConfigMap "picture" is invalid: metadata.annotations: Too long: must have at most 262144 bytes'
        in (applied.stderr)
    )
    too_big = kubectl("create", "-f", "-", stdin=config_map_manifest(MAX_SECRET_SIZE + 1))
    assert too_big.returncode == 1
    assert 'ConfigMap "picture" is invalid: : Too long: must have at most 1048576 bytes' in too_big.stderr
    created = kubectl("create", "-f", "-", stdin=config_map_manifest(MAX_SECRET_SIZE))
    assert created.returncode == 0
    assert "configmap/picture created" in created.stdout
