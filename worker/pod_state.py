"""The state of the sessions on this pod, as their owner (worker/pod_sessions.py) holds it: the runtime with
the one thread that runs it and the lock that orders its calls, and the books of the sessions.

One forward at a time per pod: every call into the runtime that touches session state (forward, reset, close,
export, import) runs on `ForwardThread`'s one thread while its `lock` (`ForwardLock`) is held; the load and
the shutdown run there too. The event loop (`/healthz`, `/metrics`, other requests' checks) never waits for
the model. The lock serves its waiters earliest rank first (`tick_order: deadline`, the default), ties in
arrival order; `tick_order: fifo` serves them in arrival order (before issue 25, and the benchmark's
baseline):
- a tick with a deadline (its `buffer_ms`, worker/playout.py) ranks at its deadline;
- a tick without one ranks at its arrival at the lock ("due now");
- every other holder ranks at its arrival too, due now: a close (DELETE, the operator's `close`/`evict` event,
  a transfer's release), a reset, the export of a suspension, a snapshot or a transfer, and the import of a
  resume or of a pulled transfer. A tick whose viewer holds seconds of play thus waits behind them, and one
  due sooner than they arrived goes first;
- bounded wait: a waiter that later arrivals have overtaken `MAX_OVERTAKES` times goes next (the oldest such
  first), so nothing starves while deadline ticks keep arriving.
The lock passes straight to the waiter it picks (no barging by a newcomer while others wait).
`SessionBooks` holds each session's book (worker/session_book.py) and which sessions have a tick, reset,
suspension or prefetch in flight: at most one each. Both are plain objects that `PodSessions` owns; the
placement guard, continuity and transfer reach them only through it, and nothing else keeps session state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ardiff.worker.errors import TickInProgress
from ardiff.worker.runtime import SessionRuntime
from ardiff.worker.session_book import SessionBook
from ardiff.worker.settings import TickOrder

T = TypeVar("T")
# A waiter overtaken this many times by later arrivals goes next: its wait is bounded by that many grants.
MAX_OVERTAKES = 4


@dataclass(eq=False)
class _Waiter:
    rank: float
    arrival: int
    granted: asyncio.Future[None]
    overtaken: int = 0


class ForwardLock:
    """The forward's lock: one holder at a time, waiters served by rank (module docstring)."""

    def __init__(
        self, order: TickOrder = "deadline", *, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.order = order
        self._clock = clock
        self._held = False
        self._waiters: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def hold(self, deadline: float | None = None) -> AsyncIterator[None]:
        """Hold the lock; a tick passes its `deadline` (`perf_counter` seconds), everything else nothing."""
        await self._acquire(deadline)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, deadline: float | None) -> None:
        now = self._clock()
        if not self._held and not self._waiters:
            self._held = True
            return
        rank = now if deadline is None or self.order == "fifo" else deadline
        waiter = _Waiter(rank, next(self._arrivals), asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._release()  # granted, then cancelled before it ran: pass the lock on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        if not self._waiters:
            self._held = False
            return
        starved = [w for w in self._waiters if w.overtaken >= MAX_OVERTAKES]
        if starved:
            chosen = min(starved, key=lambda w: w.arrival)
        else:
            chosen = min(self._waiters, key=lambda w: (w.rank, w.arrival))
        self._waiters.remove(chosen)
        for waiter in self._waiters:
            if waiter.arrival < chosen.arrival:
                waiter.overtaken += 1
        chosen.granted.set_result(None)  # the lock stays held: it passes to `chosen`


class ForwardThread:
    """The runtime (None until it is loaded), the one thread its calls run on, and the `lock` held around
    each call that touches session state between ticks."""

    def __init__(self, order: TickOrder = "deadline") -> None:
        self.runtime: SessionRuntime | None = None
        self.lock = ForwardLock(order)
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
