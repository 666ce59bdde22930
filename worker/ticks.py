"""A tick's passage through the worker service (worker/service.py), as values and one rule.

`AdmittedTick` is what the checks that need no body let through, `check_order` the chunk order a tick must
keep against its session's book and record, and `TickOutcome`/`TickResponse` what a tick hands back to its
route (`OpenedStream`: a stream's session as it opens), with `timing_header` for the stages' times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ardiff.kv.records import SessionRecord
from ardiff.worker.encoding import MediaType
from ardiff.worker.errors import ChunkOutOfOrder, MaxChunksReached, ResetRequired, SessionClosed
from ardiff.worker.session_book import CachedChunk, SessionBook, SessionStatus

# A tick's body as it reaches the service: the family's `tick_body` as validated (the HTTP tick, the stream),
# or a mapping (the realtime stream's chunks, OpenPI, the warm-up); the family parses it once.
TickInput = Mapping[str, Any] | BaseModel


@dataclass(frozen=True)
class TickOutcome:
    """A tick's chunk and how long its stages took (seconds; zeros for a retried request id)."""

    chunk: CachedChunk
    queue: float = 0.0
    forward: float = 0.0
    decode: float = 0.0

    def timing(self, **more: float) -> dict[str, float]:
        """The stages in milliseconds (`server-timing`, the stream's `timing`)."""
        stages = {"queue": self.queue, "forward": self.forward, "decode": self.decode, **more}
        return {name: round(seconds * 1000, 2) for name, seconds in stages.items()}


@dataclass(frozen=True)
class AdmittedTick:
    """A tick past the checks that need no body (`WorkerService.admitted`): the session's record (None
    standalone) and when the request arrived (`perf_counter`)."""

    session_id: str
    record: SessionRecord | None
    arrived: float


@dataclass(frozen=True)
class OpenedStream:
    """A stream's session as it opens: its view (`GET /v1/sessions/{id}`) and record (None standalone)."""

    view: dict[str, Any]
    record: SessionRecord | None


@dataclass(frozen=True)
class TickResponse:
    body: bytes
    media_type: MediaType
    headers: dict[str, str]


def timing_header(stages_ms: dict[str, float]) -> str:
    """The `server-timing` header of a tick's stages."""
    return ", ".join(f"{name};dur={ms:.2f}" for name, ms in stages_ms.items())


def check_order(tick: Any, book: SessionBook | None, record: SessionRecord | None) -> None:
    """The chunk order a tick must keep (docs/contracts.md §4): not a closed session's, a reset at chunk 0,
    no tick but a reset while the session needs one (its book's or its record's say), else the next chunk
    index, and within the record's `max_chunks`."""
    if book is not None and book.status is SessionStatus.CLOSED:
        raise SessionClosed(f"session {tick.session_id!r} was closed on this worker")
    needs_reset = (book is not None and book.status is SessionStatus.RESET_REQUIRED) or (
        record is not None and record.reset_required
    )
    if tick.reset:
        if tick.chunk_index != 0:
            raise ChunkOutOfOrder("a reset tick starts the session over at chunk 0", expected_chunk_index=0)
    elif needs_reset:
        raise ResetRequired(f"session {tick.session_id!r} lost its state; send reset=true with chunk_index=0")
    else:
        expected = book.next_chunk_index if book is not None else 0
        if tick.chunk_index != expected:
            raise ChunkOutOfOrder(
                f"expected chunk_index {expected}, got {tick.chunk_index}", expected_chunk_index=expected
            )
    if record is not None and record.max_chunks and tick.chunk_index >= record.max_chunks:
        raise MaxChunksReached(
            f"session {tick.session_id!r} is limited to {record.max_chunks} chunks",
            max_chunks=record.max_chunks,
        )
