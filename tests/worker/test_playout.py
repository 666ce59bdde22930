"""Playout on the worker (issue 25; contracts §4 "Playout"): the deadline-first forward lock with its bounded
wait, the buffer model that a client's claim cannot undercut, the figures on a controlled clock, the tick
estimate, and the fake runtime's seeded forward times. Pure parts, no worker process (test_playout_worker.py
has those)."""

from __future__ import annotations

import asyncio
import itertools
import statistics

import pytest

from ardiff.worker.fake_runtime import FakeRuntime
from ardiff.worker.playout import PlayoutTarget, SessionPlayout, TickEstimate
from ardiff.worker.pod_state import MAX_OVERTAKES, ForwardLock
from ardiff.worker.settings import WorkerSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def grant_order(lock: ForwardLock, ranks: list[float | None], clock: Clock) -> list[int]:
    """Queue one waiter per rank (None: due now) behind a holder, in list order, one clock tick apart; the
    order the lock serves them in."""
    served: list[int] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with lock.hold():
            await release.wait()

    async def waiter(index: int, deadline: float | None) -> None:
        async with lock.hold(deadline):
            served.append(index)

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    tasks = []
    for index, rank in enumerate(ranks):
        clock.now += 1
        tasks.append(asyncio.create_task(waiter(index, rank)))
        await asyncio.sleep(0)
    assert lock.waiting == len(ranks)
    release.set()
    await asyncio.gather(first, *tasks)
    return served


async def test_waiting_ticks_run_earliest_deadline_first_ties_and_due_now_in_arrival_order():
    clock = Clock()
    lock = ForwardLock("deadline", clock=clock)
    # arrivals at 101..106: deadlines 150, 120, none (due at 103), 120, 102.5, none (due at 106). The first,
    # overtaken by MAX_OVERTAKES later arrivals, goes next (the bounded wait).
    served = await grant_order(lock, [150.0, 120.0, None, 120.0, 102.5, None], clock)
    assert MAX_OVERTAKES == 4
    assert served == [4, 2, 5, 1, 0, 3]


async def test_fifo_keeps_arrival_order_whatever_the_deadlines():
    clock = Clock()
    lock = ForwardLock("fifo", clock=clock)
    served = await grant_order(lock, [150.0, 120.0, None, 0.0], clock)
    assert served == [0, 1, 2, 3]


async def test_a_tick_without_a_deadline_is_served_after_max_overtakes_while_deadline_ticks_keep_coming():
    clock = Clock()
    lock = ForwardLock("deadline", clock=clock)
    served: list[tuple[str, int]] = []  # who held the lock, and when it asked (arrival order)
    arrivals = itertools.count()
    stop = asyncio.Event()

    async def deadline_ticks(session: str) -> None:  # a session that ticks again at once, always due first
        while not stop.is_set():
            clock.now += 1
            asked = next(arrivals)
            async with lock.hold(deadline=0.0):
                served.append((session, asked))
                await asyncio.sleep(0)

    async def patient() -> None:
        asked = next(arrivals)
        async with lock.hold():
            served.append(("patient", asked))
            stop.set()

    pushers = [asyncio.create_task(deadline_ticks(f"s{i}")) for i in range(3)]
    await asyncio.sleep(0)
    clock.now += 1
    waiting = asyncio.create_task(patient())
    await asyncio.wait_for(asyncio.gather(waiting, *pushers), 5)
    position = [name for name, _ in served].index("patient")
    asked = served[position][1]
    overtook = [name for name, when in served[:position] if when > asked]
    # Exactly MAX_OVERTAKES later arrivals went first, then it did. (Without the bound it is never served:
    # every pusher is due before it.)
    assert len(overtook) == MAX_OVERTAKES, served


async def test_a_cancelled_waiter_leaves_the_queue_and_a_granted_then_cancelled_one_passes_the_lock_on():
    lock = ForwardLock("deadline")
    order: list[str] = []
    async with lock.hold():
        gone = asyncio.create_task(_enter_and_note(lock, order, "gone"))
        after = asyncio.create_task(_enter_and_note(lock, order, "after"))
        await asyncio.sleep(0)
        assert lock.waiting == 2
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert lock.waiting == 1
    await asyncio.wait_for(after, 2)
    assert order == ["after"]

    async with lock.hold():
        granted = asyncio.create_task(_enter_and_note(lock, order, "cancelled"))
        last = asyncio.create_task(_enter_and_note(lock, order, "last"))
        await asyncio.sleep(0)
    granted.cancel()  # granted by the release above, cancelled before it ran
    await asyncio.gather(granted, return_exceptions=True)
    await asyncio.wait_for(last, 2)
    assert order == ["after", "last"]
    async with asyncio.timeout(1):
        async with lock.hold():  # free again
            pass


async def _enter_and_note(lock: ForwardLock, order: list[str], name: str) -> None:
    async with lock.hold():
        order.append(name)


def test_the_figures_on_a_controlled_clock():
    playout = SessionPlayout(PlayoutTarget(fps=16, buffer_chunks=2), started=0.0)
    assert playout.deadline(0.0, None) is None  # no claim: no deadline
    first = playout.delivered(0.5, 9, None)
    assert (first.first_chunk_s, first.gap_s, first.late) == (0.5, None, None)
    assert playout.level == pytest.approx(9 / 16)
    # Claims 0 ms at 0.6, but 9/16 s were delivered at 0.5 and 0.1 s has played: due at 0.6 + 0.4625.
    due = playout.deadline(0.6, 0)
    assert due == pytest.approx(1.0625)
    on_time = playout.delivered(1.0, 12, due)
    assert (on_time.gap_s, on_time.late, on_time.stall_s) == (pytest.approx(0.5), False, 0.0)
    assert playout.level == pytest.approx(0.0625 + 0.75)
    due = playout.deadline(1.1, 200)  # claims less than the floor (0.7125 s): the floor counts
    assert due == pytest.approx(1.8125)
    late = playout.delivered(2.3125, 12, due)
    assert (late.late, late.stall_s) == (True, pytest.approx(0.5))
    assert playout.level == pytest.approx(0.75)  # the buffer had run dry: only the new chunk
    assert playout.deadline(2.4, 5000) == pytest.approx(7.4)  # a claim above the floor is believed
    assert playout.cpr(3.0) == pytest.approx(1 - 0.5 / 2.5)
    assert playout.view(3.0) == {
        "fps": 16,
        "buffer_chunks": 2,
        "time_to_first_chunk_s": 0.5,
        "chunks_on_time": 1,
        "chunks_late": 1,
        "stall_s": 0.5,
        "cpr": 0.8,
    }


def test_a_sessions_first_chunk_is_its_time_to_first_chunk_not_a_stall():
    """The first tick claims an empty buffer (due at once); its chunk comes 0.4 s later. Nothing was
    playing: that wait is the time to first chunk, neither on time nor late, and CPR starts from the first
    chunk (as the player and the viewer count it)."""
    playout = SessionPlayout(PlayoutTarget(fps=16, buffer_chunks=2), started=0.0)
    first = playout.delivered(0.4, 9, playout.deadline(0.0, 0))
    assert (first.first_chunk_s, first.late, first.stall_s) == (0.4, None, 0.0)
    second = playout.delivered(0.7, 12, playout.deadline(0.5, 0))  # due at 0.5 + 0.4625
    assert (second.late, second.stall_s) == (False, 0.0)
    assert playout.view(1.4) == {
        "fps": 16,
        "buffer_chunks": 2,
        "time_to_first_chunk_s": 0.4,
        "chunks_on_time": 1,
        "chunks_late": 0,
        "stall_s": 0.0,
        "cpr": 1.0,
    }


async def test_claiming_an_empty_buffer_does_not_move_a_tick_ahead():
    """Session a was just delivered 1.5 s of play and claims an empty buffer; session b truly holds 0.3 s.
    b is due first and goes first, though a asked first."""
    clock = Clock()
    lock = ForwardLock("deadline", clock=clock)
    greedy = SessionPlayout(PlayoutTarget(fps=16, buffer_chunks=2), started=clock.now)
    greedy.delivered(clock.now, 24, None)
    honest = SessionPlayout(PlayoutTarget(fps=16, buffer_chunks=2), started=clock.now)
    clock.now += 0.1
    greedy_due = greedy.deadline(clock.now, 0)
    honest_due = honest.deadline(clock.now, 300)
    assert greedy_due == pytest.approx(clock.now + 1.4)
    assert honest_due == pytest.approx(clock.now + 0.3)
    assert await grant_order(lock, [greedy_due, honest_due], clock) == [1, 0]


def test_the_tick_estimate_is_the_median_of_the_recent_full_chunks_and_gives_compute_fps():
    estimate = TickEstimate(utilisation=0.9)
    assert (estimate.tick_s, estimate.compute_fps) == (0.0, 0.0)  # unknown until measured
    for seconds in (0.1, 0.3, 0.2):
        estimate.add(seconds, 12)
    assert estimate.tick_s == pytest.approx(0.2)
    assert estimate.compute_fps == pytest.approx(0.9 * 12 / 0.2)
    for _ in range(16):
        estimate.add(0.5, 12)  # the window holds the last 16: the old ones are gone
    assert estimate.tick_s == 0.5
    unbounded = TickEstimate(utilisation=0.0)
    unbounded.add(0.2, 12)
    assert (unbounded.tick_s, unbounded.compute_fps) == (0.2, 0.0)


def test_fake_forward_times_are_seeded_lognormal_around_fake_tick_seconds():
    def draws(seed: int, spread: float) -> list[float]:
        runtime = FakeRuntime(
            height=16, width=16, capacity=1, tick_seconds=0.2, tick_spread=spread, seed=seed
        )
        return [runtime.tick_time() for _ in range(400)]

    assert draws(0, 0.0) == [0.2] * 400
    spread = draws(7, 0.5)
    assert spread == draws(7, 0.5)  # deterministic per seed
    assert spread != draws(8, 0.5)
    assert statistics.median(spread) == pytest.approx(0.2, rel=0.1)
    assert statistics.stdev(spread) > 0.05


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tick_order": "lifo"}, "worker tick_order must be 'deadline' or 'fifo'"),
        ({"compute_utilisation": 1.5}, r"worker compute_utilisation must be in \[0, 1\]"),
        ({"playout_fps": 0.0}, r"worker playout_fps must be in \(0, 120\]"),
        ({"playout_buffer_chunks": 17}, r"worker playout_buffer_chunks must be in \[1, 16\]"),
        ({"fake_tick_spread": -1.0}, r"worker fake_tick_spread must be in \[0, 3\]"),
    ],
)
def test_playout_settings_reject_bad_values(values, message):
    with pytest.raises(ValueError, match=message):
        WorkerSettings(pod_name="pod-a", **values)
