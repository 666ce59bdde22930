"""vllm-omni's realtime video protocol on a session (`WS /v1/realtime/video?session=<id>`, docs/contracts.md
§4 "Realtime video") against a real worker process: the fake runtime in placement mode on the shared Redis
(`realtime_worker`: sessions play at 48 fps, 2 chunks buffered; start and stall clocks of 3 s), driven by
`realtime_client.RealtimeClient`, which knows nothing of ardiff.

What a client gets: its prompt and camera interactions on the chunks they were applied to (the frames are
the fake runtime's for exactly those), a stop that leaves the session to continue at its next chunk, the
pacing rule, the session's binding and checks, vllm-omni's limits, and the errors that end a stream.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from ardiff.kv.records import PoolId, SessionState
from ardiff.worker.conditioning import Conditioning, seed_image
from ardiff.worker.fake_runtime import fake_frames
from ardiff.worker.tick_rules import parse_tick
from tests.worker.conftest import (
    REALTIME_PLAYOUT,
    REALTIME_POD,
    REALTIME_POOL,
    REALTIME_TOKEN,
    suspend_and_wait,
)
from tests.worker.realtime_client import RealtimeClient, decode

FPS, BUFFER_CHUNKS = REALTIME_PLAYOUT["playout_fps"], REALTIME_PLAYOUT["playout_buffer_chunks"]


def camera(mode: str, **data: Any) -> list[dict[str, Any]]:
    return [{"track": "camera", "schema": "lingbot.camera_actions.v1", "data": {"mode": mode, **data}}]


def held(*keys: str) -> list[dict[str, Any]]:
    """A live camera event: these keys held from now on (vllm-omni's LingBot `state` transition)."""
    return camera("state", transitions=[{"actions": list(keys)}])


def chunk_camera(*keys: str) -> list[dict[str, Any]]:
    """What a chunk is ticked with while those keys are held: the keys for each of its 3 latent frames."""
    return camera("frames", frames=[list(keys)] * 3)


TURN = held("l")


@pytest.fixture
def place(placer, realtime_worker):
    made = placer(REALTIME_POOL, REALTIME_POD, REALTIME_TOKEN, close_on=realtime_worker)

    async def place_session(**spec: Any) -> str:
        return await made(**{**REALTIME_PLAYOUT, **spec})

    return place_session


def realtime_url(worker, session: str | None) -> str:
    query = "" if session is None else f"?session={session}"
    return f"ws://127.0.0.1:{worker.port}/v1/realtime/video{query}"


def bearer(token: str = REALTIME_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def closed_with(client: RealtimeClient) -> tuple[int, str]:
    """Read to the end of the connection: its close code and reason."""
    try:
        while True:
            await client.receive()
    except ConnectionClosed as closed:
        received = closed.rcvd
    assert received is not None, "closed without a close frame"
    return received.code, received.reason


async def fails_with(
    client: RealtimeClient, code: str, close: int, *, or_code: str | None = None
) -> dict[str, Any]:
    """The `error` the worker ends the stream with (vllm-omni's shape, our code: `code`, or `or_code` where
    either may come), then its close with `close` and that code."""
    error = await client.until("error")
    assert error["type"] == "error", error
    assert error["code"] in (code, or_code), error
    assert error["message"], error
    assert await closed_with(client) == (close, error["code"])
    return error


def expected_frames(
    session: str, chunk_index: int, prompt: str, controls: list[dict[str, Any]]
) -> np.ndarray:
    """What the fake runtime renders for the session's chunk (seed 0, no image) with that prompt and those
    controls."""
    tick = parse_tick(session, {"request_id": "x", "chunk_index": chunk_index, "controls": controls})
    return fake_frames(Conditioning(seed=0, prompt=prompt), seed_image(0, 64, 64), tick)


def colour_error(got: np.ndarray, expected: np.ndarray) -> float:
    """How far decoded frames are from the frames expected, by each frame's mean colour (the fake runtime
    tints each frame by its own colour: H.264 keeps it within ~3 levels, another tint is ~8 to 40 away)."""
    means = [frames.reshape(len(got), -1, 3).mean(axis=1) for frames in (got, expected[: len(got)])]
    return float(np.abs(means[0] - means[1]).max(axis=1).mean())


# ---------------------------------------------------------------------------------------------- the stream


async def test_a_protocol_client_streams_changes_prompt_and_camera_stops_and_continues(
    realtime_worker, place
):
    """The acceptance's client (the token in session.start, nothing of ardiff): chunks come paced, a prompt
    and a camera interaction shape the chunks their events start on and after, `session.stop` ends the
    stream with `session.done`, and a new stream continues the session at its next chunk; the frames are
    the session's, for exactly the prompt and controls each chunk was made with."""
    session = await place(prompt="a walk in the forest")
    async with RealtimeClient.connect(realtime_url(realtime_worker, session)) as client:
        start = await client.start(prompt="a walk in the forest", session_token=REALTIME_TOKEN, fps=FPS)
        assert set(start) == {"type", "request_id", "format", "config", "session"}
        assert start["session"] == {
            "id": session,
            "chunk_index": 0,
            "fps": FPS,
            "buffer_chunks": BUFFER_CHUNKS,
        }
        assert start["config"]["prompt"] == "a walk in the forest"
        assert "session_token" not in json.dumps(start)  # the token is never echoed
        for _ in range(2):
            await client.chunk()
        queued = await client.interact("dusk", prompt="the forest at dusk")
        assert queued == {
            "type": "session.interaction.queued",
            "request_id": start["request_id"],
            "event_id": "dusk",
        }
        await client.interact("turn", controls=TURN)
        while "turn" not in (metadata := (await client.chunk())[0])["active_event_ids"]:
            pass
        await client.interact("clear", controls=held())
        while "clear" not in (metadata := (await client.chunk())[0])["started_event_ids"]:
            pass
        assert metadata["completed_event_ids"] == ["turn"]
        assert metadata["active_event_ids"] == ["dusk", "clear"]
        assert (await client.ping()) == {"type": "session.pong"}
        done = await client.stop()
        chunks = client.chunks()
        assert done == {
            "type": "session.done",
            "request_id": start["request_id"],
            "chunks": len(chunks),
            "stopped": True,
        }
        assert await closed_with(client) == (1000, "session stopped")
    assert [c["generation_chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert [c["transport_chunk_index"] for c in chunks] == list(range(len(chunks)))
    assert all(c["kind"] == "media" for c in chunks)
    assert [c["num_frames"] for c in chunks] == [9] + [12] * (len(chunks) - 1)
    # The whole stream decodes: every frame but the last chunk's last, which the muxer holds back until a
    # next chunk that never comes (vllm-omni sends no trailer on session.stop).
    frames = decode(client.segments)
    assert frames.shape == (sum(c["num_frames"] for c in chunks) - 1, 64, 64, 3)
    events = {
        "dusk": {"prompt": "the forest at dusk"},
        "turn": {"controls": chunk_camera("l")},
        "clear": {"controls": chunk_camera()},
    }
    at = 0
    for chunk in chunks:
        made_with = {"prompt": "a walk in the forest", "controls": chunk_camera()}  # the camera held still
        for event in chunk["active_event_ids"]:
            made_with |= events[event]
        index = chunk["generation_chunk_index"]
        got = frames[at : at + chunk["num_frames"]]
        assert colour_error(got, expected_frames(session, index, **made_with)) < 4, chunk
        if chunk["active_event_ids"]:  # the interactions changed the picture
            still = expected_frames(session, index, "a walk in the forest", chunk_camera())
            assert colour_error(got, still) > 6, chunk
        at += chunk["num_frames"]
    assert {"dusk", "turn"} <= {e for c in chunks for e in c["started_event_ids"]}

    async with RealtimeClient.connect(realtime_url(realtime_worker, session)) as again:
        start = await again.start(prompt="", session_token=REALTIME_TOKEN)  # blank: the session's own prompt
        assert start["session"]["chunk_index"] == len(chunks)
        metadata, _ = await again.chunk()
        assert (metadata["generation_chunk_index"], metadata["transport_chunk_index"]) == (len(chunks), 0)
        assert metadata["active_event_ids"] == []  # a new stream starts from the session's own prompt
        await again.stop()
    first = decode(again.segments)[:11]  # a new stream: its own init segment
    still = expected_frames(session, len(chunks), "a walk in the forest", chunk_camera())
    assert colour_error(first, still) < 4


async def test_a_stream_watched_without_input_generates_no_more_than_played_plus_buffer(
    realtime_worker, place
):
    """The pacing rule: at every chunk's arrival, the chunks generated are at most those whose playback
    started (a viewer playing from the first chunk's arrival) + bufferChunks, and once the buffer filled at
    least one fewer (it is kept full); every chunk the worker's metrics count was sent."""
    session = await place()
    before = realtime_worker.metric("ardiff_realtime_chunks_total")
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a quiet road")
        arrivals: list[tuple[float, int]] = []  # (when, frames) of each chunk
        while not arrivals or arrivals[-1][0] - arrivals[0][0] < 4:
            metadata, _ = await client.chunk()
            arrivals.append((time.monotonic(), metadata["num_frames"]))
        await client.stop()
    first, frames, starts = arrivals[0][0], 0, []
    for _, count in arrivals:  # when each chunk starts playing
        starts.append(first + frames / FPS)
        frames += count
    for index, (arrived, _) in enumerate(arrivals):
        playing = sum(1 for start in starts if start <= arrived)
        assert index + 1 <= playing + BUFFER_CHUNKS, (index, playing)
        if index >= BUFFER_CHUNKS:  # filled at first, then kept full
            assert index + 1 >= playing + BUFFER_CHUNKS - 1, (index, playing)
    assert len(arrivals) >= 4 * FPS / 12  # a chunk every chunk's play time, for 4 s
    assert realtime_worker.metric("ardiff_realtime_chunks_total") - before == len(client.chunks())


async def test_a_session_at_its_max_chunks_completes_with_the_trailer(realtime_worker, place):
    """A session limited to 3 chunks: its stream ends as vllm-omni ends a finished generation, the
    encoder's trailer (the held-back frame) then `session.done` not stopped; every frame arrives."""
    session = await place(max_chunks=3)
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a short walk")
        done = await client.until("session.done")
        assert await closed_with(client) == (1000, "session done")
    kinds = [(c["kind"], c["num_frames"], c["generation_chunk_index"]) for c in client.chunks()]
    assert kinds == [("media", 9, 0), ("media", 12, 1), ("media", 12, 2), ("trailer", 0, None)]
    assert (done["chunks"], done["stopped"]) == (4, False)
    assert decode(client.segments).shape == (33, 64, 64, 3)


# ------------------------------------------------------------------------------------------ binding and auth


async def test_without_credentials_in_two_seconds_the_socket_is_401(realtime_worker, place):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session)) as client:
        started = time.monotonic()
        await fails_with(client, "unauthorized", 4401)
        assert 1.5 < time.monotonic() - started < 3.5


@pytest.mark.parametrize(
    "start",
    [
        {"type": "session.start", "prompt": "x", "session_token": "not-the-token"},
        {"type": "session.start", "prompt": "x"},
        {"type": "session.start", "prompt": "x", "session_token": 7},
        {"type": "session.ping", "session_token": REALTIME_TOKEN},
    ],
    ids=["wrong token", "no token", "token not a string", "not a start"],
)
async def test_a_start_without_the_sessions_token_is_401(realtime_worker, place, start):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session)) as client:
        await client.send(start)
        error = await fails_with(client, "unauthorized", 4401)
        assert "request_id" not in error  # nothing was started


async def test_no_oracle_of_names(realtime_worker, place):
    """An id with no session and a real session with a wrong token are answered alike (placement mode)."""
    session = await place()
    answers = []
    for name, token in ((f"s-none-{uuid.uuid4().hex[:6]}", REALTIME_TOKEN), (session, "wrong")):
        async with RealtimeClient.connect(
            realtime_url(realtime_worker, name), headers=bearer(token)
        ) as client:
            answers.append(await fails_with(client, "unauthorized", 4401))
    assert answers[0] == answers[1]


async def test_the_session_must_be_named(realtime_worker):
    async with RealtimeClient.connect(realtime_url(realtime_worker, None), headers=bearer()) as client:
        assert (await fails_with(client, "invalid_tick", 4400))["param"] == "session"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"format": "mp4"}, "format"),
        ({"seed": 5}, "seed"),
        ({"width": 128}, "width"),
        ({"size": "64x32"}, "height"),
        ({"fps": 24}, "fps"),
        ({"num_frames": 48}, "num_frames"),
        ({"sampling_params": {"num_inference_steps": 8}}, "num_inference_steps"),
        ({"guidance_scale": 3.0}, "guidance_scale"),
        ({"model": "someone-elses-model"}, "model"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"prompt": 5}, "prompt"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
async def test_a_start_asking_what_the_session_cannot_be_is_invalid_tick(
    realtime_worker, place, fields, param
):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.send({"type": "session.start", "prompt": "a road", **fields})
        assert (await fails_with(client, "invalid_tick", 4400))["param"] == param


async def test_a_start_may_repeat_the_sessions_terms_and_unknown_fields_are_ignored(realtime_worker, place):
    session = await place(seed=9)
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        start = await client.start(
            prompt="a road",
            seed=9,
            size="64x64",
            fps=FPS,
            model="tiny-lingbot-world",
            user="me",
            colour="blue",
        )
        assert start["type"] == "video.start"
        assert "colour" not in start["config"]
        assert (start["config"]["seed"], start["config"]["user"]) == (9, "me")


@pytest.mark.parametrize(
    ("message", "param"),
    [("{not json", "body"), (json.dumps([1]), "body"), (json.dumps({"type": "session.stop"}), "type")],
    ids=["not json", "a list", "not a start"],
)
async def test_a_bad_first_message_with_the_header_is_invalid_tick(realtime_worker, place, message, param):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.ws.send(message)
        assert (await fails_with(client, "invalid_tick", 4400))["param"] == param


async def test_a_start_that_never_comes_times_out(realtime_worker, place):
    """With the header, vllm-omni's start clock (3 s on this worker; 10 s by default)."""
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        started = time.monotonic()
        error = await fails_with(client, "invalid_tick", 4400)
        assert error["message"] == "Timeout waiting for session.start"
        assert 2.5 < time.monotonic() - started < 5


# ------------------------------------------------------------------------------- messages the stream survives


def interaction(event: Any, **more: Any) -> str:
    return json.dumps({"type": "session.interaction", "interaction": {"event": event, **more}})


EVENT = "interaction.event"
CONTROL_ERRORS = {
    "not json": ("{oops", "body"),
    "not an object": (json.dumps("hello"), "body"),
    "unknown type": (json.dumps({"type": "session.dance"}), "type"),
    "no interaction": (json.dumps({"type": "session.interaction"}), "interaction"),
    "no event": (json.dumps({"type": "session.interaction", "interaction": {}}), EVENT),
    "empty event": (interaction({}), EVENT),
    "event id not a string": (interaction({"prompt": "x"}, event_id=3), "interaction.event_id"),
    "blank prompt": (interaction({"prompt": "  "}), f"{EVENT}.prompt"),
    "multi_modal_data": (interaction({"multi_modal_data": {"image": {}}}), f"{EVENT}.multi_modal_data"),
    "negative_prompt": (interaction({"prompt": "x", "negative_prompt": "y"}), f"{EVENT}.negative_prompt"),
    "control without schema": (interaction({"controls": [{"track": "camera"}]}), f"{EVENT}.controls"),
    "no controls": (interaction({"controls": []}), f"{EVENT}.controls"),
    "a track vllm-omni refuses": (
        interaction({"controls": [{**TURN[0], "track": " "}]}),
        f"{EVENT}.controls",
    ),
    "a camera mode the reducer refuses": (interaction({"controls": chunk_camera("w")}), f"{EVENT}.controls"),
    "a key the reducer refuses": (interaction({"controls": held("x")}), f"{EVENT}.controls"),
    "negative transition": (
        interaction({"prompt": "x"}, transition_chunks=-1),
        "interaction.transition_chunks",
    ),
    "an unknown event field": (interaction({"prompt": "x", "mood": "calm"}), f"{EVENT}.mood"),
}


@pytest.mark.parametrize(("message", "param"), list(CONTROL_ERRORS.values()), ids=list(CONTROL_ERRORS))
async def test_a_bad_control_message_is_an_error_and_the_stream_goes_on(
    realtime_worker, place, message, param
):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        start = await client.start(prompt="a road")
        await client.ws.send(message)
        error = await client.until("error")
        assert (error["code"], error["param"], error["request_id"]) == (
            "invalid_tick",
            param,
            start["request_id"],
        )
        await client.chunk()  # still streaming
        assert (await client.ping())["type"] == "session.pong"


async def test_a_control_message_over_128_kib_is_body_too_large_and_the_stream_goes_on(
    realtime_worker, place
):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a road")
        await client.send({"type": "session.ping", "pad": "x" * (128 << 10)})
        assert (await client.until("error"))["code"] == "body_too_large"
        await client.send({"type": "session.ping", "pad": "x" * ((128 << 10) - 40)})  # within the limit
        assert (await client.until("session.pong"))["type"] == "session.pong"
        await client.chunk()


async def test_an_event_id_names_one_event(realtime_worker, place):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a road")
        assert (await client.interact("e1", prompt="a river"))["type"] == "session.interaction.queued"
        error = await client.interact("e1", prompt="a lake")
        assert (error["code"], error["event_id"], error["param"]) == (
            "invalid_tick",
            "e1",
            "interaction.event_id",
        )
        assert error["message"].startswith("event_id_conflict")
        generated = await client.interact(None, prompt="a lake")  # no id: the worker makes one
        assert len(generated["event_id"]) == 32


# --------------------------------------------------------------------------------- errors that end a stream


async def test_a_newer_connection_supersedes_and_continues_the_session(realtime_worker, place):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as first:
        await first.start(prompt="a road")
        await first.chunk()
        async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as second:
            start = await second.start(prompt="a road")
            await fails_with(first, "superseded", 4409)
            sent = max(c["generation_chunk_index"] for c in first.chunks())
            metadata, _ = await second.chunk()
            assert metadata["generation_chunk_index"] >= start["session"]["chunk_index"] >= 1
            assert metadata["generation_chunk_index"] > sent  # the first stream's chunks are not made again


async def test_a_session_closed_mid_stream_ends_it_with_session_closed(realtime_worker, store, place):
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a road")
        await client.chunk()
        await store.release(REALTIME_POOL, session, reason="deleted")
        # Released while it waits for the viewer, or during a tick: the store's verdict, either 410.
        error = await fails_with(client, "session_closed", 4410, or_code="session_evicted")
        assert error["request_id"]


async def test_a_session_suspended_mid_stream_ends_it_with_resuming_and_a_new_stream_continues_it(
    realtime_worker, store, place
):
    """Suspended (an eviction into the host tier): the stream ends with `resuming`; placed again, a new stream
    resumes it from its export at the chunk after the last one made."""
    session = await place()
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as client:
        await client.start(prompt="a road")
        await client.chunk()
        record = await suspend_and_wait(store, REALTIME_POOL, session, reason="evicted")
        error = await fails_with(client, "resuming", 4503)
        assert error["retry_after"] == 1
    assert record.state is SessionState.SUSPENDED
    await store.request_resume(REALTIME_POOL, session)
    assert (await store.place(REALTIME_POOL, record.spec())).placement.pod == REALTIME_POD
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as again:
        start = await again.start(prompt="a road")
        assert start["session"]["chunk_index"] == record.suspended_chunk
        metadata, _ = await again.chunk()
        assert metadata["generation_chunk_index"] == record.suspended_chunk
        await again.stop()


async def test_a_session_placed_elsewhere_is_misdirected_with_its_endpoint(
    realtime_worker, store, session_spec
):
    pool = PoolId(REALTIME_POOL.namespace, REALTIME_POOL.name)
    await store.register_pod(pool, "elsewhere", capacity=1, endpoint="http://10.9.8.7:8000", lease_ms=60_000)
    await store.set_draining(pool, REALTIME_POD, draining=True)  # the next placement lands on the other pod
    name = f"s-{uuid.uuid4().hex[:8]}"
    try:
        assert (await store.place(pool, session_spec(name, REALTIME_TOKEN))).placement.pod == "elsewhere"
    finally:
        await store.set_draining(pool, REALTIME_POD, draining=False)
    try:
        async with RealtimeClient.connect(realtime_url(realtime_worker, name), headers=bearer()) as client:
            assert (await fails_with(client, "misdirected", 4421))["endpoint"] == "http://10.9.8.7:8000"
    finally:
        await store.release(pool, name, reason="test done")
        await store.remove_pod(pool, "elsewhere")


async def test_a_forward_that_fails_ends_the_stream_and_the_next_one_starts_the_session_over(
    realtime_worker, place
):
    """`forward_failed` ends the stream (the session lost its state); the protocol has no reset, so the next
    stream starts the session over at chunk 0."""
    session = await place()
    for index in range(2):
        assert realtime_worker.tick(session, index, token=REALTIME_TOKEN).status_code == 200
    headers = {**bearer(), "ardiff-test-fault": "forward"}  # this worker's test faults: its forwards fail
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=headers) as client:
        assert (await client.start(prompt="a road"))["session"]["chunk_index"] == 2
        await fails_with(client, "forward_failed", 4500)
    async with RealtimeClient.connect(realtime_url(realtime_worker, session), headers=bearer()) as again:
        assert (await again.start(prompt="a road"))["session"]["chunk_index"] == 0
        metadata, _ = await again.chunk()
        assert (metadata["generation_chunk_index"], metadata["num_frames"]) == (0, 9)
        await again.stop()
