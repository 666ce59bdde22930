"""The session stream (`/v1/sessions/{id}/stream`, docs/contracts.md §4) against real worker processes.

Fake runtime (deterministic frames, no torch) in placement mode on the shared Redis, as in
test_http_contract.py: every error code of the stream, auth by header and by first message, the newest
connection winning, back-pressure, and a fuzzed message schema.
"""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from typing import Any

import numpy as np
import psutil
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from ardiff.kv.records import PoolId
from ardiff.wire import ServedBy
from ardiff.worker.encoding import encode_images
from tests.worker.conftest import CAMERA, launch_fake_pod
from tests.worker.test_http_contract import first_chunk, wait_for

POOL = PoolId("default", f"wk-stream-{uuid.uuid4().hex[:6]}")
POD = "stream-worker-0"
FAST_POOL = PoolId("default", f"wk-stream-fast-{uuid.uuid4().hex[:6]}")
FAST_POD = "stream-worker-fast"
TOKEN = "stream-token"
FAKE_TICK_SECONDS = 0.3  # two ticks of one session overlap


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url):
    process = launch_fake_pod(
        launch_worker,
        redis_url,
        POOL,
        POD,
        fake_capacity=4,
        fake_tick_seconds=FAKE_TICK_SECONDS,
        test_faults=1,
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def fast_worker(launch_worker, redis_url):
    """Forwards that take no time: a client can ask for chunks faster than it reads them."""
    process = launch_fake_pod(launch_worker, redis_url, FAST_POOL, FAST_POD, width=256, height=256)
    yield process
    process.stop()


@pytest.fixture
def place(placer, worker):
    return placer(POOL, POD, TOKEN)


def stream_url(worker, session: str, **query: str) -> str:
    url = f"ws://127.0.0.1:{worker.port}/v1/sessions/{session}/stream"
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def open_stream(
    worker, session: str, *, token: str | None = TOKEN, fault: bool = False, max_queue: int = 16, **query: str
):
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if fault:
        headers["ardiff-test-fault"] = "forward"
    url = stream_url(worker, session, **query)
    return connect(url, additional_headers=headers, max_size=None, max_queue=max_queue)


def tick_message(chunk_index: int, **fields: Any) -> str:
    body = {
        "type": "tick",
        "request_id": f"r-{chunk_index}",
        "chunk_index": chunk_index,
        "controls": [CAMERA],
    }
    return json.dumps({**body, **fields})


async def receive_json(ws: ClientConnection) -> dict[str, Any]:
    message = await asyncio.wait_for(ws.recv(), 30)
    assert isinstance(message, str), f"expected a JSON message, got {len(message)} bytes"
    return json.loads(message)


async def ready(ws: ClientConnection) -> dict[str, Any]:
    message = await receive_json(ws)
    assert message["type"] == "ready", message
    return message


async def chunk(ws: ClientConnection) -> tuple[dict[str, Any], list[bytes]]:
    """A chunk message and its frame images."""
    message = await receive_json(ws)
    assert message["type"] == "chunk", message
    images = [await asyncio.wait_for(ws.recv(), 30) for _ in range(message["frames"])]
    assert all(isinstance(image, bytes) for image in images)
    return message, images


async def error(ws: ClientConnection, code: str) -> dict[str, Any]:
    message = await receive_json(ws)
    assert message["type"] == "error", message
    assert message["error"]["code"] == code, message
    assert message["error"]["message"]
    return message["error"]


async def closed_with(ws: ClientConnection, close_code: int, reason: str) -> None:
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), 30)
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (close_code, reason)


def decode(image: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))


# ------------------------------------------------------------------------------------------ the happy path


async def test_ticks_stream_their_frames_as_jpeg_with_the_metadata_echo(worker, place):
    session = await place(seed=5, prompt="a quiet harbour")
    async with open_stream(worker, session) as ws:
        hello = await ready(ws)
        assert hello == {
            "type": "ready",
            "session_id": session,
            "state": "active",
            "next_chunk_index": 0,
            "format": "jpeg",
            "media_type": "image/jpeg",
        }
        await ws.send(tick_message(0, applied_event_ids=[4]))
        message, images = await chunk(ws)
        served_by = ServedBy.parse(message["metadata"].pop("served_by"))  # issue 40: who served it
        assert (served_by.pod, served_by.epoch > 0) == (POD, True)
        assert message["metadata"] == {
            "session_id": session,
            "request_id": "r-0",
            "chunk_index": 0,
            "applied_event_ids": [4],
        }
        assert message["frame_shape"] == [9, 64, 64, 3]
        assert set(message["timing"]) == {"queue", "forward", "decode", "encode"}
        assert len(images) == 9
        assert all(image[:2] == b"\xff\xd8" for image in images)
        expected = first_chunk(session, seed=5, prompt="a quiet harbour")
        assert images == encode_images(expected, "jpeg")  # exactly the chunk's frames, as JPEG
        assert decode(images[0]).shape == (64, 64, 3)

        await ws.send(tick_message(1, buffer_ms=60_000))  # the client's buffered play: a deadline, met
        message, images = await chunk(ws)
        assert (message["metadata"]["chunk_index"], len(images)) == (1, 12)
        await ws.send(tick_message(1))  # a retried request id: the same chunk, nothing advances
        again, replayed = await chunk(ws)
        assert again["metadata"] == message["metadata"]
        assert replayed == images
    response = worker.tick(session, 2, token=TOKEN)  # the HTTP tick continues where the stream left off
    assert response.status_code == 200, response.text
    view = worker.client.get(f"{worker.url}/v1/sessions/{session}", headers=worker.headers(TOKEN)).json()
    assert (view["playout"]["chunks_on_time"], view["playout"]["chunks_late"]) == (1, 0)


async def test_webp_by_query_and_an_unknown_format_is_refused(worker, place):
    session = await place()
    async with open_stream(worker, session, format="webp") as ws:
        assert (await ready(ws))["media_type"] == "image/webp"
        await ws.send(tick_message(0))
        _, images = await chunk(ws)
        assert images[0][:4] == b"RIFF"
        assert images[0][8:12] == b"WEBP"
    async with open_stream(worker, session, format="gif") as ws:
        assert (await error(ws, "invalid_tick"))["param"] == "format"
        await closed_with(ws, 4400, "invalid_tick")


async def test_a_browser_sends_the_token_in_its_first_message(worker, place):
    session = await place()
    async with open_stream(worker, session, token=None) as ws:
        await ws.send(json.dumps({"type": "auth", "token": TOKEN}))
        assert (await ready(ws))["next_chunk_index"] == 0
        await ws.send(tick_message(0))
        assert (await chunk(ws))[0]["metadata"]["chunk_index"] == 0
    async with open_stream(worker, session, token=None) as ws:
        await ws.send(json.dumps({"type": "auth", "token": "not-the-token"}))
        await error(ws, "unauthorized")
        await closed_with(ws, 4401, "unauthorized")
    async with open_stream(worker, session, token=None) as ws:
        await ws.send(tick_message(1))  # a tick before any credentials
        await error(ws, "unauthorized")
        await closed_with(ws, 4401, "unauthorized")


async def test_the_newest_connection_to_a_session_wins(worker, place):
    session = await place()
    async with open_stream(worker, session) as first:
        await ready(first)
        await first.send(tick_message(0))
        await chunk(first)
        async with open_stream(worker, session) as second:  # a page reload
            assert (await ready(second))["next_chunk_index"] == 1
            await error(first, "superseded")
            await closed_with(first, 4409, "superseded")
            await second.send(tick_message(1))
            assert (await chunk(second))[0]["metadata"]["chunk_index"] == 1


# ------------------------------------------------------------------------- errors that keep the stream open


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("{not json", "body"),
        (json.dumps([1, 2]), "body"),
        (json.dumps({"type": "tick", "chunk_index": 0}), "request_id"),
        (json.dumps({"type": "tock", "request_id": "r", "chunk_index": 0}), "type"),
        (json.dumps({"type": "tick", "request_id": "r", "chunk_index": -1}), "chunk_index"),
        (tick_message(0, surprise=True), "surprise"),
        (tick_message(0, controls="wasd"), "controls"),
        (tick_message(0, buffer_ms=-5), "buffer_ms"),
    ],
    ids=[
        "malformed",
        "a list",
        "no request id",
        "unknown type",
        "negative chunk",
        "unknown field",
        "controls not a list",
        "negative buffer",
    ],
)
async def test_an_invalid_tick_message_is_invalid_tick_and_the_stream_goes_on(worker, place, message, param):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        await ws.send(message)
        assert (await error(ws, "invalid_tick"))["param"] == param
        await ws.send(b"\x00binary")
        assert (await error(ws, "invalid_tick"))["param"] == "body"
        await ws.send(tick_message(0))
        assert (await chunk(ws))[0]["metadata"]["chunk_index"] == 0


async def test_order_limits_faults_and_size_are_errors_the_stream_survives(worker, place):
    session = await place(max_chunks=2)
    async with open_stream(worker, session) as ws:
        await ready(ws)
        assert (await error_after(ws, tick_message(3), "chunk_out_of_order"))["expected_chunk_index"] == 0
        await ws.send(tick_message(0))
        await chunk(ws)
        await ws.send(
            json.dumps({"type": "tick", "request_id": "big", "chunk_index": 1, "prompt": "x" * (1 << 20)})
        )
        await error(ws, "body_too_large")
        await ws.send(tick_message(1))
        await chunk(ws)
        assert (await error_after(ws, tick_message(2), "max_chunks_reached"))["max_chunks"] == 2
    faulty = await place()
    async with open_stream(worker, faulty, fault=True) as ws:
        await ready(ws)
        await error_after(ws, tick_message(0), "forward_failed")
        await error_after(ws, tick_message(0), "reset_required")


async def error_after(ws: ClientConnection, message: str, code: str) -> dict[str, Any]:
    await ws.send(message)
    return await error(ws, code)


async def test_a_rewind_message_is_answered_rewound_and_a_chunk_not_kept_keeps_the_stream(
    worker, store, place
):
    """Issue 26: `{"type": "rewind", "chunk": N}` puts a session that keeps 2 boundaries back at N (`rewound`,
    the store's chunk index too), and the chunk generated again is the first one's; a chunk not kept and a bad
    body are error messages on a stream that goes on."""
    session = await place(history_keep_chunks=2)
    async with open_stream(worker, session) as ws:
        await ready(ws)
        first = []
        for index in range(3):
            await ws.send(tick_message(index))
            first.append(await chunk(ws))
        await ws.send(json.dumps({"type": "rewind", "chunk": 1}))
        assert (await error(ws, "chunk_not_kept"))["kept_chunks"] == [2, 3]
        await ws.send(json.dumps({"type": "rewind", "chunk": "2"}))
        assert (await error(ws, "invalid_tick"))["param"] == "chunk"
        await ws.send(json.dumps({"type": "rewind", "chunk": 2}))
        rewound = {"type": "rewound", "session": session, "chunk_index": 2, "kept_chunks": [2]}
        assert await receive_json(ws) == rewound
        assert (await store.get_session(POOL, session)).chunk_index == 2
        await ws.send(tick_message(2))
        message, images = await chunk(ws)
        assert message["metadata"]["chunk_index"] == 2
        assert images == first[2][1]


async def test_a_tick_in_flight_over_http_makes_the_streams_tick_409(worker, place):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        http_tick = asyncio.create_task(asyncio.to_thread(worker.tick, session, 0, token=TOKEN))
        await asyncio.sleep(FAKE_TICK_SECONDS / 3)
        await error_after(ws, tick_message(0), "tick_in_progress")
        assert (await http_tick).status_code == 200
        await error_after(ws, tick_message(0, request_id="other"), "chunk_out_of_order")


async def test_while_the_store_recovers_the_stream_is_told_to_retry(worker, store, place, redis_url):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        await ws.send(tick_message(0))
        await chunk(ws)
        pod = await store.get_pod(POOL, POD)
        record = await store.get_session(POOL, session)
        async with aioredis.from_url(redis_url) as redis:
            await redis.delete(*[key async for key in redis.scan_iter(match=f"{POOL.tag}*")])
        found = await error_after(ws, tick_message(1), "placement_recovering")
        assert found["retry_after"] == 1
        assert (await wait_for(lambda: store.get_pod(POOL, POD))).epoch == pod.epoch  # healed by heartbeat
        assert await store.restore(
            POOL, record.spec(), pod=POD, pod_epoch=pod.epoch, chunk_index=1, reset_required=False
        )
        await ws.send(tick_message(1))
        assert (await chunk(ws))[0]["metadata"]["chunk_index"] == 1


# ------------------------------------------------------------------------------ errors that end the stream


async def test_an_unknown_session_is_401_and_closes(worker):
    async with open_stream(
        worker, "no-such-session"
    ) as ws:  # answered as a wrong token is: no oracle of names
        await error(ws, "unauthorized")
        await closed_with(ws, 4401, "unauthorized")


async def test_a_released_session_is_410_and_closes(worker, store, place):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        await ws.send(tick_message(0))
        await chunk(ws)
        await store.release(POOL, session, reason="deleted")
        await error_after(ws, tick_message(1), "session_closed")
        await closed_with(ws, 4410, "session_closed")


async def test_a_session_placed_elsewhere_is_421_naming_its_endpoint(worker, store, session_spec):
    other = PoolId(POOL.namespace, POOL.name)
    await store.register_pod(other, "elsewhere", capacity=1, endpoint="http://10.1.2.3:8000", lease_ms=60_000)
    await store.set_draining(other, POD, draining=True)  # the next placement lands on the other pod
    name = f"s-{uuid.uuid4().hex[:8]}"
    try:
        placed = await store.place(other, session_spec(name, TOKEN))
        assert placed.placement is not None
        assert placed.placement.pod == "elsewhere"
    finally:
        await store.set_draining(other, POD, draining=False)
    try:
        async with open_stream(worker, name) as ws:
            assert (await error(ws, "misdirected"))["endpoint"] == "http://10.1.2.3:8000"
            await closed_with(ws, 4421, "misdirected")
        # Through the front door (its header: issue 37), the same close, and no Pod address in the error.
        front_door = connect(
            stream_url(worker, name),
            additional_headers={"Authorization": f"Bearer {TOKEN}", "ardiff-front-door": "1"},
            max_size=None,
        )
        async with front_door as ws:
            assert "endpoint" not in await error(ws, "misdirected")
            await closed_with(ws, 4421, "misdirected")
    finally:
        await store.release(other, name, reason="test done")
        await store.remove_pod(other, "elsewhere")


async def test_closing_the_session_from_the_stream_ends_it(worker, place):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        await ws.send(tick_message(0, close_session=True))
        await chunk(ws)
        await closed_with(ws, 1000, "session closed")
    assert worker.tick(session, 1, token=TOKEN).json()["error"]["code"] == "session_closed"


# ---------------------------------------------------------------------------- back-pressure and fuzzing


async def test_a_client_that_stops_reading_stops_its_ticks_and_the_worker_does_not_grow(fast_worker, placer):
    session = await placer(FAST_POOL, FAST_POD, TOKEN)()
    process = psutil.Process(fast_worker.process.pid)
    requested = 80  # a few hundred KB of frames per chunk at 256x256: more than socket buffers hold

    def ticks_done() -> float:
        text = fast_worker.client.get(f"{fast_worker.url}/metrics").text
        return next(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith("ardiff_ticks_total")
        )

    baseline = ticks_done()
    async with open_stream(fast_worker, session, max_queue=4) as ws:
        await ready(ws)
        for index in range(requested):
            await ws.send(tick_message(index, controls=[]))
        await asyncio.sleep(3)
        stalled = ticks_done() - baseline
        rss = process.memory_info().rss
        await asyncio.sleep(1)
        assert ticks_done() - baseline == stalled  # nothing moves while the client reads nothing
        print(f"ticks done while the client read nothing: {stalled:.0f} of {requested}")
        assert stalled < requested / 2
        assert process.memory_info().rss - rss < 32 << 20
        for index in range(requested):  # then everything arrives, in order
            message, _ = await chunk(ws)
            assert message["metadata"]["chunk_index"] == index


MESSAGES = st.one_of(
    st.text(max_size=200),
    st.dictionaries(
        st.text(max_size=12),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
            ),
            max_leaves=8,
        ),
        max_size=6,
    ).map(json.dumps),
    st.fixed_dictionaries(
        {"type": st.just("tick"), "request_id": st.text(max_size=10), "chunk_index": st.integers(-2, 3)},
        optional={
            "controls": st.lists(
                st.fixed_dictionaries(
                    {
                        "track": st.text(max_size=8),
                        "schema": st.text(max_size=30),
                        "data": st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
                    }
                ),
                max_size=2,
            ),
            "reset": st.booleans(),
            "prompt": st.none() | st.text(max_size=30),
            "applied_event_ids": st.lists(st.integers(-1, 5), max_size=3),
        },
    ).map(json.dumps),
)


async def test_fuzzed_messages_get_errors_or_chunks_never_a_broken_stream(worker, place):
    session = await place()
    async with open_stream(worker, session) as ws:
        await ready(ws)
        answers: list[str] = []

        @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(MESSAGES)
        def send_one(message: str) -> None:
            answers.append(asyncio.run_coroutine_threadsafe(answer(ws, message), loop).result(timeout=30))

        loop = asyncio.get_running_loop()
        await asyncio.to_thread(send_one)
    assert len(answers) >= 50
    assert set(answers) <= {"chunk", "invalid_tick", "chunk_out_of_order", "reset_required", "body_too_large"}
    metrics = worker.client.get(f"{worker.url}/metrics").text
    assert 'ardiff_tick_errors_total{code="internal_error"}' not in metrics

    async def no_stream_left_open():  # nothing leaks: every connection of the module has ended
        return "ardiff_streams_open 0.0" in worker.client.get(f"{worker.url}/metrics").text

    await wait_for(no_stream_left_open)


async def answer(ws: ClientConnection, message: str) -> str:
    """What the worker answers a message with: `chunk` or the error code (the stream must stay open)."""
    await ws.send(message)
    reply = await receive_json(ws)
    if reply["type"] == "chunk":
        for _ in range(reply["frames"]):
            await ws.recv()
        return "chunk"
    assert reply["type"] == "error", reply
    return reply["error"]["code"]
