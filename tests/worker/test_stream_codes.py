"""Every error code on the stream, in-process: the error message, then either the stream goes on (the same
tick can be sent again) or it closes with `4000 + status` and the code as reason (docs/contracts.md §4).

The app runs standalone over the fake runtime, with `WorkerService.tick` made to raise each error the worker
has, exactly as the worker builds them; the codes' real causes are tested in test_stream.py and
test_http_contract.py.
"""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from ardiff.worker import errors
from ardiff.worker.app import create_app
from ardiff.worker.server import load_runtime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings
from tests.client.test_client_units import worker_error_instances

TICK = {"type": "tick", "request_id": "r0", "chunk_index": 0}
CLOSING = {"unauthorized", "unknown_session", "session_evicted", "session_closed", "misdirected"}


@pytest.mark.parametrize("error", worker_error_instances(), ids=lambda e: e.code)
def test_each_code_is_an_error_message_and_closes_only_when_the_connection_cannot_go_on(error) -> None:
    settings = WorkerSettings(runtime="fake", fake_capacity=1)
    service = WorkerService(settings, lambda: load_runtime(settings))

    async def failing_tick(*args, **kwargs):
        raise error

    service.tick = failing_tick  # type: ignore[method-assign]
    with TestClient(create_app(service)) as client:
        deadline = time.monotonic() + 30
        while not service.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        with client.websocket_connect("/v1/sessions/s-1/stream") as ws:
            assert ws.receive_json()["type"] == "ready"
            ws.send_json(TICK)
            message = ws.receive_json()
            assert message["type"] == "error"
            assert message["error"] == {**error.envelope()["error"], **_retry(error)}
            if error.code in CLOSING:
                with pytest.raises(WebSocketDisconnect) as closed:
                    ws.receive_json()
                assert (closed.value.code, closed.value.reason) == (4000 + error.status, error.code)
            else:  # the stream goes on: the next tick is answered
                ws.send_json(TICK)
                assert ws.receive_json()["error"]["code"] == error.code


def _retry(error: errors.WorkerError) -> dict[str, int]:
    return {} if error.retry_after_seconds is None else {"retry_after": error.retry_after_seconds}
