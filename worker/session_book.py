"""The worker's own bookkeeping for one session, as one serialisable record (DESIGN §10).

Everything the HTTP layer knows about a session lives here: the next chunk index it accepts, the last
request id with its cached chunk (so a retry returns the same chunk without advancing), the token hash it was
admitted with, and its state. The model's state lives in the runtime, behind the session adapter. Books are
immutable; each transition returns a new one, so a failed step never leaves a half-updated book.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


class SessionStatus(StrEnum):
    ACTIVE = "active"
    RESET_REQUIRED = "reset_required"  # its state was lost (failed forward): only reset=true, chunk 0 goes on
    CLOSED = "closed"  # closed on this worker (DELETE or close_session); answers 410 until released


@dataclass(frozen=True)
class CachedChunk:
    """The last chunk a session produced, kept so a retried request id gets it again."""

    request_id: str
    chunk_index: int
    frames: np.ndarray
    metadata: dict[str, Any]
    actions: np.ndarray | None = None  # a robot policy's action chunk (float32)

    def to_dict(self) -> dict[str, Any]:
        value = {
            "request_id": self.request_id,
            "chunk_index": self.chunk_index,
            "frames": self.frames.tobytes(),
            "frame_shape": list(self.frames.shape),
            "metadata": self.metadata,
        }
        if self.actions is not None:
            value["actions"] = self.actions.astype("<f4").tobytes()
            value["action_shape"] = list(self.actions.shape)
        return value

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> CachedChunk:
        frames = np.frombuffer(value["frames"], dtype=np.uint8).reshape(value["frame_shape"])
        actions = None
        if value.get("actions") is not None:
            actions = np.frombuffer(value["actions"], dtype="<f4").reshape(value["action_shape"])
        return cls(value["request_id"], value["chunk_index"], frames, dict(value["metadata"]), actions)


@dataclass(frozen=True)
class SessionBook:
    session_id: str
    token_sha256: str = ""  # empty in standalone mode
    status: SessionStatus = SessionStatus.ACTIVE
    next_chunk_index: int = 0
    last_chunk: CachedChunk | None = None
    ticks: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, str) or not self.session_id:
            raise ValueError(f"session book session_id must be a non-empty string, got {self.session_id!r}")
        if self.next_chunk_index < 0:
            raise ValueError(f"session book next_chunk_index must be >= 0, got {self.next_chunk_index}")
        object.__setattr__(self, "status", SessionStatus(self.status))

    @property
    def holds_slot(self) -> bool:
        """Whether the session counts against the runtime's capacity (closed ones don't)."""
        return self.status is not SessionStatus.CLOSED

    def retry_of(self, request_id: str, chunk_index: int) -> CachedChunk | None:
        """The cached chunk when (`request_id`, `chunk_index`) repeats the last successful tick."""
        last = self.last_chunk
        if last is not None and last.request_id == request_id and last.chunk_index == chunk_index:
            return last
        return None

    def advanced(self, chunk: CachedChunk, *, closed: bool = False) -> SessionBook:
        return dataclasses.replace(
            self,
            status=SessionStatus.CLOSED if closed else SessionStatus.ACTIVE,
            next_chunk_index=chunk.chunk_index + 1,
            last_chunk=chunk,
            ticks=self.ticks + 1,
        )

    def failed(self) -> SessionBook:
        return dataclasses.replace(self, status=SessionStatus.RESET_REQUIRED, last_chunk=None)

    def after_reset(self) -> SessionBook:
        return dataclasses.replace(self, status=SessionStatus.ACTIVE, next_chunk_index=0, last_chunk=None)

    def forked(self, session_id: str) -> SessionBook:
        """The book of a fork (issue 26) installed from this one's kept state as `session_id`: the same chunk
        index, no token hash (the fork's own is set by its resume) and no cached chunk (the fork never sent
        that request)."""
        return dataclasses.replace(self, session_id=session_id, token_sha256="", last_chunk=None)

    def closed(self) -> SessionBook:
        return dataclasses.replace(self, status=SessionStatus.CLOSED, last_chunk=None)

    def describe(self) -> dict[str, Any]:
        """The public view (no token hash, no frames)."""
        return {
            "session_id": self.session_id,
            "state": self.status.value,
            "next_chunk_index": self.next_chunk_index,
            "last_request_id": self.last_chunk.request_id if self.last_chunk else None,
            "ticks": self.ticks,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "token_sha256": self.token_sha256,
            "status": self.status.value,
            "next_chunk_index": self.next_chunk_index,
            "last_chunk": self.last_chunk.to_dict() if self.last_chunk else None,
            "ticks": self.ticks,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> SessionBook:
        last = value.get("last_chunk")
        return cls(
            session_id=value["session_id"],
            token_sha256=value.get("token_sha256", ""),
            status=SessionStatus(value["status"]),
            next_chunk_index=int(value["next_chunk_index"]),
            last_chunk=CachedChunk.from_dict(last) if last else None,
            ticks=int(value.get("ticks", 0)),
        )
