"""`ardiff worker serve`: the worker process (uvicorn) with its drain-on-SIGTERM behaviour."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from types import FrameType

import uvicorn

from ardiff.worker.app import create_app
from ardiff.worker.errors import ModelUnavailable
from ardiff.worker.net import listen_socket
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings
from ardiff.worker.stream import MAX_FRAME_BYTES

log = logging.getLogger(__name__)


def load_runtime(settings: WorkerSettings) -> SessionRuntime:
    """The runtime `settings` asks for. The vllm path imports torch and vllm-omni; the fake one never."""
    if settings.runtime == "fake":
        from ardiff.worker.fake_runtime import FakeRuntime
        from ardiff.worker.pipelines import DEFAULT_FAMILY, family_of

        return FakeRuntime(
            height=settings.height,
            width=settings.width,
            capacity=settings.fake_capacity,
            tick_seconds=settings.fake_tick_seconds,
            family=family_of(settings.pipeline) or DEFAULT_FAMILY,  # DreamZeroPipeline: its robot mode
        )
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    return load_vllm_runtime(settings)


class DrainingServer(uvicorn.Server):
    """SIGTERM/SIGINT: drain first (503 for new ticks, in-flight ticks finish), then stop; a second signal
    stops at once. The process then exits 0 instead of re-raising the signal as uvicorn would."""

    def __init__(self, config: uvicorn.Config, service: WorkerService) -> None:
        super().__init__(config)
        self.service = service
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Task[None] | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        self._watch = asyncio.create_task(self._exit_when_stopped())

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
    link = None
    if not settings.standalone:
        from ardiff.worker.pod_link import PodLink

        link = PodLink.connect(settings)
    service = WorkerService(settings, lambda: load_runtime(settings), link=link)
    config = uvicorn.Config(
        create_app(service),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=False,
        timeout_keep_alive=30,
        lifespan="on",
        ws_max_size=MAX_FRAME_BYTES,
    )
    log.info(
        "worker %s (%s runtime, %s) listening on %s:%d",
        settings.pod_name,
        settings.runtime,
        "standalone" if settings.standalone else f"pool {settings.namespace}/{settings.pool}",
        settings.host,
        settings.port,
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
