"""A player of one session: plays its frames at the session's rate from a buffer, ticks ahead while the buffer
is below its target, tells the worker its buffer level with every tick, and keeps the figures a viewer feels.

The target is the session's `playout` (`fps`, `buffer_chunks` of the worker's session view,
docs/contracts.md §4; either overridable). The buffer is play time: a chunk of F frames delivered at t adds
F / fps seconds, and the buffer drains at one second per second from the first chunk on (playback starts with
the first chunk, as the worker models it, `worker/playout.py`). When it runs dry the picture
stalls until the next chunk arrives:

    level(t) = max(0, level(t_last) - (t - t_last))      after a delivery at t_last
    stall    = (t - t_last) - level(t_last)              when positive, at the next delivery t

The player sends its next tick (one in flight, as the worker takes them) while the buffer holds less than
`buffer_chunks` chunks of play (a chunk: the frames of the latest one), with `buffer_ms` = the buffer's level
then. Its figures (`PlayoutFigures`), as the viewer sees them: time to first chunk (from the first tick sent),
the gaps between chunk arrivals, chunks on time (the buffer had not run dry when it arrived) and late (it had;
the first chunk is neither: its wait is the time to first chunk), stall seconds, and the continuous-playback
ratio CPR = 1 - stall / (time since the first chunk). Time comes from a `Clock` (`MonotonicClock`; tests pass
one they move by known tick times). The frames themselves are the caller's (`Player.tick` returns each chunk;
the viewer page shows them).

    with SessionClient(...) as client:
        figures = Player(client).run(seconds=30)
        figures.cpr, figures.stall_s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ardiff.client import Chunk, hold

DEFAULT_FPS = 16.0  # the worker's default `playout_fps` (standalone) and the pools' default
DEFAULT_BUFFER_CHUNKS = 2
MAX_FPS = 120.0
MAX_BUFFER_CHUNKS = 16
MAX_BUFFER_MS = 600_000  # the most a tick's `buffer_ms` may say


class Clock(Protocol):
    """Seconds on a monotonic scale, and a way to wait."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The process's monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class Ticker(Protocol):
    """What the player needs of a `SessionClient`."""

    def tick(
        self,
        controls: Sequence[Mapping[str, Any]] = (),
        *,
        prompt: str | None = None,
        buffer_ms: int | None = None,
    ) -> Chunk: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class PlayoutTarget:
    """Frames per second to play at, and the chunks to keep buffered before and while playing."""

    fps: float = DEFAULT_FPS
    buffer_chunks: int = DEFAULT_BUFFER_CHUNKS

    def __post_init__(self) -> None:
        if isinstance(self.fps, bool) or not isinstance(self.fps, int | float) or not 0 < self.fps <= MAX_FPS:
            raise ValueError(f"playout fps must be in (0, {MAX_FPS:g}], got {self.fps!r}")
        chunks = self.buffer_chunks
        if isinstance(chunks, bool) or not isinstance(chunks, int) or not 1 <= chunks <= MAX_BUFFER_CHUNKS:
            raise ValueError(f"playout buffer_chunks must be in 1..{MAX_BUFFER_CHUNKS}, got {chunks!r}")

    @classmethod
    def of_view(
        cls, view: Mapping[str, Any], *, fps: float | None = None, buffer_chunks: int | None = None
    ) -> PlayoutTarget:
        """The target of a session view (`GET /v1/sessions/{id}`: `playout.fps`, `playout.buffer_chunks`;
        the defaults where it names none), with `fps`/`buffer_chunks` overriding it when given."""
        playout = view.get("playout") or {}
        return cls(
            fps=float(fps if fps is not None else playout.get("fps") or DEFAULT_FPS),
            buffer_chunks=int(
                buffer_chunks
                if buffer_chunks is not None
                else playout.get("buffer_chunks") or DEFAULT_BUFFER_CHUNKS
            ),
        )


@dataclass(frozen=True)
class PlayoutFigures:
    """A session's playback as its viewer saw it (seconds)."""

    time_to_first_chunk_s: float | None  # None: no chunk yet
    gaps_s: tuple[float, ...]  # between consecutive chunk arrivals
    chunks_on_time: int
    chunks_late: int
    stall_s: float
    played_s: float  # from the first chunk to the figures' time
    frames: int

    @property
    def chunks(self) -> int:
        return self.chunks_on_time + self.chunks_late + (self.time_to_first_chunk_s is not None)

    @property
    def cpr(self) -> float:
        """The share of the time since the first chunk the buffer was not empty (1.0 before any)."""
        return 1.0 - self.stall_s / self.played_s if self.played_s > 0 else 1.0


@dataclass
class Playback:
    """The viewer's buffer and figures, from chunk deliveries at a clock's times."""

    fps: float
    started_at: float | None = None  # the first tick sent
    first_at: float | None = None  # the first chunk delivered
    last_at: float | None = None
    level_s: float = 0.0  # play time buffered at `last_at`
    frames: int = 0
    last_frames: int = 0
    gaps: list[float] = field(default_factory=list)
    on_time: int = 0
    late: int = 0
    stall_s: float = 0.0

    def start(self, at: float) -> None:
        if self.started_at is None:
            self.started_at = at

    def buffered_s(self, at: float) -> float:
        """Play time buffered and not yet shown at `at`."""
        if self.last_at is None:
            return 0.0
        return max(0.0, self.level_s - (at - self.last_at))

    def stalled_s(self, at: float) -> float:
        """How long the picture has been stalled at `at` (0 while the buffer holds frames)."""
        if self.last_at is None:
            return 0.0
        return max(0.0, (at - self.last_at) - self.level_s)

    def deliver(self, at: float, frames: int) -> None:
        """A chunk of `frames` frames arrived at `at`."""
        self.start(at)
        if self.last_at is None:
            self.first_at = at
        else:
            self.gaps.append(at - self.last_at)
            stalled = self.stalled_s(at)
            self.stall_s += stalled
            if stalled > 0:
                self.late += 1
            else:
                self.on_time += 1
        self.level_s = self.buffered_s(at) + frames / self.fps
        self.last_at = at
        self.frames += frames
        self.last_frames = frames

    def figures(self, at: float | None = None) -> PlayoutFigures:
        """The figures at `at` (a stall under way then counts), or at the last delivery (None)."""
        at = self.last_at if at is None else at
        first = self.first_at
        return PlayoutFigures(
            time_to_first_chunk_s=None
            if first is None or self.started_at is None
            else first - self.started_at,
            gaps_s=tuple(self.gaps),
            chunks_on_time=self.on_time,
            chunks_late=self.late,
            stall_s=self.stall_s + (self.stalled_s(at) if at is not None else 0.0),
            played_s=0.0 if first is None or at is None else at - first,
            frames=self.frames,
        )


Controls = Callable[[int], Sequence[Mapping[str, Any]]]


def walk_forward(_chunk: int) -> Sequence[Mapping[str, Any]]:
    """The default controls: hold W."""
    return (hold("w"),)


@dataclass(frozen=True)
class SentTick:
    """A tick the player sent: its chunk (the player's count), when, and the buffer it reported."""

    chunk: int
    at: float
    buffer_ms: int


class Player:
    """Plays one session through `client` (see the module docstring) at the session's target: its session
    view's, read once here unless both `fps` and `buffer_chunks` are given. `prompt` goes with every tick
    (a standalone worker's session has none of its own)."""

    def __init__(
        self,
        client: Ticker,
        *,
        fps: float | None = None,
        buffer_chunks: int | None = None,
        clock: Clock | None = None,
        prompt: str | None = None,
    ) -> None:
        view = {} if fps is not None and buffer_chunks is not None else client.describe()
        self.client = client
        self.target = PlayoutTarget.of_view(view, fps=fps, buffer_chunks=buffer_chunks)
        self.clock = clock or MonotonicClock()
        self.prompt = prompt
        self.playback = Playback(self.target.fps)
        self.sent: list[SentTick] = []

    def target_s(self) -> float:
        """The play time to keep buffered: `buffer_chunks` chunks of the latest chunk's size."""
        return self.target.buffer_chunks * self.playback.last_frames / self.target.fps

    def buffer_ms(self, at: float) -> int:
        return min(MAX_BUFFER_MS, round(1000 * self.playback.buffered_s(at)))

    def tick(self, controls: Sequence[Mapping[str, Any]]) -> Chunk:
        """Send the next tick now with the buffer's level, and take its chunk into the buffer."""
        at = self.clock.now()
        self.playback.start(at)
        buffer_ms = self.buffer_ms(at)
        self.sent.append(SentTick(len(self.sent), at, buffer_ms))
        chunk = self.client.tick(controls, prompt=self.prompt, buffer_ms=buffer_ms)
        self.playback.deliver(self.clock.now(), len(chunk.frames))
        return chunk

    def run(
        self, *, chunks: int | None = None, seconds: float | None = None, controls: Controls = walk_forward
    ) -> PlayoutFigures:
        """Play until `chunks` chunks arrived or `seconds` passed (whichever first; one is needed), ticking
        while the buffer is below target and waiting while it is not; returns the figures at the last
        chunk."""
        if chunks is None and seconds is None:
            raise ValueError("player run needs chunks or seconds")
        started = self.clock.now()
        count = 0
        while (chunks is None or count < chunks) and (
            seconds is None or self.clock.now() - started < seconds
        ):
            now = self.clock.now()
            ahead = self.playback.buffered_s(now) - self.target_s()
            if ahead > 0:
                if seconds is not None:
                    ahead = min(ahead, started + seconds - now)
                self.clock.sleep(ahead)
                continue
            self.tick(controls(count))
            count += 1
        return self.playback.figures()
