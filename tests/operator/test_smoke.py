"""The chart's `helm test` tick (operator/smoke.py): sent again while the worker does not answer yet or
answers 503, over real HTTP on loopback; given up at the deadline with a message, not a traceback."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ardiff.operator import smoke
from ardiff.worker.net import free_port


@contextmanager
def worker(port: int, statuses: list[int]) -> Iterator[list[dict]]:
    """A loopback HTTP server answering each POST with the next of `statuses` (the last one repeated)."""
    received: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"body": body, "authorization": self.headers["Authorization"]})
            status = statuses[min(len(received), len(statuses)) - 1]
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "POLL_SECONDS", 0.1)


@pytest.mark.usefixtures("quick_polls")
def test_the_tick_is_sent_again_until_the_worker_answers() -> None:
    port = free_port()
    said: list[str] = []
    result: dict = {}

    def serve_late() -> None:
        time.sleep(0.5)  # the worker listens half a second after the first try
        with worker(port, [503, 200]) as received:
            result["received"] = received
            while "done" not in result:
                time.sleep(0.05)

    server = threading.Thread(target=serve_late, daemon=True)
    server.start()
    try:
        reply = smoke.post_first_tick(
            f"http://127.0.0.1:{port}/v1/sessions/s/ticks",
            "s",
            "tok",
            deadline=time.monotonic() + 20,
            verify=True,
            say=said.append,
        )
    finally:
        result["done"] = True
        server.join()
    assert reply is not None
    assert reply.status_code == 200
    assert any("ConnectError" in line and "sending it again" in line for line in said)
    assert any("HTTP 503; sending it again" in line for line in said)
    # The same request each time (ticks are idempotent), with the session's token.
    assert [r["body"] for r in result["received"]] == [{"request_id": "s-0", "chunk_index": 0}] * 2
    assert {r["authorization"] for r in result["received"]} == {"Bearer tok"}


@pytest.mark.usefixtures("quick_polls")
def test_an_answer_other_than_503_is_the_result_at_once() -> None:
    port = free_port()
    with worker(port, [401]) as received:
        reply = smoke.post_first_tick(
            f"http://127.0.0.1:{port}/t", "s", "tok", deadline=time.monotonic() + 20, verify=True, say=print
        )
    assert reply is not None
    assert reply.status_code == 401
    assert len(received) == 1


@pytest.mark.usefixtures("quick_polls")
def test_no_answer_by_the_deadline_is_none_with_a_message() -> None:
    said: list[str] = []
    url = f"http://127.0.0.1:{free_port()}/v1/sessions/s/ticks"
    reply = smoke.post_first_tick(
        url, "s", "tok", deadline=time.monotonic() + 0.5, verify=True, say=said.append
    )
    assert reply is None
    assert said[-1].startswith(f"tick 0 of s got no answer from {url}: ConnectError")
