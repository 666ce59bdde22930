"""A history of the answers a test's clients got from session routes, and its checker (issue 40 item 3).

Clients record every answer (`History.record`, an httpx response hook: the session, the chunk and request id
asked for, the status and error code, the Pod and epoch that answered from `ardiff-served-by`, a digest of the
body, the time); at the end `History.violations` says what went wrong over the whole run, as sentences a
failing test prints:

- *no split brain*: an incarnation (Pod and epoch) that served a session never delivers a chunk another one
  reached after it (it served the session beside that one; a session that moves back to a pod goes on past
  it), unless the client saw a reset or a rewind in between; and an incarnation known to be fenced or cut off
  (`stale`, with the time from which it may serve nothing) answers no request sent from then on with a chunk
  (a chunk it made before, read late by a busy client, is no violation: the request's send time decides);
- *no silent fork*: within one line of a session (between resets and rewinds) every delivery of chunk *i* has
  the same bytes (a retried request id answers the same chunk; a pod that resumed the session from a snapshot
  makes it again, the same with the same controls);
- *nothing without a word*: no 5xx without an error code.

The leak and convergence checks (nothing of a deleted session left, slots equal bindings) are the store's
invariants (`kv/invariants.py`) and the tests' own `assert_consistent`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from ardiff.wire import SERVED_BY_HEADER, ServedBy

# The answers after which a session's chunks start a new line: a reset (a tick that asked for one, or a 200 of
# the reset route) is recorded as `Answer.reset`; a rewind's 409 says the session went back to a kept or
# snapshot boundary.
NEW_LINE_CODES = frozenset({"rewound"})


@dataclass(frozen=True)
class Answer:
    """One answer of a session route as its client saw it."""

    session: str
    chunk_index: int | None  # the chunk a tick asked for (None: another route)
    request_id: str  # a tick's ("" for another route)
    status: int  # 0: no answer (connection refused or reset: `History.unanswered`)
    code: str  # the error's code ("" for a 2xx or an error without the envelope; "unreachable" for 0)
    served_by: ServedBy | None  # None: the answer named no Pod (a proxy's, a worker from before it)
    digest: str  # SHA-256 of a 200's body ("" otherwise)
    sent: float  # time.monotonic() when the request was sent
    at: float  # and when its answer arrived
    reset: bool = False  # the tick asked to start the session over, or a reset (its own route) was done


# `/v1/sessions/<id>/...` under any prefix (a front door's `/pools/<namespace>/<pool>`).
_SESSION_ROUTE = re.compile(r"/v1/sessions/(?P<session>[^/]+)(?P<rest>/[^?]*)?$")


@dataclass
class History:
    """The answers of a run, in the order they arrived (safe to record from several threads)."""

    answers: list[Answer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, response: httpx.Response) -> Answer | None:
        """Record an answer of a session route (other URLs: None): an httpx response hook, so every answer a
        client gets is recorded, retries and redirections included (`client.event_hooks["response"]`). A
        tick's chunk, request id and reset are read from its request's body."""
        route = _SESSION_ROUTE.search(response.request.url.path)
        if route is None:
            return None
        response.read()
        chunk_index, request_id, reset = None, "", False
        if route["rest"] == "/ticks" and response.request.method == "POST":
            body = json.loads(response.request.content)
            chunk_index, request_id = int(body["chunk_index"]), str(body["request_id"])
            reset = bool(body.get("reset", False))
        elif route["rest"] == "/reset" and response.request.method == "POST":
            reset = response.status_code == 200  # `SessionClient.reset()`: the next tick is chunk 0
        code = ""
        if response.status_code >= 400:
            try:
                code = str(response.json()["error"]["code"])
            except (ValueError, KeyError, TypeError):
                code = ""
        header = response.headers.get(SERVED_BY_HEADER)
        at = time.monotonic()
        try:
            elapsed = response.elapsed.total_seconds()
        except RuntimeError:  # a response no client sent (a test's)
            elapsed = 0.0
        answer = Answer(
            session=route["session"],
            chunk_index=chunk_index,
            request_id=request_id,
            status=response.status_code,
            code=code,
            served_by=ServedBy.parse(header) if header else None,
            digest=hashlib.sha256(response.content).hexdigest() if response.status_code == 200 else "",
            sent=at - elapsed,
            at=at,
            reset=reset,
        )
        with self._lock:
            self.answers.append(answer)
        return answer

    def unanswered(self, session: str, chunk_index: int, request_id: str, sent: float) -> Answer:
        """A tick sent at `sent` that got no answer (a transport error: refused, reset)."""
        answer = Answer(session, chunk_index, request_id, 0, "unreachable", None, "", sent, time.monotonic())
        with self._lock:
            self.answers.append(answer)
        return answer

    def of(self, session: str) -> list[Answer]:
        with self._lock:
            return [answer for answer in self.answers if answer.session == session]

    def violations(self, *, stale: Mapping[ServedBy, float] = {}) -> list[str]:
        """What the run broke (empty: nothing). `stale`: incarnations that may serve nothing from a time on
        (fenced, cut off from the store), by `time.monotonic()`."""
        found: list[str] = []
        lines: dict[str, int] = defaultdict(int)  # session -> its current line
        # (session, line) -> its deliveries so far: (incarnation, chunk), in order
        deliveries: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
        digests: dict[tuple[str, int, int], set[str]] = defaultdict(set)  # (session, line, chunk) -> bodies
        for answer in self.answers:
            if answer.reset or answer.code in NEW_LINE_CODES:
                lines[answer.session] += 1
            where = f"{answer.session} chunk {answer.chunk_index}"
            if answer.status >= 500 and not answer.code:
                found.append(f"{where}: a {answer.status} without a code")
            if answer.status != 200 or answer.chunk_index is None:
                continue
            server = answer.served_by.header if answer.served_by is not None else "?"
            since = stale.get(answer.served_by) if answer.served_by is not None else None
            if since is not None and answer.sent >= since:
                found.append(
                    f"{where}: 200 from {server}, asked {answer.sent - since:.1f} s after it was stale"
                )
            seen = deliveries[answer.session, lines[answer.session]]
            # An incarnation that served the session, then delivers a chunk another one had already reached
            # after it, served it beside that one (a session that moves back to a pod goes on from there).
            first = next((i for i, (other, _) in enumerate(seen) if other == server), len(seen))
            ahead = [
                other for other, chunk in seen[first:] if other != server and chunk >= answer.chunk_index
            ]
            if ahead:
                found.append(f"{where}: split brain, {server} delivered it after {ahead[-1]} had")
            seen.append((server, answer.chunk_index))
            digests[answer.session, lines[answer.session], answer.chunk_index].add(answer.digest)
        for (session, number, chunk), bodies in digests.items():
            # A chunk delivered again (a retried request id; made again on the next pod from a snapshot, with
            # the same controls) has the same bytes, or the session's line forked without a word.
            if len(bodies) > 1:
                found.append(f"{session} chunk {chunk} (line {number}): a silent fork, {len(bodies)} bodies")
        return found
