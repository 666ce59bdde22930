"""The worker's model of each session's playout (issue 25): the viewer's buffer, a tick's deadline, and the
figures people judge a world model by (docs/contracts.md §4 "Playout").

A session plays at its target's `fps` (the placement record's `playout_fps`, else the worker's `playout_fps`
setting). After the worker delivers a chunk of F frames at t, the viewer's buffer holds `level = max(0, level
- (t - t_last)) + F / fps` seconds of play. A tick that arrives at `now` claiming `buffer_ms` has the
effective buffer `max(claimed, floor)`, the floor being what was delivered minus what has played since
(`max(0, level - (now - t_last))`): claiming an empty buffer buys nothing. Its chunk's deadline is `now +
effective buffer`, when the viewer's buffer would run dry; a tick without `buffer_ms` has none (arrival
order). The figures: time to first chunk (from the session's first tick here to its first chunk), the gap
between deliveries, chunks after the first delivered by their deadline (on time) or after it (late), stall
seconds (delivered minus deadline, for late ones) and the continuous-playback ratio
`CPR = 1 - stall / (time since first chunk)`.
Times are `time.perf_counter()` seconds, as a tick's arrival (worker/ticks.py `AdmittedTick`).

`TickEstimate` is the pod's side of compute admission: its forward time per full chunk (the median of the
recent ones) and the frames/s it may be asked for, `compute_utilisation x frames per full chunk / tick time`.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass
from typing import Any

from ardiff.kv.records import SessionRecord
from ardiff.worker.settings import WorkerSettings


@dataclass(frozen=True)
class PlayoutTarget:
    """The rate a session's viewer plays at and the chunks it keeps buffered."""

    fps: float
    buffer_chunks: int

    def __post_init__(self) -> None:
        if not 0 < self.fps <= 120:
            raise ValueError(f"playout fps must be in (0, 120], got {self.fps!r}")
        if not 1 <= self.buffer_chunks <= 16:
            raise ValueError(f"playout buffer_chunks must be in [1, 16], got {self.buffer_chunks!r}")


def target_of(record: SessionRecord | None, settings: WorkerSettings) -> PlayoutTarget:
    """The record's target (its pool's or its own, resolved by the operator), else the worker's settings."""
    if record is not None and record.playout_fps > 0:
        return PlayoutTarget(
            record.playout_fps, record.playout_buffer_chunks or settings.playout_buffer_chunks
        )
    return PlayoutTarget(settings.playout_fps, settings.playout_buffer_chunks)


@dataclass(frozen=True)
class Delivery:
    """What one delivered chunk adds to the figures (worker/metrics.py observes it)."""

    first_chunk_s: float | None  # the session's time to first chunk, when this was its first
    gap_s: float | None  # since the session's previous chunk
    late: bool | None  # None: the tick had no deadline
    stall_s: float  # delivered minus deadline when late, else 0


class SessionPlayout:
    """One session's buffer model and figures; created by its first tick on this pod (`started`)."""

    def __init__(self, target: PlayoutTarget, started: float) -> None:
        self.target = target
        self.started = started
        self.level = 0.0  # seconds of play the viewer held right after the last delivery
        self.last_delivery: float | None = None
        self.first_delivery: float | None = None
        self.on_time = 0
        self.late = 0
        self.stall_s = 0.0

    def floor(self, now: float) -> float:
        """The play time the viewer must still hold at `now`: delivered, less what has played since."""
        if self.last_delivery is None:
            return 0.0
        return max(0.0, self.level - (now - self.last_delivery))

    def deadline(self, now: float, buffer_ms: int | None) -> float | None:
        """When a tick arriving at `now` claiming `buffer_ms` must be delivered; None without a claim."""
        if buffer_ms is None:
            return None
        return now + max(buffer_ms / 1000, self.floor(now))

    def delivered(self, now: float, frames: int, deadline: float | None) -> Delivery:
        """A chunk of `frames` frames delivered at `now` for a tick due at `deadline`."""
        gap = None if self.last_delivery is None else now - self.last_delivery
        first = None
        if self.first_delivery is None:
            self.first_delivery = now
            first = now - self.started
        self.level = self.floor(now) + frames / self.target.fps
        self.last_delivery = now
        # A session's first chunk is its time to first chunk, not a stall: nothing was playing yet (as the
        # player and the viewer count it; CPR runs from the first chunk).
        late = None if deadline is None or first is not None else now > deadline
        stall = 0.0
        if late:
            stall = now - deadline
            self.late += 1
            self.stall_s += stall
        elif late is False:
            self.on_time += 1
        return Delivery(first, gap, late, stall)

    def played_s(self, now: float) -> float:
        """Wall time since the first chunk (0 before it)."""
        return 0.0 if self.first_delivery is None else max(0.0, now - self.first_delivery)

    def cpr(self, now: float) -> float | None:
        """The share of the time since the first chunk the viewer's buffer was not empty; None before it."""
        played = self.played_s(now)
        if self.first_delivery is None:
            return None
        return 1.0 if played <= 0 else max(0.0, 1.0 - self.stall_s / played)

    def view(self, now: float) -> dict[str, Any]:
        """The session view's `playout`."""
        cpr = self.cpr(now)
        ttfc = None if self.first_delivery is None else self.first_delivery - self.started
        return {
            "fps": self.target.fps,
            "buffer_chunks": self.target.buffer_chunks,
            "time_to_first_chunk_s": None if ttfc is None else round(ttfc, 6),
            "chunks_on_time": self.on_time,
            "chunks_late": self.late,
            "stall_s": round(self.stall_s, 6),
            "cpr": None if cpr is None else round(cpr, 6),
        }


def target_view(target: PlayoutTarget) -> dict[str, Any]:
    """The `playout` of a session that has not ticked here yet."""
    return SessionPlayout(target, 0.0).view(0.0)


class Playouts(dict[str, SessionPlayout]):
    """The playout of each session that ticked on this pod, by id."""

    def of(self, session_id: str, target: PlayoutTarget, now: float) -> SessionPlayout:
        """The session's playout (a new one at its first tick), under the record's current target."""
        playout = self.get(session_id)
        if playout is None:
            playout = self[session_id] = SessionPlayout(target, now)
        playout.target = target
        return playout

    def keep_only(self, session_ids: set[str]) -> None:
        """Forget the sessions this pod no longer holds."""
        for session_id in set(self) - session_ids:
            del self[session_id]

    def pod_cpr(self, now: float, playing: set[str]) -> float:
        """CPR over the `playing` sessions (those holding a slot) that had a first chunk: 1 - their stall /
        their time played; 1 when there is none."""
        playouts = [self[session_id] for session_id in playing & set(self)]
        played = sum(p.played_s(now) for p in playouts)
        stall = sum(p.stall_s for p in playouts)
        return 1.0 if played <= 0 else max(0.0, 1.0 - stall / played)


# The full-chunk forwards the estimate is the median of: recent enough to follow a change, many enough that
# one slow forward (a GC pause, a first call) does not move it.
TICK_WINDOW = 16


class TickEstimate:
    """The forward time of a full chunk (any but a session's first, which is shorter), from recent ticks."""

    def __init__(self, utilisation: float) -> None:
        self.utilisation = utilisation
        self._seconds: collections.deque[float] = collections.deque(maxlen=TICK_WINDOW)
        self._frames = 0

    def add(self, forward_s: float, frames: int) -> None:
        """A full chunk of `frames` frames took `forward_s`."""
        self._seconds.append(forward_s)
        self._frames = frames

    @property
    def tick_s(self) -> float:
        """The median of the recent full-chunk forwards; 0 before the first."""
        return statistics.median(self._seconds) if self._seconds else 0.0

    @property
    def compute_fps(self) -> float:
        """Frames/s this pod may be asked for; 0 (not limited) without a bound or a measurement."""
        tick_s = self.tick_s
        return self.utilisation * self._frames / tick_s if tick_s > 0 else 0.0
