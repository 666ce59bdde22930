"""`SessionCache`: what the operator remembers of each session between its events.

Nothing here is the truth (the session's status and Redis are): a restarted operator starts empty and pays
one extra read or write per session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

SessionKey = tuple[str, str]  # (namespace, session name)


@dataclass
class SessionCache:
    # How often a status is written although nothing changed (the operator's --mirror-seconds).
    mirror_seconds: float
    # The last status written per session, so a lagging watch does not make us write it twice; and when.
    written_status: dict[SessionKey, dict[str, Any]] = field(default_factory=dict)
    mirrored_at: dict[SessionKey, float] = field(default_factory=dict)
    # SHA-256 of each session's token (read from its Secret once).
    token_hashes: dict[SessionKey, str] = field(default_factory=dict)
    # Why a session's state changed, when the status cannot tell (e.g. who evicted it): used once.
    notes: dict[SessionKey, str] = field(default_factory=dict)
    # When each session was admitted (monotonic seconds) until its first Ready status (the placement
    # histogram).
    admitted_at: dict[SessionKey, float] = field(default_factory=dict)
    # Sessions being deleted (uids) whose slot was released while someone else's finalizer holds them: each of
    # their further events would release again; forgotten at their DELETED event.
    released_uids: set[str] = field(default_factory=set)

    def mirror_due(self, key: SessionKey) -> bool:
        return time.monotonic() - self.mirrored_at.get(key, 0.0) >= self.mirror_seconds

    def remember_status(self, key: SessionKey, status: dict[str, Any]) -> None:
        self.written_status[key] = {**self.written_status.get(key, {}), **status}
        self.mirrored_at[key] = time.monotonic()

    def forget(self, key: SessionKey) -> None:
        for cache in (self.written_status, self.mirrored_at, self.token_hashes, self.notes, self.admitted_at):
            cache.pop(key, None)
