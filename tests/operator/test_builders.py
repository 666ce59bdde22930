"""Pure builders of the operator, compared with exact dicts (no Redis). The pool that sets every Pod knob and
the Pods made from it are also judged by the session's real API server (server-side dry-run: `admission`)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from ardiff.devcluster.cluster import DevCluster
from ardiff.kv.records import token_sha256
from ardiff.operator.admission import build_placement_spec
from ardiff.operator.pods import (
    SECRET_HASH_ANNOTATION,
    TEMPLATE_HASH_ANNOTATION,
    build_pool_service,
    build_worker_env,
    build_worker_pod,
    build_worker_redis_secret,
    new_redis_password,
    new_transfer_token,
    read_redis_ca,
    secret_data_hash,
    session_identity_hash,
    worker_pod_name,
    worker_template_hash,
)
from ardiff.operator.specs import (
    ForkFrom,
    ImageRef,
    InvalidSpec,
    Playout,
    SessionResourceSpec,
    WorkerPoolSpec,
)
from ardiff.operator.tokens import build_token_secret, read_token
from tests.conftest import Admission

POOL_SPEC = {
    "model": {
        "name": "tiny-lingbot-world",
        "pipeline": "LingBotWorldCausalDMDPipeline",
        "height": 64,
        "width": 64,
    },
    "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
    "resources": {"limits": {"nvidia.com/gpu": 1}},
    "nodeSelector": {"gpu": "h200"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "env": [{"name": "ARDIFF_RUNTIME", "value": "fake"}, {"name": "ARDIFF_PORT", "value": "9000"}],
    "kv": {"gpuMemoryFraction": 0.5, "sessionCapacity": 4},
    "replicas": {"min": 1, "max": 3},
    "scaleDownDelaySeconds": 5,
    "eviction": {"minIdleSeconds": 0},
}

REDIS_CA_VOLUME = {
    "name": "redis-ca",
    "secret": {
        "secretName": "tiny-workers-redis",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
        "optional": True,
    },
}
LABELS = {
    "app.kubernetes.io/name": "ardiff",
    "app.kubernetes.io/component": "worker",
    "ardiffusion.dev/pool": "tiny",
}


def test_worker_pod_is_exactly_what_contracts_describe() -> None:
    spec = WorkerPoolSpec.from_resource(POOL_SPEC)
    pod = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c")
    probe = {"port": "http"}
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "tiny-ab12c",
            "namespace": "worlds",
            "labels": LABELS,
            # Of everything below but the name: any change to how Pods are rendered changes it, and rolls the
            # pools' pods when the operator is upgraded (safely: only pods that hold no session go).
            "annotations": {
                "ardiffusion.dev/template-hash": "8ea19dfd9dd9dd0a",
                # Of what an exported session must match (model, pipeline, size, dtype, runtime): issue 12.
                "ardiffusion.dev/identity-hash": "6fee671b8c80e317",
            },
        },
        "spec": {
            "hostname": "tiny-ab12c",
            "subdomain": "tiny-workers",
            "restartPolicy": "Always",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 30,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "worker",
                    "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
                    "command": ["ardiff", "worker", "serve"],
                    "env": [
                        {"name": "ARDIFF_MODEL", "value": "tiny-lingbot-world"},
                        {"name": "ARDIFF_PIPELINE", "value": "LingBotWorldCausalDMDPipeline"},
                        {"name": "ARDIFF_HEIGHT", "value": "64"},
                        {"name": "ARDIFF_WIDTH", "value": "64"},
                        {"name": "ARDIFF_KV_MEMORY_FRACTION", "value": "0.5"},
                        {"name": "ARDIFF_SESSION_CAPACITY", "value": "4"},
                        # The URL (and its password) stays in the pool's Secret, never in the Pod spec.
                        {
                            "name": "ARDIFF_REDIS_URL",
                            "valueFrom": {"secretKeyRef": {"name": "tiny-workers-redis", "key": "url"}},
                        },
                        # So is the pool's worker-to-worker transfer token (issue 12).
                        {
                            "name": "ARDIFF_TRANSFER_TOKEN",
                            "valueFrom": {
                                "secretKeyRef": {"name": "tiny-workers-redis", "key": "transfer-token"}
                            },
                        },
                        {"name": "ARDIFF_NAMESPACE", "value": "worlds"},
                        {"name": "ARDIFF_POOL", "value": "tiny"},
                        # Writable places on a read-only root filesystem (the volumes below).
                        {"name": "ARDIFF_MODEL_CACHE", "value": "/var/cache/ardiff/models"},
                        {"name": "HOME", "value": "/home/ardiff"},
                        {
                            "name": "ARDIFF_POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        },
                        {"name": "ARDIFF_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        # The pool's own env comes last and replaces a default of the same name.
                        {"name": "ARDIFF_RUNTIME", "value": "fake"},
                        {"name": "ARDIFF_PORT", "value": "9000"},
                    ],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                    # Waits spec.startupTimeoutSeconds (default 600) for the model to load.
                    "startupProbe": {
                        "httpGet": {"path": "/healthz", **probe},
                        "periodSeconds": 5,
                        "timeoutSeconds": 5,
                        "failureThreshold": 120,
                    },
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", **probe},
                        "periodSeconds": 10,
                        "timeoutSeconds": 5,
                        "failureThreshold": 3,
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", **probe},
                        "periodSeconds": 2,
                        "timeoutSeconds": 3,
                        "failureThreshold": 2,
                    },
                    # cpu and memory requested by default: not BestEffort.
                    "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "1", "memory": "2Gi"}},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "home", "mountPath": "/home/ardiff"},
                        {"name": "model-cache", "mountPath": "/var/cache/ardiff/models"},
                        # The Redis CA, where the URL's ssl_ca_certs points (TLS Redis; else no file).
                        {"name": "redis-ca", "mountPath": "/etc/ardiff/redis-tls", "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {"name": "home", "emptyDir": {}},
                {"name": "model-cache", "emptyDir": {}},
                REDIS_CA_VOLUME,
            ],
        },
    }


@pytest.mark.parametrize("kubernetes_version", ["1.28.0", kubernetes_validate.latest_version()])
def test_everything_the_operator_creates_passes_kubernetes_validate_strict(kubernetes_version: str) -> None:
    spec = WorkerPoolSpec.from_resource(POOL_SPEC)
    for obj in (
        build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c"),
        build_pool_service("worlds", "tiny"),
        build_worker_redis_secret("worlds", "tiny", "redis://redis:6379/0", transfer_token="t0k3n"),
        build_token_secret("worlds", "forest", "s3cret"),
    ):
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)


def test_template_hash_follows_what_the_pods_run_not_their_names_or_the_pool_size() -> None:
    spec = WorkerPoolSpec.from_resource(POOL_SPEC)
    digest = worker_template_hash("worlds", "tiny", spec)
    for name in ("tiny-ab12c", "tiny-zz999"):
        pod = build_worker_pod("worlds", "tiny", spec, pod_name=name)
        assert pod["metadata"]["annotations"] == {
            "ardiffusion.dev/template-hash": digest,
            "ardiffusion.dev/identity-hash": session_identity_hash("worlds", "tiny", spec),
        }
    assert len(digest) == 16
    assert worker_template_hash("worlds", "tiny", WorkerPoolSpec.from_resource(POOL_SPEC)) == digest
    # Scaling and eviction settings change no Pod: no roll.
    resized = {**POOL_SPEC, "replicas": {"min": 2, "max": 9}, "scaleDownDelaySeconds": 60}
    assert worker_template_hash("worlds", "tiny", WorkerPoolSpec.from_resource(resized)) == digest
    # What the worker runs does.
    for changed in (
        {**POOL_SPEC, "image": "ghcr.io/ardiff/ardiff-worker:0.2.0"},
        {**POOL_SPEC, "model": {**POOL_SPEC["model"], "height": 128}},
        {**POOL_SPEC, "env": [{"name": "ARDIFF_RUNTIME", "value": "vllm"}]},
        {**POOL_SPEC, "kv": {"gpuMemoryFraction": 0.5, "sessionCapacity": 2}},
    ):
        assert worker_template_hash("worlds", "tiny", WorkerPoolSpec.from_resource(changed)) != digest


def test_identity_hash_follows_what_an_exported_session_must_match() -> None:
    """A roll migrates sessions only between pods of one identity (issue 12): model, pipeline, height, width,
    dtype and runtime, the pool's env included; the image, the KV budget or the replicas do not change it."""
    identity = session_identity_hash("worlds", "tiny", WorkerPoolSpec.from_resource(POOL_SPEC))
    for same in (
        {**POOL_SPEC, "image": "ghcr.io/ardiff/ardiff-worker:0.2.0"},
        {**POOL_SPEC, "kv": {"gpuMemoryFraction": 0.5, "sessionCapacity": 2}},
        {**POOL_SPEC, "replicas": {"min": 2, "max": 9}},
        {**POOL_SPEC, "env": [*POOL_SPEC["env"], {"name": "EXTRA", "value": "1"}]},
    ):
        assert session_identity_hash("worlds", "tiny", WorkerPoolSpec.from_resource(same)) == identity
    for changed in (
        {**POOL_SPEC, "model": {**POOL_SPEC["model"], "height": 128}},
        {**POOL_SPEC, "model": {**POOL_SPEC["model"], "dtype": "float16"}},
        {**POOL_SPEC, "model": {**POOL_SPEC["model"], "name": "other-model"}},
        {**POOL_SPEC, "env": [{"name": "ARDIFF_RUNTIME", "value": "vllm"}]},
        {**POOL_SPEC, "env": [*POOL_SPEC["env"], {"name": "ARDIFF_WIDTH", "value": "32"}]},
    ):
        assert session_identity_hash("worlds", "tiny", WorkerPoolSpec.from_resource(changed)) != identity


def test_worker_pod_does_not_alias_the_spec() -> None:
    spec = WorkerPoolSpec.from_resource(POOL_SPEC)
    pod = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    pod["spec"]["tolerations"].clear()
    assert spec.resources == {"limits": {"nvidia.com/gpu": 1}}
    assert len(spec.tolerations) == 1


def test_worker_env_defaults_and_optional_settings() -> None:
    spec = WorkerPoolSpec.from_resource(
        {
            "image": "w:1",
            "model": {"path": "/models/lingbot", "dtype": "bfloat16"},
            "kv": {"cpuFreeMemoryBytes": 1024},
        }
    )
    env = {e["name"]: e.get("value") for e in build_worker_env("ns", "p", spec)}
    assert env == {
        "ARDIFF_MODEL": "/models/lingbot",
        "ARDIFF_PIPELINE": "LingBotWorldCausalDMDPipeline",
        "ARDIFF_HEIGHT": "480",
        "ARDIFF_WIDTH": "832",
        "ARDIFF_DTYPE": "bfloat16",
        "ARDIFF_KV_MEMORY_FRACTION": "0.9",
        "ARDIFF_CPU_FREE_MEMORY_BYTES": "1024",
        "ARDIFF_REDIS_URL": None,  # from the Secret p-workers-redis
        "ARDIFF_TRANSFER_TOKEN": None,  # from the same Secret
        "ARDIFF_NAMESPACE": "ns",
        "ARDIFF_POOL": "p",
        "ARDIFF_PORT": "8000",
        "ARDIFF_MODEL_CACHE": "/var/cache/ardiff/models",
        "HOME": "/home/ardiff",
        "ARDIFF_POD_NAME": None,
        "ARDIFF_POD_IP": None,
    }


def test_a_pool_that_admits_by_compute_tells_its_workers_the_bound() -> None:
    """Issue 25: the worker reports compute_fps = computeUtilisation x its throughput; a pool without a
    bound makes the same Pods as before (no roll on upgrade)."""
    bounded = WorkerPoolSpec.from_resource({"image": "w:1", "computeUtilisation": 0.9})
    env = {e["name"]: e.get("value") for e in build_worker_env("ns", "p", bounded)}
    assert env["ARDIFF_COMPUTE_UTILISATION"] == "0.9"
    plain = WorkerPoolSpec.from_resource({"image": "w:1", "computeUtilisation": 0})
    assert "ARDIFF_COMPUTE_UTILISATION" not in {e["name"] for e in build_worker_env("ns", "p", plain)}
    assert (plain.playout.fps, plain.playout.buffer_chunks) == (16.0, 2)  # the defaults


def test_pool_service_is_headless_and_selects_the_pool() -> None:
    assert build_pool_service("worlds", "tiny") == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "tiny-workers", "namespace": "worlds", "labels": LABELS},
        "spec": {
            "clusterIP": "None",
            "selector": LABELS,
            "publishNotReadyAddresses": True,  # a draining pod's name resolves: TLS peers pull from it
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def test_a_pool_with_tls_serves_https_with_its_secret_and_probes_over_https() -> None:
    """Issue 23 item 9: the pool's kubernetes.io/tls Secret mounted, the worker told where its files are (it
    then serves https and advertises its DNS name), the probes over https; a pool without TLS unchanged."""
    plain = WorkerPoolSpec.from_resource(POOL_SPEC)
    spec = WorkerPoolSpec.from_resource({**POOL_SPEC, "tls": {"secretName": "tiny-tls"}})
    assert (plain.tls_secret, spec.tls_secret) == (None, "tiny-tls")
    pod = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c")
    before = build_worker_pod("worlds", "tiny", plain, pod_name="tiny-ab12c")
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("tiny-ab12c", "tiny-workers")
    added = [v for v in pod["spec"]["volumes"] if v not in before["spec"]["volumes"]]
    assert added == [{"name": "worker-tls", "secret": {"secretName": "tiny-tls"}}]
    (worker,), (was,) = pod["spec"]["containers"], before["spec"]["containers"]
    assert [m for m in worker["volumeMounts"] if m not in was["volumeMounts"]] == [
        {"name": "worker-tls", "mountPath": "/etc/ardiff/tls", "readOnly": True}
    ]
    assert [e for e in worker["env"] if e not in was["env"]] == [
        {"name": "ARDIFF_TLS_CERT_FILE", "value": "/etc/ardiff/tls/tls.crt"},
        {"name": "ARDIFF_TLS_KEY_FILE", "value": "/etc/ardiff/tls/tls.key"},
        {"name": "ARDIFF_TLS_CA_FILE", "value": "/etc/ardiff/tls/ca.crt"},
    ]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert worker[probe]["httpGet"] == {**was[probe]["httpGet"], "scheme": "HTTPS"}
        assert "scheme" not in was[probe]["httpGet"]
    assert worker_template_hash("worlds", "tiny", spec) != worker_template_hash("worlds", "tiny", plain)
    kubernetes_validate.validate(pod, "1.28.0", strict=True)
    with pytest.raises(InvalidSpec, match=r"spec\.tls\.secretName must be a non-empty string"):
        WorkerPoolSpec.from_resource({**POOL_SPEC, "tls": {}})


def test_worker_redis_secret_holds_the_url_for_the_pools_pods() -> None:
    url = "redis://:s3cret@redis.worlds.svc:6379/0"
    assert build_worker_redis_secret("worlds", "tiny", url) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": "tiny-workers-redis",
            "namespace": "worlds",
            "labels": {"app.kubernetes.io/name": "ardiff", "ardiffusion.dev/pool": "tiny"},
        },
        "data": {"url": base64.b64encode(url.encode()).decode()},
    }
    pod = build_worker_pod("worlds", "tiny", WorkerPoolSpec.from_resource(POOL_SPEC), pod_name="tiny-ab12c")
    assert "s3cret" not in str(pod)
    with_token = build_worker_redis_secret("worlds", "tiny", url, transfer_token="t0k3n")
    assert with_token["data"] == {
        "url": base64.b64encode(url.encode()).decode(),
        "transfer-token": base64.b64encode(b"t0k3n").decode(),
    }
    assert len(new_transfer_token()) >= 43  # 32 random bytes, URL-safe base64
    assert new_transfer_token() != new_transfer_token()


def test_worker_redis_secret_logs_in_as_the_pools_own_user() -> None:
    """Issue 23 item 1: the URL the pool's workers get names the pool's user, not the operator's."""
    operators = "redis://ardiff-operator:op-s3cret@redis.worlds.svc:6379/0?health_check_interval=30"
    password = new_redis_password()
    secret = build_worker_redis_secret(
        "worlds", "tiny", operators, transfer_token="t0k3n", user=("ardiff-pool.worlds.tiny", password)
    )
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        "url": f"redis://ardiff-pool.worlds.tiny:{password}@redis.worlds.svc:6379/0?health_check_interval=30",
        "transfer-token": "t0k3n",
        "redis-username": "ardiff-pool.worlds.tiny",
        "redis-password": password,
    }
    assert len(password) >= 43
    assert new_redis_password() != password
    # Waiting for the administrator's user: no URL a Pod could start with.
    assert set(build_worker_redis_secret("worlds", "tiny", None, transfer_token="t0k3n")["data"]) == {
        "transfer-token"
    }


def test_a_changed_workers_secret_changes_the_pod_template_hash() -> None:
    """Issue 23 item 12: env values from a Secret are fixed at container start, so the Secret's digest is part
    of the template: Pods made before it changed are stale and roll."""
    spec = WorkerPoolSpec.from_resource(POOL_SPEC)
    old, new = secret_data_hash({"url": "b2xk"}), secret_data_hash({"url": "bmV3"})
    assert old != new
    assert secret_data_hash({"url": "b2xk", "transfer-token": "dA=="}) == secret_data_hash(
        {"transfer-token": "dA==", "url": "b2xk"}
    )
    pod = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c", secret_hash=old)
    assert pod["metadata"]["annotations"][SECRET_HASH_ANNOTATION] == old
    assert pod["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] == worker_template_hash(
        "worlds", "tiny", spec, old
    )
    assert len({worker_template_hash("worlds", "tiny", spec, h) for h in (None, old, new)}) == 3


def test_worker_pod_names() -> None:
    assert worker_pod_name("tiny", "ab12c") == "tiny-ab12c"
    names = {worker_pod_name("tiny") for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith("tiny-") and len(n) == 10 and n[5:].isalnum() and n.islower() for n in names)
    with pytest.raises(ValueError, match="5 lowercase alphanumerics"):
        worker_pod_name("tiny", "AB12C")


def test_token_secret_round_trip() -> None:
    secret = build_token_secret("worlds", "forest", "s3cret")
    assert secret == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": "forest-token",
            "namespace": "worlds",
            "labels": {"app.kubernetes.io/name": "ardiff", "ardiffusion.dev/session": "forest"},
        },
        "data": {"token": base64.b64encode(b"s3cret").decode()},
    }
    assert read_token(secret) == "s3cret"
    assert token_sha256("s3cret") == hashlib.sha256(b"s3cret").hexdigest()
    with pytest.raises(ValueError, match="has no key 'token'"):
        read_token({"metadata": {"name": "x"}, "data": {}})


def test_pool_spec_defaults_follow_the_crd() -> None:
    spec = WorkerPoolSpec.from_resource({"image": "w:1", "model": {"name": "m"}})
    assert (spec.min_replicas, spec.max_replicas, spec.scale_down_delay_seconds, spec.min_idle_seconds) == (
        1,
        1,
        300,
        30,
    )
    assert spec.startup_timeout_seconds == 600
    assert (spec.model.height, spec.model.width, spec.kv_memory_fraction, spec.session_capacity) == (
        480,
        832,
        0.9,
        None,
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": {"name": "m"}}, "spec.image must be a non-empty string"),
        ({"image": "w", "replicas": {"min": 3, "max": 2}}, "spec.replicas.max must be >= max"),
        ({"image": "w", "replicas": {"min": -1}}, "spec.replicas.min must be an integer >= 0"),
        ({"image": "w", "kv": {"gpuMemoryFraction": 1.5}}, "spec.kv.gpuMemoryFraction must be in"),
        ({"image": "w", "kv": {"gpuMemoryFraction": "half"}}, "spec.kv.gpuMemoryFraction must be a number"),
        ({"image": "w", "model": {"name": "m", "path": "/p"}}, "only one of name and path"),
        ({"image": "w", "env": [{"value": "x"}]}, "spec.env entries must be EnvVar objects"),
        ({"image": "w", "tolerations": {"key": "x"}}, "spec.tolerations must be a list"),
        ({"image": "w", "startupTimeoutSeconds": 0}, "spec.startupTimeoutSeconds must be an integer >= 1"),
    ],
)
def test_bad_pool_specs_name_the_field(spec: dict, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message.replace("(", r"\(").replace(".", r"\.")):
        WorkerPoolSpec.from_resource(spec)


def test_session_spec_parsing() -> None:
    spec = SessionResourceSpec.from_resource(
        {
            "poolRef": "tiny",
            "prompt": "a forest",
            "seed": 3,
            "priority": 10,
            "evictionPolicy": "Never",
            "image": {"configMapKeyRef": {"name": "pics", "key": "forest.png"}},
        }
    )
    assert (spec.pool_ref, spec.prompt, spec.seed, spec.priority) == ("tiny", "a forest", 3, 10)
    assert (spec.eviction_policy, spec.idle_timeout_seconds, spec.max_chunks) == ("Never", 0, 0)
    assert spec.image == ImageRef(source="configMap", name="pics", key="forest.png")


def test_a_fork_spec_leaves_what_it_inherits_unset() -> None:
    """Issue 26: forkFrom and history.keepChunks parsed; seed and prompt None when unset (a fork takes its
    parent's; anyone else 0 and "")."""
    fork = SessionResourceSpec.from_resource(
        {"poolRef": "tiny", "forkFrom": {"session": "walk", "chunk": 12}, "history": {"keepChunks": 8}}
    )
    assert (fork.fork_from, fork.history_keep_chunks, fork.seed, fork.prompt) == (
        ForkFrom("walk", 12),
        8,
        None,
        None,
    )
    latest = SessionResourceSpec.from_resource({"poolRef": "tiny", "forkFrom": {"session": "walk"}})
    assert (latest.fork_from, latest.history_keep_chunks) == (ForkFrom("walk", None), 0)
    plain = SessionResourceSpec.from_resource({"poolRef": "tiny"})
    placement = build_placement_spec("s", plain, token_sha256="0" * 64, image=b"", playout=Playout())
    assert (plain.fork_from, placement.seed, placement.prompt, placement.history_keep_chunks) == (
        None,
        0,
        "",
        0,
    )
    kept = build_placement_spec("s", fork, token_sha256="0" * 64, image=b"", playout=Playout())
    assert (kept.history_keep_chunks, kept.fork_from) == (8, "")  # the fork itself is resolved at placement


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"prompt": "x"}, "spec.poolRef must be a non-empty string"),
        ({"poolRef": "p", "forkFrom": {"chunk": 2}}, "spec.forkFrom.session must be a non-empty string"),
        ({"poolRef": "p", "forkFrom": {"session": "Walk"}}, "spec.forkFrom.session must be a DNS-1123 label"),
        (
            {"poolRef": "p", "forkFrom": {"session": "w", "chunk": 0}},
            "spec.forkFrom.chunk must be an integer >= 1",
        ),
        ({"poolRef": "p", "forkFrom": "walk"}, "spec.forkFrom must be an object"),
        ({"poolRef": "p", "history": {"keepChunks": 65}}, "spec.history.keepChunks must be <= 64"),
        ({"poolRef": "p", "history": {"keepChunks": -1}}, "spec.history.keepChunks must be an integer >= 0"),
        ({"poolRef": "Not_A_Label"}, "spec.poolRef must be a DNS-1123 label"),
        ({"poolRef": "p", "priority": 1001}, "spec.priority must be <= 1000"),
        ({"poolRef": "p", "evictionPolicy": "FIFO"}, "spec.evictionPolicy must be 'LRU' or 'Never'"),
        ({"poolRef": "p", "seed": -1}, "spec.seed must be an integer >= 0"),
        ({"poolRef": "p", "prompt": 7}, "spec.prompt must be a string"),
        ({"poolRef": "p", "image": {}}, "exactly one of configMapKeyRef, secretKeyRef"),
        ({"poolRef": "p", "image": {"secretKeyRef": {"name": "s"}}}, "spec.image.secretKeyRef.key must be"),
    ],
)
def test_bad_session_specs_name_the_field(spec: dict, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message.replace(".", r"\.")):
        SessionResourceSpec.from_resource(spec)


@pytest.mark.parametrize(("timeout", "threshold"), [(600, 120), (61, 13), (1, 1), (86400, 17280)])
def test_the_startup_probe_waits_the_pools_startup_timeout(timeout: int, threshold: int) -> None:
    spec = WorkerPoolSpec.from_resource({**POOL_SPEC, "startupTimeoutSeconds": timeout})
    [container] = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c")["spec"]["containers"]
    probe = container["startupProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (5, threshold)
    assert probe["periodSeconds"] * probe["failureThreshold"] >= timeout


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({}, {"requests": {"cpu": "1", "memory": "2Gi"}}),
        # A limit alone: the apiserver defaults the request to it, no default request may exceed it.
        (
            {"limits": {"memory": "1Gi", "nvidia.com/gpu": 1}},
            {"limits": {"memory": "1Gi", "nvidia.com/gpu": 1}, "requests": {"cpu": "1"}},
        ),
        (
            {"requests": {"cpu": "8", "memory": "64Gi"}},
            {"requests": {"cpu": "8", "memory": "64Gi"}},
        ),
    ],
)
def test_cpu_and_memory_are_requested_unless_the_pool_says(resources: dict, expected: dict) -> None:
    spec = WorkerPoolSpec.from_resource({**POOL_SPEC, "resources": resources})
    before = json.dumps(spec.resources, sort_keys=True)
    [container] = build_worker_pod("worlds", "tiny", spec, pod_name="tiny-ab12c")["spec"]["containers"]
    assert container["resources"] == expected
    assert json.dumps(spec.resources, sort_keys=True) == before  # the pool's spec is not mutated


def _knobs_pool(admission: Admission) -> dict:
    """tests/manifests/pool-all-knobs.yaml as the API server would store it (server-side dry-run): with the
    CRD's defaults, as the operator sees it, and nothing pruned."""
    doc = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "manifests" / "pool-all-knobs.yaml").read_text()
    )
    verdict = admission.create(doc)
    assert verdict.pruned == []
    return verdict.obj


@pytest.fixture(scope="module")
def knobs_references(dev_cluster: DevCluster, admission: Admission) -> Iterator[None]:
    """What Pod admission looks up for the knobs pool's Pod: its ServiceAccount (in the namespace `admission`
    judges Pods in), its PriorityClass (the Priority plugin resolves the value) and its RuntimeClass (the
    RuntimeClass plugin adds the overhead); made here, removed afterwards if made here."""
    objects = [
        (
            f"/api/v1/namespaces/{admission.namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "worlds-worker"}},
        ),
        (
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "inference-high"},
                "value": 1000,
            },
        ),
        (
            "/apis/node.k8s.io/v1/runtimeclasses",
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            },
        ),
    ]
    with dev_cluster.admin.client() as client:
        made = []
        for url, body in objects:
            created = client.post(url, json=body)
            assert created.status_code in (201, 409), created.text
            if created.status_code == 201:
                made.append(f"{url}/{body['metadata']['name']}")
        yield
        for path in made:
            client.delete(path)


def test_pod_template_knobs_reach_the_worker_pod(admission: Admission) -> None:
    """Issue 11 item 3: every knob of the pool spec lands in the Pod, the operator's own parts kept."""
    spec = WorkerPoolSpec.from_resource(_knobs_pool(admission)["spec"])
    pod = build_worker_pod("worlds", "knobs", spec, pod_name="knobs-ab12c")
    assert pod["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "gpu-queue",
        "team": "worlds",
        "app.kubernetes.io/name": "ardiff",
        "app.kubernetes.io/component": "worker",
        "ardiffusion.dev/pool": "knobs",
    }
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert set(annotations) == {
        "prometheus.io/scrape",
        "ardiffusion.dev/template-hash",
        "ardiffusion.dev/identity-hash",
    }
    pod_spec = pod["spec"]
    assert {k: pod_spec[k] for k in ("runtimeClassName", "priorityClassName", "schedulerName")} == {
        "runtimeClassName": "nvidia",
        "priorityClassName": "inference-high",
        "schedulerName": "volcano",
    }
    assert pod_spec["serviceAccountName"] == "worlds-worker"
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    assert pod_spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H200"]}]}
    ]
    # A constraint without a selector spreads the pool's own workers.
    assert pod_spec["topologySpreadConstraints"] == [
        {
            "labelSelector": {"matchLabels": LABELS | {"ardiffusion.dev/pool": "knobs"}},
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
        }
    ]
    assert pod_spec["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        {"name": "model-cache", "emptyDir": {}},
        {**REDIS_CA_VOLUME, "secret": {**REDIS_CA_VOLUME["secret"], "secretName": "knobs-workers-redis"}},
        {"name": "worker-tls", "secret": {"secretName": "knobs-tls"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        {"name": "model", "persistentVolumeClaim": {"claimName": "models"}},
        {"name": "prompts", "configMap": {"name": "prompts", "defaultMode": 420}},
        {
            "name": "scratch",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "100Gi"}},
                    }
                }
            },
        },
    ]
    (worker,) = pod_spec["containers"]
    assert worker["imagePullPolicy"] == "IfNotPresent"
    assert worker["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": "/home/ardiff"},
        {"name": "model-cache", "mountPath": "/var/cache/ardiff/models"},
        {"name": "redis-ca", "mountPath": "/etc/ardiff/redis-tls", "readOnly": True},
        {"name": "worker-tls", "mountPath": "/etc/ardiff/tls", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "model", "mountPath": "/models", "readOnly": True},
        {"name": "prompts", "mountPath": "/etc/prompts", "readOnly": True},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    assert {"name": "ARDIFF_MODEL", "value": "/models/lingbot-world"} in worker["env"]
    # The memory limit alone: cpu requested by the pool, memory defaulted to its limit by the apiserver.
    assert worker["resources"] == {
        "limits": {"nvidia.com/gpu": 1, "memory": "200Gi"},
        "requests": {"cpu": "8"},
    }
    assert pod_spec["initContainers"] == [
        {
            "name": "model-download",
            "image": "ghcr.io/ardiff/ardiff-worker:0.1.0",
            "imagePullPolicy": "IfNotPresent",
            "command": [
                "ardiff",
                "worker",
                "download-model",
                "--dest",
                "$(ARDIFF_MODEL)",
                "--hf-repo",
                "robbyant/lingbot-world-base-cam",
                "--revision",
                "main",
            ],
            "env": [
                {"name": "ARDIFF_MODEL", "value": "/models/lingbot-world"},
                {"name": "HOME", "value": "/home/ardiff"},
                {
                    "name": "ARDIFF_DOWNLOAD_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
                },
            ],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
            "volumeMounts": [
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "home", "mountPath": "/home/ardiff"},
                {"name": "model", "mountPath": "/models"},
            ],
        }
    ]


@pytest.mark.parametrize("kubernetes_version", ["1.28.0", kubernetes_validate.latest_version()])
def test_a_pod_with_every_knob_passes_kubernetes_validate_and_pod_admission(
    kubernetes_version: str, admission: Admission, knobs_references: None
) -> None:
    """kubernetes-validate (strict) and the real API server's whole Pod admission (server-side dry-run)."""
    spec = WorkerPoolSpec.from_resource(_knobs_pool(admission)["spec"])
    pod = build_worker_pod("worlds", "knobs", spec, pod_name="knobs-ab12c")
    kubernetes_validate.validate(pod, kubernetes_version, strict=True)
    admitted = admission.create(pod)
    assert admitted.admitted, admitted.body
    assert (admitted.warnings, admitted.pruned) == ((), [])
    emptydir = WorkerPoolSpec.from_resource(
        {
            "image": "w:1",
            "model": {"path": "/models/m"},
            "modelDownload": {"url": "https://files.example/m.tgz", "emptyDir": {"sizeLimit": "50Gi"}},
            "securityContext": {},
        }
    )
    pod = build_worker_pod("worlds", "p", emptydir, pod_name="p-ab12c")
    assert {"name": "model", "emptyDir": {"sizeLimit": "50Gi"}} in pod["spec"]["volumes"]
    assert pod["spec"]["initContainers"][0]["command"][3:] == [
        "--dest",
        "$(ARDIFF_MODEL)",
        "--url",
        "https://files.example/m.tgz",
    ]
    assert pod["spec"]["securityContext"] == {}  # OpenShift: the platform picks the UID
    kubernetes_validate.validate(pod, kubernetes_version, strict=True)
    admitted = admission.create(pod)
    assert admitted.admitted, admitted.body
    assert (admitted.warnings, admitted.pruned) == ((), [])


def test_a_model_download_needs_a_model_path_under_models() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.modelDownload needs spec\.model\.path"):
        WorkerPoolSpec.from_resource({"image": "w:1", "modelDownload": {"url": "https://x/m"}})
    with pytest.raises(InvalidSpec, match=r"spec\.model\.path must be under /models/"):
        WorkerPoolSpec.from_resource(
            {"image": "w:1", "model": {"path": "/opt/m"}, "modelDownload": {"url": "https://x/m"}}
        )


def test_a_private_redis_ca_is_copied_into_the_pools_secret_and_the_url_points_at_the_mount(
    tmp_path: Path,
) -> None:
    """Issue 11 item 5: the workers got `ssl_ca_certs=<the operator's path>` and no file there."""
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    url = f"rediss://:pw@redis.example:6380/0?ssl_ca_certs={ca_file}&ssl_cert_reqs=required"
    assert read_redis_ca("redis://redis:6379/0") is None
    secret = build_worker_redis_secret("worlds", "tiny", url, read_redis_ca(url))
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "url": "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ardiff/redis-tls/ca.crt",
        "ca.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    }
    pod = build_worker_pod("worlds", "tiny", WorkerPoolSpec.from_resource(POOL_SPEC), pod_name="tiny-ab12c")
    assert REDIS_CA_VOLUME in pod["spec"]["volumes"]
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/etc/ardiff/redis-tls"] == "redis-ca"
    kubernetes_validate.validate(secret, "1.28.0", strict=True)
