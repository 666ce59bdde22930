"""The chart's front door (issue 37, `gateway.*`): the Envoy and picker Deployment as rendered by the real
helm, its Services, budget and policies, the operator's flags, and the optional InferencePool and HTTPRoute,
which the real API server accepts with the upstream CRDs installed (from their Go modules)."""

from __future__ import annotations

import pytest

from ardiff.devcluster.gateway_crds import upstream_crds
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.operator.pods import WORKER_PORT, pool_labels
from tests.chart.test_chart import by_kind, one


def gateway_pod(chart, values=None):
    deployment = one(chart.render(values or {}), "Deployment", f"{chart.fullname}-gateway")
    return deployment, deployment["spec"]["template"]["spec"]


def test_the_gateway_runs_envoy_and_the_picker_from_one_image_with_a_generated_bootstrap(chart):
    deployment, pod = gateway_pod(chart)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert pod["automountServiceAccountToken"] is False  # it needs nothing of the API
    [bootstrap] = pod["initContainers"]
    envoy, picker = pod["containers"]
    image = "ghcr.io/ardiff/ardiff-gateway:0.1.0"
    assert {bootstrap["image"], envoy["image"], picker["image"]} == {image}
    assert [*bootstrap["command"], *bootstrap["args"]] == [
        "ardiff",
        "gateway",
        "bootstrap",
        "--out=/etc/envoy/envoy.yaml",
        "--listen-port=8080",
        "--health-port=8081",
        "--admin-port=9901",
        "--picker=127.0.0.1:9002",
        "--dynamic-dir=/etc/envoy/dynamic",
    ]
    assert envoy["command"] == ["envoy"]
    assert envoy["args"][:2] == ["-c", "/etc/envoy/envoy.yaml"]
    assert [*picker["command"], *picker["args"]] == [
        "ardiff",
        "gateway",
        "picker",
        "--listen=0.0.0.0:9002",
        "--http-listen=0.0.0.0:9003",
        "--dynamic-dir=/etc/envoy/dynamic",
        "--envoy-admin=127.0.0.1:9901",
        "--redis-url-file=/etc/ardiff/gateway-redis/url",
    ]
    # The gateway's Redis URL from the Secret the chart makes and the operator fills: a file (a rotated
    # password arrives without a restart), its CA beside it when the URL names one.
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = f"{chart.fullname}-gateway-redis"
    assert volumes["gateway-redis"]["secret"] == {
        "secretName": secret,
        "items": [{"key": "url", "path": "url"}],
    }
    assert volumes["redis-tls"]["secret"]["optional"] is True
    made = one(chart.render({}), "Secret", secret)
    assert "data" not in made
    assert "stringData" not in made
    # Ready means: Envoy answers, and the picker reaches Redis (its /readyz).
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "envoy-metrics"}
    assert picker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "picker-metrics"}
    # Replicas prefer different nodes.
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()


def test_the_gateway_service_is_cluster_ip_by_default_and_node_port_or_load_balancer_by_value(chart):
    service = one(chart.render({}), "Service", f"{chart.fullname}-gateway")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    values = {"gateway": {"service": {"type": "NodePort", "nodePort": 30080, "port": 8080}}}
    node_port = one(chart.render(values), "Service", f"{chart.fullname}-gateway")
    assert node_port["spec"]["type"] == "NodePort"
    assert node_port["spec"]["ports"][0]["nodePort"] == 30080
    picker = one(chart.render({}), "Service", f"{chart.fullname}-picker")
    assert [(p["name"], p["port"]) for p in picker["spec"]["ports"]] == [
        ("grpc", 9002),
        ("picker-metrics", 9003),
        ("envoy-metrics", 8081),
    ]


def test_tls_at_the_edge_mounts_the_secret_and_the_bootstrap_names_its_files(chart):
    _, pod = gateway_pod(chart, {"gateway": {"tls": {"secretName": "worlds-example-com"}}})
    assert pod["initContainers"][0]["args"][-2:] == [
        "--tls-cert-file=/etc/ardiff/gateway-tls/tls.crt",
        "--tls-key-file=/etc/ardiff/gateway-tls/tls.key",
    ]
    [volume] = [v for v in pod["volumes"] if v["name"] == "gateway-tls"]
    assert volume["secret"] == {"secretName": "worlds-example-com"}
    assert {"name": "gateway-tls", "mountPath": "/etc/ardiff/gateway-tls", "readOnly": True} in pod[
        "containers"
    ][0]["volumeMounts"]


def test_the_operator_writes_the_public_url_and_keeps_the_gateways_redis_user(chart):
    operator = f"{chart.fullname}-operator"

    def args(values):
        statefulset = one(chart.render(values), "StatefulSet", operator)
        return statefulset["spec"]["template"]["spec"]["containers"][0]["args"]

    with_url = args({"gateway": {"publicURL": "https://worlds.example.com"}})
    assert "--gateway-public-url=https://worlds.example.com" in with_url
    assert f"--gateway-redis-secret={chart.fullname}-gateway-redis" in with_url
    assert not [arg for arg in args({}) if arg.startswith("--gateway-public-url")]
    assert not [arg for arg in args({"gateway": {"enabled": False}}) if arg.startswith("--gateway")]
    off = chart.render({"gateway": {"enabled": False}})
    assert not [obj for obj in off if obj["metadata"]["name"].startswith(f"{chart.fullname}-gateway")]


def test_the_gateway_policy_opens_its_http_port_and_keeps_the_picker_and_metrics_to_their_clients(chart):
    prometheus = {"podSelector": {"matchLabels": {"app": "prometheus"}}}
    gie = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}
    values = {
        "networkPolicy": {"workerClients": [prometheus]},
        "gateway": {
            "inferenceExtension": {"enabled": True, "gatewayClients": [gie], "parentRefs": [{"name": "g"}]}
        },
        "defaultPool": {"enabled": True},
    }
    policy = one(chart.render(values), "NetworkPolicy", f"{chart.fullname}-gateway")
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": 8080, "protocol": "TCP"}]},
        {
            "from": [prometheus],
            "ports": [{"port": 8081, "protocol": "TCP"}, {"port": 9003, "protocol": "TCP"}],
        },
        {"from": [gie], "ports": [{"port": 9002, "protocol": "TCP"}]},
    ]
    assert one(chart.render({}), "NetworkPolicy", f"{chart.fullname}-gateway")["spec"]["ingress"] == [
        {"ports": [{"port": 8080, "protocol": "TCP"}]}
    ]


def test_the_service_monitor_scrapes_envoy_and_the_picker(chart):
    objects = chart.render({"monitoring": {"serviceMonitor": {"enabled": True}}})
    monitor = one(objects, "ServiceMonitor", f"{chart.fullname}-gateway")
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [
        ("envoy-metrics", "/stats/prometheus"),
        ("picker-metrics", "/metrics"),
    ]
    picker = one(objects, "Service", f"{chart.fullname}-picker")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= picker["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gateway": {"publicURL": "ftp://worlds.example.com"}}, "gateway.publicURL: Does not match pattern"),
        (
            {"gateway": {"publicURL": "https://w.example.com/?a=1"}},
            "gateway.publicURL: Does not match pattern",
        ),
        ({"gateway": {"service": {"type": "Ingress"}}}, "gateway.service.type must be one of"),
        ({"gateway": {"service": {"nodePort": 80}}}, "gateway.service.nodePort: Must be greater than"),
        ({"gateway": {"replicas": 0}}, "gateway.replicas: Must be greater than or equal to 1"),
        (
            {"gateway": {"inferenceExtension": {"enabled": True}}, "defaultPool": {"enabled": True}},
            "gateway.inferenceExtension.parentRefs must name the Gateway",
        ),
    ],
)
def test_bad_gateway_values_fail_with_a_clear_message(chart, values, message):
    result = chart.helm_with_values("template", values)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def inference_objects(chart, namespaces=None):
    values = {
        "defaultPool": {"enabled": True, "name": "worlds"},
        "gateway": {"inferenceExtension": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]}},
    }
    if namespaces:
        values["operator"] = {"watchNamespaces": namespaces}
    return chart.render(values)


def test_the_inference_extension_routes_each_pool_through_the_picker(chart):
    objects = inference_objects(chart)
    pool = one(objects, "InferencePool", "worlds")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == pool_labels("worlds")
    assert pool["spec"]["targetPorts"] == [{"number": WORKER_PORT}]
    assert pool["spec"]["endpointPickerRef"] == {
        "name": f"{chart.fullname}-picker",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    route = one(objects, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway"}]
    [rule] = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": f"/pools/{chart.namespace}/worlds/"}}]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "worlds"}
    ]
    assert not [s for s in by_kind(objects, "Service") if s["spec"].get("type") == "ExternalName"]
    # A pool in another namespace than the release's names the picker through an ExternalName there.
    elsewhere = inference_objects(chart, ["team-a"])
    [alias] = [s for s in by_kind(elsewhere, "Service") if s["spec"].get("type") == "ExternalName"]
    assert alias["metadata"]["namespace"] == "team-a"
    assert alias["spec"]["externalName"] == f"{chart.fullname}-picker.{chart.namespace}.svc.cluster.local"
    assert not by_kind(chart.render({}), "InferencePool")


@pytest.mark.slow
def test_the_real_api_server_accepts_the_inference_pool_and_the_route_with_the_upstream_crds(
    chart, dev_cluster, admission
):
    with dev_cluster.admin.client() as client:
        for crd in upstream_crds():
            created = client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
            assert created.status_code in (201, 409), created.text

        def established() -> bool:
            crds = client.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").json()["items"]
            names = {"httproutes.gateway.networking.k8s.io", "inferencepools.inference.networking.k8s.io"}
            return all(
                any(c["metadata"]["name"] == name and condition_true(c, "Established") for c in crds)
                for name in names
            )

        wait_until(established, timeout=60, what="the upstream CRDs established")
    for kind in ("InferencePool", "HTTPRoute"):
        verdict = admission.create(one(inference_objects(chart), kind))
        assert verdict.admitted, verdict.body
        assert verdict.pruned == [], verdict.pruned
