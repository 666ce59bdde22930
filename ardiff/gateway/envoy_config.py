"""The front door's Envoy configuration, made in one place (issue 37; `ardiff gateway bootstrap` writes it,
Envoy checks it in `tests/gateway/test_envoy_config.py` with `envoy --mode validate`).

One listener takes the sessions' traffic: every request under `/pools/` goes through the `ext_proc` filter to
the endpoint picker (`ardiff.gateway.picker`: request and response headers, never a body), then to the Pod it
picked through an original-destination cluster keyed by `x-gateway-destination-endpoint` (the Gateway API
Inference Extension's header), the `/pools/<namespace>/<pool>` prefix stripped; anything else is 404 at the
edge without asking the picker. WebSocket upgrades pass; timeouts fit a GPU's first chunk (a tick may take
`REQUEST_TIMEOUT_SECONDS`) and a stream's life (`STREAM_IDLE_SECONDS` without a byte); request bodies are
bounded by the worker's largest limit at the edge (413). Every answer Envoy makes itself — the picker
unreachable or failing (fail closed), the Pod not answering, a body too large — is the worker's JSON envelope
with a code, scoped by response flags so the picker's own answers pass unchanged. Every forwarded request
carries `ardiff-front-door: 1` (a client's own copy replaced), so the worker leaves Pod addresses out of its
answers.

Pods of a TLS pool are reached over https, verifying the pool's CA with the Pod's DNS name as SNI and SAN: a
cluster per pool and CA (`tls_cluster_name`, chosen by the picker's `x-ardiff-upstream-cluster`), read from
files under `dynamic_dir` that `write_tls_clusters` writes and Envoy watches (pools come and go, CAs
rotate).

A second listener (`health_port`) answers `/ready` while Envoy runs and serves Envoy's metrics
(`/stats/prometheus`); the admin interface listens on loopback only.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ardiff.gateway.routes import MOVED, MOVED_FROM_STATUS
from ardiff.wire import FRONT_DOOR_HEADER, FRONT_DOOR_POOLS, error_envelope

_TYPE = "type.googleapis.com/envoy."  # the start of every typed config's `@type`
DESTINATION_HEADER = "x-gateway-destination-endpoint"
POD_HOST_HEADER = "x-ardiff-pod-host"
UPSTREAM_CLUSTER_HEADER = "x-ardiff-upstream-cluster"
PODS_CLUSTER = "pods"  # plain HTTP pools
PICKER_CLUSTER = "picker"
ADMIN_CLUSTER = "admin"
CDS_FILE = "cds.yaml"
# A tick's first chunk on a GPU takes 6-19 s (vllm-omni's LingBot numbers): a request may take this long.
REQUEST_TIMEOUT_SECONDS = 120
# A WebSocket may be quiet this long (a paused viewer) before Envoy closes it.
STREAM_IDLE_SECONDS = 3600
# The worker's largest request body (a DreamZero tick's observation, 4 MiB; a LingBot tick 1 MiB).
MAX_BODY_BYTES = 4 << 20
# How long the picker may take to answer one message (a store read; Envoy's default is 200 ms).
PICKER_TIMEOUT_MS = 2000
# Envoy's answers that are failures of the front door or of the Pod (not the picker's answers): the picker
# unreachable or failing, no upstream host, the Pod refusing or resetting the connection, a timeout.
_FAILURE_FLAGS = ("UH", "UF", "UO", "URX", "UC", "UT", "LR", "NC", "DPE", "UMSDR", "UPE")
_WEBSOCKET_ROUTES = r"(/v1/sessions/[^/]+/(stream|openpi)|/v1/realtime/video)"
_POOL_PREFIX = rf"^/{FRONT_DOOR_POOLS}/[^/]+/[^/]+"


@dataclass(frozen=True)
class EnvoySettings:
    """What the bootstrap is made from (`ardiff gateway bootstrap`'s flags)."""

    listen_port: int = 8080
    health_port: int = 8081
    admin_port: int = 9901
    picker: str = "127.0.0.1:9002"  # host:port; a name is resolved by DNS
    tls_cert_file: str | None = None  # downstream TLS (a kubernetes.io/tls Secret's tls.crt and tls.key)
    tls_key_file: str | None = None
    dynamic_dir: str | None = None  # where the TLS pools' clusters are (`write_tls_clusters`)

    def __post_init__(self) -> None:
        for name in ("listen_port", "health_port", "admin_port"):
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"gateway envoy {name} must be a port (1-65535), got {port!r}")
        if len({self.listen_port, self.health_port, self.admin_port}) != 3:
            raise ValueError("gateway envoy listen_port, health_port and admin_port must differ")
        host, _, port = self.picker.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"gateway envoy picker must be <host>:<port>, got {self.picker!r}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("gateway envoy tls_cert_file and tls_key_file go together")


def _json_reply(code: str, status: int, message: str) -> dict[str, Any]:
    envelope = error_envelope(code, status, message)
    return {"json_format": envelope, "content_type": "application/json"}


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _static_cluster(name: str, host: str, port: int, *, http2: bool = False) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STATIC" if _is_ip(host) else "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(host, port)}}]}],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_TYPE}extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def pod_cluster(name: str, ca_file: str | None = None) -> dict[str, Any]:
    """An original-destination cluster to the Pod the picker names; with `ca_file`, over TLS verifying that
    CA and the Pod's DNS name (the picker's `x-ardiff-pod-host`) as SNI and SAN."""
    cluster: dict[str, Any] = {
        "name": name,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        "cleanup_interval": "30s",
    }
    if ca_file is not None:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_TYPE}extensions.upstreams.http.v3.HttpProtocolOptions",
                "upstream_http_protocol_options": {
                    "auto_sni": True,
                    "auto_san_validation": True,
                    "override_auto_sni_header": POD_HOST_HEADER,
                },
                "explicit_http_config": {"http_protocol_options": {}},
            }
        }
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": f"{_TYPE}extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"validation_context": {"trusted_ca": {"filename": ca_file}}},
            },
        }
    return cluster


def _session_route(websocket: bool) -> dict[str, Any]:
    path = f"{_POOL_PREFIX}{_WEBSOCKET_ROUTES}$" if websocket else f"{_POOL_PREFIX}/.*"
    route: dict[str, Any] = {
        "match": {"safe_regex": {"regex": path}},
        "route": {
            "cluster_header": UPSTREAM_CLUSTER_HEADER,
            "timeout": "0s" if websocket else f"{REQUEST_TIMEOUT_SECONDS}s",
            "idle_timeout": f"{STREAM_IDLE_SECONDS}s",
            "regex_rewrite": {"pattern": {"regex": f"{_POOL_PREFIX}(/.*)$"}, "substitution": "\\1"},
        },
        "request_headers_to_add": [_set_header(FRONT_DOOR_HEADER, "1")],
        "request_headers_to_remove": [UPSTREAM_CLUSTER_HEADER],
    }
    if websocket:  # a socket's messages are not a body to buffer
        route["typed_per_filter_config"] = {"envoy.filters.http.buffer": _filter_disabled()}
    return route


def _local_replies() -> dict[str, Any]:
    """Envoy's own answers as the worker's envelope: a body too large (413), and every failure of the front
    door or of the Pod (retryable 503 `not_ready`). The picker's answers match neither: they pass as made."""
    failure = {
        "or_filter": {
            "filters": [
                {"response_flag_filter": {"flags": list(_FAILURE_FLAGS)}},
                {"status_code_filter": _status_is(504)},
                # ext_proc's failures carry no response flag, only their details.
                {
                    "extension_filter": {
                        "name": "envoy.access_loggers.extension_filters.cel",
                        "typed_config": {
                            "@type": f"{_TYPE}extensions.access_loggers.filters.cel.v3.ExpressionFilter",
                            "expression": "response.code_details.startsWith('ext_proc_error')",
                        },
                    }
                },
            ]
        }
    }
    return {
        "mappers": [
            {
                "filter": {"status_code_filter": _status_is(413)},
                "body_format_override": _json_reply(
                    "body_too_large", 413, f"request body exceeds {MAX_BODY_BYTES} bytes"
                ),
            },
            {
                "filter": failure,
                "status_code": 503,
                "headers_to_add": [_set_header("retry-after", "1")],
                "body_format_override": _json_reply(
                    "not_ready", 503, "the front door cannot reach the session's pod right now; retry"
                ),
            },
        ]
    }


def _set_header(key: str, value: str) -> dict[str, Any]:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


def _filter_disabled() -> dict[str, Any]:
    return {"@type": f"{_TYPE}config.route.v3.FilterConfig", "disabled": True}


def _routes() -> list[dict[str, Any]]:
    """The session routes (sockets first: no body buffer), then 404 for anything else, without the picker."""
    not_a_session = error_envelope(
        "not_found", 404, "not a session route of the front door (docs/contracts.md)"
    )
    return [
        _session_route(websocket=True),
        _session_route(websocket=False),
        {
            "match": {"prefix": "/"},
            "direct_response": {
                "status": 404,
                "body": {"inline_string": json.dumps(not_a_session, separators=(",", ":"))},
            },
            "response_headers_to_add": [_set_header("content-type", "application/json")],
            "typed_per_filter_config": {"envoy.filters.http.ext_proc": _filter_disabled()},
        },
    ]


def _http_filters() -> list[dict[str, Any]]:
    """ext_proc (headers only, failing closed), the body bound, the router."""
    picker = {
        "@type": f"{_TYPE}extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}, "timeout": "5s"},
        "message_timeout": f"{PICKER_TIMEOUT_MS / 1000:g}s",
        "failure_mode_allow": False,
        "status_on_error": {"code": "ServiceUnavailable"},
        "processing_mode": {
            "request_header_mode": "SEND",
            # A worker's 421 is rewritten by `_moved_rewrite` in Envoy itself: asking the picker about every
            # response would cost a second gRPC round trip per request (docs/benchmarks.md "Front door").
            "response_header_mode": "SKIP",
            "request_body_mode": "NONE",
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        },
    }
    body_bound = {
        "@type": f"{_TYPE}extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": MAX_BODY_BYTES,
    }
    return [
        {"name": "envoy.filters.http.ext_proc", "typed_config": picker},
        {"name": "envoy.filters.http.lua", "typed_config": _moved_rewrite()},
        {"name": "envoy.filters.http.buffer", "typed_config": body_bound},
        _router(),
    ]


def _moved_rewrite() -> dict[str, Any]:
    """A worker's 421 `misdirected` (the session moved while the request was in flight) becomes the picker's
    `MOVED` answer: 503 `resuming`, `Retry-After: 0`, no Pod address. Envoy's retries would reuse the picked
    header; the client's retry is placed afresh."""
    body = json.dumps(MOVED.body, separators=(",", ":")).replace("\\", "\\\\").replace("'", "\\'")
    source = f"""
function envoy_on_response(handle)
  local headers = handle:headers()
  if headers:get(':status') ~= '{MOVED_FROM_STATUS}' then
    return
  end
  headers:replace(':status', '{MOVED.status}')
  headers:replace('retry-after', '{MOVED.retry_after}')
  headers:replace('content-type', 'application/json')
  local body = handle:body()
  if body ~= nil then
    body:setBytes('{body}')
  end
end
"""
    return {
        "@type": f"{_TYPE}extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": source},
    }


def _router() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": f"{_TYPE}extensions.filters.http.router.v3.Router"},
    }


def _front_listener(settings: EnvoySettings) -> dict[str, Any]:
    manager = {
        "@type": f"{_TYPE}extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "front",
        "use_remote_address": True,
        "request_headers_timeout": "10s",
        "stream_idle_timeout": f"{STREAM_IDLE_SECONDS}s",
        "upgrade_configs": [{"upgrade_type": "websocket"}],
        "local_reply_config": _local_replies(),
        "route_config": {"virtual_hosts": [{"name": "sessions", "domains": ["*"], "routes": _routes()}]},
        "http_filters": _http_filters(),
    }
    chain: dict[str, Any] = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]
    }
    if settings.tls_cert_file is not None:
        chain["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": f"{_TYPE}extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": {
                    "tls_certificates": [
                        {
                            "certificate_chain": {"filename": settings.tls_cert_file},
                            "private_key": {"filename": settings.tls_key_file},
                        }
                    ],
                    "alpn_protocols": ["http/1.1"],
                },
            },
        }
    return {"name": "front", "address": _address("0.0.0.0", settings.listen_port), "filter_chains": [chain]}


def _status_is(code: int) -> dict[str, Any]:
    return {
        "comparison": {"op": "EQ", "value": {"default_value": code, "runtime_key": f"ardiff.status_{code}"}}
    }


def _health_listener(settings: EnvoySettings) -> dict[str, Any]:
    ready = {
        "match": {"path": "/ready"},
        "direct_response": {"status": 200, "body": {"inline_string": "ready"}},
    }
    metrics = {"match": {"path": "/stats/prometheus"}, "route": {"cluster": ADMIN_CLUSTER}}
    manager = {
        "@type": f"{_TYPE}extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "health",
        "route_config": {"virtual_hosts": [{"name": "health", "domains": ["*"], "routes": [ready, metrics]}]},
        "http_filters": [_router()],
    }
    return {
        "name": "health",
        "address": _address("0.0.0.0", settings.health_port),
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
        ],
    }


def bootstrap(settings: EnvoySettings) -> dict[str, Any]:
    """The whole bootstrap configuration (see the module docstring)."""
    picker_host, _, picker_port = settings.picker.rpartition(":")
    config: dict[str, Any] = {
        # File-based dynamic resources want a node identity (any; nothing serves xDS to it).
        "node": {"id": "ardiff-gateway", "cluster": "ardiff-gateway"},
        "admin": {"address": _address("127.0.0.1", settings.admin_port)},
        "static_resources": {
            "listeners": [_front_listener(settings), _health_listener(settings)],
            "clusters": [
                _static_cluster(PICKER_CLUSTER, picker_host.strip("[]"), int(picker_port), http2=True),
                pod_cluster(PODS_CLUSTER),
                _static_cluster(ADMIN_CLUSTER, "127.0.0.1", settings.admin_port),
            ],
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": {
                        "@type": f"{_TYPE}extensions.resource_monitors.downstream_connections.v3"
                        ".DownstreamConnectionsConfig",
                        "max_active_downstream_connections": 50_000,
                    },
                }
            ]
        },
    }
    if settings.dynamic_dir is not None:
        config["dynamic_resources"] = {
            "cds_config": {
                "path_config_source": {
                    "path": str(Path(settings.dynamic_dir) / CDS_FILE),
                    "watched_directory": {"path": settings.dynamic_dir},
                },
                "resource_api_version": "V3",
            }
        }
    return config


def write_tls_clusters(dynamic_dir: Path, ca_files: Mapping[str, str]) -> None:
    """The TLS pools' clusters (`cluster name -> CA file`) as the CDS file Envoy watches, replaced at once
    (written beside it, then renamed: Envoy never reads half of it)."""
    resources = [
        {"@type": f"{_TYPE}config.cluster.v3.Cluster", **pod_cluster(name, ca_file)}
        for name, ca_file in sorted(ca_files.items())
    ]
    dynamic_dir.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=dynamic_dir, prefix=".cds-", suffix=".yaml")
    with os.fdopen(handle, "w") as out:
        yaml.safe_dump({"resources": resources}, out, sort_keys=False)
    os.replace(partial, dynamic_dir / CDS_FILE)


def tls_cluster_name(namespace: str, pool: str, ca_sha256: str) -> str:
    """The cluster of a TLS pool's pods trusting the CA of digest `ca_sha256` (the picker names it in
    `x-ardiff-upstream-cluster`): a new CA is a new cluster, so a request never meets the old one's."""
    return f"pool-tls.{namespace}.{pool}.{ca_sha256[:16]}"


def render(settings: EnvoySettings) -> str:
    """The bootstrap as YAML (what `ardiff gateway bootstrap` writes)."""
    return yaml.safe_dump(bootstrap(settings), sort_keys=False)
