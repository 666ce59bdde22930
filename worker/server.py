"""`ardiff worker serve`: the worker process (uvicorn) with its drain-on-SIGTERM behaviour."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
import zlib
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ardiff.worker.app import create_app
from ardiff.worker.background import supervised
from ardiff.worker.errors import ModelUnavailable
from ardiff.worker.net import listen_socket
from ardiff.worker.placement_port import PlacementPort, Standalone
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.stream import MAX_FRAME_BYTES

log = logging.getLogger(__name__)

# What a connection may cost before it has shown a credential (issue 23 item 10; contracts §10).
# A request head (request line and headers) over this is 400: h11 refuses it, where httptools (uvicorn's
# default parser) buffered a head of any size.
MAX_REQUEST_HEAD_BYTES = 16 << 10
# A connection has this long to send each request head, counted from when it opened or its last answer went
# out, however slowly its bytes trickle in; then it is closed. (uvicorn's own keep-alive timer restarts at
# every byte received and never runs for a connection that has sent nothing.) Longer than httpx keeps an idle
# connection (5 s; the client's and the pods' own clients), so a client drops one before the worker does.
REQUEST_HEAD_SECONDS = 10
# Open connections (HTTP and WebSocket); a request on one past it is answered 503. A pod serves a few
# sessions, each a stream or a tick at a time, plus probes, metrics and pod-to-pod pulls: far fewer.
MAX_CONNECTIONS = 512
# How often a TLS worker looks for a renewed certificate (cert-manager rewrites the Secret, the kubelet the
# mounted files): a stat of two files.
CERTIFICATE_CHECK_SECONDS = 5.0


def load_runtime(settings: WorkerSettings) -> SessionRuntime:
    """The runtime `settings` asks for. The vllm path imports torch and vllm-omni; the fake one never."""
    if settings.runtime == "fake":
        from ardiff.model_families import DEFAULT_FAMILY, family_of
        from ardiff.worker.fake_runtime import FakeRuntime

        return FakeRuntime(
            height=settings.height,
            width=settings.width,
            capacity=settings.fake_capacity,
            tick_seconds=settings.fake_tick_seconds,
            tick_spread=settings.fake_tick_spread,
            seed=zlib.crc32(settings.pod_name.encode()),  # pods of one run draw different forward times
            family=family_of(settings.pipeline) or DEFAULT_FAMILY,  # DreamZeroPipeline: its robot mode
        )
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    return load_vllm_runtime(settings)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head: `REQUEST_HEAD_SECONDS` from the moment
    one is expected (the connection opened, or the previous answer went out) until it has arrived whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole head was parsed (or the connection failed)
            self._head_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request already received
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_head()

    def _await_head(self) -> None:
        self._head_arrived()
        self._head_deadline = self.loop.call_later(REQUEST_HEAD_SECONDS, self.transport.close)

    def _head_arrived(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None


async def reload_certificate_forever(
    context: ssl.SSLContext, cert_file: str, key_file: str, every: float = CERTIFICATE_CHECK_SECONDS
) -> None:
    """Load the certificate and key into the serving context again whenever their files change (inode, size
    or mtime): the next handshakes get the renewed certificate, open connections keep theirs. A pair that
    does not load yet (half written) is tried again at the next check; the old one serves meanwhile."""
    seen = _file_stamp(cert_file, key_file)
    while True:
        await asyncio.sleep(every)
        try:
            stamp = _file_stamp(cert_file, key_file)
            if stamp == seen:
                continue
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "could not load the TLS certificate %s (tried again in %g s): %s", cert_file, every, exc
            )
            continue
        seen = stamp
        log.info("loaded the renewed TLS certificate %s", cert_file)


def _file_stamp(*paths: str) -> tuple[tuple[int, int, int], ...]:
    return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in map(os.stat, paths))


class DrainingServer(uvicorn.Server):
    """SIGTERM/SIGINT: drain first (503 for new ticks, in-flight ticks finish), then stop; a second signal
    stops at once. The process then exits 0 instead of re-raising the signal as uvicorn would."""

    def __init__(self, config: uvicorn.Config, service: WorkerService) -> None:
        super().__init__(config)
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Task[None] | None = None
        self._reload: asyncio.Task[None] | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        self._watch = asyncio.create_task(self._exit_when_stopped())
        settings = self.service.settings
        if self.config.ssl is not None and settings.tls_cert_file and settings.tls_key_file:
            context, cert, key = self.config.ssl, settings.tls_cert_file, settings.tls_key_file
            self._reload = supervised(
                "tls-reload", lambda: reload_certificate_forever(context, cert, key), self.service.metrics
            )

    async def _exit_when_stopped(self) -> None:
        await self.service.stopped.wait()  # fenced, or the model failed to load
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.service.draining or self._loop is None:
            self.should_exit = True  # a second signal: stop without waiting for the drain
            return
        log.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain_then_exit()))

    async def _drain_then_exit(self) -> None:
        await self.service.drain()
        self.should_exit = True


def serve(settings: WorkerSettings) -> None:
    placement: PlacementPort = Standalone(settings)
    if not settings.standalone:
        from ardiff.worker.pod_link import PodLink

        placement = PodLink.connect(settings)
    service = WorkerService(settings, lambda: load_runtime(settings), placement=placement)
    config = uvicorn.Config(
        create_app(service),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        http=BoundedH11Protocol,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES,
        timeout_keep_alive=REQUEST_HEAD_SECONDS,  # BoundedH11Protocol's deadline covers it: never later
        limit_concurrency=MAX_CONNECTIONS,
        lifespan="on",
        ws_max_size=MAX_FRAME_BYTES,
        ssl_certfile=settings.tls_cert_file,  # None: plain HTTP
        ssl_keyfile=settings.tls_key_file,
    )
    log.info(
        "worker %s (%s runtime, %s) listening on %s:%d (%s)",
        settings.pod_name,
        settings.runtime,
        "standalone" if settings.standalone else f"pool {settings.namespace}/{settings.pool}",
        settings.host,
        settings.port,
        "https" if settings.tls else "http",
    )
    sock = listen_socket(settings.host, settings.port)
    if sock is not None:
        log.info("listening on [::]:%d (dual-stack: IPv6 and IPv4)", settings.port)
    DrainingServer(config, service).run(sockets=None if sock is None else [sock])
    if service.loading:
        # Stopped while the model loads (a pod deleted while it starts): the load cannot be interrupted, and
        # the interpreter would wait for its thread at exit (a real model takes minutes).
        log.warning("stopped while the model was loading: exiting without waiting for the load")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if service.failure is not None:
        raise ModelUnavailable(f"the worker could not start: {service.failure}") from service.failure
