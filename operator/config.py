"""The operator's settings: command-line flags with environment fallbacks (docs/contracts.md §5)."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, get_args

from ardiff.errors import ArdiffError
from ardiff.kv.records import check_name
from ardiff.operator.pod_policy import RESTRICTED_VOLUME_TYPES, PodTemplatePolicy
from ardiff.wire import front_door_url

# Who makes each pool's Redis user (docs/contracts.md §10): the operator, on every node it uses (its own user
# may `ACL SETUSER`), or the administrator (a managed Redis that keeps ACLs to its console), who names it in
# the pool's `<pool>-workers-redis` Secret.
WorkerRedisUsers = Literal["operator", "administrator"]
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# The front door's public URL: a session's `status.url` adds `/pools/<namespace>/<pool>` (at most 134
# characters) and the CRD bounds it at 2,048.
MAX_PUBLIC_URL_LENGTH = 1024
# A Secret's name: a DNS-1123 subdomain.
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class OperatorConfigError(ArdiffError):
    code = "invalid_operator_config"


@dataclass(frozen=True)
class OperatorConfig:
    redis_url: str
    worker_redis_url: str  # what worker Pods are told (in-cluster DNS may differ from the operator's view)
    namespaces: tuple[str, ...] = ()  # empty with all_namespaces=True
    all_namespaces: bool = False
    standalone: bool = False
    peering: str | None = None
    priority: int = 0
    liveness: str | None = None
    metrics: str | None = None  # http://HOST:PORT/metrics: Prometheus metrics on their own port
    reconcile_seconds: float = 2.0  # a pool's level-triggered reconcile period
    mirror_seconds: float = 5.0  # throttle of the chunkIndex/lastTickTime status mirror
    # How often Redis state whose session or pool is gone from the API is swept (operator/sweep.py).
    sweep_seconds: float = 30.0
    # How long a worker may take to report a suspended session's export before the session counts as evicted
    # (while one is suspending its pool evicts nobody); a 26 GB export at 1 GB/s takes ~30 s.
    suspend_timeout_seconds: float = 120.0
    cancellation_polling_seconds: float = 2.0  # how often kopf re-checks a stopping daemon
    # How long a silent peer (a killed active operator) blocks a standby; kopf's default is 60 s. Keepalives
    # go out every max(1, lifetime - 5..10) s, so a few seconds cost about one PATCH per second per operator.
    peering_lifetime_seconds: float = 5.0
    status_write_concurrency: int = 16
    # Follow node drains (issue 22): read the Nodes of the pools' Pods (cluster-scoped `get nodes`, an
    # explicit opt-in beside namespaced Roles) and move the sessions off a cordoned node: its drain completes.
    follow_drains: bool = False
    # What a pool's Pod template may carry (operator/pod_policy.py; the chart's workerPods.allowed*).
    allowed_volume_types: tuple[str, ...] = RESTRICTED_VOLUME_TYPES
    allowed_service_accounts: tuple[str, ...] = ()
    worker_redis_users: WorkerRedisUsers = "operator"
    # The front door (issue 37): its public base URL, under which each session's `status.url` is (None: no
    # `url` is written), and the Secret in the operator's own namespace that the operator keeps the gateway's
    # Redis URL and user in (None: no gateway user or Secret; operator/gateway_credentials.py).
    gateway_public_url: str | None = None
    gateway_redis_secret: str | None = None
    # The namespace the operator runs in (ARDIFF_OPERATOR_NAMESPACE, else its service account's): where the
    # gateway's Secret lives; its name is the gateway's Redis user's (`ardiff-gateway.<namespace>`).
    operator_namespace: str | None = None

    def __post_init__(self) -> None:
        if not self.redis_url:
            raise OperatorConfigError("operator redis_url must be set (--redis-url or ARDIFF_REDIS_URL)")
        if self.all_namespaces == bool(self.namespaces):
            raise OperatorConfigError(
                f"operator must watch some namespaces or all of them, got namespaces={self.namespaces}, "
                f"all_namespaces={self.all_namespaces}"
            )
        if self.standalone and self.peering:
            raise OperatorConfigError("operator standalone and peering are mutually exclusive")
        if self.worker_redis_users not in get_args(WorkerRedisUsers):
            raise OperatorConfigError(
                f"operator worker_redis_users must be one of {get_args(WorkerRedisUsers)}, got "
                f"{self.worker_redis_users!r}"
            )
        if self.gateway_public_url is not None:
            check_public_url(self.gateway_public_url)
        self._check_gateway_secret()
        if self.metrics is not None:
            from ardiff.operator.metrics import parse_metrics_address

            parse_metrics_address(self.metrics)  # MetricsAddressError naming the value
        positive = {
            "reconcile_seconds": self.reconcile_seconds,
            "mirror_seconds": self.mirror_seconds,
            "sweep_seconds": self.sweep_seconds,
            "suspend_timeout_seconds": self.suspend_timeout_seconds,
            "cancellation_polling_seconds": self.cancellation_polling_seconds,
            "peering_lifetime_seconds": self.peering_lifetime_seconds,
            "status_write_concurrency": self.status_write_concurrency,
        }
        for name, value in positive.items():
            if value <= 0:
                raise OperatorConfigError(f"operator {name} must be positive, got {value}")
        try:
            self.pod_policy  # noqa: B018 -- validates the allowlists
        except ValueError as exc:
            raise OperatorConfigError(f"operator {exc}") from None

    def _check_gateway_secret(self) -> None:
        if self.operator_namespace is not None:
            try:
                check_name("namespace", self.operator_namespace)
            except ValueError:
                raise OperatorConfigError(
                    f"operator operator_namespace must be a DNS-1123 label, got {self.operator_namespace!r}"
                ) from None
        if self.gateway_redis_secret is None:
            return
        name = self.gateway_redis_secret
        if len(name) > 253 or not _SECRET_NAME.match(name):
            raise OperatorConfigError(
                f"operator gateway_redis_secret must be a Secret name (a DNS-1123 subdomain), got {name!r}"
            )
        if self.operator_namespace is None:
            raise OperatorConfigError(
                "operator gateway_redis_secret needs the operator's own namespace, where that Secret is "
                "kept: set ARDIFF_OPERATOR_NAMESPACE (in a Pod its service account's namespace is read), got "
                "none"
            )

    @cached_property
    def pod_policy(self) -> PodTemplatePolicy:
        return PodTemplatePolicy.from_lists(self.allowed_volume_types, self.allowed_service_accounts)

    def session_url(self, namespace: str, pool: str) -> str | None:
        """A pool's sessions' `status.url` (their base URL at the front door); None without a public URL."""
        if self.gateway_public_url is None:
            return None
        return front_door_url(self.gateway_public_url, namespace, pool)


def check_public_url(url: str) -> str:
    """The front door's public base URL: http(s), a host, maybe a path; no user, query or fragment (every
    session's URL is this plus `/pools/<namespace>/<pool>`, and it is shown to every user of a session)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- validates the port
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or len(url) > MAX_PUBLIC_URL_LENGTH
        or "?" in url
        or "#" in url
    ):
        raise OperatorConfigError(
            "operator gateway_public_url must be an http:// or https:// URL with a host and no user, query "
            f"or fragment, at most {MAX_PUBLIC_URL_LENGTH} characters (e.g. https://worlds.example.com), got "
            f"{url!r}"
        )
    return url


ENV_SECONDS = {
    "reconcile_seconds": "ARDIFF_OPERATOR_RECONCILE_SECONDS",
    "mirror_seconds": "ARDIFF_OPERATOR_MIRROR_SECONDS",
    "sweep_seconds": "ARDIFF_OPERATOR_SWEEP_SECONDS",
    "suspend_timeout_seconds": "ARDIFF_OPERATOR_SUSPEND_TIMEOUT_SECONDS",
    "cancellation_polling_seconds": "ARDIFF_OPERATOR_CANCELLATION_POLLING_SECONDS",
    "peering_lifetime_seconds": "ARDIFF_OPERATOR_PEERING_LIFETIME_SECONDS",
}


ENV_TEXTS = {
    "gateway_public_url": "ARDIFF_GATEWAY_PUBLIC_URL",
    "gateway_redis_secret": "ARDIFF_GATEWAY_REDIS_SECRET",
}


ENV_LISTS = {
    "allowed_volume_types": "ARDIFF_OPERATOR_ALLOWED_VOLUME_TYPES",
    "allowed_service_accounts": "ARDIFF_OPERATOR_ALLOWED_SERVICE_ACCOUNTS",
}


def comma_list(text: str) -> tuple[str, ...]:
    """`a,b, c` -> ("a", "b", "c"); empty items are dropped (`""` is the empty list)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def own_namespace(env: Mapping[str, str]) -> str | None:
    """The operator's own namespace: `ARDIFF_OPERATOR_NAMESPACE`, else its Pod's service account's."""
    if env.get("ARDIFF_OPERATOR_NAMESPACE"):
        return env["ARDIFF_OPERATOR_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return None


def default_namespaces(env: Mapping[str, str]) -> tuple[str, ...]:
    """`ARDIFF_WATCH_NAMESPACES`, else the operator's own namespace, else `default`."""
    listed = tuple(ns.strip() for ns in env.get("ARDIFF_WATCH_NAMESPACES", "").split(",") if ns.strip())
    if listed:
        return listed
    return (own_namespace(env) or "default",)


def env_float(env: Mapping[str, str], name: str) -> float | None:
    """The number in `name`, or None when it is unset (the config's default applies)."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise OperatorConfigError(f"operator {name} must be a number, got {raw!r}") from None


def config_from_env(env: Mapping[str, str] = os.environ, **overrides: object) -> OperatorConfig:
    """Environment values, with explicit (non-None) `overrides` from the command line taking precedence."""
    given = {k: v for k, v in overrides.items() if v is not None and v != () and v is not False}
    redis_url = str(given.pop("redis_url", env.get("ARDIFF_REDIS_URL", "")))
    all_namespaces = bool(given.pop("all_namespaces", False))
    namespaces = given.pop("namespaces", ()) or (() if all_namespaces else default_namespaces(env))
    values: dict[str, object] = {
        "redis_url": redis_url,
        "worker_redis_url": env.get("ARDIFF_WORKER_REDIS_URL") or redis_url,
        "namespaces": tuple(namespaces),  # type: ignore[arg-type]
        "all_namespaces": all_namespaces,
    }
    for field_name, variable in ENV_SECONDS.items():
        if (seconds := env_float(env, variable)) is not None:
            values[field_name] = seconds
    if env.get("ARDIFF_WORKER_REDIS_USERS"):
        values["worker_redis_users"] = env["ARDIFF_WORKER_REDIS_USERS"]
    if env.get("ARDIFF_OPERATOR_FOLLOW_DRAINS", "").lower() in ("1", "true", "yes"):
        values["follow_drains"] = True
    for field_name, variable in ENV_TEXTS.items():
        if env.get(variable):
            values[field_name] = env[variable]
    values["operator_namespace"] = own_namespace(env)
    for field_name, variable in ENV_LISTS.items():
        if variable in env:
            values[field_name] = comma_list(env[variable])
        if isinstance(given.get(field_name), str):  # the command line's comma-separated form
            given[field_name] = comma_list(str(given[field_name]))
    values.update(given)
    return OperatorConfig(**values)  # type: ignore[arg-type]
