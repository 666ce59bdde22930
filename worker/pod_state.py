"""The state the worker's collaborators share (worker/service.py wires them): the runtime with the one thread
that runs it, and the books of the sessions on this pod.

One forward at a time per pod: every call into the runtime that touches session state (forward, reset, close,
export, import) runs on `ForwardThread`'s one thread while its `lock` is held; the load and the shutdown run
there too. An `asyncio.Lock` wakes its waiters in arrival order, so ticks of different sessions are served
FIFO, and the event loop (`/healthz`, `/metrics`, other requests' checks) never waits for the model.
`SessionBooks` holds each session's book (worker/session_book.py) and which sessions have a tick, reset,
suspension or prefetch in flight: at most one each. Both are plain objects passed explicitly to the placement
guard, continuity and transfer, which read and write them; nothing else keeps session state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ardiff.worker.errors import TickInProgress
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.session_book import SessionBook

T = TypeVar("T")


class ForwardThread:
    """The runtime (None until it is loaded), the one thread its calls run on, and the FIFO `lock` held
    around each call that touches session state between ticks."""

    def __init__(self) -> None:
        self.runtime: SessionRuntime | None = None
        self.lock = asyncio.Lock()  # asyncio.Lock wakes its waiters in arrival order: FIFO fairness
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ardiff-forward")
        self._load: Future[SessionRuntime] | None = None

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`func(*args, **kwargs)` on the forward thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args, **kwargs))

    async def load(self, loader: Callable[[], SessionRuntime]) -> SessionRuntime:
        """Run `loader` on the forward thread (a load cannot be interrupted); the caller sets `runtime`."""
        self._load = self._executor.submit(loader)
        return await asyncio.wrap_future(self._load)

    @property
    def loading(self) -> bool:
        """The runtime is still loading on the forward thread."""
        return self._load is not None and not self._load.done()

    def abandon(self) -> None:
        """Stopped while the model loads: the process exits without waiting for the load (server.serve)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)


class SessionBooks(collections.UserDict[str, SessionBook]):
    """The books of the sessions on this pod, by id: at most `capacity` of them hold a slot (0 until the
    runtime is loaded; the runner would evict its least recently used session silently when full), and
    `in_flight` names those with a tick (or reset, suspension, prefetch) under way; `idle` is set while there
    is none (a drain waits on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.capacity = 0
        self.in_flight: set[str] = set()
        self.idle = asyncio.Event()
        self.idle.set()

    def admitted(self) -> int:
        """The sessions holding a slot."""
        return sum(1 for book in self.values() if book.holds_slot)

    @contextlib.contextmanager
    def exclusive(self, session_id: str) -> Iterator[None]:
        """At most one tick (or reset) per session in flight."""
        if session_id in self.in_flight:
            raise TickInProgress(f"a tick of session {session_id!r} is in flight")
        self.in_flight.add(session_id)
        self.idle.clear()
        try:
            yield
        finally:
            self.in_flight.discard(session_id)
            if not self.in_flight:
                self.idle.set()
