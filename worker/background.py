"""The worker's background tasks and how they end (issue 23 item 3: none dies silently, none outlives a stop).

Long-lived ones (the heartbeat, the event consumer, the tier sweep, offering held sessions) run `supervised`:
restarted whenever they raise. One-off ones (the load, a held session's deadline, a prefetch, a sent copy's
clean-up) are spawned plainly. `Background` is the one list of them that the service and its collaborators add
to; the worker's stop cancels them all (`cancel_and_wait`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

from ardiff.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# Stopping: how often a cancel is repeated, how long background tasks get to end (see cancel_and_wait).
RECANCEL_SECONDS = 0.05
STOP_TIMEOUT_SECONDS = 5.0
RESTART_SECONDS = 1.0  # how soon a failed long-lived task (heartbeat, events, tier sweep) runs again


async def cancel_and_wait(
    tasks: list[asyncio.Task[None]], *, grace_seconds: float = STOP_TIMEOUT_SECONDS
) -> None:
    """Cancel `tasks` and wait until they end, cancelling again every `RECANCEL_SECONDS`.

    One `cancel()` is not enough: Python 3.11's `asyncio.wait_for`, which redis-py wraps around every command
    it sends, drops a cancel that arrives in the loop iteration where its inner call completes. The heartbeat
    then carried on into its next sleep, and the worker hung at "Waiting for application shutdown" until it
    was killed. A task still running after `grace_seconds` is left with a warning (asyncio.run ends it).
    """
    pending = {task for task in tasks if not task.done()}
    deadline = time.monotonic() + grace_seconds
    while pending and time.monotonic() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    if pending:
        log.warning(
            "background tasks still running after %.1fs: %s",
            grace_seconds,
            sorted(t.get_name() for t in pending),
        )


def supervised(
    name: str,
    run: Callable[[], Awaitable[None]],
    metrics: WorkerMetrics,
    *,
    restart_seconds: float = RESTART_SECONDS,
) -> asyncio.Task[None]:
    """A long-lived task that never dies silently: `run()` again after `restart_seconds` whenever it raises
    (logged with its traceback, counted in `ardiff_background_task_restarts_total`); a return ends it (the
    heartbeat of a fenced pod), and so does a cancel (the worker stopping)."""

    async def forever() -> None:
        while True:
            try:
                await run()
                return
            except Exception:
                log.exception("background task %s failed; restarting it in %.1f s", name, restart_seconds)
                metrics.background_restarts.labels(name).inc()
            await asyncio.sleep(restart_seconds)

    return asyncio.create_task(forever(), name=name)


class Background:
    """The worker's background tasks (iterating gives them); those that ended are dropped as new ones come."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._tasks: list[asyncio.Task[None]] = []

    def __iter__(self) -> Iterator[asyncio.Task[None]]:
        return iter(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A one-off task."""
        return self._add(asyncio.create_task(coro, name=name))

    def supervise(self, name: str, run: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """A long-lived task (`supervised`)."""
        return self._add(supervised(name, run, self._metrics))

    def _add(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(task)
        return task

    async def stop(self) -> None:
        """Cancel them all and wait for them to end (`cancel_and_wait`)."""
        await cancel_and_wait(self._tasks)
