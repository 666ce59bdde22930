"""Pure builders for what a pool owns: its worker Pods, its headless Service and the Secret that holds the
workers' Redis URL (docs/contracts.md §1, §3).

They return plain dicts (the handler adopts and creates them); user input is deep-copied, never aliased.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import secrets
import string
import urllib.parse
from pathlib import Path
from typing import Any

from ardiff.kv.connection import with_user
from ardiff.operator.specs import MODEL_VOLUME_MOUNT, ModelDownload, WorkerPoolSpec

POOL_LABEL = "ardiffusion.dev/pool"
COMPONENT_LABEL = "app.kubernetes.io/component"
WORKER_COMPONENT = "worker"
TEMPLATE_HASH_ANNOTATION = "ardiffusion.dev/template-hash"
# Issue 23 item 12: the digest of the `<pool>-workers-redis` data a Pod was made with (`secret_data_hash`).
# It is part of the Pod template, so a changed Secret makes the pool's Pods stale and they roll (env values
# from a Secret are fixed when a container starts: a rotated password would strand them).
SECRET_HASH_ANNOTATION = "ardiffusion.dev/secret-hash"
# Issue 12: the hash of what an exported session must match to be imported (`session_identity_hash`): pods
# with the pool's current identity can take the sessions of a stale pod by migration.
IDENTITY_HASH_ANNOTATION = "ardiffusion.dev/identity-hash"
IDENTITY_ENV = (
    "ARDIFF_MODEL",
    "ARDIFF_PIPELINE",
    "ARDIFF_HEIGHT",
    "ARDIFF_WIDTH",
    "ARDIFF_DTYPE",
    "ARDIFF_RUNTIME",
)
WORKER_PORT = 8000
WORKER_PORT_NAME = "http"
WORKER_CONTAINER = "worker"
WORKER_USER_ID = 1000
REDIS_URL_KEY = "url"
# TLS Redis behind a private CA (issue 11 item 5): the operator copies the CA its worker URL names
# (`?ssl_ca_certs=<path>`, a file in the operator's Pod) into the pool's Secret; every worker Pod mounts that
# key (optional: absent without TLS) here, and the URL it reads names this path.
REDIS_CA_KEY = "ca.crt"
# Pod-to-pod transfer of migrating sessions (issue 12): a random token per pool, made once, in the same
# Secret; workers read it as ARDIFF_TRANSFER_TOKEN and accept pulls only with it.
TRANSFER_TOKEN_KEY = "transfer-token"
# Issue 23 item 1: the pool's own Redis user (kv/acl.py), which the key `url` logs in as: made by the operator
# (`ardiff-pool.<namespace>.<pool>`, a random password), or by the administrator, who writes both keys.
REDIS_USERNAME_KEY = "redis-username"
REDIS_PASSWORD_KEY = "redis-password"
WORKER_REDIS_CA_DIR = "/etc/ardiff/redis-tls"
REDIS_CA_VOLUME = "redis-ca"
# The pool's TLS (spec.tls, issue 23 item 9): its kubernetes.io/tls Secret (tls.crt, tls.key and, from a
# private CA, ca.crt: cert-manager writes all three) mounted here; the worker serves https with the first two
# and verifies the pool's other pods with the third.
WORKER_TLS_DIR = "/etc/ardiff/tls"
TLS_CA_KEY = "ca.crt"  # the Secret's CA bundle (also the pool's record's, for the front door: issue 37)
TLS_VOLUME = "worker-tls"
# The root filesystem is read-only: everything the worker writes goes to one of these emptyDir volumes
# (Python's and vllm's scratch files, HOME's caches, the embedded tiny model it generates).
WORKER_HOME = "/home/ardiff"
WORKER_MODEL_CACHE = "/var/cache/ardiff/models"
WORKER_VOLUMES = {"tmp": "/tmp", "home": WORKER_HOME, "model-cache": WORKER_MODEL_CACHE}
SHM_VOLUME = "dshm"  # spec.shmSize: a memory-backed emptyDir at /dev/shm (NCCL, torch's shared tensors)
MODEL_VOLUME = "model"  # spec.modelDownload's PVC or emptyDir, at /models
DOWNLOAD_CONTAINER = "model-download"
DOWNLOAD_TOKEN_ENV = "ARDIFF_DOWNLOAD_TOKEN"
# Names and paths the operator's own volumes use; the pool CRD refuses them in spec.volumes/volumeMounts.
RESERVED_VOLUMES = (*WORKER_VOLUMES, SHM_VOLUME, MODEL_VOLUME, REDIS_CA_VOLUME, TLS_VOLUME)
RESERVED_MOUNT_PATHS = (
    *WORKER_VOLUMES.values(),
    "/dev/shm",
    MODEL_VOLUME_MOUNT,
    WORKER_REDIS_CA_DIR,
    WORKER_TLS_DIR,
)
_SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
# Requests a worker gets for what the pool's `resources` leave unset (neither a request nor a limit): a
# worker with only a GPU limit would be BestEffort, first to go under node memory pressure.
DEFAULT_REQUESTS = {"cpu": "1", "memory": "2Gi"}
STARTUP_PROBE_PERIOD_SECONDS = 5
# A GPU-loaded worker may answer slowly: the probes wait longer than the 1 s default.
PROBE_TIMEOUT_SECONDS = {"startup": 5, "liveness": 5, "readiness": 3}


def pool_labels(pool: str) -> dict[str, str]:
    """The labels every worker Pod of `pool` carries; also the Service's selector."""
    return {
        "app.kubernetes.io/name": "ardiff",
        COMPONENT_LABEL: WORKER_COMPONENT,
        POOL_LABEL: pool,
    }


def worker_pod_name(pool: str, suffix: str | None = None) -> str:
    """`<pool>-<5 lowercase alphanumerics>`; random unless `suffix` is given."""
    suffix = suffix or "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))
    if len(suffix) != 5 or any(ch not in _SUFFIX_ALPHABET for ch in suffix):
        raise ValueError(f"worker pod suffix must be 5 lowercase alphanumerics, got {suffix!r}")
    return f"{pool}-{suffix}"


def pool_service_name(pool: str) -> str:
    return f"{pool}-workers"


def worker_redis_secret_name(pool: str) -> str:
    return f"{pool}-workers-redis"


def redis_ca_path(url: str) -> str | None:
    """The CA bundle a Redis URL names (`ssl_ca_certs`), if any."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("ssl_ca_certs")
    return values[-1] if values else None


def read_redis_ca(url: str) -> bytes | None:
    """The CA bundle the operator's worker URL names, read from the operator's own filesystem (the chart
    mounts `redis.external.tls.caSecret` there); None without one. Raises OSError when it cannot be read."""
    path = redis_ca_path(url)
    return None if path is None else Path(path).read_bytes()


def new_transfer_token() -> str:
    return secrets.token_urlsafe(32)


def new_redis_password() -> str:
    """A pool user's password: 32 random bytes, URL-safe base64 (43 characters, nothing to escape)."""
    return secrets.token_urlsafe(32)


def secret_data_hash(data: dict[str, str]) -> str:
    """A short, stable digest of a Secret's `data` (base64 values, as the API returns them)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def redis_secret_data(
    url: str | None, ca: bytes | None = None, user: tuple[str, str] | None = None
) -> dict[str, str]:
    """What a Secret gives a Redis client of ours (its `data`: base64 values): key `url`, logging in as
    `user` (keys `redis-username`, `redis-password`) in place of any user it names; with `ca` (a private TLS
    CA), key `ca.crt` holds it and the URL's `ssl_ca_certs` names where Pods mount it. `url` None: no key
    `url` (the administrator's user is awaited)."""
    data = {}
    if user is not None:
        username, password = user
        data[REDIS_USERNAME_KEY] = base64.b64encode(username.encode()).decode()
        data[REDIS_PASSWORD_KEY] = base64.b64encode(password.encode()).decode()
        if url is not None:
            url = with_user(url, username, password)
    if url is not None and ca is not None:
        parts = urllib.parse.urlsplit(url)
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "ssl_ca_certs"]
        query.append(("ssl_ca_certs", f"{WORKER_REDIS_CA_DIR}/{REDIS_CA_KEY}"))
        url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, safe="/")))
        data[REDIS_CA_KEY] = base64.b64encode(ca).decode()
    if url is not None:
        data[REDIS_URL_KEY] = base64.b64encode(url.encode()).decode()
    return data


def build_worker_redis_secret(
    namespace: str,
    pool: str,
    url: str | None,
    ca: bytes | None = None,
    *,
    transfer_token: str | None = None,
    user: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The Secret the pool's workers read their Redis URL from (key `url`, `redis_secret_data`), so that its
    password is in no Pod spec; it lives in the pool's namespace, where the workers can read it (not adopted
    yet: the handler adopts it). `transfer_token`: the pool's worker-to-worker token (key `transfer-token`).
    `user`: the pool's Redis user and password, which the URL logs in as."""
    data = redis_secret_data(url, ca, user)
    if transfer_token is not None:
        data[TRANSFER_TOKEN_KEY] = base64.b64encode(transfer_token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": worker_redis_secret_name(pool),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "ardiff", POOL_LABEL: pool},
        },
        "data": data,
    }


def build_worker_env(namespace: str, pool: str, spec: WorkerPoolSpec) -> list[dict[str, Any]]:
    """The worker's settings (contracts §3), then the pool's own `env`, which wins on a name clash."""
    model = spec.model
    values: dict[str, str | None] = {
        "ARDIFF_MODEL": model.name,
        "ARDIFF_PIPELINE": model.pipeline,
        "ARDIFF_HEIGHT": str(model.height),
        "ARDIFF_WIDTH": str(model.width),
        "ARDIFF_DTYPE": model.dtype,
        "ARDIFF_KV_MEMORY_FRACTION": str(spec.kv_memory_fraction),
        "ARDIFF_SESSION_CAPACITY": None if spec.session_capacity is None else str(spec.session_capacity),
        "ARDIFF_CPU_FREE_MEMORY_BYTES": None
        if spec.cpu_free_memory_bytes is None
        else str(spec.cpu_free_memory_bytes),
        # Issue 25: the worker reports compute_fps = this x its measured throughput (unset: 0, not limited).
        "ARDIFF_COMPUTE_UTILISATION": str(spec.compute_utilisation) if spec.compute_utilisation else None,
    }
    if spec.tls_secret is not None:  # https at the Pod's DNS name (the worker's endpoint default with TLS)
        values |= {
            "ARDIFF_TLS_CERT_FILE": f"{WORKER_TLS_DIR}/tls.crt",
            "ARDIFF_TLS_KEY_FILE": f"{WORKER_TLS_DIR}/tls.key",
            "ARDIFF_TLS_CA_FILE": f"{WORKER_TLS_DIR}/{TLS_CA_KEY}",
        }
    env: list[dict[str, Any]] = [{"name": name, "value": value} for name, value in values.items() if value]
    redis_url = {"name": worker_redis_secret_name(pool), "key": REDIS_URL_KEY}
    env += [
        {"name": "ARDIFF_REDIS_URL", "valueFrom": {"secretKeyRef": redis_url}},
        {
            "name": "ARDIFF_TRANSFER_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": worker_redis_secret_name(pool), "key": TRANSFER_TOKEN_KEY}
            },
        },
        {"name": "ARDIFF_NAMESPACE", "value": namespace},
        {"name": "ARDIFF_POOL", "value": pool},
        {"name": "ARDIFF_PORT", "value": str(WORKER_PORT)},
        {"name": "ARDIFF_MODEL_CACHE", "value": WORKER_MODEL_CACHE},
        {"name": "HOME", "value": WORKER_HOME},
        {"name": "ARDIFF_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "ARDIFF_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    overridden = {entry["name"] for entry in spec.env}
    return [entry for entry in env if entry["name"] not in overridden] + copy.deepcopy(spec.env)


def build_worker_pod(
    namespace: str, pool: str, spec: WorkerPoolSpec, *, pod_name: str, secret_hash: str | None = None
) -> dict[str, Any]:
    """One worker Pod of `pool` (not yet adopted: the handler sets the owner reference), annotated with the
    hash of the template it was made from (`secret_hash`: of the workers' Secret it reads, part of it)."""
    pod = build_worker_pod_template(namespace, pool, spec, secret_hash=secret_hash)
    digest = template_hash(pod)
    identity = session_identity_hash(namespace, pool, spec)
    pod["metadata"] |= {
        "name": pod_name,
        "annotations": {
            **pod["metadata"].get("annotations", {}),
            TEMPLATE_HASH_ANNOTATION: digest,
            IDENTITY_HASH_ANNOTATION: identity,
        },
    }
    pod["spec"]["hostname"] = pod_name  # stable DNS `<pod>.<pool>-workers` through the headless Service
    return pod


def template_hash(template: dict[str, Any]) -> str:
    """A short, stable digest of a rendered Pod template: pods whose hash differs from the pool's current one
    are stale (the spec, or the operator's way of rendering it, changed since they were made)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[
        :16
    ]


def session_identity_hash(namespace: str, pool: str, spec: WorkerPoolSpec) -> str:
    """What an exported session's identity (contracts §9) depends on in the pool's spec: the model, pipeline,
    height, width, dtype and runtime the worker is told (the pool's `env` included, as it wins). A roll that
    keeps it migrates sessions; one that changes it waits for them to end. (An image whose runtime or weights
    differ is refused at import: the worker's import check is the last word.)"""
    env = {
        e["name"]: e.get("value")
        for e in build_worker_env(namespace, pool, spec)
        if e["name"] in IDENTITY_ENV
    }
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]


def worker_template_hash(
    namespace: str, pool: str, spec: WorkerPoolSpec, secret_hash: str | None = None
) -> str:
    return template_hash(build_worker_pod_template(namespace, pool, spec, secret_hash=secret_hash))


def worker_resources(resources: dict[str, Any]) -> dict[str, Any]:
    """The pool's `resources`, with DEFAULT_REQUESTS for cpu and memory where it sets neither a request nor a
    limit (a limit alone makes the apiserver default the request to it)."""
    merged = copy.deepcopy(resources)
    requests, limits = merged.get("requests") or {}, merged.get("limits") or {}
    defaults = {k: v for k, v in DEFAULT_REQUESTS.items() if k not in requests and k not in limits}
    if defaults:
        merged["requests"] = {**requests, **defaults}
    return merged


def startup_failure_threshold(startup_timeout_seconds: int) -> int:
    """Startup probe failures allowed so that the kubelet waits `spec.startupTimeoutSeconds` (rounded up to a
    probe period) before it restarts a worker still loading its model."""
    return max(1, -(-startup_timeout_seconds // STARTUP_PROBE_PERIOD_SECONDS))


DEFAULT_POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": WORKER_USER_ID,
    "runAsGroup": WORKER_USER_ID,
    "fsGroup": WORKER_USER_ID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def build_worker_pod_template(
    namespace: str, pool: str, spec: WorkerPoolSpec, *, secret_hash: str | None = None
) -> dict[str, Any]:
    """Everything of a worker Pod that does not depend on its name. Knobs the pool leaves unset are left out,
    so such a pool's Pods (and their template hash) are what they were before the knobs existed.
    `secret_hash`: the digest of the workers' Secret data (`secret_data_hash`), as annotation
    SECRET_HASH_ANNOTATION: a Pod made before the Secret changed is stale."""
    probe_port = {"port": WORKER_PORT_NAME, **({"scheme": "HTTPS"} if spec.tls_secret is not None else {})}
    options = spec.pod
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.image,
        **({"imagePullPolicy": options.image_pull_policy} if options.image_pull_policy else {}),
        "command": ["ardiff", "worker", "serve"],
        "env": build_worker_env(namespace, pool, spec),
        "ports": [{"name": WORKER_PORT_NAME, "containerPort": WORKER_PORT, "protocol": "TCP"}],
        # Loading a real checkpoint takes minutes: the startup probe holds liveness off till then.
        "startupProbe": {
            "httpGet": {"path": "/healthz", **probe_port},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": PROBE_TIMEOUT_SECONDS["startup"],
            "failureThreshold": startup_failure_threshold(spec.startup_timeout_seconds),
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **probe_port},
            "periodSeconds": 10,
            "timeoutSeconds": PROBE_TIMEOUT_SECONDS["liveness"],
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **probe_port},
            "periodSeconds": 2,
            "timeoutSeconds": PROBE_TIMEOUT_SECONDS["readiness"],
            "failureThreshold": 2,
        },
        "resources": worker_resources(spec.resources),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": [{"name": name, "mountPath": path} for name, path in WORKER_VOLUMES.items()],
    }
    volumes: list[dict[str, Any]] = [{"name": name, "emptyDir": {}} for name in WORKER_VOLUMES]
    # The Redis CA, when the pool's Secret holds one (TLS Redis behind a private CA); nothing is mounted else.
    volumes.append(
        {
            "name": REDIS_CA_VOLUME,
            "secret": {
                "secretName": worker_redis_secret_name(pool),
                "items": [{"key": REDIS_CA_KEY, "path": REDIS_CA_KEY}],
                "optional": True,
            },
        }
    )
    container["volumeMounts"].append(
        {"name": REDIS_CA_VOLUME, "mountPath": WORKER_REDIS_CA_DIR, "readOnly": True}
    )
    if spec.tls_secret is not None:
        volumes.append({"name": TLS_VOLUME, "secret": {"secretName": spec.tls_secret}})
        container["volumeMounts"].append({"name": TLS_VOLUME, "mountPath": WORKER_TLS_DIR, "readOnly": True})
    if options.shm_size is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": options.shm_size}})
        container["volumeMounts"].append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    init_containers = []
    if spec.model_download is not None:
        volumes.append(model_volume(spec.model_download))
        container["volumeMounts"].append(
            {"name": MODEL_VOLUME, "mountPath": MODEL_VOLUME_MOUNT, "readOnly": True}
        )
        init_containers.append(build_download_container(spec))
    volumes += copy.deepcopy(options.volumes)
    container["volumeMounts"] += copy.deepcopy(options.volume_mounts)
    pod_spec: dict[str, Any] = {
        "subdomain": pool_service_name(pool),
        "restartPolicy": "Always",
        "enableServiceLinks": False,
        # Workers never call the Kubernetes API: no token unless the pool asks for one.
        "automountServiceAccountToken": options.automount_service_account_token,
        "terminationGracePeriodSeconds": 30,
        "securityContext": copy.deepcopy(
            DEFAULT_POD_SECURITY_CONTEXT if options.security_context is None else options.security_context
        ),
        "nodeSelector": copy.deepcopy(spec.node_selector),
        "tolerations": copy.deepcopy(spec.tolerations),
    }
    optional = {
        "serviceAccountName": options.service_account_name,
        "runtimeClassName": options.runtime_class_name,
        "priorityClassName": options.priority_class_name,
        "schedulerName": options.scheduler_name,
        "affinity": copy.deepcopy(options.affinity),
        "topologySpreadConstraints": [
            {"labelSelector": {"matchLabels": pool_labels(pool)}, **copy.deepcopy(constraint)}
            for constraint in options.topology_spread_constraints
        ],
        "imagePullSecrets": copy.deepcopy(options.image_pull_secrets),
        "initContainers": init_containers,
    }
    pod_spec |= {key: value for key, value in optional.items() if value}
    pod_spec |= {"containers": [container], "volumes": volumes}
    metadata: dict[str, Any] = {"namespace": namespace, "labels": {**options.labels, **pool_labels(pool)}}
    annotations = copy.deepcopy(options.annotations)
    if secret_hash is not None:
        annotations[SECRET_HASH_ANNOTATION] = secret_hash
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def model_volume(download: ModelDownload) -> dict[str, Any]:
    """The volume a model download writes into: the pool's PVC, else an emptyDir (per Pod)."""
    if download.claim_name is not None:
        return {"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": download.claim_name}}
    size = {} if download.size_limit is None else {"sizeLimit": download.size_limit}
    return {"name": MODEL_VOLUME, "emptyDir": size}


def download_command(download: ModelDownload) -> list[str]:
    """`ardiff worker download-model` for the pool's source (worker/download.py), into `$(ARDIFF_MODEL)` (the
    container's env says where: a kubelet expands the reference, and the dev cluster's pod runner maps a path
    under a mount to its local directory only in env values)."""
    command = ["ardiff", "worker", "download-model", "--dest", "$(ARDIFF_MODEL)"]
    if download.url is not None:
        return [*command, "--url", download.url]
    assert download.hugging_face_repo is not None
    revision = (
        [] if download.hugging_face_revision is None else ["--revision", download.hugging_face_revision]
    )
    return [*command, "--hf-repo", download.hugging_face_repo, *revision]


def build_download_container(spec: WorkerPoolSpec) -> dict[str, Any]:
    """The init container that fetches `spec.modelDownload` into the model volume before the worker starts
    (a complete earlier download in a PVC is kept: the command returns at once)."""
    download = spec.model_download
    assert download is not None
    env: list[dict[str, Any]] = [
        {"name": "ARDIFF_MODEL", "value": download.destination},
        {"name": "HOME", "value": WORKER_HOME},
    ]
    if download.token_secret is not None:
        env.append({"name": DOWNLOAD_TOKEN_ENV, "valueFrom": {"secretKeyRef": dict(download.token_secret)}})
    container: dict[str, Any] = {
        "name": DOWNLOAD_CONTAINER,
        "image": download.image or spec.image,
        **({"imagePullPolicy": spec.pod.image_pull_policy} if spec.pod.image_pull_policy else {}),
        "command": download_command(download),
        "env": env,
        "resources": {"requests": dict(DEFAULT_REQUESTS)},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": WORKER_HOME},
            {"name": MODEL_VOLUME, "mountPath": MODEL_VOLUME_MOUNT},
        ],
    }
    return container


def build_pool_service(namespace: str, pool: str) -> dict[str, Any]:
    """The pool's headless Service: per-pod DNS names, no load balancing (sessions are pinned). A Pod's name
    resolves while it is not Ready too (draining, terminating): with TLS it is the pod's endpoint, and the
    pod that a draining one's sessions move to pulls them from there."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pool_service_name(pool), "namespace": namespace, "labels": pool_labels(pool)},
        "spec": {
            "clusterIP": "None",
            "selector": pool_labels(pool),
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": WORKER_PORT_NAME,
                    "port": WORKER_PORT,
                    "targetPort": WORKER_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }
