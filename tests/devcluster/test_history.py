"""The history checker (issue 40 item 3) on histories written by hand: each violation it must find, and none
where the answers are what the contracts allow (a retry replayed by the pod a session moved to, a new line
after a reset or a rewind)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable

import httpx

from ardiff.devcluster.history import Answer, History
from ardiff.wire import SERVED_BY_HEADER, ServedBy

Response = Callable[..., httpx.Response]
A1, A2, B1, B2 = ServedBy("pod-a", 1), ServedBy("pod-a", 2), ServedBy("pod-b", 1), ServedBy("pod-b", 2)


def answer(status: int, served_by: ServedBy | None, body: bytes = b"", code: str = "") -> Response:
    """What `history.record` of a tick `(session, chunk, request id)` records: a response to its request."""
    headers = {SERVED_BY_HEADER: served_by.header} if served_by is not None else {}
    if code:
        body = json.dumps({"error": {"code": code, "message": "m"}}).encode()
    return lambda session, chunk, request_id, reset=False: httpx.Response(
        status,
        headers=headers,
        content=body,
        request=httpx.Request(
            "POST",
            f"http://pod:8000/v1/sessions/{session}/ticks",
            json={"request_id": request_id, "chunk_index": chunk, "reset": reset},
        ),
    )


def tick(history: History, session: str, chunk: int, request_id: str, respond: Response, **kw) -> Answer:
    recorded = history.record(respond(session, chunk, request_id, **kw))
    assert recorded is not None
    return recorded


def test_a_clean_history_with_a_move_a_replayed_retry_a_rewind_and_a_reset_has_no_violation() -> None:
    history = History()
    tick(history, "t", 0, "t0", answer(200, A1, b"t0"))
    tick(history, "t", 1, "t1", answer(200, B1, b"t1"))  # migrated to pod-b
    tick(history, "t", 2, "t2", answer(200, A1, b"t2"))  # and back to pod-a, going on
    tick(history, "s", 0, "r0", answer(200, A1, b"c0"))
    tick(history, "s", 1, "r1", answer(200, A1, b"c1"))
    tick(history, "s", 1, "r1", answer(200, B1, b"c1"))  # retried at the pod it moved to: replayed
    tick(history, "s", 2, "r2", answer(503, A1, code="not_ready"))
    tick(history, "s", 2, "r2", answer(200, B1, b"c2"))
    tick(history, "s", 3, "r3", answer(409, B1, code="rewound"))  # B1 resumed it at chunk 2
    tick(history, "s", 2, "r2b", answer(200, A2, b"c2"))  # a new line: chunk 2 again elsewhere
    tick(history, "s", 3, "r3b", answer(200, B2, b"c3"))
    tick(history, "s", 3, "r3c", answer(200, B2, b"c3"))  # made again from a snapshot: the same bytes
    tick(history, "s", 0, "r0b", answer(200, A2, b"other"), reset=True)  # another world, another line
    assert history.violations() == []


def test_an_incarnation_delivering_again_after_another_took_over_is_a_split_brain() -> None:
    history = History()
    tick(history, "s", 0, "r0", answer(200, A1, b"c0"))
    tick(history, "s", 1, "r1", answer(200, B1, b"c1"))  # moved to pod-b
    tick(history, "s", 1, "r1", answer(200, A1, b"c1"))  # and pod-a still serves it
    tick(history, "s", 2, "r2", answer(200, B1, b"c2"))
    assert history.violations() == ["s chunk 1: split brain, pod-a/1 delivered it after pod-b/1 had"]


def test_two_bodies_for_one_chunk_in_one_line_is_a_silent_fork() -> None:
    history = History()
    tick(history, "s", 0, "r0", answer(200, A1, b"c0"))
    tick(history, "s", 0, "r0", answer(200, A1, b"not c0"))  # a retry that did not replay
    assert history.violations() == ["s chunk 0 (line 0): a silent fork, 2 bodies"]


def test_a_stale_incarnation_answering_200_and_a_5xx_without_a_code_are_violations() -> None:
    history = History()
    first = tick(history, "s", 0, "r0", answer(200, A1, b"c0"))
    tick(history, "s", 1, "r1", answer(200, A1, b"c1"))
    tick(history, "s", 2, "r2", answer(502, None, b"bad gateway"))
    found = history.violations(stale={A1: first.at + 1e-9})
    assert len(found) == 2
    assert found[0].startswith("s chunk 1: 200 from pod-a/1, asked ")
    assert found[1] == "s chunk 2: a 502 without a code"
    assert history.violations(stale={A1: first.at + 3600}) == ["s chunk 2: a 502 without a code"]


def test_a_chunk_made_before_its_incarnation_went_stale_and_read_late_is_no_violation() -> None:
    """The recorded 30-minute soak of 2026-12-07 22:03 flagged a 200 read 3 s after its worker was cut from
    Redis: the chunk was made and recorded in the store before the cut, and a busy client read it late. What
    decides is when the request was sent (`sent`: the answer's arrival less httpx's `elapsed`)."""
    history = History()
    made = answer(200, A1, b"c0")("s", 0, "r0")
    made.read()
    made.elapsed = datetime.timedelta(seconds=3.0)  # sent 3 s before it was read
    late = history.record(made)
    assert late is not None
    assert late.at - late.sent >= 3.0
    assert history.violations(stale={A1: late.sent + 1.0}) == []  # stale from 1 s after it was sent
    sent_after = tick(history, "s", 1, "r1", answer(200, A1, b"c1"))
    assert history.violations(stale={A1: late.sent + 1.0}) == [
        f"s chunk 1: 200 from pod-a/1, asked {sent_after.sent - late.sent - 1.0:.1f} s after it was stale"
    ]


def test_only_session_routes_are_recorded_and_a_describe_is_no_delivery() -> None:
    history = History()
    health = httpx.Response(200, request=httpx.Request("GET", "http://pod:8000/healthz"))
    assert history.record(health) is None
    view = httpx.Response(
        200,
        headers={SERVED_BY_HEADER: A1.header},
        content=b"{}",
        request=httpx.Request("GET", "http://door/pools/ns/p/v1/sessions/s"),
    )
    recorded = history.record(view)
    assert recorded is not None
    assert (recorded.session, recorded.chunk_index, recorded.served_by) == ("s", None, A1)
    assert history.violations(stale={A1: 0.0}) == []  # a stale pod's view is not a chunk delivered


def test_a_reset_through_its_own_route_starts_a_new_line() -> None:
    """`SessionClient.reset()` (`POST /v1/sessions/<id>/reset`, not a tick's `reset`) starts the session
    over: a session lost with its pod and placed again needs one, and its chunk 0 then comes from another
    incarnation."""
    history = History()
    tick(history, "s", 0, "r0", answer(200, A1, b"c0"))
    tick(history, "s", 1, "r1", answer(200, A1, b"c1"))
    tick(history, "s", 2, "r2", answer(409, B1, code="reset_required"))  # A1's pod died: placed on pod-b
    reset = httpx.Request("POST", "http://pod-b:8000/v1/sessions/s/reset")
    not_ready = {"error": {"code": "not_ready", "message": "m"}}
    failed = history.record(
        httpx.Response(503, headers={SERVED_BY_HEADER: B1.header}, json=not_ready, request=reset)
    )
    assert failed is not None
    assert not failed.reset  # only a reset done starts a line
    done = history.record(httpx.Response(200, headers={SERVED_BY_HEADER: B1.header}, json={}, request=reset))
    assert done is not None
    assert done.reset
    assert done.chunk_index is None
    tick(history, "s", 0, "r0b", answer(200, B1, b"c0 again"))
    tick(history, "s", 1, "r1b", answer(200, B1, b"c1"))
    assert history.violations() == []
