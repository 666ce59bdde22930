"""A `SessionRuntime` without a model: deterministic frames, quickly, and no torch import.

It behaves like LingBot-World's runner where the worker can observe it: 9 frames for a session's first chunk
and 12 afterwards, chunk indices contiguous per session (a gap fails the forward), a reset or close frees the
session's blocks; a forward takes `tick_seconds`, or (with `tick_spread`, for the playout benchmark) a seeded
lognormal draw around it. Frames are a pure function of (seed, image, prompt, chunk index, controls), so a
test can recompute them. It exports and imports its sessions (their next chunk, and the worker's book) in the
real export format (docs/contracts.md §9), so control-plane tests can suspend and move them. Unlike the real
runner, a fake that is full refuses a new session instead of evicting one: the worker must never let that
happen, and a loud failure shows it if it does.

Its DreamZero mode (`family="dreamzero"`: a pool whose `model.pipeline` is `DreamZeroPipeline`) answers robot
ticks like DreamZero where the control plane sees it: an action chunk (`ACTION_HORIZON x ACTION_DIMS` float32,
a pure function of the seed, prompt, chunk index and observation) and frames only on `return_frames`, two KV
branches per session (twice the blocks); its sessions export like LingBot's, the cached actions in the book.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ardiff.worker import tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import (
    ExportCorrupt,
    ExportDuplicateSession,
    ExportNoCapacity,
    ExportNotIdle,
)
from ardiff.worker.families import TickGeometry
from ardiff.worker.runtime import ChunkOutput, Forwarded, KVBlocks, PreparedTick
from ardiff.worker.session_book import SessionBook
from ardiff.worker.session_export import (
    ExportReader,
    Readable,
    Writable,
    check_book_tensor,
    check_identity,
    refuse_tensor,
    write_export,
)

FIRST_CHUNK_FRAMES = 9
CHUNK_FRAMES = 12
BLOCKS_PER_CHUNK = 3
MAX_BLOCKS_PER_SESSION = 9  # sink + window, as the real cache slides
ACTION_HORIZON, ACTION_DIMS = 24, 8  # DreamZero's chunk: 24 steps of 7 joints + the gripper
FAMILIES = ("lingbot", "dreamzero")


@dataclass(frozen=True)
class FakeRequest:
    tick: Any  # vllm-omni's ARDiffusionTickRequest
    conditioning: Conditioning
    image: np.ndarray


@dataclass(frozen=True)
class FakeChunk:
    """One forward's raw output: frames whether or not the tick asks (as DreamZero's video)."""

    frames: np.ndarray
    actions: np.ndarray | None


@dataclass(frozen=True)
class FakeTicks:
    """The fake runtime's family runner: its request is the tick, the conditioning and the picture; a chunk is
    the forward's frames (a robot tick's only on `return_frames`) and actions, the tick's metadata."""

    geometry: TickGeometry
    robot: bool  # DreamZero mode: the tick carries an observation and `return_frames`

    def prepare(self, tick: Any, conditioning: Conditioning) -> PreparedTick:
        image = conditioning.picture_at(*self.geometry.frame_size)
        return PreparedTick(
            tick.session_id,
            FakeRequest(tick, conditioning, image),
            close_after=tick.close_session,
            metadata=tick_rules.metadata_of(tick),
            return_frames=tick.return_frames if self.robot else True,
        )

    def decode(self, prepared: PreparedTick, output: FakeChunk, forward_s: float) -> ChunkOutput:
        return ChunkOutput(
            frames=output.frames if prepared.return_frames else output.frames[:0],
            metadata=dict(prepared.metadata),
            forward_s=forward_s,
            decode_s=0.0,
            actions=output.actions,
        )


def fake_frames(conditioning: Conditioning, image: np.ndarray, tick: Any) -> np.ndarray:
    """The frames of `tick`'s chunk: the conditioning image, tinted by a hash of everything that matters."""
    height, width, _ = image.shape
    count = FIRST_CHUNK_FRAMES if tick.chunk_index == 0 else CHUNK_FRAMES
    key = json.dumps(
        {
            "seed": conditioning.seed,
            "prompt": conditioning.prompt,
            "chunk": tick.chunk_index,
            "controls": [control.to_dict() for control in tick.controls],
        },
        sort_keys=True,
    ).encode()
    digest = hashlib.sha256(key + image.tobytes()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    offsets = rng.integers(-40, 40, size=(count, 1, 1, 3))
    frames = image[None].astype(np.int16) + offsets + np.arange(count, dtype=np.int16)[:, None, None, None]
    return np.clip(frames, 0, 255).astype(np.uint8).reshape(count, height, width, 3)


def fake_actions(conditioning: Conditioning, tick: Any) -> np.ndarray:
    """A robot tick's action chunk: deterministic in (seed, prompt, chunk index, every observation array)."""
    key = {"seed": conditioning.seed, "prompt": conditioning.prompt, "chunk": tick.chunk_index}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    for key in sorted(tick.robot_obs):
        digest.update(key.encode() + np.ascontiguousarray(tick.robot_obs[key]).tobytes())
    rng = np.random.default_rng(int.from_bytes(digest.digest()[:8], "little"))
    return rng.uniform(-1, 1, size=(ACTION_HORIZON, ACTION_DIMS)).astype(np.float32)


class FakeRuntime:
    def __init__(
        self,
        *,
        height: int,
        width: int,
        capacity: int,
        tick_seconds: float = 0.0,
        tick_spread: float = 0.0,
        seed: int = 0,
        family: str = "lingbot",
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"fake runtime capacity must be positive, got {capacity}")
        if family not in FAMILIES:
            raise ValueError(f"fake runtime family must be one of {list(FAMILIES)}, got {family!r}")
        self._family = family
        self._branches = 2 if family == "dreamzero" else 1  # positive and negative (CFG)
        # LingBot's AR block: 3 latent frames, 9 frames through the VAE's time factor (the first chunk's).
        geometry = TickGeometry(height, width, FIRST_CHUNK_FRAMES, BLOCKS_PER_CHUNK)
        self._ticks = FakeTicks(geometry, robot=family == "dreamzero")
        self._capacity = capacity
        self._tick_seconds = tick_seconds
        self._tick_spread = tick_spread
        self._tick_rng = random.Random(seed)  # the forward thread alone draws from it: one sequence per seed
        self._next_chunk: dict[str, int] = {}
        self._lock = threading.Lock()  # forward runs on the forward thread; snapshots are read elsewhere

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def frame_size(self) -> tuple[int, int]:
        return self._ticks.geometry.frame_size

    @property
    def ticks(self) -> FakeTicks:
        return self._ticks

    def forward(self, prepared: PreparedTick, *, inject_fault: bool = False) -> Forwarded:
        request: FakeRequest = prepared.request
        tick, session_id = request.tick, prepared.session_id
        started = time.perf_counter()
        try:
            if tick.reset:
                self.reset(session_id)
            with self._lock:
                if session_id not in self._next_chunk and len(self._next_chunk) >= self._capacity:
                    raise RuntimeError(
                        f"fake runtime is full ({self._capacity} sessions); the worker over-admitted"
                    )
                expected = self._next_chunk.setdefault(session_id, 0)
            if tick.chunk_index != expected:
                raise ValueError(
                    f"chunk_index must be contiguous: expected {expected}, got {tick.chunk_index}"
                )
            if self._tick_seconds:
                time.sleep(self.tick_time())
            if inject_fault:
                raise RuntimeError("injected forward fault (ARDIFF_TEST_FAULTS)")
            actions = fake_actions(request.conditioning, tick) if self._family == "dreamzero" else None
            chunk = FakeChunk(fake_frames(request.conditioning, request.image, tick), actions)
        except Exception:
            self.close(session_id)  # fail closed, like the runner's bound session
            raise
        with self._lock:
            self._next_chunk[session_id] = expected + 1
        return Forwarded(chunk, time.perf_counter() - started)

    def tick_time(self) -> float:
        """The next forward's time: `tick_seconds` x a lognormal draw of sigma `tick_spread` (median 1)."""
        if not self._tick_spread:
            return self._tick_seconds
        return self._tick_seconds * self._tick_rng.lognormvariate(0.0, self._tick_spread)

    def reset(self, session_id: str) -> None:
        self.close(session_id)

    def close(self, session_id: str) -> None:
        with self._lock:
            self._next_chunk.pop(session_id, None)

    def resident_sessions(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._next_chunk)

    def kv_blocks(self) -> KVBlocks:
        total = self._capacity * MAX_BLOCKS_PER_SESSION * self._branches
        with self._lock:
            used = self._branches * sum(
                min(n * BLOCKS_PER_CHUNK, MAX_BLOCKS_PER_SESSION) for n in self._next_chunk.values()
            )
        return KVBlocks(free=total - used, total=total)

    @property
    def identity(self) -> dict[str, Any]:
        height, width = self.frame_size
        identity: dict[str, Any] = {"runtime": "fake", "height": height, "width": width}
        if self._family != "lingbot":
            identity["family"] = self._family
        return identity

    @property
    def supports_export(self) -> bool:
        return True

    def export_session(self, session_id: str, out: Writable, *, book: SessionBook) -> int:
        with self._lock:
            next_chunk = self._next_chunk.get(session_id)
        if next_chunk is None:
            raise ExportNotIdle(f"session {session_id!r} is not resident on this fake runtime")
        state = {"next_chunk": next_chunk}
        return write_export(
            out, session_id=session_id, identity=self.identity, book=book, state=state, tensors=()
        )

    def import_session(
        self, source: Readable, *, as_session: str | None = None, share_with: str | None = None
    ) -> SessionBook:
        del share_with  # the fake holds no KV blocks to share: a fork is always a copy
        reader = ExportReader(source)
        check_identity(reader.identity, self.identity)
        session_id = as_session or reader.session_id

        def check(name: str, dtype: str, shape: tuple[int, ...]) -> None:  # the book's tensors, nothing else
            if not check_book_tensor(name, dtype, shape, self.frame_size):
                refuse_tensor(name, dtype, shape, "no tensor but the book's frames and actions")

        for _ in reader.tensors(check):  # none of its own; this reads the book's frames and checks the digest
            pass
        book = reader.book() if as_session is None else reader.book().forked(as_session)
        next_chunk = reader.state.get("next_chunk")
        if not isinstance(next_chunk, int) or next_chunk < 0:
            raise ExportCorrupt(f"fake session export has next_chunk {next_chunk!r}")
        with self._lock:
            if session_id in self._next_chunk:
                raise ExportDuplicateSession(
                    f"session {session_id!r} is already resident on this fake runtime"
                )
            if len(self._next_chunk) >= self._capacity:
                raise ExportNoCapacity(f"this fake runtime holds {self._capacity} sessions, its capacity")
            self._next_chunk[session_id] = next_chunk
        return book

    def shutdown(self) -> None:
        with self._lock:
            self._next_chunk.clear()
