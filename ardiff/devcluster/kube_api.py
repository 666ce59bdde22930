"""The dev cluster's emulated Kubernetes API: HTTP in front of `kube_store.ObjectStore`.

No kube-apiserver can be installed on the development machines (notes/k8s-test-harness.md), so this is
a development harness that speaks enough of the API for kopf, kubectl, the `kubernetes` client and the
pod runner: discovery (`/api`, `/apis`, ...), list/get/watch/create/replace/patch/delete of every kind
in kmock's bundled K3s catalogue and of custom resources once their CRD is created, the `status` and
`binding` subresources, `?dryRun=All`, `?fieldValidation=Strict` (unknown fields are otherwise dropped
with a `Warning` header), label/field selectors, server-side printing (`Accept: ...;as=Table`, so
`kubectl get adsession` shows the CRD's printer columns), and Status errors like the apiserver's (422
`Invalid` naming the field). `/openapi/v3` is just enough for kubectl's default `--validate=strict` to
hand validation to the server. `KubeAPI.request_log` records the resource requests of chosen clients (by
bearer token) as RBAC verbs, for deriving a Role. Not emulated: authentication, RBAC, admission webhooks,
server-side apply, protobuf (so kubectl's typed generators such as `kubectl create namespace|secret` get a
415: use `kubectl apply -f`).

Design note: kmock 0.8's `KubernetesEmulator` keeps every request and object version in memory, patches
aiohttp's resolver process-wide and has no resourceVersion/generation/status/selector/watch-resume
semantics; the dev cluster reuses kmock's bundled resource catalogue and implements the semantics in
`kube_store` on a plain aiohttp server.

Run it:
- in-process on the running loop: `async with KubeAPIServer() as server: server.url`;
- on a background thread (sync tests, fixtures): `with KubeAPIThread(kubeconfig=path) as api: ...`;
- as a process: `python -m ardiff.devcluster.kube_api --port P --kubeconfig PATH [--install-crds]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from aiohttp import web

from ardiff.devcluster.api_resources import (
    ResourceType,
    build_api_group,
    build_api_group_list,
    build_api_versions,
    build_openapi_v3_group_version,
    build_openapi_v3_index,
    build_resource_list,
)
from ardiff.devcluster.crd import CRD_DIR, load_manifests
from ardiff.devcluster.kube_store import (
    CLOSED,
    ApiError,
    DeleteOptions,
    ObjectStore,
    WriteResult,
    bad_request,
)
from ardiff.devcluster.patches import APPLY_PATCH
from ardiff.devcluster.request_log import ApiRequest, RequestLog, rbac_verb
from ardiff.devcluster.selectors import FieldSelector, LabelSelector, SelectorError
from ardiff.devcluster.tables import build_table

# The apiserver's limit on a request body (etcd holds objects of at most ~1.5 MiB).
MAX_BODY_BYTES = 3 << 20
DEFAULT_NAMESPACES = ("default", "kube-system")
SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-ardiff-devcluster",
    "platform": "linux/amd64",
}
# Not a Kubernetes path: bulk objects for simulations at scale (`KubeAPI._seed`).
SEED_PATH = "/devcluster/seed"
# How often an idle watch checks whether its client went away.
_WATCH_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class ApiPath:
    """A resource URL: `/api/v1[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]` or `/apis/<g>/<v>/...`."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_api_path(path: str) -> ApiPath | None:
    """The resource a URL addresses, or None for discovery and other non-resource URLs."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # /namespaces/<ns>/<plural>/... is namespaced; /namespaces[/<name>[/status|finalize]] is a Namespace.
    if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        return None
    plural, name, subresource = [*rest, None, None][:3]
    return ApiPath(group, version, plural, namespace, name, subresource)  # type: ignore[arg-type]


def _json(body: Any, status: int = 200, warnings: Iterable[str] = ()) -> web.Response:
    response = web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )
    for warning in warnings:
        response.headers.add("Warning", f"299 - {json.dumps(warning)}")
    return response


def _wants_table(request: web.BaseRequest) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _flag(params: Mapping[str, str], name: str) -> bool:
    return params.get(name, "").lower() in ("true", "1")


class KubeAPI:
    """The request handler: routes Kubernetes API requests into an ObjectStore."""

    def __init__(self, store: ObjectStore | None = None) -> None:
        self.store = store or ObjectStore()
        # The resource requests of followed clients, as RBAC authorizes them (request_log.py).
        self.request_log = RequestLog()
        namespaces = self.store.resource("", "v1", "namespaces")
        for name in DEFAULT_NAMESPACES:
            self.store.create(namespaces, None, {"metadata": {"name": name}})

    # --- in-process helpers --------------------------------------------------------------------------

    def apply(self, manifests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Create each manifest, or replace it if it exists (what `kubectl apply` amounts to here)."""
        applied = []
        for doc in manifests:
            rtype = self.store.registry.by_kind(doc["apiVersion"], doc["kind"])
            if rtype is None:
                raise ApiError(
                    404, "NotFound", f"no matches for kind {doc['kind']!r} in version {doc['apiVersion']!r}"
                )
            namespace = doc.get("metadata", {}).get("namespace") or ("default" if rtype.namespaced else None)
            try:
                applied.append(self.store.create(rtype, namespace, doc).obj)
            except ApiError as exc:
                if exc.reason != "AlreadyExists":
                    raise
                current = self.store.get(rtype, namespace, doc["metadata"]["name"])
                body = {
                    **doc,
                    "metadata": {
                        **doc["metadata"],
                        "resourceVersion": current["metadata"]["resourceVersion"],
                    },
                }
                applied.append(self.store.replace(rtype, namespace, doc["metadata"]["name"], body).obj)
        return applied

    def install_crds(self, directory: Path = CRD_DIR) -> list[dict[str, Any]]:
        return self.apply(load_manifests(directory))

    # --- HTTP ----------------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except ApiError as exc:
            return _json(exc.as_status(), exc.status)

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        registry = self.store.registry
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if request.method == "GET":
            parts = [p for p in path.split("/") if p]
            discovery: Any = None
            if path == "/version":
                discovery = SERVER_VERSION
            elif path == "/":
                discovery = {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/version"]}
            elif path == "/api":
                discovery = build_api_versions()
            elif path == "/apis":
                discovery = build_api_group_list(registry)
            elif path == "/openapi/v3":
                discovery = build_openapi_v3_index(registry)
            elif parts[:2] == ["openapi", "v3"] and parts[2] == "api" and len(parts) == 4:
                discovery = build_openapi_v3_group_version(registry, "", parts[3])
            elif parts[:2] == ["openapi", "v3"] and parts[2] == "apis" and len(parts) == 5:
                discovery = build_openapi_v3_group_version(registry, parts[3], parts[4])
            elif parts[0] == "apis" and len(parts) == 2:
                discovery = build_api_group(registry, parts[1])
            elif (parts[0] == "api" and len(parts) == 2) or (parts[0] == "apis" and len(parts) == 3):
                group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
                discovery = build_resource_list(registry, group, version)
            if discovery is not None:
                return _json(discovery)
        if path == SEED_PATH and request.method == "POST":
            return _json({"seeded": self._seed(await self._body(request))}, 201)
        api_path = parse_api_path(path)
        if api_path is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rtype = self.store.resource(api_path.group, api_path.version, api_path.plural)
        if api_path.namespace is not None and not rtype.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return await self._resource(request, rtype, api_path)

    async def _body(self, request: web.BaseRequest) -> Any:
        if request.content_type == APPLY_PATCH:
            raise ApiError(
                415, "UnsupportedMediaType", "server-side apply is not supported by the dev cluster"
            )
        if request.content_type.startswith(("application/vnd.kubernetes.protobuf", "application/cbor")):
            # Typed clients (`kubectl create namespace`, ...) retry with JSON after a 415.
            raise ApiError(
                415, "UnsupportedMediaType", f"the dev cluster speaks JSON, not {request.content_type}"
            )
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise bad_request(f"the request body is neither JSON nor YAML: {exc}") from exc

    async def _resource(
        self, request: web.BaseRequest, rtype: ResourceType, p: ApiPath
    ) -> web.StreamResponse:
        params = request.query
        store = self.store
        if request.method == "GET":
            self._log(request, rtype, p)
        if request.method == "GET" and p.subresource == "scale" and p.name is not None:
            return _json(store.get_scale(rtype, p.namespace, p.name))
        if request.method == "GET":
            if p.subresource not in (None, "status"):
                raise ApiError(
                    404, "NotFound", f"the dev cluster does not serve {rtype.qualified}/{p.subresource}"
                )
            if _flag(params, "watch"):
                return await self._watch(request, rtype, p)
            if p.name is not None:
                obj = store.get(rtype, p.namespace, p.name)
                return _json(self._table(request, rtype, [obj]) if _wants_table(request) else obj)
            labels, fields = self._selectors(params)
            items = store.list(rtype, p.namespace, labels, fields)
            if _wants_table(request):
                return _json(self._table(request, rtype, items))
            list_kind = rtype.crd.list_kind if rtype.crd else f"{rtype.kind}List"
            metadata = {"resourceVersion": store.resource_version}
            return _json(
                {"apiVersion": rtype.api_version, "kind": list_kind, "metadata": metadata, "items": items}
            )

        body = await self._body(request)
        self._log(request, rtype, p, body)
        dry_run = params.get("dryRun") == "All"
        strict = params.get("fieldValidation") == "Strict"
        result: WriteResult
        if request.method == "POST":
            if p.subresource == "binding" and rtype.qualified == "pods" and p.name and p.namespace:
                node = ((body or {}).get("target") or {}).get("name")
                if not node:
                    raise bad_request("a Binding needs target.name")
                store.bind_pod(p.namespace, p.name, node)
                return _json(
                    {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 201},
                    201,
                )
            if p.name is not None:
                raise ApiError(405, "MethodNotAllowed", f"POST is not allowed on a named {rtype.kind}")
            result = store.create(rtype, p.namespace, body, dry_run=dry_run, strict=strict)
            return _json(result.obj, 201, result.warnings)
        if request.method == "DELETE":
            options = self._delete_options(body, params)
            if p.name is None:
                labels, fields = self._selectors(params)
                deleted = [
                    store.delete(rtype, obj["metadata"].get("namespace"), obj["metadata"]["name"], options)
                    for obj in store.list(rtype, p.namespace, labels, fields)
                ]
                return _json(
                    {
                        "apiVersion": rtype.api_version,
                        "kind": f"{rtype.kind}List",
                        "metadata": {},
                        "items": deleted,
                    }
                )
            return _json(store.delete(rtype, p.namespace, p.name, options))
        if p.name is None:
            raise ApiError(405, "MethodNotAllowed", f"{request.method} needs a named {rtype.kind}")
        if p.subresource == "scale" and request.method in ("PUT", "PATCH"):
            content_type = None if request.method == "PUT" else request.content_type
            result = store.update_scale(rtype, p.namespace, p.name, body, content_type, dry_run=dry_run)
        elif request.method == "PUT":
            result = store.replace(
                rtype, p.namespace, p.name, body, subresource=p.subresource, dry_run=dry_run, strict=strict
            )
        elif request.method == "PATCH":
            result = store.patch(
                rtype,
                p.namespace,
                p.name,
                body,
                request.content_type,
                subresource=p.subresource,
                dry_run=dry_run,
                strict=strict,
            )
        else:
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not supported")
        return _json(result.obj, 200, result.warnings)

    def _seed(self, body: Any) -> int:
        """`POST /devcluster/seed {"items": [...]}`: objects as restored from etcd (`ObjectStore.seed`)."""
        items = (body or {}).get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise bad_request('a seed body is {"items": [objects]}')
        for obj in items:
            rtype = self.store.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
            if rtype is None:
                raise bad_request(f"no kind {obj.get('kind')!r} in version {obj.get('apiVersion')!r}")
            self.store.seed(rtype, (obj.get("metadata") or {}).get("namespace"), obj)
        return len(items)

    def _log(self, request: web.BaseRequest, rtype: ResourceType, p: ApiPath, body: Any = None) -> None:
        verb = rbac_verb(request.method, named=p.name is not None, watch=_flag(request.query, "watch"))
        entry = ApiRequest(verb, rtype.group, rtype.plural, p.subresource, p.namespace, p.name)

        def resolve_kind(api_version: str, kind: str) -> tuple[str, str] | None:
            owner = self.store.registry.by_kind(api_version, kind)
            return None if owner is None else (owner.group, owner.plural)

        self.request_log.record(request.headers, entry, body, resolve_kind)

    def _selectors(self, params: Mapping[str, str]) -> tuple[LabelSelector, FieldSelector]:
        try:
            return LabelSelector.parse(params.get("labelSelector", "")), FieldSelector.parse(
                params.get("fieldSelector", "")
            )
        except SelectorError as exc:
            raise bad_request(str(exc)) from exc

    def _delete_options(self, body: Any, params: Mapping[str, str]) -> DeleteOptions:
        body = body if isinstance(body, dict) else {}
        grace = body.get("gracePeriodSeconds", params.get("gracePeriodSeconds"))
        preconditions = body.get("preconditions") or {}
        return DeleteOptions(
            propagation_policy=body.get("propagationPolicy")
            or params.get("propagationPolicy")
            or "Background",
            grace_period_seconds=int(grace) if grace is not None else None,
            precondition_uid=preconditions.get("uid"),
            precondition_resource_version=preconditions.get("resourceVersion"),
            dry_run="All" in (body.get("dryRun") or []) or params.get("dryRun") == "All",
        )

    def _table(
        self, request: web.BaseRequest, rtype: ResourceType, objects: list[dict[str, Any]]
    ) -> dict[str, Any]:
        columns = rtype.crd.printer_columns if rtype.crd else ()
        include = request.query.get("includeObject", "Metadata")
        return build_table(
            rtype.kind, objects, columns, resource_version=self.store.resource_version, include_object=include
        )

    async def _watch(self, request: web.BaseRequest, rtype: ResourceType, p: ApiPath) -> web.StreamResponse:
        params = request.query
        labels, fields = self._selectors(params)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            initial, watch = self.store.watch(
                rtype,
                p.namespace,
                name=p.name,
                labels=labels,
                fields=fields,
                since=params.get("resourceVersion"),
                send_initial_events=_flag(params, "sendInitialEvents"),
            )
        except ApiError as exc:
            if exc.status != 410:
                raise
            # An expired resourceVersion is an ERROR event in a 200 stream, as on a real apiserver.
            await response.prepare(request)
            await response.write(json.dumps({"type": "ERROR", "object": exc.as_status()}).encode() + b"\n")
            return response
        await response.prepare(request)
        table = _wants_table(request)
        first = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None

        async def send(event_type: str, obj: dict[str, Any]) -> None:
            nonlocal first
            if table and event_type != "BOOKMARK":
                obj = self._table(request, rtype, [obj])
                if not first:
                    obj["columnDefinitions"] = []
                first = False
            await response.write(
                json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"
            )

        try:
            for event_type, obj in initial:
                await send(event_type, obj)
            while deadline is None or loop.time() < deadline:
                wait = (
                    _WATCH_POLL_SECONDS
                    if deadline is None
                    else min(_WATCH_POLL_SECONDS, deadline - loop.time())
                )
                try:
                    event_type, obj = await asyncio.wait_for(watch.queue.get(), timeout=max(wait, 0))
                except TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break  # the client went away
                    continue
                if event_type == CLOSED:
                    break
                await send(event_type, obj)
        except ConnectionError:
            pass  # the client went away mid-write
        finally:
            self.store.unwatch(watch)
        return response


DEV_TOKEN = "ardiff-dev-token"


def build_kubeconfig(
    server: str, namespace: str = "default", name: str = "ardiff-dev", token: str = DEV_TOKEN
) -> dict[str, Any]:
    """A kubeconfig for the emulated API (plain HTTP, a dummy token: the dev cluster has no auth; a distinct
    token names a client for `KubeAPI.request_log`)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, server: str, namespace: str = "default", token: str = DEV_TOKEN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(build_kubeconfig(server, namespace, token=token), sort_keys=False))
    return path


class KubeAPIServer:
    """Serve a KubeAPI on the running event loop: `async with KubeAPIServer() as server: server.url`."""

    def __init__(self, api: KubeAPI | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api or KubeAPI()
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '') else self.host}:{self.port}"

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.api.handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, shutdown_timeout=_WATCH_POLL_SECONDS * 3)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the bound port when 0 was asked for
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            self.api.store.close_watches()
            await self._runner.cleanup()
            self._runner = None


class KubeAPIThread:
    """The emulated API on a background thread with its own event loop (for sync code and fixtures)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig: Path | None = None,
        install_crds: bool = False,
    ) -> None:
        self.host, self.port, self.kubeconfig, self._install_crds = host, port, kubeconfig, install_crds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: KubeAPIServer | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "KubeAPIThread is not started"
        return self._server.url

    @property
    def api(self) -> KubeAPI:
        """The request handler (its `store`, its `request_log`); touch it only through thread-safe parts."""
        assert self._server is not None, "KubeAPIThread is not started"
        return self._server.api

    def start(self, timeout: float = 10) -> Self:
        started: Future[None] = Future()

        async def serve() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                api = KubeAPI()
                if self._install_crds:
                    api.install_crds()
                async with KubeAPIServer(api, host=self.host, port=self.port) as server:
                    self._server, self.port = server, server.port
                    started.set_result(None)
                    await self._stop.wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        self._thread = threading.Thread(
            target=asyncio.run, args=(serve(),), name="ardiff-kube-api", daemon=True
        )
        self._thread.start()
        started.result(timeout)
        if self.kubeconfig is not None:
            write_kubeconfig(self.kubeconfig, self.url)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


async def serve_forever(host: str, port: int, kubeconfig: Path | None, install_crds: bool) -> None:
    api = KubeAPI()
    if install_crds:
        api.install_crds()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KubeAPIServer(api, host=host, port=port) as server:
        if kubeconfig is not None:
            write_kubeconfig(kubeconfig, server.url)
        print(f"ardiff dev cluster API serving at {server.url}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="The dev cluster's emulated Kubernetes API (a development harness)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the API here once it listens")
    parser.add_argument("--install-crds", action="store_true", help=f"create the CRDs of {CRD_DIR} at start")
    args = parser.parse_args(argv)
    asyncio.run(serve_forever(args.host, args.port, args.kubeconfig, args.install_crds))


if __name__ == "__main__":
    main()
