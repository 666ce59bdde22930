"""The capability the HTTP worker needs from whatever runs the model: the `SessionRuntime` protocol.

Two implementations: the vllm-omni session adapter (`ardiff.worker.session_adapter`, the real paged-KV runner)
and `ardiff.worker.fake_runtime` (deterministic frames, no torch) for control-plane tests.

A tick's path: the runtime's family runner (`ticks`, `ardiff.worker.families.FamilyRunner`) prepares it, then
`run_tick` runs the runtime's `forward` and the runner's `decode` on the forward thread; that function is the
one place where a forward and its decode meet, and where a failed tick closes its session.

Threading contract: `forward`, `reset`, `close`, `export_session` and `import_session` (and so `run_tick`)
are only ever called from the worker's one forward thread, one at a time (so an export always sees a session
between ticks); `ticks.prepare` may run on any thread concurrently with them and must not touch session
state; `resident_sessions` and `kv_blocks` are cheap snapshots safe to read from the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ardiff.worker.session_book import SessionBook
from ardiff.worker.session_export import Readable, Writable

if TYPE_CHECKING:
    from ardiff.worker.families import FamilyRunner


@dataclass(frozen=True)
class KVBlocks:
    """The runner's paged KV pool: blocks free for sessions, out of the managed total; `shared`: blocks
    more than one session holds (same-pod forks, worker/block_share.py)."""

    free: int
    total: int
    shared: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.total:
            raise ValueError(f"kv blocks free must be in [0, total={self.total}], got {self.free}")
        if not 0 <= self.shared <= self.total - self.free:
            used = self.total - self.free
            raise ValueError(f"kv blocks shared must be in [0, used={used}], got {self.shared}")


@dataclass(frozen=True)
class ChunkOutput:
    """One generated AR block."""

    frames: np.ndarray  # uint8 FxHxWx3, decoded by the session's own streaming decoder
    metadata: dict[str, Any]  # the runner's ARDiffusionChunkMetadata echo
    forward_s: float
    decode_s: float
    latents: Any = None  # model-space latents where the runtime has them (tests compare them bit for bit)
    actions: np.ndarray | None = None  # a robot policy's action chunk (DreamZero: float32 horizon x dims)

    def __post_init__(self) -> None:
        if self.frames.dtype != np.uint8 or self.frames.ndim != 4 or self.frames.shape[-1] != 3:
            raise ValueError(
                f"chunk frames must be uint8 FxHxWx3, got {self.frames.dtype} {self.frames.shape}"
            )
        if self.actions is not None and (self.actions.dtype != np.float32 or self.actions.ndim != 2):
            raise ValueError(
                f"chunk actions must be float32 N x D, got {self.actions.dtype} {self.actions.shape}"
            )


@dataclass(frozen=True)
class PreparedTick:
    """A tick that passed the pipeline's own pre-process, and what its chunk's decode needs of it."""

    session_id: str
    request: Any  # what the runtime's forward runs: the engine request (the fake runtime's own request)
    # Close the session once the chunk is decoded: the runner would close (and drop the session's streaming
    # decoder) before the decode, so the runner's request never asks it.
    close_after: bool = False
    # The chunk's metadata where the runner's output does not echo it (DreamZero, the fake): the tick's.
    metadata: dict[str, Any] = field(default_factory=dict)
    return_frames: bool = True  # DreamZero decodes its predicted frames only when the tick asks


@dataclass(frozen=True)
class Forwarded:
    """The runner's raw output of one forward, and how long the forward took."""

    output: Any
    forward_s: float


@runtime_checkable
class SessionRuntime(Protocol):
    """Runs ticks of resident sessions; never decides admission (the worker admits at most `capacity`)."""

    @property
    def capacity(self) -> int:
        """Sessions the runner keeps resident at once (its KV budget after load, optionally capped)."""
        ...

    @property
    def frame_size(self) -> tuple[int, int]:
        """(height, width) of every frame, fixed at load."""
        ...

    @property
    def ticks(self) -> FamilyRunner:
        """The family runner this runtime was loaded with: it prepares ticks and decodes their chunks."""
        ...

    def forward(self, prepared: PreparedTick, *, inject_fault: bool = False) -> Forwarded:
        """Run one AR block; its raw output, not decoded (`run_tick` runs both). A failed forward raises.

        `inject_fault` (tests only, behind ARDIFF_TEST_FAULTS) makes the model forward itself raise.
        """
        ...

    def reset(self, session_id: str) -> None:
        """Release the session's KV and model state; idempotent. The next tick starts at chunk 0."""
        ...

    def close(self, session_id: str) -> None:
        """Release the session's KV and model state for good; idempotent."""
        ...

    def resident_sessions(self) -> tuple[str, ...]:
        """Sessions whose state the runner holds now."""
        ...

    def kv_blocks(self) -> KVBlocks: ...

    @property
    def supports_export(self) -> bool:
        """Whether this runtime's sessions can be exported (LingBot-World, DreamZero, the fake runtime); a
        pipeline whose session state no family module knows keeps reset-on-evict."""
        ...

    def export_session(self, session_id: str, out: Writable, *, book: SessionBook) -> int:
        """Write a resident session at a tick boundary, with the worker's `book`, to `out` in the export
        format (docs/contracts.md §9), part by part; returns the bytes written. Read-only: the session stays
        resident.

        `ExportUnsupported` when this runtime's model family cannot export (it keeps reset-on-evict);
        `ExportNotIdle` when the session is not resident or not between ticks.
        """
        ...

    def import_session(
        self, source: Readable, *, as_session: str | None = None, share_with: str | None = None
    ) -> SessionBook:
        """Install a session read from `source` as a resident one whose next tick continues it; returns the
        worker's book that travelled with it. `as_session` (a fork, issue 26) installs it under that id
        instead of the export's, with the book `SessionBook.forked` gives. `share_with` (a fork on its
        parent's pod): the resident session whose KV blocks the fork may hold too instead of copies, for each
        KV branch where that session is still at the export's boundary (worker/block_share.py); elsewhere the
        pages are copied as usual.

        Refuses with `ExportCorrupt` (not an export, unknown version, truncated, checksum or header wrong),
        `ExportIdentityMismatch`, `ExportDuplicateSession` or `ExportNoCapacity` (resident capacity, free KV
        blocks); `ExportUnsupported` as for export. On any failure nothing of the session is left behind.
        """
        ...

    def shutdown(self) -> None: ...


def run_tick(runtime: SessionRuntime, prepared: PreparedTick, *, inject_fault: bool = False) -> ChunkOutput:
    """On the forward thread: the runner's forward of a prepared tick, then its family's decode; fails closed
    (the session is closed on any error), and closes it after the chunk when the tick asked."""
    try:
        forwarded = runtime.forward(prepared, inject_fault=inject_fault)
        chunk = runtime.ticks.decode(prepared, forwarded.output, forwarded.forward_s)
    except Exception:
        # The runner already released a failed forward's KV; a failed decode leaves it: close either way.
        runtime.close(prepared.session_id)
        raise
    if prepared.close_after:
        runtime.close(prepared.session_id)
    return chunk
