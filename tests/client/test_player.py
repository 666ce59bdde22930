"""The player (`ardiff.player`): its buffer and figures from known tick times (a clock the test moves), and
against a real standalone worker on the fake runtime: the buffer it reports on the wire is its own, a fast
tick plays without a stall, and a tick slower than a chunk's play time stalls by what the tick times say."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np
import pytest

from ardiff.client import Chunk, ChunkMetadata, SessionClient
from ardiff.player import Playback, Player, PlayoutTarget
from tests.worker.conftest import LaunchWorker, launch_worker  # noqa: F401  (the fixture)

PROMPT = "a misty forest"
FIRST_FRAMES, FRAMES = 9, 12  # LingBot-World's chunks: the first has 9 frames, later ones 12


class ManualClock:
    """Time that moves only when slept or told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class TimedTicks:
    """A session whose every tick takes `tick_s` on `clock`; records the buffer each tick reported."""

    def __init__(self, clock: ManualClock, tick_s: float, view: Mapping[str, Any] | None = None) -> None:
        self.clock, self.tick_s, self.view = clock, tick_s, dict(view or {})
        self.reported: list[int | None] = []

    def tick(
        self,
        controls: Sequence[Mapping[str, Any]] = (),
        *,
        prompt: str | None = None,
        buffer_ms: int | None = None,
    ) -> Chunk:
        self.reported.append(buffer_ms)
        self.clock.sleep(self.tick_s)
        index = len(self.reported) - 1
        frames = np.zeros((FIRST_FRAMES if index == 0 else FRAMES, 2, 2, 3), np.uint8)
        return Chunk(frames, ChunkMetadata("s", f"r{index}", index, ()), {}, self.tick_s, "fake")

    def describe(self) -> dict[str, Any]:
        return self.view


def test_a_tick_slower_than_a_chunk_stalls_by_what_the_tick_times_say() -> None:
    clock = ManualClock()
    session = TimedTicks(clock, tick_s=1.0)
    player = Player(session, fps=16, buffer_chunks=2, clock=clock)
    figures = player.run(chunks=5)
    # Chunks arrive at 1, 2, 3, 4, 5 s. The first (9 frames) plays 0.5625 s: dry 0.4375 s before the second;
    # each later one (12 frames) plays 0.75 s and the next comes 1 s after: 0.25 s dry each time.
    assert figures.time_to_first_chunk_s == 1.0
    assert figures.gaps_s == (1.0, 1.0, 1.0, 1.0)
    assert figures.stall_s == pytest.approx(0.4375 + 3 * 0.25)
    assert figures.played_s == 4.0
    assert figures.cpr == pytest.approx(1 - 1.1875 / 4)
    assert (figures.chunks_on_time, figures.chunks_late, figures.chunks) == (0, 4, 5)
    # Always below target, so it ticks back to back: at 0 (nothing yet), at 1 (the first chunk's 0.5625 s),
    # then at each arrival with that chunk's 0.75 s.
    assert session.reported == [0, 562, 750, 750, 750]
    assert [tick.buffer_ms for tick in player.sent] == session.reported


def test_a_fast_tick_plays_without_a_stall_and_ticks_only_ahead_of_the_buffer() -> None:
    clock = ManualClock()
    session = TimedTicks(clock, tick_s=0.1)
    player = Player(session, fps=16, buffer_chunks=2, clock=clock)
    figures = player.run(seconds=30)
    assert figures.cpr == 1.0
    assert figures.stall_s == 0.0
    assert figures.chunks_late == 0
    assert figures.chunks_on_time == figures.chunks - 1
    # Paced by play, not by tick speed (0.1 s ticks could make 300 chunks): it kept up with 30 s of play and
    # was never more than its target (2 chunks) and the chunk in flight ahead.
    played_frames = 16 * 30
    assert played_frames <= figures.frames <= played_frames + 3 * FRAMES
    # Below target it ticks at once (0, the first chunk's 0.5625 s, then 1.2125 s under the 1.5 s of two
    # chunks); from then on it waits until the buffer is down to its target and ticks with exactly that.
    assert session.reported[:3] == [0, 562, 1212]
    assert set(session.reported[3:]) == {1500}


def test_the_target_is_the_session_views_unless_overridden() -> None:
    clock = ManualClock()
    view = {"playout": {"fps": 24.0, "buffer_chunks": 3}}
    assert Player(TimedTicks(clock, 0.1, view), clock=clock).target == PlayoutTarget(24.0, 3)
    assert Player(TimedTicks(clock, 0.1, view), fps=8, clock=clock).target == PlayoutTarget(8.0, 3)
    assert Player(TimedTicks(clock, 0.1, {}), clock=clock).target == PlayoutTarget(16.0, 2)  # no target named
    with pytest.raises(ValueError, match="buffer_chunks"):
        PlayoutTarget(16.0, 17)
    with pytest.raises(ValueError, match="fps"):
        PlayoutTarget(0.0, 2)


def test_playback_counts_a_stall_under_way() -> None:
    playback = Playback(fps=10.0)
    playback.start(0.0)
    playback.deliver(0.5, 10)  # plays 1 s: from 0.5 to 1.5
    assert playback.buffered_s(1.0) == pytest.approx(0.5)
    assert playback.figures(at=2.0).stall_s == pytest.approx(0.5)  # dry since 1.5
    assert playback.figures(at=2.0).cpr == pytest.approx(1 - 0.5 / 1.5)
    assert playback.figures().stall_s == 0.0  # at the last delivery


def wire_buffers(client: SessionClient) -> list[int | None]:
    """The `buffer_ms` of every tick body `client` sends."""
    sent: list[int | None] = []

    def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/ticks"):
            sent.append(json.loads(request.content).get("buffer_ms"))

    client.http.event_hooks["request"] = [record]
    return sent


def test_a_fast_worker_plays_without_a_stall_and_gets_the_players_buffer(launch_worker: LaunchWorker) -> None:  # noqa: F811
    worker = launch_worker(runtime="fake", fake_tick_seconds=0.02)
    with SessionClient("fast", worker.url, "-") as client:
        sent = wire_buffers(client)
        player = Player(client, fps=16, buffer_chunks=2, prompt=PROMPT)
        figures = player.run(seconds=4)
        seen = client.describe()["playout"]  # the worker's model of this viewer, from the buffers it reported
    assert figures.cpr == 1.0
    assert figures.chunks_late == 0
    assert sent == [tick.buffer_ms for tick in player.sent]
    assert sent[0] == 0
    assert all(0 < ms <= 1500 for ms in sent[2:])
    assert figures.frames <= 16 * 4 + 3 * FRAMES  # paced by play
    # Every chunk after the first came before the buffer the player reported ran dry, on the worker's clock
    # too (the first had no buffer to come before: the worker counts its wait as late).
    assert seen["chunks_on_time"] == figures.chunks_on_time == figures.chunks - 1


def test_a_slow_worker_stalls_by_what_its_tick_time_says(launch_worker: LaunchWorker) -> None:  # noqa: F811
    tick_s = 0.5
    worker = launch_worker(runtime="fake", fake_tick_seconds=tick_s)
    with SessionClient("slow", worker.url, "-") as client:
        figures = Player(client, fps=32, buffer_chunks=2, prompt=PROMPT).run(chunks=6)
    # At 32 fps a chunk plays 0.375 s (the first 0.28125 s) and takes at least 0.5 s to come: the picture is
    # dry 0.21875 s before the second and 0.125 s before each later one; more when ticks take longer (the
    # machine's load), by what the gaps between chunks say (the buffer is empty at every arrival).
    nominal_stall = (tick_s - FIRST_FRAMES / 32) + 4 * (tick_s - FRAMES / 32)
    nominal_cpr = 1 - nominal_stall / (5 * tick_s)
    assert figures.chunks_late == 5
    assert len(figures.gaps_s) == 5
    assert min(figures.gaps_s) >= tick_s
    plays = [FIRST_FRAMES / 32] + [FRAMES / 32] * 4
    assert figures.stall_s == pytest.approx(sum(g - p for g, p in zip(figures.gaps_s, plays, strict=True)))
    assert figures.stall_s >= nominal_stall
    assert figures.cpr <= nominal_cpr + 1e-9
