"""The two custom resources' `spec`s as validated values.

The API server (or the dev cluster) already checks the CRD schema; these parsers re-check what the operator
relies on, apply the CRD's defaults (an emulated API may not), and turn a bad spec into one clear message that
the operator reports as `Failed` / `InvalidSpec` instead of retrying forever.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ardiff.kv.records import (
    MAX_KEEP_CHUNKS,
    MAX_PLAYOUT_BUFFER_CHUNKS,
    MAX_PLAYOUT_FPS,
    MAX_PRIORITY,
    EvictionPolicy,
    check_name,
)
from ardiff.model_families import DEFAULT_FAMILY, FAMILY_NAMES, family_of

DEFAULT_MODEL = "tiny-lingbot-world"
DEFAULT_PIPELINE = "LingBotWorldCausalDMDPipeline"
DEFAULT_SCALE_DOWN_DELAY_SECONDS = 300
# A worker Pod that has not registered in Redis this long after it was first seen is replaced. Loading a real
# checkpoint takes minutes; the worker's startup probe allows 10 (operator/pods.py).
DEFAULT_STARTUP_TIMEOUT_SECONDS = 600
DEFAULT_MIN_IDLE_SECONDS = 30
DEFAULT_IDLE_TIMEOUT_SECONDS = 0  # never
DEFAULT_HEIGHT = 480
DEFAULT_WIDTH = 832
DEFAULT_KV_MEMORY_FRACTION = 0.9
# Issue 25: a pool's default playout target (a LingBot chunk of 12 frames every 0.75 s) and compute bound.
DEFAULT_PLAYOUT_FPS = 16.0
DEFAULT_PLAYOUT_BUFFER_CHUNKS = 2
DEFAULT_COMPUTE_UTILISATION = 0.0  # admit by KV memory only


class InvalidSpec(ValueError):
    """A spec the operator cannot act on; the message names the field."""


def _int(spec: Mapping[str, Any], path: str, default: int, *, minimum: int = 0) -> int:
    value = _get(spec, path, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidSpec(f"spec.{path} must be an integer >= {minimum}, got {value!r}")
    return value


def _str(spec: Mapping[str, Any], path: str, default: str | None = None) -> str:
    value = _get(spec, path, default)
    if not isinstance(value, str) or not value:
        raise InvalidSpec(f"spec.{path} must be a non-empty string, got {value!r}")
    return value


def _get(spec: Mapping[str, Any], path: str, default: Any) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _number(spec: Mapping[str, Any], path: str, default: float | None) -> float | None:
    value = _get(spec, path, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSpec(f"spec.{path} must be a number, got {value!r}")
    return float(value)


def _mapping(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    value = _get(spec, path, {})
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"spec.{path} must be an object, got {value!r}")
    return copy.deepcopy(dict(value))


def _list(spec: Mapping[str, Any], path: str) -> list[Any]:
    value = _get(spec, path, [])
    if not isinstance(value, list):
        raise InvalidSpec(f"spec.{path} must be a list, got {value!r}")
    return copy.deepcopy(value)


@dataclass(frozen=True)
class ModelSpec:
    name: str = DEFAULT_MODEL  # an embedded model's name or a model directory in the worker image
    pipeline: str = DEFAULT_PIPELINE
    height: int = DEFAULT_HEIGHT
    width: int = DEFAULT_WIDTH
    dtype: str | None = None  # None: the worker's default for its device

    def __post_init__(self) -> None:
        for name, value in {"height": self.height, "width": self.width}.items():
            if value <= 0:
                raise InvalidSpec(f"spec.model.{name} must be positive, got {value}")

    @property
    def family(self) -> str | None:
        """The model family serving the pipeline (`ardiff.model_families`), None when none does."""
        return family_of(self.pipeline)

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> ModelSpec:
        has_name, has_path = (
            _get(spec, "model.name", None) is not None,
            _get(spec, "model.path", None) is not None,
        )
        if has_name and has_path:
            raise InvalidSpec("spec.model must set only one of name and path")
        dtype = _get(spec, "model.dtype", None)
        return cls(
            name=_str(spec, "model.path") if has_path else _str(spec, "model.name", DEFAULT_MODEL),
            pipeline=_str(spec, "model.pipeline", DEFAULT_PIPELINE),
            height=_int(spec, "model.height", DEFAULT_HEIGHT, minimum=1),
            width=_int(spec, "model.width", DEFAULT_WIDTH, minimum=1),
            dtype=None if dtype is None else _str(spec, "model.dtype"),
        )


@dataclass(frozen=True)
class Playout:
    """A playout target (issue 25): the frames per second a session's viewer plays, and the chunks its player
    keeps buffered before and while it plays."""

    fps: float = DEFAULT_PLAYOUT_FPS
    buffer_chunks: int = DEFAULT_PLAYOUT_BUFFER_CHUNKS

    def __post_init__(self) -> None:
        if not 0 < self.fps <= MAX_PLAYOUT_FPS:
            raise InvalidSpec(f"spec.playout.fps must be in (0, {MAX_PLAYOUT_FPS:g}], got {self.fps:g}")
        if not 1 <= self.buffer_chunks <= MAX_PLAYOUT_BUFFER_CHUNKS:
            limit = MAX_PLAYOUT_BUFFER_CHUNKS
            raise InvalidSpec(f"spec.playout.bufferChunks must be in 1..{limit}, got {self.buffer_chunks}")

    def status(self) -> dict[str, Any]:
        """As `status.playout` shows it."""
        return {"fps": self.fps, "bufferChunks": self.buffer_chunks}


@dataclass(frozen=True)
class PlayoutOverride:
    """A session's `spec.playout`: each field it sets overrides its pool's default."""

    fps: float | None = None
    buffer_chunks: int | None = None

    def resolve(self, default: Playout) -> Playout:
        return Playout(
            fps=default.fps if self.fps is None else self.fps,
            buffer_chunks=default.buffer_chunks if self.buffer_chunks is None else self.buffer_chunks,
        )

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> PlayoutOverride:
        buffer = _get(spec, "playout.bufferChunks", None)
        override = cls(
            fps=_number(spec, "playout.fps", None),
            buffer_chunks=None if buffer is None else _int(spec, "playout.bufferChunks", 0, minimum=1),
        )
        override.resolve(Playout())  # checks the ranges
        return override


MODEL_VOLUME_MOUNT = "/models"  # where a model download's volume is mounted (init and worker containers)


@dataclass(frozen=True)
class ModelDownload:
    """`spec.modelDownload`: an init container fetches the model into `model.path` (under /models) before
    the worker starts; a PVC keeps it across Pods (the step is skipped when it is already complete there)."""

    destination: str  # spec.model.path
    hugging_face_repo: str | None = None
    hugging_face_revision: str | None = None
    url: str | None = None
    token_secret: dict[str, str] | None = (
        None  # {name, key}: the Hugging Face token or the URL's bearer token
    )
    claim_name: str | None = None  # a PersistentVolumeClaim, else an emptyDir
    size_limit: str | int | None = None  # the emptyDir's sizeLimit
    image: str | None = None  # None: the worker's image

    def __post_init__(self) -> None:
        if (self.hugging_face_repo is None) == (self.url is None):
            raise InvalidSpec("spec.modelDownload must set exactly one of huggingFace and url")
        if not self.destination.startswith(MODEL_VOLUME_MOUNT + "/"):
            raise InvalidSpec(
                f"spec.model.path must be under {MODEL_VOLUME_MOUNT}/ with a modelDownload, "
                f"got {self.destination!r}"
            )

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> ModelDownload | None:
        if _get(spec, "modelDownload", None) is None:
            return None
        if _get(spec, "model.path", None) is None:
            raise InvalidSpec("spec.modelDownload needs spec.model.path (where the model is written)")
        token = _get(spec, "modelDownload.tokenSecretRef", None)
        size = _get(spec, "modelDownload.emptyDir.sizeLimit", None)
        return cls(
            destination=_str(spec, "model.path"),
            hugging_face_repo=None
            if _get(spec, "modelDownload.huggingFace", None) is None
            else _str(spec, "modelDownload.huggingFace.repo"),
            hugging_face_revision=_get(spec, "modelDownload.huggingFace.revision", None),
            url=_get(spec, "modelDownload.url", None),
            token_secret=None
            if token is None
            else {
                "name": _str(spec, "modelDownload.tokenSecretRef.name"),
                "key": _str(spec, "modelDownload.tokenSecretRef.key"),
            },
            claim_name=None
            if _get(spec, "modelDownload.persistentVolumeClaim", None) is None
            else _str(spec, "modelDownload.persistentVolumeClaim.claimName"),
            size_limit=size,
            image=_get(spec, "modelDownload.image", None),
        )


@dataclass(frozen=True)
class PodOptions:
    """The pool's Pod template knobs (`spec.volumes`, `spec.affinity`, ...), deep-copied from the spec; the
    builder leaves out what is unset, so a pool that sets none makes the same Pods as before."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    shm_size: str | int | None = None
    affinity: dict[str, Any] = field(default_factory=dict)
    topology_spread_constraints: list[dict[str, Any]] = field(default_factory=list)
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    image_pull_secrets: list[dict[str, Any]] = field(default_factory=list)
    image_pull_policy: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    service_account_name: str | None = None
    automount_service_account_token: bool = False
    security_context: dict[str, Any] | None = None  # None: the operator's (runAsUser 1000, ...)

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> PodOptions:
        automount = _get(spec, "automountServiceAccountToken", False)
        if not isinstance(automount, bool):
            raise InvalidSpec(f"spec.automountServiceAccountToken must be a boolean, got {automount!r}")
        security = _get(spec, "securityContext", None)
        return cls(
            volumes=_list(spec, "volumes"),
            volume_mounts=_list(spec, "volumeMounts"),
            shm_size=_get(spec, "shmSize", None),
            affinity=_mapping(spec, "affinity"),
            topology_spread_constraints=_list(spec, "topologySpreadConstraints"),
            runtime_class_name=_optional_str(spec, "runtimeClassName"),
            priority_class_name=_optional_str(spec, "priorityClassName"),
            scheduler_name=_optional_str(spec, "schedulerName"),
            image_pull_secrets=_list(spec, "imagePullSecrets"),
            image_pull_policy=_optional_str(spec, "imagePullPolicy"),
            labels=_mapping(spec, "podLabels"),
            annotations=_mapping(spec, "podAnnotations"),
            service_account_name=_optional_str(spec, "serviceAccountName"),
            automount_service_account_token=automount,
            security_context=None if security is None else _mapping(spec, "securityContext"),
        )


def _optional_str(spec: Mapping[str, Any], path: str) -> str | None:
    return None if _get(spec, path, None) is None else _str(spec, path)


@dataclass(frozen=True)
class WorkerPoolSpec:
    """`ARDiffusionWorkerPool.spec`: what one worker pod runs and how many of them may exist."""

    image: str
    model: ModelSpec = field(default_factory=ModelSpec)
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)
    kv_memory_fraction: float = DEFAULT_KV_MEMORY_FRACTION
    session_capacity: int | None = None
    cpu_free_memory_bytes: int | None = None
    min_replicas: int = 1
    max_replicas: int = 1
    scale_down_delay_seconds: int = DEFAULT_SCALE_DOWN_DELAY_SECONDS
    min_idle_seconds: int = DEFAULT_MIN_IDLE_SECONDS
    startup_timeout_seconds: int = DEFAULT_STARTUP_TIMEOUT_SECONDS
    pod: PodOptions = field(default_factory=PodOptions)
    model_download: ModelDownload | None = None
    # spec.tls.secretName: a kubernetes.io/tls Secret (tls.crt, tls.key, optional ca.crt) the workers serve
    # https with, at their DNS names under the pool's headless Service. None: plain HTTP.
    tls_secret: str | None = None
    # Issue 25: its sessions' default playout target, and the share of its pods' measured throughput that
    # admission may promise (0: admit by KV memory only).
    playout: Playout = field(default_factory=Playout)
    compute_utilisation: float = DEFAULT_COMPUTE_UTILISATION

    def __post_init__(self) -> None:
        if not 0 <= self.compute_utilisation <= 1:
            raise InvalidSpec(f"spec.computeUtilisation must be in [0, 1], got {self.compute_utilisation:g}")
        if self.max_replicas < max(1, self.min_replicas):
            raise InvalidSpec(
                f"spec.replicas.max must be >= max(1, replicas.min), got max={self.max_replicas}, "
                f"min={self.min_replicas}"
            )
        if not 0 < self.kv_memory_fraction <= 1:
            raise InvalidSpec(f"spec.kv.gpuMemoryFraction must be in (0, 1], got {self.kv_memory_fraction}")
        if self.startup_timeout_seconds < 1:
            raise InvalidSpec(f"spec.startupTimeoutSeconds must be >= 1, got {self.startup_timeout_seconds}")
        if self.session_capacity is not None and self.session_capacity < 1:
            raise InvalidSpec(f"spec.kv.sessionCapacity must be >= 1, got {self.session_capacity}")
        for entry in self.env:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise InvalidSpec(f"spec.env entries must be EnvVar objects with a name, got {entry!r}")

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> WorkerPoolSpec:
        fraction = _get(spec, "kv.gpuMemoryFraction", DEFAULT_KV_MEMORY_FRACTION)
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise InvalidSpec(f"spec.kv.gpuMemoryFraction must be a number, got {fraction!r}")
        capacity = _get(spec, "kv.sessionCapacity", None)
        cpu_bytes = _get(spec, "kv.cpuFreeMemoryBytes", None)
        min_replicas = _int(spec, "replicas.min", 1)
        return cls(
            image=_str(spec, "image"),
            model=ModelSpec.from_resource(spec),
            resources=_mapping(spec, "resources"),
            node_selector=_mapping(spec, "nodeSelector"),
            tolerations=_list(spec, "tolerations"),
            env=_list(spec, "env"),
            kv_memory_fraction=float(fraction),
            session_capacity=None if capacity is None else _int(spec, "kv.sessionCapacity", 1, minimum=1),
            cpu_free_memory_bytes=None
            if cpu_bytes is None
            else _int(spec, "kv.cpuFreeMemoryBytes", 1, minimum=1),
            min_replicas=min_replicas,
            max_replicas=_int(spec, "replicas.max", max(1, min_replicas)),
            scale_down_delay_seconds=_int(spec, "scaleDownDelaySeconds", DEFAULT_SCALE_DOWN_DELAY_SECONDS),
            min_idle_seconds=_int(spec, "eviction.minIdleSeconds", DEFAULT_MIN_IDLE_SECONDS),
            startup_timeout_seconds=_int(
                spec, "startupTimeoutSeconds", DEFAULT_STARTUP_TIMEOUT_SECONDS, minimum=1
            ),
            pod=PodOptions.from_resource(spec),
            model_download=ModelDownload.from_resource(spec),
            tls_secret=None if _get(spec, "tls", None) is None else _str(spec, "tls.secretName"),
            playout=PlayoutOverride.from_resource(spec).resolve(Playout()),
            compute_utilisation=_number(spec, "computeUtilisation", DEFAULT_COMPUTE_UTILISATION) or 0.0,
        )


@dataclass(frozen=True)
class ImageRef:
    """Where a session's conditioning image lives: one key of a ConfigMap or Secret in its namespace."""

    source: Literal["configMap", "secret"]
    name: str
    key: str


@dataclass(frozen=True)
class ForkFrom:
    """`spec.forkFrom` (issue 26): the parent session (same namespace) and the chunk the child starts at
    (None: the parent's latest kept chunk)."""

    session: str
    chunk: int | None = None

    def __post_init__(self) -> None:
        try:
            check_name("session", self.session)
        except ValueError:
            raise InvalidSpec(
                f"spec.forkFrom.session must be a DNS-1123 label, got {self.session!r}"
            ) from None
        if self.chunk is not None and self.chunk < 1:
            raise InvalidSpec(f"spec.forkFrom.chunk must be >= 1, got {self.chunk}")

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> ForkFrom | None:
        if _get(spec, "forkFrom", None) is None:
            return None
        _mapping(spec, "forkFrom")  # an object, or a clear message
        chunk = _get(spec, "forkFrom.chunk", None)
        return cls(
            session=_str(spec, "forkFrom.session"),
            chunk=None if chunk is None else _int(spec, "forkFrom.chunk", 1, minimum=1),
        )


@dataclass(frozen=True)
class SessionResourceSpec:
    """`ARDiffusionSession.spec`. `prompt` and `seed` are None where unset: "" and 0, or a fork's parent's."""

    pool_ref: str
    prompt: str | None = None
    seed: int | None = None
    priority: int = 0
    eviction_policy: EvictionPolicy = "LRU"
    idle_timeout_seconds: int = DEFAULT_IDLE_TIMEOUT_SECONDS  # 0: never expires
    max_chunks: int = 0  # 0: unlimited (the CRD leaves it unset)
    image: ImageRef | None = None
    family: str = DEFAULT_FAMILY  # the model family it speaks; must be its pool's
    playout: PlayoutOverride = field(default_factory=PlayoutOverride)  # unset fields: the pool's
    fork_from: ForkFrom | None = None  # issue 26
    history_keep_chunks: int = 0  # spec.history.keepChunks

    def __post_init__(self) -> None:
        try:
            check_name("pool", self.pool_ref)
        except ValueError:
            raise InvalidSpec(f"spec.poolRef must be a DNS-1123 label, got {self.pool_ref!r}") from None
        if self.priority > MAX_PRIORITY:
            raise InvalidSpec(f"spec.priority must be <= {MAX_PRIORITY}, got {self.priority}")
        if self.eviction_policy not in ("LRU", "Never"):
            raise InvalidSpec(f"spec.evictionPolicy must be 'LRU' or 'Never', got {self.eviction_policy!r}")
        if self.family not in FAMILY_NAMES:
            raise InvalidSpec(f"spec.family must be one of {list(FAMILY_NAMES)}, got {self.family!r}")
        if self.history_keep_chunks > MAX_KEEP_CHUNKS:
            raise InvalidSpec(
                f"spec.history.keepChunks must be <= {MAX_KEEP_CHUNKS}, got {self.history_keep_chunks}"
            )

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> SessionResourceSpec:
        prompt = _get(spec, "prompt", None)
        if prompt is not None and not isinstance(prompt, str):
            raise InvalidSpec(f"spec.prompt must be a string, got {prompt!r}")
        return cls(
            pool_ref=_str(spec, "poolRef"),
            prompt=prompt,
            seed=None if _get(spec, "seed", None) is None else _int(spec, "seed", 0),
            priority=_int(spec, "priority", 0),
            eviction_policy=_get(spec, "evictionPolicy", "LRU"),
            idle_timeout_seconds=_int(spec, "idleTimeoutSeconds", DEFAULT_IDLE_TIMEOUT_SECONDS),
            max_chunks=_int(spec, "maxChunks", 0),
            image=_image_ref(spec),
            family=_get(spec, "family", DEFAULT_FAMILY),
            playout=PlayoutOverride.from_resource(spec),
            fork_from=ForkFrom.from_resource(spec),
            history_keep_chunks=_int(spec, "history.keepChunks", 0),
        )


def _image_ref(spec: Mapping[str, Any]) -> ImageRef | None:
    image = _get(spec, "image", None)
    if image is None:
        return None
    if not isinstance(image, Mapping):
        raise InvalidSpec(f"spec.image must be an object, got {image!r}")
    sources = {"configMapKeyRef": "configMap", "secretKeyRef": "secret"}
    present = [ref for ref in sources if image.get(ref) is not None]
    if len(present) != 1:
        raise InvalidSpec("spec.image must set exactly one of configMapKeyRef, secretKeyRef")
    (ref,) = present
    return ImageRef(
        source=sources[ref], name=_str(spec, f"image.{ref}.name"), key=_str(spec, f"image.{ref}.key")
    )
