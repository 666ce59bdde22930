"""Simulated worker pods: the pod runner's mode for control-plane scale (`PodRunner(..., simulated=True)`).

A simulated pod has no process. It registers in Redis and heartbeats through the worker's own `PodLink`
(`ardiff.worker.pod_link`: the same `register_pod`/`heartbeat` calls, epochs and lease as a real worker), with
the settings a real worker would read from the Pod's env (`build_settings`), and the runner reports it Running
and Ready once registered. What it cannot do: serve ticks (its endpoint has no listener) or consume its event
stream (no runner holds sessions to close or export). With a shared tier in its env it registers
`exports=1`, as the fake runtime's worker would, and never reports a suspension: a silent worker. 1,000 pods
cost 1,000 asyncio tasks and 1,000 Redis connections, not 1,000 processes.

Its capacity is what the fake runtime would report (`ARDIFF_FAKE_CAPACITY`), capped by
`ARDIFF_SESSION_CAPACITY` as the worker caps its runner's. Its compute (issue 25) is what the worker's tick
estimate would report for the fake runtime's forwards: `ARDIFF_COMPUTE_UTILISATION` x 12 frames per
`ARDIFF_FAKE_TICK_SECONDS` (0, not limited, without either), with every registration and heartbeat. On
deletion it marks itself draining (what a worker does on SIGTERM) and stops heartbeating; its record goes when
the operator sees the Pod gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from ardiff.worker.fake_runtime import CHUNK_FRAMES
from ardiff.worker.playout import TickEstimate
from ardiff.worker.pod_link import PodLink
from ardiff.worker.settings import WorkerSettings, build_settings

log = logging.getLogger(__name__)

# A registration that fails (Redis away) is tried again after this long, like a crashed worker's restart.
RETRY_SECONDS = 1.0


def simulated_capacity(settings: WorkerSettings) -> int:
    """The fake runtime's capacity, capped as `WorkerService` caps its runner's (`session_capacity`)."""
    cap = settings.session_capacity
    return settings.fake_capacity if cap is None else min(settings.fake_capacity, cap)


def simulated_compute(settings: WorkerSettings) -> TickEstimate:
    """The tick estimate a fake-runtime worker would hold once its forwards ran: every full chunk (12
    frames) takes `fake_tick_seconds`."""
    estimate = TickEstimate(settings.compute_utilisation)
    if settings.fake_tick_seconds > 0:
        estimate.add(settings.fake_tick_seconds, CHUNK_FRAMES)
    return estimate


def simulated_link(env: Mapping[str, str]) -> PodLink:
    """The worker's link to Redis for a Pod with this env, with a Redis client of its own as each worker has
    (a shared one refuses calls past its 100 connections: 1,000 pods' heartbeats failed); ValueError when the
    env is not a worker's."""
    settings = build_settings(environ=env)
    if settings.redis_url is None:
        raise ValueError("a simulated worker pod needs ARDIFF_REDIS_URL (a standalone one registers nowhere)")
    link = PodLink.connect(settings)
    link.capacity = simulated_capacity(settings)
    link.exports = settings.suspend_dir is not None  # the fake runtime can export
    estimate = simulated_compute(settings)
    link.compute_fps, link.tick_ms = estimate.compute_fps, estimate.tick_s * 1000
    return link


async def run_simulated(
    link: PodLink, terminating: asyncio.Event, on_registered: Callable[[int], Awaitable[None]]
) -> None:
    """Register (each incarnation: a new epoch), report it, heartbeat until `terminating`; then drain.

    A fenced incarnation (a newer one registered) starts again, as a real worker restarts after exiting.
    """
    incarnation = 0
    while not terminating.is_set():
        try:
            await link.register(link.capacity)
        except Exception as exc:  # Redis away: like a worker that failed to start, try again
            log.warning("simulated pod %s could not register: %s", link.pod, exc)
            await _wait(terminating, RETRY_SECONDS)
            continue
        await on_registered(incarnation)
        incarnation += 1
        fenced = asyncio.Event()
        heartbeat = asyncio.create_task(link.heartbeat_forever(fenced.set))
        stopping = asyncio.create_task(terminating.wait())
        await asyncio.wait([heartbeat, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        heartbeat.cancel()
        await asyncio.gather(heartbeat, stopping, return_exceptions=True)
    try:
        if link.registered:
            await link.set_draining()
    except Exception as exc:  # its record may be gone already; the operator forgets it with the Pod
        log.info("simulated pod %s could not mark itself draining: %s", link.pod, exc)
    finally:
        await link.close()


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)
