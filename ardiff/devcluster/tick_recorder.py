"""Tick one session back to back over raw HTTP and keep every answer, for fault tests and benchmarks.

`ardiff.client.SessionClient` hides the answers it retries; a fault test needs to see each of them (which
codes, when) to assert that a window was only ever "retry", and to time it. After an error the recorder waits
`pause_seconds` (finer than the worker's `Retry-After: 1`) so that the end of a window is seen closely.
"""

from __future__ import annotations

import threading
import time

import httpx

from ardiff.client import SessionClient, hold
from ardiff.devcluster.history import Answer, History


class TickRecorder(threading.Thread):
    """Ticks `session` until stopped, each answer (or its absence) in `history` (its own, or one shared by
    several recorders and clients: `ardiff.devcluster.history`)."""

    def __init__(
        self,
        session: SessionClient,
        *,
        keys: str = "w",
        pause_seconds: float = 0.1,
        history: History | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"ticks-{session.session_id}")
        self.session_id = session.session_id
        self.url = f"{session.endpoint}/v1/sessions/{session.session_id}/ticks"
        self.headers = {"Authorization": f"Bearer {session.token}"}
        self.next_chunk = session.next_chunk_index
        self.control = hold(keys)
        self.pause_seconds = pause_seconds
        self.history = history if history is not None else History()
        self._stopping = threading.Event()

    @property
    def answers(self) -> list[Answer]:
        return self.history.of(self.session_id)

    def run(self) -> None:
        with httpx.Client(timeout=120, event_hooks={"response": [self.history.record]}) as http:
            while not self._stopping.is_set():
                index = self.next_chunk
                request_id = f"rec-{index}"
                body = {"request_id": request_id, "chunk_index": index, "controls": [self.control]}
                sent = time.monotonic()
                try:
                    response = http.post(self.url, json=body, headers=self.headers)
                except httpx.TransportError:
                    self.history.unanswered(self.session_id, index, request_id, sent)
                    time.sleep(self.pause_seconds)
                    continue
                if response.status_code == 200:
                    self.next_chunk += 1
                    continue
                time.sleep(self.pause_seconds)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=120)

    def since(self, moment: float) -> list[Answer]:
        """The answers to requests sent at or after `moment` (monotonic)."""
        return [a for a in self.answers if a.sent >= moment]

    def first_success_since(self, moment: float) -> Answer | None:
        return next((a for a in self.since(moment) if a.status == 200), None)
