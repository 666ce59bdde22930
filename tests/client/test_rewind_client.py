"""`SessionClient.rewind` (issue 26) against a loopback HTTP server answering as the worker does: the request
it sends, the book it keeps, the typed `ChunkNotKept` from the worker's own envelope, and bad chunks refused
before anything is sent; `ardiff session rewind` and `ardiff session fork` refuse bad input without a
traceback."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ardiff import client
from ardiff.worker import errors as worker_errors

Answer = tuple[int, dict[str, Any]]


class RewindWorker(ThreadingHTTPServer):
    """Answers each POST with the next scripted JSON answer and records (path, Authorization, body)."""

    def __init__(self, answers: list[Answer]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.requests: list[tuple[str, str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: RewindWorker

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        self.server.requests.append((self.path, self.headers.get("authorization", ""), body))
        status, answer = self.server.answers[min(len(self.server.requests), len(self.server.answers)) - 1]
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def worker(answers: list[Answer]) -> Iterator[RewindWorker]:
    server = RewindWorker(answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_rewind_posts_the_chunk_and_the_next_tick_is_that_chunk() -> None:
    answer = {"session": "walk", "chunk_index": 3, "kept_chunks": [1, 2, 3]}
    with (
        worker([(200, answer)]) as server,
        client.SessionClient("walk", server.url, "t0ken", next_chunk_index=7) as walk,
    ):
        rewind = walk.rewind(3)
        assert walk.next_chunk_index == 3
    assert rewind == client.Rewind(session="walk", chunk_index=3, kept_chunks=(1, 2, 3))
    assert server.requests == [("/v1/sessions/walk/rewind", "Bearer t0ken", {"chunk": 3})]


def test_a_chunk_the_session_does_not_keep_is_a_typed_error_and_changes_nothing() -> None:
    refusal = worker_errors.ChunkNotKept("chunk 2 is not kept; kept: [5, 6, 7]", kept_chunks=[5, 6, 7])
    assert (refusal.status, refusal.code) == (404, "chunk_not_kept")
    with (
        worker([(refusal.status, refusal.envelope())]) as server,
        client.SessionClient("walk", server.url, "t0ken", next_chunk_index=8) as walk,
    ):
        with pytest.raises(client.ChunkNotKept) as raised:
            walk.rewind(2)
        assert walk.next_chunk_index == 8
    assert (raised.value.status, raised.value.code) == (404, "chunk_not_kept")
    assert raised.value.message == "chunk 2 is not kept; kept: [5, 6, 7]"
    assert (raised.value.kept_chunks, raised.value.param) == ((5, 6, 7), "chunk")
    assert not raised.value.retryable
    assert len(server.requests) == 1  # final: not retried


@pytest.mark.parametrize("chunk", [0, -1, True, 2.0, "3"])
def test_a_chunk_that_cannot_be_kept_is_refused_before_anything_is_sent(chunk: Any) -> None:
    with (
        worker([(500, {})]) as server,
        client.SessionClient("walk", server.url, "t0ken", next_chunk_index=4) as walk,
    ):
        with pytest.raises(ValueError, match="rewind chunk must be an integer >= 1"):
            walk.rewind(chunk)
        assert walk.next_chunk_index == 4
    assert server.requests == []


def ardiff(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ardiff.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"KUBECONFIG": str(tmp_path / "missing"), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    "args",
    [("session", "rewind", "walk", "0"), ("session", "fork", "walk", "walk-b", "--at", "0")],
    ids=["rewind-0", "fork-at-0"],
)
def test_the_cli_refuses_chunk_0_as_a_usage_error(args: tuple[str, ...], tmp_path: Path) -> None:
    result = ardiff(*args, tmp_path=tmp_path)
    assert result.returncode == 2
    assert "must be a positive integer, got 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [("session", "rewind", "walk", "3"), ("session", "fork", "walk", "walk-b", "--at", "3")],
    ids=["rewind", "fork"],
)
def test_the_cli_without_a_cluster_is_a_one_line_error(args: tuple[str, ...], tmp_path: Path) -> None:
    result = ardiff(*args, "--kubeconfig", str(tmp_path / "missing"), tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: kubernetes_error: no usable Kubernetes credentials")
    assert "Traceback" not in result.stderr
