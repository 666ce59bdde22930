"""The endpoint picker (issue 37): an Envoy external-processing (`ext_proc`) gRPC server that tells the front
door which Pod serves each session request, speaking the Gateway API Inference Extension's endpoint-picker
protocol (its `docs/proposals/004-endpoint-picker-protocol`).

For a request's headers it reads the session from the placement store (`PlacementStore.route`: one read-only
round trip, as the store's gateway user) and answers with `ardiff.gateway.routes.decide`'s verdict: the
session's pod as `x-gateway-destination-endpoint: <ip:port>`, in the request's headers and in the `envoy.lb`
dynamic metadata (the protocol asks for both), or an immediate answer in the worker's envelope. It never asks
for a body: the bundled Envoy sends headers only (body mode NONE: WebSocket upgrades through `ext_proc` hang
otherwise, envoy issues 47048 and 47081); a third-party gateway that streams bodies gets each chunk passed on
unchanged. A worker's 421 (the session moved while the request was in flight) on the response headers is
rewritten to 503 `resuming` with `Retry-After: 0`, so no Pod address leaves the front door and the client's
retry is placed afresh (Envoy's own retries reuse the picked header).

Health: the gRPC health service (`liveness`; `readiness` and the ext_proc service: SERVING once the store
answered a PING, checked every `HEALTH_SECONDS`: see `PickerState`), and the same over HTTP with the metrics
(`/healthz`, `/readyz`, `/metrics`) for a kubelet's probes and Prometheus.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from ardiff.gateway.envoy_config import (
    DESTINATION_HEADER,
    POD_HOST_HEADER,
    PODS_CLUSTER,
    UPSTREAM_CLUSTER_HEADER,
)
from ardiff.gateway.routes import (
    MOVED,
    MOVED_FROM_STATUS,
    NO_TLS_CLUSTER,
    NOT_A_SESSION_ROUTE,
    OUTSIDE_SUBSET,
    REFUSED,
    STORE_UNAVAILABLE,
    Answer,
    Forward,
    SessionRequest,
    decide,
    parse_request,
)
from ardiff.gateway.tls_clusters import TlsClusters
from ardiff.kv.placement import PlacementStore
from ardiff.kv.placement_gateway import SessionRoute
from ardiff.kv.records import PoolId
from ardiff.wire import JSON

log = logging.getLogger(__name__)

# The endpoint-picker protocol's names (GIE proposal 004; the destination header: envoy_config).
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
HEALTH_SECONDS = 2.0
# Sessions whose pod is remembered (a request then reads the store once): bounded, least recently used out.
EXPECTED_PODS = 100_000
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class PickerMetrics:
    """`ardiff_gateway_requests_total{outcome}` (`forward` or the answer's code), the decision's latency, and
    the store's failures."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ardiff_gateway_requests_total",
            "Requests the endpoint picker decided, by outcome (forward, or the error code answered)",
            ["outcome"],
            registry=self.registry,
        )
        self.decision = Histogram(
            "ardiff_gateway_decision_seconds",
            "Time from a request's headers to the picker's answer (the store's read included)",
            buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0),
            registry=self.registry,
        )
        self.store_errors = Counter(
            "ardiff_gateway_store_errors_total",
            "Placement store calls of the picker that failed",
            registry=self.registry,
        )
        self.store_up = Gauge(
            "ardiff_gateway_store_up",
            "1 while the placement store answers the picker's PING",
            registry=self.registry,
        )


@dataclass
class PickerState:
    """Whether the picker is ready (the store answered a PING since it started: a front door that never
    reached the store takes no traffic) and whether the store answers now. Once ready it stays so: while the
    store is away it answers every request 503 `not_ready` with its code, which is better than a Service
    without endpoints (a refused connection, no code) when the store is away for every replica alike."""

    ready: bool = False
    store_up: bool = False


class EndpointPicker(ext_proc_grpc.ExternalProcessorServicer):
    """The ext_proc service (see the module docstring)."""

    def __init__(self, store: PlacementStore, metrics: PickerMetrics, tls: TlsClusters | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.tls = tls  # None: this front door reaches no TLS pool
        self._expected: collections.OrderedDict[tuple[str, str, str], str] = collections.OrderedDict()

    async def Process(
        self, request_iterator: AsyncIterator[ext_proc.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        async for message in request_iterator:
            kind = message.WhichOneof("request")
            if kind == "request_headers":
                yield await self._request_headers(message)
            elif kind == "response_headers":
                yield self._response_headers(message.response_headers)
            elif kind == "request_body":
                yield ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
            elif kind == "response_body":
                yield ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
            elif kind == "request_trailers":
                yield ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
            elif kind == "response_trailers":
                yield ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())

    async def _request_headers(self, message: ext_proc.ProcessingRequest) -> ext_proc.ProcessingResponse:
        started = time.perf_counter()
        headers = _headers(message.request_headers.headers.headers)
        request = parse_request(headers.get(":method", ""), headers.get(":path", ""), headers)
        verdict = await self._verdict(request)
        if isinstance(verdict, Forward):
            subset = _subset(message.metadata_context)
            if subset is not None and verdict.address not in subset:
                verdict = OUTSIDE_SUBSET
        self.metrics.decision.observe(time.perf_counter() - started)
        if isinstance(verdict, Forward):
            self.metrics.requests.labels("forward").inc()
            return _forward(verdict)
        self.metrics.requests.labels(verdict.body["error"]["code"]).inc()
        return _immediate(verdict)

    async def _verdict(self, request: SessionRequest | None) -> Forward | Answer:
        if request is None:
            return NOT_A_SESSION_ROUTE
        if not request.names_valid:
            return REFUSED  # a name no session can have is refused as an unknown one is
        pool = request.pool_id
        key = (request.namespace, request.pool, request.session)
        try:
            route = await self.store.route(
                pool,
                request.session,
                expected_pod=self._expected.get(key, ""),
                any_live=request.any_pod_answers,
            )
            verdict = decide(request, route)
            if isinstance(verdict, Answer) and verdict.demand_resume:
                await self.store.request_resume(pool, request.session)
            if isinstance(verdict, Forward):
                cluster = await self._cluster(pool, verdict, route)
                verdict = NO_TLS_CLUSTER if cluster is None else dataclasses.replace(verdict, cluster=cluster)
        except Exception as exc:  # Redis away or not answering: what a worker answers then
            self.metrics.store_errors.inc()
            log.warning("placement store read for %s/%s failed: %r", pool, request.session, exc)
            return STORE_UNAVAILABLE
        self._remember(key, route.pod.name if route.pod is not None else "")
        return verdict

    async def _cluster(self, pool: PoolId, verdict: Forward, route: SessionRoute) -> str | None:
        """The bundled Envoy's cluster for the pod: plain, or the one trusting its TLS pool's CA (made on the
        first request; None: no way to verify the pod)."""
        if verdict.tls_host is None:
            return PODS_CLUSTER
        if self.tls is None:
            return None
        return await self.tls.cluster(self.store, pool, route.pool_ca_sha256 or "")

    def _remember(self, key: tuple[str, str, str], pod: str) -> None:
        if not pod:
            self._expected.pop(key, None)
            return
        self._expected[key] = pod
        self._expected.move_to_end(key)
        while len(self._expected) > EXPECTED_PODS:
            self._expected.popitem(last=False)

    def _response_headers(self, headers: ext_proc.HttpHeaders) -> ext_proc.ProcessingResponse:
        if _headers(headers.headers.headers).get(":status") == str(MOVED_FROM_STATUS):
            self.metrics.requests.labels("moved").inc()
            return _immediate(MOVED)
        return ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())


def _headers(entries: Iterable[base_pb2.HeaderValue]) -> dict[str, str]:
    """Header names (lower case, as Envoy sends them) to values; Envoy may send either field."""
    return {h.key: h.raw_value.decode("latin-1") if h.raw_value else h.value for h in entries}


def _subset(metadata: base_pb2.Metadata) -> frozenset[str] | None:
    """The endpoints a gateway lets the picker choose from (`envoy.lb.subset_hint`); None: it sets none."""
    hint = metadata.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return frozenset(item.string_value for item in value.list_value.values)
    return frozenset(part.strip() for part in value.string_value.split(",") if part.strip())


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _forward(verdict: Forward) -> ext_proc.ProcessingResponse:
    """The pod as the destination and the bundled Envoy's cluster for it (with, for a TLS pool, the name
    its certificate carries): set always, so a client's own copies never choose."""
    headers = [
        _header(DESTINATION_HEADER, verdict.address),
        _header(UPSTREAM_CLUSTER_HEADER, verdict.cluster),
    ]
    if verdict.tls_host is not None:
        headers.append(_header(POD_HOST_HEADER, verdict.tls_host))
    metadata = struct_pb2.Struct()
    metadata.update({LB_NAMESPACE: {DESTINATION_HEADER: verdict.address}})
    return ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(
                header_mutation=ext_proc.HeaderMutation(
                    set_headers=headers,
                    remove_headers=[] if verdict.tls_host is not None else [POD_HOST_HEADER],
                ),
                clear_route_cache=True,  # the route's cluster is the header set here
            )
        ),
        dynamic_metadata=metadata,
    )


def _immediate(answer: Answer) -> ext_proc.ProcessingResponse:
    headers = [_header("content-type", JSON)]
    if answer.retry_after is not None:
        headers.append(_header("retry-after", str(answer.retry_after)))
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=answer.status),
            headers=ext_proc.HeaderMutation(set_headers=headers),
            body=json.dumps(answer.body, separators=(",", ":")).encode(),
            details="ardiff_picker",
        )
    )


# ------------------------------------------------------------------------------------------ the process


@dataclass(frozen=True)
class PickerSettings:
    """`ardiff gateway picker`'s settings: the store (the gateway's Redis user: its URL, or a file holding
    it, read again every `HEALTH_SECONDS`: a mounted Secret's rotated password is taken up without a
    restart), the gRPC address Envoy calls, the HTTP address of the probes and metrics, and for TLS pools the
    directory the bundled Envoy reads their clusters from and its admin address
    (`ardiff.gateway.tls_clusters`)."""

    redis_url: str = ""
    redis_url_file: str | None = None
    listen: str = "0.0.0.0:9002"
    http_listen: str = "0.0.0.0:9003"
    dynamic_dir: str | None = None
    envoy_admin: str | None = None

    def __post_init__(self) -> None:
        if bool(self.redis_url) == (self.redis_url_file is not None):
            raise ValueError("gateway picker needs one of redis_url and redis_url_file")
        for name in ("listen", "http_listen"):
            host, _, port = getattr(self, name).rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(f"gateway picker {name} must be <host>:<port>, got {getattr(self, name)!r}")

    def current_redis_url(self) -> str:
        """The store's URL now (the file's content, when the URL comes from a file)."""
        if self.redis_url_file is None:
            return self.redis_url
        return Path(self.redis_url_file).read_text().strip()


def _http_app(metrics: PickerMetrics, state: PickerState) -> Callable[..., Iterable[bytes]]:
    """`/healthz` (the process answers), `/readyz` (`PickerState.ready`: 503 until the store first answered),
    `/metrics`."""
    prometheus = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok"]
        if path == "/readyz":
            status = "200 OK" if state.ready else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain")])
            return [b"ready" if state.ready else b"the placement store has not answered yet"]
        return prometheus(environ, start_response)

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a probe every few seconds is not news


def _serve_http(address: str, metrics: PickerMetrics, state: PickerState) -> ThreadingWSGIServer:
    host, _, port = address.rpartition(":")
    server = make_server(host, int(port), _http_app(metrics, state), ThreadingWSGIServer, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="picker-http", daemon=True).start()
    return server


async def _watch_store(
    picker: EndpointPicker, settings: PickerSettings, state: PickerState, servicer: health.aio.HealthServicer
) -> None:
    """Every `HEALTH_SECONDS`: a store client for a changed URL (its file rewritten: a rotated password), then
    a PING; readiness (gRPC and HTTP) follows the answer."""
    url = settings.current_redis_url()
    while True:
        with contextlib.suppress(OSError):
            fresh = settings.current_redis_url()
            if fresh and fresh != url:
                url, previous = fresh, picker.store
                picker.store = PlacementStore.from_url(url)
                log.info("the placement store's URL changed: a new client")
                asyncio.get_running_loop().call_later(HEALTH_SECONDS, asyncio.ensure_future, previous.close())
        try:
            await asyncio.wait_for(picker.store.ping(), HEALTH_SECONDS)
            up = True
        except Exception as exc:
            up = False
            if state.store_up:
                log.warning("the placement store stopped answering: %r", exc)
        if up and not state.store_up:
            log.info("the placement store answers")
        state.store_up = up
        picker.metrics.store_up.set(int(up))
        if up and not state.ready:
            state.ready = True
            for service in ("readiness", EXT_PROC_SERVICE, ""):
                await servicer.set(service, SERVING)
            log.info("endpoint picker ready")
        await asyncio.sleep(HEALTH_SECONDS)


async def serve(settings: PickerSettings, stop: asyncio.Event) -> None:
    """Serve until `stop` is set; in-flight streams get a second to finish."""
    metrics, state = PickerMetrics(), PickerState()
    tls = (
        None
        if settings.dynamic_dir is None
        else TlsClusters(Path(settings.dynamic_dir), settings.envoy_admin)
    )
    picker = EndpointPicker(PlacementStore.from_url(settings.current_redis_url()), metrics, tls)
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(picker, server)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await servicer.set("liveness", SERVING)
    for service in ("readiness", EXT_PROC_SERVICE, ""):
        await servicer.set(service, NOT_SERVING)
    if not server.add_insecure_port(settings.listen):
        raise OSError(f"the endpoint picker cannot listen on {settings.listen}")
    http = _serve_http(settings.http_listen, metrics, state)
    await server.start()
    log.info("endpoint picker on %s (probes and metrics on %s)", settings.listen, settings.http_listen)
    watcher = asyncio.create_task(_watch_store(picker, settings, state, servicer))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        await server.stop(1.0)
        http.shutdown()
        await picker.store.close()
