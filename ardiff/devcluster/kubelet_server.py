"""The process kubelet's API on <node IP>:10250 (HTTPS, its serving certificate): what the API server proxies
`kubectl logs` to.

Served: `GET /healthz`, `GET /pods` (the Pods this kubelet runs), `GET /containerLogs/{ns}/{pod}/{container}`
with `follow`, `previous`, `tailLines`, `limitBytes` and `sinceSeconds` (read from the file the container's
output goes to; `timestamps` is accepted and ignored: the files hold the output as written). Clients must
present a certificate of the cluster's CA for `kube-apiserver-kubelet-client` (the API server's) or a
`system:masters` one; a kubelet authorizes through SubjectAccessReviews instead, which this one does not make.
`exec`, `attach` and `portForward` answer 501: the dev cluster's containers are plain processes (use `nsenter`
into the container's process on this machine instead).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from ardiff.devcluster.kubelet import Kubelet

KUBELET_PORT = 10250
ALLOWED_CLIENTS = {"kube-apiserver-kubelet-client"}


def _client_allowed(request: web.Request) -> bool:
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    if not peer:
        return False
    subject = {key: value for part in peer.get("subject", ()) for key, value in part}
    return subject.get("commonName") in ALLOWED_CLIENTS or subject.get("organizationName") == "system:masters"


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


async def serve_kubelet_api(kubelet: Kubelet) -> web.AppRunner:
    """Start serving; the caller cleans the returned runner up."""

    @web.middleware
    async def authorize(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path != "/healthz" and not _client_allowed(request):
            return web.Response(
                status=403, text="Forbidden: the dev cluster's kubelet serves the API server only\n"
            )
        return await handler(request)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def pods(_: web.Request) -> web.Response:
        items = [w.pod for w in kubelet.workers.values()]
        return web.Response(
            text=json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}),
            content_type="application/json",
        )

    async def container_logs(request: web.Request) -> web.StreamResponse:
        ns, name, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        worker = next((w for w in kubelet.workers.values() if (w.namespace, w.name) == (ns, name)), None)
        runner = None if worker is None else worker.container(container)
        if worker is None or runner is None:
            return web.Response(
                status=404, text=f"container {container!r} of pod {ns}/{name} is not on this node\n"
            )
        query = request.query
        previous = query.get("previous") == "true"
        if previous and runner.restart_count == 0:
            return web.Response(
                status=400, text=f'previous terminated container "{container}" in pod "{name}" not found\n'
            )
        path = runner.log_path(runner.restart_count - 1 if previous else None)
        data = path.read_bytes() if path.exists() else b""
        if (
            "sinceSeconds" in query
            and path.exists()
            and time.time() - path.stat().st_mtime > int(query["sinceSeconds"])
        ):
            data = b""
        if "tailLines" in query:
            data = _tail(data, int(query["tailLines"]))
        if "limitBytes" in query:
            data = data[: int(query["limitBytes"])]
        if query.get("follow") != "true" or previous:
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        offset = path.stat().st_size if path.exists() else 0
        while runner.process is not None and runner.log_path() == path:
            await asyncio.sleep(0.2)
            if path.exists() and path.stat().st_size > offset:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                offset += len(chunk)
                await response.write(chunk)
        await response.write_eof()
        return response

    async def not_served(_: web.Request) -> web.Response:
        return web.Response(
            status=501, text="the dev cluster's process kubelet does not serve exec, attach or port-forward\n"
        )

    app = web.Application(middlewares=[authorize])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/pods", pods)
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    for prefix in ("exec", "attach", "portForward", "run"):
        app.router.add_route("*", f"/{prefix}/{{tail:.*}}", not_served)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=kubelet.config.ca)
    context.load_cert_chain(kubelet.config.serving_cert, kubelet.config.serving_key)
    context.verify_mode = ssl.CERT_OPTIONAL
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, kubelet.config.node_ip, KUBELET_PORT, ssl_context=context)
    await site.start()
    return runner
