"""Every error code a tick can answer, as a realtime video stream meets it (docs/contracts.md §4 "Realtime
video"), in-process: the retryable ones are retried and the stream goes on, an order conflict continues from
the chunk named, `max_chunks_reached` completes the stream, and every other code ends it with vllm-omni's
`error` message carrying our code and extras, closed with `4000 + status`. Also the stall clock, an
interaction the runtime refuses at its chunk, and the protocol's values pinned to vllm-omni 0.30.0's.

The app runs standalone over the fake runtime, with `WorkerService.tick` made to raise the error once (the
way the worker builds it) before the real tick answers; the codes' real causes are in test_realtime.py.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketTestSession

from ardiff.worker import errors
from ardiff.worker.app import create_app
from ardiff.worker.realtime import MAX_QUEUED_EVENTS
from ardiff.worker.realtime_messages import (
    MAX_CONTROL_BYTES,
    MAX_START_BYTES,
    VIDEO_CODEC_OPTIONS,
    upstream,
)
from ardiff.worker.server import load_runtime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings
from tests.client.test_client_units import worker_error_instances

RETRIED = {"not_ready", "placement_recovering", "tick_in_progress"}
FROM_THE_CHUNK_NAMED = {"chunk_out_of_order", "rewound"}
START = {"type": "session.start", "prompt": "a road", "fps": 48}
CAMERA = {"track": "camera", "schema": "lingbot.camera_actions.v1"}
TURN = [{**CAMERA, "data": {"mode": "state", "transitions": [{"actions": ["l"]}]}}]  # hold L
TURNING = [{**CAMERA, "data": {"mode": "frames", "frames": [["l"]] * 3}}]  # a chunk's camera while L is held
STILL = [{**CAMERA, "data": {"mode": "frames", "frames": [[]] * 3}}]  # and while nothing is


def test_the_protocols_values_are_vllm_omnis() -> None:
    upstream()  # imported the way the worker does, keeping this process's logging (the test below)
    from vllm_omni.entrypoints.openai import serving_video_output_stream as upstream_module

    settings = WorkerSettings()
    assert settings.realtime_start_timeout_seconds == upstream_module._DEFAULT_START_TIMEOUT
    assert settings.realtime_stall_timeout_seconds == upstream_module._DEFAULT_STALL_TIMEOUT
    assert (MAX_START_BYTES, MAX_CONTROL_BYTES) == (
        upstream_module._MAX_START_MESSAGE_SIZE,
        upstream_module._MAX_CONTROL_MESSAGE_SIZE,
    )
    source = inspect.getsource(upstream_module.OmniStreamingVideoOutputHandler._stream_video_bytes)
    assert f"video_codec_options = {json.dumps(VIDEO_CODEC_OPTIONS)}" in source


def test_the_first_stream_leaves_the_workers_logging_as_it_was() -> None:
    """vllm's OpenAI entrypoints, imported by a process's first realtime stream, set the root logger and its
    handlers to ERROR as they load (`model_hosting_container_standards`); the worker's warnings went with it.
    In a fresh process, since this one has imported them."""
    script = (
        "import json, logging; logging.basicConfig(level=logging.INFO)\n"
        "from ardiff.worker.realtime_messages import upstream; upstream()\n"
        "root = logging.getLogger()\n"
        "print(json.dumps([root.level, [handler.level for handler in root.handlers]]))"
    )
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {"LOG_LEVEL", "SAGEMAKER_CONTAINER_LOG_LEVEL"}
    }
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=300
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.splitlines()[-1]) == [20, [0]]


class Worker:
    """The app in-process, its service's tick answering `failures` (in turn) before the real ones."""

    def __init__(self, **settings: Any) -> None:
        self.settings = WorkerSettings(runtime="fake", fake_capacity=1, playout_fps=48, **settings)
        self.service = WorkerService(self.settings, lambda: load_runtime(self.settings))
        self.failures: list[Exception] = []
        self.refused_controls: Exception | None = None  # raised once, by the first tick carrying controls
        self.ticks: list[dict[str, Any]] = []
        real_tick = self.service.tick

        async def tick(session_id: str, body: dict[str, Any], **kwargs: Any) -> Any:
            self.ticks.append(body)
            if self.failures:
                raise self.failures.pop(0)
            if body["controls"] != STILL and self.refused_controls is not None:
                refused, self.refused_controls = self.refused_controls, None
                raise refused
            return await real_tick(session_id, body, **kwargs)

        self.service.tick = tick  # type: ignore[method-assign]

    def __enter__(self) -> TestClient:
        self.client = TestClient(create_app(self.service)).__enter__()
        deadline = time.monotonic() + 30
        while not self.service.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.__exit__(*exc)


def next_of(ws: WebSocketTestSession, *kinds: str) -> dict[str, Any]:
    """The next JSON message of one of `kinds` (or an error), past others and chunks' binary segments."""
    while True:
        message = ws.receive()
        if message.get("text") is None:
            assert message["type"] == "websocket.send", message
            continue
        value = json.loads(message["text"])
        if value["type"] in (*kinds, "error"):
            return value


def closed_with(ws: WebSocketTestSession) -> tuple[int, str]:
    """Read to the connection's close: its code and reason."""
    while (message := ws.receive())["type"] != "websocket.close":
        pass
    return message["code"], message.get("reason", "")


@pytest.mark.parametrize("error", worker_error_instances(), ids=lambda e: e.code)
def test_each_code_of_a_tick_as_the_stream_meets_it(error: errors.WorkerError) -> None:
    worker = Worker()
    worker.failures.append(error)
    with worker as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_json(START)
        start = next_of(ws, "video.start")
        message = next_of(ws, "video.chunk_metadata", "session.done")
        if error.code in RETRIED | FROM_THE_CHUNK_NAMED:  # the stream goes on: the chunk comes
            assert message["type"] == "video.chunk_metadata", message
            assert message["generation_chunk_index"] == 0
            first, second = worker.ticks[:2]
            assert first["request_id"] == f"{start['request_id']}-0"
            if error.code in RETRIED:  # the same tick again
                assert second == first
            else:  # from the chunk named: the fake session then says it is at 0
                assert second["chunk_index"] == error.extra["expected_chunk_index"]
            return
        if error.code == "max_chunks_reached":  # a finished generation: no segment, nothing to trail
            done = {"type": "session.done", "request_id": start["request_id"], "chunks": 0, "stopped": False}
            assert message == done
            return
        expected = {"type": "error", "message": error.message, "code": error.code, "param": error.param}
        expected |= {
            **error.extra,
            "retry_after": error.retry_after_seconds,
            "request_id": start["request_id"],
        }
        assert message == {key: value for key, value in expected.items() if value is not None}
        assert closed_with(ws) == (4000 + error.status, error.code)


def test_a_stream_without_progress_ends_at_the_stall_clock() -> None:
    """A tick retried without end (the store recovering): `not_ready` at the stall clock, naming the last."""
    worker = Worker(realtime_stall_timeout_seconds=1.5)
    worker.failures.extend(errors.PlacementRecovering("the store lost its data") for _ in range(10))
    with worker as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_json(START)
        next_of(ws, "video.start")
        started = time.monotonic()
        error = next_of(ws, "video.chunk_metadata")
        assert time.monotonic() - started >= 1.5
        assert error["code"] == "not_ready"
        assert (
            error["message"] == "Stall timeout: no generation progress in 1.5 s (last: placement_recovering)"
        )
        assert closed_with(ws) == (4503, "not_ready")


def test_an_interaction_its_chunk_refuses_is_reported_and_dropped() -> None:
    """Controls vllm-omni's rules let through but the runtime refuses at the chunk they would shape (LingBot's
    camera checks): an `error` naming the event, and the stream goes on without it."""
    worker = Worker()
    with worker as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_json(START)
        next_of(ws, "video.start")
        next_of(ws, "video.chunk_metadata")
        worker.refused_controls = errors.InvalidTick("a trajectory must cover the chunk", param="controls")
        event = {"event_id": "turn", "event": {"controls": TURN}}
        ws.send_json({"type": "session.interaction", "interaction": event})
        assert next_of(ws, "session.interaction.queued")["event_id"] == "turn"
        error = next_of(ws, "error")
        assert (error["code"], error["event_id"], error["param"]) == ("invalid_tick", "turn", "controls")
        refused = next(i for i, tick in enumerate(worker.ticks) if tick["controls"] != STILL)
        after = next_of(ws, "video.chunk_metadata")
        assert (after["generation_chunk_index"], after["active_event_ids"]) == (
            worker.ticks[refused]["chunk_index"],
            [],
        )
        later = len(worker.ticks) - refused - 1
        assert [tick["controls"] for tick in worker.ticks[refused:]] == [TURNING] + [STILL] * later


def test_a_start_over_4_mib_is_body_too_large_before_it_is_parsed() -> None:
    """`session.start` holds at most 4 MiB (vllm-omni's limit; over a real server the WebSocket layer's
    too, which closes the connection with 1009 first): over it, `body_too_large` and the end, unparsed."""
    worker = Worker()
    with worker as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_text(json.dumps({**START, "pad": "x" * MAX_START_BYTES}))
        error = next_of(ws, "video.start")
        assert (error["code"], "request_id" in error) == ("body_too_large", False)
        assert closed_with(ws) == (4413, "body_too_large")


def test_the_interactions_waiting_for_a_chunk_are_bounded() -> None:
    """While a chunk cannot be made (its tick retried), at most 64 interactions wait for it; the next is
    `too_many_requests` naming it, and the stream goes on."""
    worker = Worker()
    worker.failures.extend(errors.NotReady("the store is away") for _ in range(2))
    with worker as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_json(START)
        next_of(ws, "video.start")
        for n in range(MAX_QUEUED_EVENTS + 1):
            ws.send_json(
                {
                    "type": "session.interaction",
                    "interaction": {"event_id": f"e{n}", "event": {"prompt": "x"}},
                }
            )
        answers = [next_of(ws, "session.interaction.queued") for _ in range(MAX_QUEUED_EVENTS + 1)]
        assert [a["event_id"] for a in answers[:-1]] == [f"e{n}" for n in range(MAX_QUEUED_EVENTS)]
        assert (answers[-1]["code"], answers[-1]["event_id"]) == (
            "too_many_requests",
            f"e{MAX_QUEUED_EVENTS}",
        )
        while not (chunk := next_of(ws, "video.chunk_metadata"))["started_event_ids"]:
            pass  # the chunk being retried was prepared before they came
        assert chunk["started_event_ids"] == [f"e{n}" for n in range(MAX_QUEUED_EVENTS)]


def test_a_start_prompt_over_a_ticks_bound_is_body_too_large() -> None:
    """The prompt goes into every chunk's tick: at most a tick's 1 MiB, though `session.start` holds 4 MiB."""
    with Worker() as client, client.websocket_connect("/v1/realtime/video?session=s-1") as ws:
        ws.send_json({**START, "prompt": "a road " * (1 << 18)})  # 1.75 MiB
        error = next_of(ws, "video.start")
        assert error["code"] == "body_too_large"
        assert closed_with(ws) == (4413, "body_too_large")
