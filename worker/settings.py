"""The worker's settings (docs/contracts.md §3): one frozen value, read from flags, then env, then defaults.

Light on purpose: the `fake` runtime path imports this module and must never import torch.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from ardiff.kv.records import check_name
from ardiff.worker.net import ANY_HOST, http_url, url_host

EMBEDDED_TINY_MODEL = "tiny-lingbot-world"
# The trained tiny world (issue 16), shipped in the package; `--model` takes its name.
TRAINED_WORLD_MODEL = "tiny-world-trained"
DEFAULT_PIPELINE = "LingBotWorldCausalDMDPipeline"
# The KV pool is `free memory x fraction`. On CPU the pool is host memory next to other processes, so the
# default fraction there is small (the OS backs the pool lazily, but its block table is built eagerly).
DEFAULT_GPU_KV_FRACTION = 0.9
DEFAULT_CPU_KV_FRACTION = 0.1
DEFAULT_CPU_FREE_MEMORY_BYTES = 8 << 30
Runtime = Literal["vllm", "fake"]
TickOrder = Literal["deadline", "fifo"]  # worker/pod_state.py ForwardLock
Dtype = Literal["bfloat16", "float16", "float32"]


def resolve_model(model: str) -> str:
    """A shipped model's name -> its directory in the package; anything else unchanged."""
    if model == TRAINED_WORLD_MODEL:
        return str(Path(__file__).resolve().parent / "models" / TRAINED_WORLD_MODEL)
    return model


def _default_model_cache() -> str:
    return str(Path("~/.cache/ardiff/models").expanduser())


@dataclass(frozen=True)
class WorkerSettings:
    model: str = EMBEDDED_TINY_MODEL
    pipeline: str = DEFAULT_PIPELINE
    height: int = 64
    width: int = 64
    dtype: Dtype | None = None  # None: bfloat16 on an accelerator, float32 on CPU
    kv_memory_fraction: float | None = None  # None: DEFAULT_GPU_KV_FRACTION / DEFAULT_CPU_KV_FRACTION
    session_capacity: int | None = None
    cpu_free_memory_bytes: int = DEFAULT_CPU_FREE_MEMORY_BYTES
    redis_url: str | None = None
    namespace: str = "default"
    pool: str = "default"
    pod_name: str = field(default_factory=socket.gethostname)
    pod_ip: str = "127.0.0.1"
    host: str = ANY_HOST  # listens on [::] dual-stack where the host has IPv6 (worker/net.py listen_socket)
    port: int = 8000
    endpoint: str | None = None  # None: http://<pod_ip>:<port>, or https://<this host's DNS name>:<port>
    # TLS (issue 23 item 9): the certificate and key this worker serves https with (both or neither), and the
    # CA its pulls from and offers to the pool's other pods verify them with (None: the system's CAs).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    lease_seconds: float = 10.0
    heartbeat_seconds: float = 2.0
    # The shared tier (issue 12): a directory every pod of the pool mounts; None = sessions are not exported
    # (evicted ones lose their KV, as before).
    suspend_dir: str | None = None
    snapshot_every_chunks: int = 0  # a snapshot to the shared tier every N chunks (0 = none)
    # The host tier (issue 12): bytes of this pod's memory for suspended sessions' exports (0 = none).
    host_tier_bytes: int = 0
    # Kept history (issue 26): bytes of this pod's memory for sessions' kept chunk boundaries (rewind, fork).
    history_bytes: int = 1 << 30
    # Host memory kept between pulls to receive exports into (issue 42; 0: each pull gets fresh memory).
    transfer_staging_bytes: int = 0
    # Pod-to-pod transfer of migrating sessions (issue 12): the pool's shared secret (never a flag, so never
    # in a process listing; never in a repr), and how long a migrated session waits here for its new pod.
    transfer_token: str | None = field(default=None, repr=False)
    transfer_hold_seconds: float = 20.0
    # How often this pod removes the tier's files of sessions the store has closed (deleted ones).
    tier_sweep_seconds: float = 300.0
    # Playout (issue 25): how waiting ticks are served, the share of its measured throughput this pod may be
    # asked for (0 = admit by KV memory only), and a standalone session's target (placement: the record's).
    tick_order: TickOrder = "deadline"
    compute_utilisation: float = 0.0
    playout_fps: float = 16.0
    playout_buffer_chunks: int = 2
    # vllm-omni's realtime video protocol (issue 38, worker/realtime.py): its start and stall clocks, by
    # default vllm-omni's own (a test pins them to its values); tests shorten them.
    realtime_start_timeout_seconds: float = 10.0
    realtime_stall_timeout_seconds: float = 60.0
    runtime: Runtime = "vllm"
    fake_capacity: int = 4
    fake_tick_seconds: float = 0.0
    fake_tick_spread: float = 0.0  # lognormal sigma of a fake forward's time around fake_tick_seconds
    model_cache: str = field(default_factory=_default_model_cache)
    test_faults: bool = False
    # Tests only (with test_faults): a transfer this worker serves pauses this long halfway (kill it then).
    test_transfer_stall_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in ("height", "width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % 16:
                raise ValueError(f"worker {name} must be a positive multiple of 16, got {value!r}")
        positive = {
            "cpu_free_memory_bytes": self.cpu_free_memory_bytes,
            "fake_capacity": self.fake_capacity,
            "lease_seconds": self.lease_seconds,
            "heartbeat_seconds": self.heartbeat_seconds,
            "transfer_hold_seconds": self.transfer_hold_seconds,
            "tier_sweep_seconds": self.tier_sweep_seconds,
            "realtime_start_timeout_seconds": self.realtime_start_timeout_seconds,
            "realtime_stall_timeout_seconds": self.realtime_stall_timeout_seconds,
        }
        if self.session_capacity is not None:
            positive["session_capacity"] = self.session_capacity
        for name, value in positive.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"worker {name} must be positive, got {value!r}")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError(
                f"worker heartbeat_seconds must be shorter than lease_seconds ({self.lease_seconds}), "
                f"got {self.heartbeat_seconds}"
            )
        if self.kv_memory_fraction is not None and not 0 < self.kv_memory_fraction <= 1:
            raise ValueError(f"worker kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction!r}")
        if isinstance(self.snapshot_every_chunks, bool) or self.snapshot_every_chunks < 0:
            raise ValueError(f"worker snapshot_every_chunks must be >= 0, got {self.snapshot_every_chunks!r}")
        for name in ("host_tier_bytes", "history_bytes", "transfer_staging_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise ValueError(f"worker {name} must be >= 0, got {value!r}")
        if self.snapshot_every_chunks and not self.suspend_dir:
            raise ValueError(
                "worker snapshot_every_chunks needs suspend_dir (the shared tier snapshots go to)"
            )
        if self.fake_tick_seconds < 0:
            raise ValueError(f"worker fake_tick_seconds must be >= 0, got {self.fake_tick_seconds!r}")
        if not 0 <= self.fake_tick_spread <= 3:
            raise ValueError(f"worker fake_tick_spread must be in [0, 3], got {self.fake_tick_spread!r}")
        if self.tick_order not in get_args(TickOrder):
            raise ValueError(f"worker tick_order must be 'deadline' or 'fifo', got {self.tick_order!r}")
        if not 0 <= self.compute_utilisation <= 1:
            raise ValueError(
                f"worker compute_utilisation must be in [0, 1], got {self.compute_utilisation!r}"
            )
        if not 0 < self.playout_fps <= 120:
            raise ValueError(f"worker playout_fps must be in (0, 120], got {self.playout_fps!r}")
        if isinstance(self.playout_buffer_chunks, bool) or not 1 <= self.playout_buffer_chunks <= 16:
            raise ValueError(
                f"worker playout_buffer_chunks must be in [1, 16], got {self.playout_buffer_chunks!r}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"worker port must be in [0, 65535], got {self.port!r}")
        if self.runtime not in get_args(Runtime):
            raise ValueError(f"worker runtime must be 'vllm' or 'fake', got {self.runtime!r}")
        if self.dtype is not None and self.dtype not in get_args(Dtype):
            raise ValueError(f"worker dtype must be bfloat16, float16 or float32, got {self.dtype!r}")
        for name in ("model", "pipeline", "host", "pod_ip", "model_cache"):
            if not getattr(self, name):
                raise ValueError(f"worker {name} must be non-empty, got {getattr(self, name)!r}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "worker tls_cert_file and tls_key_file must be set together, got "
                f"{self.tls_cert_file!r} and {self.tls_key_file!r}"
            )
        if self.redis_url is not None:  # they become Redis keys; a standalone worker never uses them
            check_name("namespace", self.namespace)
            check_name("pool", self.pool)
            check_name("pod", self.pod_name)

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def advertised_endpoint(self) -> str:
        """What clients are told to call (the Redis pod record's `endpoint`): with TLS, this host's DNS
        name (a certificate cannot name a pod IP that changes; a Pod with `hostname` and `subdomain` under a
        headless Service has `<pod>.<service>.<namespace>.svc.<cluster domain>`, which its /etc/hosts
        gives), else the pod IP (an IPv6 one bracketed)."""
        if self.endpoint:
            return self.endpoint
        if not self.tls:
            return http_url(self.pod_ip, self.port)
        name = socket.getfqdn()
        if "." not in name:
            raise ValueError(
                "worker endpoint: with TLS it must be a DNS name the certificate names, and this host's "
                f"name {name!r} has no domain (a Pod needs hostname and subdomain under a headless Service); "
                "set endpoint"
            )
        return http_url(name, self.port, tls=True)

    @property
    def advertised_address(self) -> str:
        """`<pod ip>:<port>` (an IPv6 pod IP bracketed): where the front door's original-destination cluster
        connects (the pod record's `address`, issue 37), whatever name `advertised_endpoint` gives."""
        return f"{url_host(self.pod_ip)}:{self.port}"

    @property
    def standalone(self) -> bool:
        """No placement store: no auth, sessions created on first tick up to capacity."""
        return self.redis_url is None

    def kv_fraction(self, *, accelerator: bool) -> float:
        if self.kv_memory_fraction is not None:
            return self.kv_memory_fraction
        return DEFAULT_GPU_KV_FRACTION if accelerator else DEFAULT_CPU_KV_FRACTION


def _env_name(name: str) -> str:
    return f"ARDIFF_{name.upper()}"


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


# Settings without a flag (contracts §3): test-only switches.
_ENV_ONLY = {"test_faults", "test_transfer_stall_seconds", "transfer_token"}
_HELP = {
    "model": "a model directory, or an embedded model's name (tiny-lingbot-world, tiny-world-trained)",
    "pipeline": "pipeline class",
    "dtype": "bfloat16 on GPU, float32 on CPU by default",
    "kv_memory_fraction": "fraction of free device memory for the KV pool (0.9 GPU, 0.1 CPU)",
    "session_capacity": "optional cap below the runner's resident capacity",
    "cpu_free_memory_bytes": "'free device memory' on CPU (sizes the KV pool)",
    "redis_url": "placement store; none = standalone (no auth, sessions created on first tick)",
    "endpoint": "what clients are told (default http://<pod ip>:<port>, an IPv6 pod ip bracketed; with TLS "
    "https://<this host's DNS name>:<port>)",
    "tls_cert_file": "serve https with this certificate (PEM, the chain after it; with tls_key_file)",
    "tls_key_file": "the certificate's private key (PEM)",
    "tls_ca_file": "the CA that pulls from and offers to the pool's other pods verify them with "
    "(default: the system's)",
    "suspend_dir": "the shared tier: a directory all pods of the pool mount (suspended sessions, snapshots)",
    "snapshot_every_chunks": "a snapshot of each session to the shared tier every N chunks (0: none)",
    "host_tier_bytes": "bytes of host memory for suspended sessions' exports (0: none; the shared tier then)",
    "history_bytes": "bytes of host memory for sessions' kept chunks (history.keepChunks: rewind, fork)",
    "transfer_staging_bytes": "bytes of host memory kept between pulls to receive sessions' exports into "
    "(0: fresh memory for each pull)",
    "transfer_hold_seconds": "how long a migrated session waits here for its new pod to pull it directly",
    "tier_sweep_seconds": "how often the shared tier's files of deleted sessions are removed",
    "runtime": "vllm (vllm-omni's paged-KV runner) or fake (no torch; control-plane tests)",
    "fake_capacity": "sessions a fake runtime holds",
    "fake_tick_seconds": "how long a fake forward takes",
    "fake_tick_spread": "lognormal sigma of a fake forward's time around fake_tick_seconds (seeded by the "
    "pod's name; 0: fixed)",
    "tick_order": "deadline (earliest playout deadline first, bounded wait) or fifo (arrival order)",
    "compute_utilisation": "the share of its measured throughput this pod may be asked for (0: admit by KV "
    "memory only; the pool's spec.computeUtilisation)",
    "playout_fps": "a standalone session's playout rate (placement: the record's)",
    "playout_buffer_chunks": "a standalone session's buffer in chunks (placement: the record's)",
    "realtime_start_timeout_seconds": "how long a realtime video socket may wait to send session.start",
    "realtime_stall_timeout_seconds": "a realtime video stream without progress this long ends",
    "model_cache": "where the embedded tiny model is written",
}


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; every default is None so that env and defaults apply underneath."""
    for item in fields(WorkerSettings):
        if item.name in _ENV_ONLY:
            continue
        kwargs: dict[str, Any] = {"default": None, "help": _HELP.get(item.name, "")}
        kwargs["help"] = f"{kwargs['help']} [env {_env_name(item.name)}]".strip()
        if item.name == "runtime":
            kwargs["choices"] = get_args(Runtime)
        if item.name == "dtype":
            kwargs["choices"] = get_args(Dtype)
        if item.name == "tick_order":
            kwargs["choices"] = get_args(TickOrder)
        parser.add_argument(_flag_name(item.name), dest=item.name, **kwargs)


def _convert(name: str, raw: str) -> Any:
    kind = {f.name: f.type for f in fields(WorkerSettings)}[name]
    try:
        if kind == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes")
        if kind.startswith("int"):
            return int(raw)
        if kind.startswith("float"):
            return float(raw)
    except ValueError:
        raise ValueError(f"worker {name} must be a {kind.split(' ')[0]}, got {raw!r}") from None
    return raw


def build_settings(
    flags: Mapping[str, Any] | argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Flags win over `ARDIFF_*` env vars, which win over the defaults. Empty env values count as unset."""
    flags = vars(flags) if isinstance(flags, argparse.Namespace) else dict(flags or {})
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for item in fields(WorkerSettings):
        raw = flags.get(item.name)
        if raw is None:
            raw = environ.get(_env_name(item.name)) or None
        if raw is not None:
            values[item.name] = _convert(item.name, raw) if isinstance(raw, str) else raw
    if "model" in values:
        values["model"] = resolve_model(values["model"])
    return WorkerSettings(**values)
