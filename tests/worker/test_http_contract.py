"""The worker's HTTP error contract (docs/contracts.md §4), one test per code, against a real worker process.

The worker runs the `fake` runtime (deterministic frames, no torch) in placement mode on the shared Redis:
sessions are placed through the real `PlacementStore`, exactly as the operator does. What needs the real model
(isolation, KV accounting, a malformed camera control) is in test_real_runtime.py.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import numpy as np
import pytest
import redis.asyncio as aioredis

from ardiff.kv.records import PoolId, SessionState
from ardiff.worker.conditioning import Conditioning, seed_image
from ardiff.worker.fake_runtime import fake_frames
from ardiff.worker.tick_rules import parse_tick
from tests.worker.conftest import CAMERA, TRANSFER_TOKEN, launch_fake_pod

POOL = PoolId("default", f"wk-contract-{uuid.uuid4().hex[:6]}")
POD = "fake-worker-0"
TOKEN = "s3cret-token"
FAKE_TICK_SECONDS = 0.3  # long enough for two requests to overlap


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url):
    # (The pool's transfer token: the listing names sessions only to it.)
    process = launch_fake_pod(
        launch_worker,
        redis_url,
        POOL,
        POD,
        fake_capacity=3,
        fake_tick_seconds=FAKE_TICK_SECONDS,
        test_faults=1,
    )
    yield process
    process.stop()


@pytest.fixture
def place(placer, worker):
    """Place a fresh session on the worker's pod (the only live pod taking placements in the pool)."""
    return placer(POOL, POD, TOKEN)


def error_of(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    assert {"code", "message", "type", "param"} <= error.keys()
    assert error["message"]
    return error


def first_chunk(session: str, *, seed: int, prompt: str, image: np.ndarray | None = None) -> np.ndarray:
    """The frames the fake runtime renders for the session's chunk 0 (the helpers' camera control)."""
    tick = parse_tick(session, {"request_id": "x", "chunk_index": 0, "controls": [CAMERA]})
    conditioning_image = seed_image(seed, 64, 64) if image is None else image
    return fake_frames(Conditioning(seed=seed, prompt=prompt), conditioning_image, tick)


async def wait_for(predicate, within: float = 10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_registers_the_pod_with_capacity_endpoint_and_epoch(worker, store):
    pod = await store.get_pod(POOL, POD)
    assert pod is not None
    assert pod.capacity == 3
    assert pod.endpoint == worker.url
    assert pod.epoch > 0
    assert not pod.draining
    assert pod.lease_expires_ms > time.time() * 1000
    assert worker.client.get(f"{worker.url}/readyz").json() == {"status": "ready"}
    assert worker.client.get(f"{worker.url}/healthz").json() == {"status": "ok"}


async def test_tick_returns_the_chunk_frames_and_touches_the_record(worker, store, place):
    session = await place(seed=7, prompt="a red castle")
    response = worker.tick(session, 0, token=TOKEN, applied_event_ids=[3, 5])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["ardiff-frame-shape"] == "9,64,64,3"
    assert json.loads(response.headers["ardiff-chunk-metadata"]) == {
        "session_id": session,
        "request_id": f"{session}-0",
        "chunk_index": 0,
        "applied_event_ids": [3, 5],
    }
    stages = [part.split(";")[0] for part in response.headers["server-timing"].split(", ")]
    assert stages == ["queue", "forward", "decode", "encode"]
    frames = np.frombuffer(response.content, dtype=np.uint8).reshape(9, 64, 64, 3)
    expected = first_chunk(session, seed=7, prompt="a red castle")
    np.testing.assert_array_equal(frames, expected)

    record = await store.get_session(POOL, session)
    assert record.chunk_index == 1
    assert record.last_tick_ms > 0
    second = worker.tick(session, 1, token=TOKEN)
    assert second.headers["ardiff-frame-shape"] == "12,64,64,3"
    assert (await store.get_session(POOL, session)).chunk_index == 2


async def test_a_tick_prompt_overrides_the_session_prompt(worker, place):
    session = await place(seed=3, prompt="a quiet river")
    response = worker.tick(session, 0, token=TOKEN, prompt="a burning city")
    expected = first_chunk(session, seed=3, prompt="a burning city")
    np.testing.assert_array_equal(np.frombuffer(response.content, np.uint8).reshape(expected.shape), expected)


async def test_the_record_image_conditions_the_frames(worker, place):
    import io

    import PIL.Image

    from ardiff.worker.conditioning import conditioning_image

    png = io.BytesIO()
    PIL.Image.fromarray(np.full((48, 80, 3), (20, 200, 90), np.uint8)).save(png, format="PNG")
    session = await place(seed=5, prompt="a green field", image=png.getvalue())
    response = worker.tick(session, 0, token=TOKEN)
    image = conditioning_image(png.getvalue(), 5, 64, 64)
    expected = first_chunk(session, seed=5, prompt="a green field", image=image)
    np.testing.assert_array_equal(np.frombuffer(response.content, np.uint8).reshape(expected.shape), expected)
    assert not np.array_equal(image, seed_image(5, 64, 64))


async def test_a_sessions_image_is_read_from_the_store_once_not_on_every_tick(worker, place, redis_url):
    """Issue 41: a tick reads its session's record but the image (up to 1 MiB); the image is read and decoded
    once per session on the pod, and still conditions every chunk."""
    import io

    import PIL.Image

    from ardiff.kv.records import MAX_IMAGE_BYTES
    from ardiff.worker.conditioning import conditioning_image

    png = io.BytesIO()
    noise = np.random.default_rng(41).integers(0, 256, (440, 760, 3), dtype=np.uint8)  # PNG cannot shrink it
    PIL.Image.fromarray(noise).save(png, format="PNG", compress_level=0)
    assert MAX_IMAGE_BYTES // 2 < len(png.getvalue()) <= MAX_IMAGE_BYTES
    session = await place(seed=7, prompt="static", image=png.getvalue())
    assert worker.tick(session, 0, token=TOKEN).status_code == 200  # the first tick here reads the image
    client = aioredis.from_url(redis_url)
    try:
        sent_before = int((await client.info("stats"))["total_net_output_bytes"])
        for chunk_index in (1, 2, 3):
            response = worker.tick(session, chunk_index, token=TOKEN)
            assert response.status_code == 200, response.text
        sent = int((await client.info("stats"))["total_net_output_bytes"]) - sent_before
    finally:
        await client.aclose()
    # Three ticks' record reads, touches and the pods' heartbeats meanwhile: a few KB (one image is 0.5 MiB+).
    assert sent < 3 * 32 * 1024, f"Redis sent {sent} bytes for 3 ticks"
    tick = parse_tick(session, {"request_id": "x", "chunk_index": 3, "controls": [CAMERA]})
    picture = conditioning_image(png.getvalue(), 7, 64, 64)
    expected = fake_frames(Conditioning(seed=7, prompt="static"), picture, tick)
    np.testing.assert_array_equal(np.frombuffer(response.content, np.uint8).reshape(expected.shape), expected)


async def test_every_answer_of_a_session_route_names_the_pod_and_epoch_that_served_it(worker, place, store):
    """Issue 40 item 3: a history of answers tells which incarnation of which Pod gave each one."""
    from ardiff.client import SessionClient
    from ardiff.wire import SERVED_BY_HEADER, ServedBy

    record = await store.get_pod(POOL, POD)
    assert record is not None
    expected = ServedBy(POD, record.epoch)
    assert record.epoch > 0
    session = await place()
    answers = [
        worker.tick(session, 0, token=TOKEN),  # 200
        worker.tick(session, 5, token=TOKEN),  # 409 out of order
        worker.tick(session, 1, token="wrong"),  # 401
        worker.client.get(f"{worker.url}/v1/sessions/{session}", headers=worker.headers(TOKEN)),
    ]
    assert [a.status_code for a in answers] == [200, 409, 401, 200]
    assert {ServedBy.parse(a.headers[SERVED_BY_HEADER]) for a in answers} == {expected}
    assert SERVED_BY_HEADER not in worker.client.get(f"{worker.url}/healthz").headers  # not a session route
    with SessionClient(session, worker.url, TOKEN, next_chunk_index=1) as client:
        assert client.tick([CAMERA]).served_by == expected


async def test_mp4_by_accept_header(worker, place):
    import av

    session = await place()
    response = worker.tick(session, 0, token=TOKEN, accept="video/mp4")
    assert response.status_code == 200
    assert response.headers["content-type"] == "video/mp4"
    with av.open(__import__("io").BytesIO(response.content)) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 9
    assert decoded[0].shape == (64, 64, 3)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"chunk_index": -1}, "chunk_index"),
        ({"chunk_index": True}, "chunk_index"),
        ({"request_id": "  "}, "request_id"),
        ({"applied_event_ids": [4, 2]}, "applied_event_ids"),
        ({"controls": [{"track": "", "schema": "x", "data": {}}]}, "controls.0.track"),
        ({"prompt": "   "}, "prompt"),
        ({"controls": [{"track": "camera", "schema": "x"}]}, "controls.0.data"),
        ({"surprise": 1}, "surprise"),
        ({"buffer_ms": -1}, "buffer_ms"),
        ({"buffer_ms": 600_001}, "buffer_ms"),
        ({"buffer_ms": 1.5}, "buffer_ms"),
        ({"buffer_ms": "100"}, "buffer_ms"),
    ],
)
async def test_invalid_tick_is_400_naming_the_field(worker, place, body, param):
    session = await place()
    payload = {"request_id": "r", "chunk_index": 0, **body}
    response = worker.client.post(
        f"{worker.url}/v1/sessions/{session}/ticks", json=payload, headers=worker.headers(TOKEN)
    )
    assert error_of(response, 400, "invalid_tick")["param"] == param


async def test_malformed_json_is_400(worker, place):
    session = await place()
    response = worker.client.post(
        f"{worker.url}/v1/sessions/{session}/ticks",
        content=b'{"request_id": ',
        headers={**worker.headers(TOKEN), "content-type": "application/json"},
    )
    assert error_of(response, 400, "invalid_tick")["param"] == "body"


async def test_missing_or_wrong_token_is_401(worker, place):
    session = await place()
    error_of(worker.tick(session, 0), 401, "unauthorized")
    error_of(worker.tick(session, 0, token="not-the-token"), 401, "unauthorized")
    error_of(worker.tick(session, 0, headers={"authorization": f"Basic {TOKEN}"}), 401, "unauthorized")
    assert worker.tick(session, 0, token=TOKEN).status_code == 200


async def test_an_unknown_session_is_401_like_a_wrong_token(worker):
    # No oracle of names (issue 23 item 10; test_unauthenticated_surface.py compares the answers in full).
    error_of(worker.tick("no-such-session", 0, token=TOKEN), 401, "unauthorized")
    error_of(worker.tick("Not_A_Name", 0, token=TOKEN), 401, "unauthorized")
    error_of(worker.client.get(f"{worker.url}/v1/sessions/no-such-session"), 401, "unauthorized")


async def lose_the_pools_data(redis_url: str) -> None:
    """What a Redis restart without persistence does to this pool: every key of its hash tag is gone."""
    async with aioredis.from_url(redis_url) as redis:
        keys = [key async for key in redis.scan_iter(match=f"{POOL.tag}*")]
        assert keys
        await redis.delete(*keys)


async def test_a_held_session_without_a_record_is_503_retryable_until_the_binding_is_rebuilt(
    worker, store, place, redis_url
):
    session = await place(seed=3)
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    pod = await store.get_pod(POOL, POD)
    spec = await _spec_of(store, session)
    await lose_the_pools_data(redis_url)
    # An id the worker never held: 503 while its own pod record is gone too (the store not healed yet), else
    # the 401 of any unknown id once the heartbeat (every 0.5 s) has re-created the record. Which comes first
    # is timing: on a loaded machine the tick can arrive after that heartbeat.
    never_held = worker.tick("never-held", 0, token=TOKEN)
    code = never_held.json()["error"]["code"]
    answers = {(503, "placement_recovering"), (401, "unauthorized")}
    assert (never_held.status_code, code) in answers, never_held.text

    error = error_of(worker.tick(session, 1, token=TOKEN), 503, "placement_recovering")
    assert "lives on this worker" in error["message"]
    assert worker.tick(session, 1, token=TOKEN).headers["retry-after"] == "1"
    # A wrong token is checked against its book, and answered as for an id the worker never held: 503 while
    # the pod's own record is still missing, 401 once the heartbeat has re-created it (within 0.5 s).
    wrong = worker.tick(session, 1, token="not-the-token")
    assert wrong.status_code in (401, 503), wrong.text
    assert "lives on this worker" not in wrong.text
    error_of(
        worker.client.get(f"{worker.url}/v1/sessions/{session}", headers=worker.headers(TOKEN)),
        503,
        "placement_recovering",
    )

    async def healed():  # the worker's heartbeat re-creates its pod record with the same epoch
        return await store.get_pod(POOL, POD)

    assert (await wait_for(healed)).epoch == pod.epoch
    restored = await store.restore(
        POOL, spec, pod=POD, pod_epoch=pod.epoch, chunk_index=1, reset_required=False
    )
    assert restored is not None
    response = worker.tick(session, 1, token=TOKEN)  # the session goes on where it was: no reset
    assert response.status_code == 200, response.text
    assert json.loads(response.headers["ardiff-chunk-metadata"])["chunk_index"] == 1
    assert (await store.get_session(POOL, session)).chunk_index == 2

    # The pod record is back: an id the worker never held and the store does not know is refused again.
    error_of(worker.tick("never-held", 0, token=TOKEN), 401, "unauthorized")
    metrics = worker.client.get(f"{worker.url}/metrics").text
    assert 'ardiff_tick_errors_total{code="placement_recovering"}' in metrics


async def test_chunk_out_of_order_is_409_with_the_expected_index(worker, place):
    session = await place()
    assert (
        error_of(worker.tick(session, 1, token=TOKEN), 409, "chunk_out_of_order")["expected_chunk_index"] == 0
    )
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    assert (
        error_of(worker.tick(session, 3, token=TOKEN), 409, "chunk_out_of_order")["expected_chunk_index"] == 1
    )
    reset_later = worker.tick(session, 2, token=TOKEN, reset=True)
    assert error_of(reset_later, 409, "chunk_out_of_order")["expected_chunk_index"] == 0


async def test_max_chunks_is_409(worker, place):
    session = await place(max_chunks=1)
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    assert error_of(worker.tick(session, 1, token=TOKEN), 409, "max_chunks_reached")["max_chunks"] == 1


async def test_concurrent_ticks_on_one_session_are_409_tick_in_progress(worker, place):
    session = await place()
    body = {"request_id": "first", "chunk_index": 0, "controls": []}
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
        first = asyncio.create_task(
            client.post(f"/v1/sessions/{session}/ticks", json=body, headers=worker.headers(TOKEN))
        )
        await asyncio.sleep(FAKE_TICK_SECONDS / 3)
        second = await client.post(
            f"/v1/sessions/{session}/ticks",
            json={**body, "request_id": "second"},
            headers=worker.headers(TOKEN),
        )
        first = await first
    assert first.status_code == 200
    error_of(second, 409, "tick_in_progress")


async def test_forwards_run_one_at_a_time_in_arrival_order(worker, place):
    sessions = [await place() for _ in range(3)]
    finished: list[str] = []
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:

        async def tick(session: str, delay: float) -> httpx.Response:
            await asyncio.sleep(delay)
            response = await client.post(
                f"/v1/sessions/{session}/ticks",
                json={"request_id": "r", "chunk_index": 0, "controls": []},
                headers=worker.headers(TOKEN),
            )
            finished.append(session)
            return response

        started = time.monotonic()
        responses = await asyncio.gather(*(tick(s, 0.05 * i) for i, s in enumerate(sessions)))
        elapsed = time.monotonic() - started
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert finished == sessions  # FIFO across sessions
    assert elapsed >= 3 * FAKE_TICK_SECONDS  # serialized: one forward at a time
    queued = [float(r.headers["server-timing"].split(", ")[0].split("dur=")[1]) for r in responses]
    assert queued[0] < queued[1] < queued[2]


async def waiting_order(worker, sessions: list[str], buffers: list[int | None]) -> list[str]:
    """Tick each session once, 0.05 s apart (the first holds the forward while the others queue), the tick
    of each carrying its buffer_ms (None: none); the order the ticks finished in."""
    finished: list[str] = []
    async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:

        async def tick(session: str, delay: float, buffer_ms: int | None) -> None:
            await asyncio.sleep(delay)
            body = {"request_id": "r", "chunk_index": 0, "controls": []}
            if buffer_ms is not None:
                body["buffer_ms"] = buffer_ms
            response = await client.post(
                f"/v1/sessions/{session}/ticks", json=body, headers=worker.headers(TOKEN)
            )
            assert response.status_code == 200, response.text
            finished.append(session)

        ticks = enumerate(zip(sessions, buffers, strict=True))
        await asyncio.gather(*(tick(session, 0.05 * i, buffer_ms) for i, (session, buffer_ms) in ticks))
    return finished


async def test_a_tick_due_sooner_overtakes_one_that_arrived_before_it(worker, place):
    sessions = [await place() for _ in range(3)]
    # the second's viewer holds 10 s of play, the third's nothing: the third is due first
    assert await waiting_order(worker, sessions, [None, 10_000, 0]) == [sessions[0], sessions[2], sessions[1]]


async def test_tick_order_fifo_serves_arrival_order_whatever_the_buffers(launch_worker, redis_url, placer):
    pool = PoolId("default", f"wk-fifo-{uuid.uuid4().hex[:6]}")
    fifo = launch_fake_pod(
        launch_worker,
        redis_url,
        pool,
        "fifo-worker-0",
        fake_capacity=3,
        fake_tick_seconds=FAKE_TICK_SECONDS,
        tick_order="fifo",
    )
    try:
        place = placer(pool, "fifo-worker-0", TOKEN)
        sessions = [await place() for _ in range(3)]
        assert await waiting_order(fifo, sessions, [None, 10_000, 0]) == sessions
    finally:
        fifo.stop()


async def test_retried_request_id_returns_the_same_chunk_without_advancing(worker, store, place):
    session = await place()
    first = worker.tick(session, 0, token=TOKEN, request_id="req-a")
    again = worker.tick(session, 0, token=TOKEN, request_id="req-a")
    assert again.status_code == 200
    assert again.content == first.content
    assert again.headers["ardiff-chunk-metadata"] == first.headers["ardiff-chunk-metadata"]
    assert (await store.get_session(POOL, session)).chunk_index == 1
    described = worker.client.get(f"{worker.url}/v1/sessions/{session}", headers=worker.headers(TOKEN)).json()
    assert described["next_chunk_index"] == 1
    assert described["ticks"] == 1
    # a new request id for the same chunk is not a retry
    error_of(worker.tick(session, 0, token=TOKEN, request_id="req-b"), 409, "chunk_out_of_order")
    assert worker.tick(session, 1, token=TOKEN, request_id="req-c").status_code == 200


async def test_forward_failure_is_500_closes_only_that_session(worker, store, place):
    failing, healthy = await place(), await place()
    assert worker.tick(failing, 0, token=TOKEN).status_code == 200
    assert worker.tick(healthy, 0, token=TOKEN).status_code == 200
    error_of(
        worker.tick(failing, 1, token=TOKEN, headers={"ardiff-test-fault": "forward"}), 500, "forward_failed"
    )
    assert (await store.get_session(POOL, failing)).reset_required
    assert worker.tick(healthy, 1, token=TOKEN).status_code == 200  # the other session keeps working

    error_of(worker.tick(failing, 1, token=TOKEN), 409, "reset_required")
    error_of(worker.tick(failing, 0, token=TOKEN), 409, "reset_required")
    restarted = worker.tick(failing, 0, token=TOKEN, reset=True)
    assert restarted.status_code == 200
    assert restarted.headers["ardiff-frame-shape"] == "9,64,64,3"
    record = await store.get_session(POOL, failing)
    assert not record.reset_required
    assert record.chunk_index == 1
    assert worker.tick(failing, 1, token=TOKEN).status_code == 200


async def test_re_placed_session_must_reset(worker, store, place):
    session = await place()
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    assert await store.evict_lru(POOL, min_idle_ms=0) == session  # the only session placed in the pool
    assert (await store.get_session(POOL, session)).state is SessionState.EVICTED
    error_of(worker.tick(session, 1, token=TOKEN), 410, "session_evicted")
    replaced = await store.place(POOL, await _spec_of(store, session))
    assert replaced.placement is not None
    assert replaced.placement.reset_required
    error_of(worker.tick(session, 0, token=TOKEN), 409, "reset_required")
    assert worker.tick(session, 0, token=TOKEN, reset=True).status_code == 200


async def _spec_of(store, session):
    from ardiff.kv.records import SessionSpec

    record = await store.get_session(POOL, session)
    return SessionSpec(name=session, token_sha256=record.token_sha256, seed=record.seed, prompt=record.prompt)


async def test_released_session_is_410_and_leaves_the_runner(worker, store, place):
    session = await place()
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    await store.release(POOL, session, reason="deleted")
    error_of(worker.tick(session, 1, token=TOKEN), 410, "session_closed")

    async def gone():
        listing = worker.client.get(
            f"{worker.url}/v1/sessions", headers=worker.headers(TRANSFER_TOKEN)
        ).json()
        return session not in {s["session_id"] for s in listing["sessions"]}

    await wait_for(gone)  # the worker consumed the `close` event and freed the runner's state
    metrics = worker.client.get(f"{worker.url}/metrics").text
    assert 'ardiff_session_evictions_total{reason="close"}' in metrics


async def test_delete_closes_the_session_and_is_idempotent(worker, place):
    session = await place()
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    url = f"{worker.url}/v1/sessions/{session}"
    error_of(worker.client.delete(url), 401, "unauthorized")
    first = worker.client.delete(url, headers=worker.headers(TOKEN))
    assert first.status_code == 200
    assert first.json()["state"] == "closed"
    assert worker.client.delete(url, headers=worker.headers(TOKEN)).json()["state"] == "closed"
    error_of(worker.tick(session, 1, token=TOKEN), 410, "session_closed")


async def test_reset_route_starts_over(worker, store, place):
    session = await place()
    for chunk in range(2):
        assert worker.tick(session, chunk, token=TOKEN).status_code == 200
    reset = worker.client.post(f"{worker.url}/v1/sessions/{session}/reset", headers=worker.headers(TOKEN))
    assert reset.status_code == 200
    assert reset.json()["next_chunk_index"] == 0
    assert (await store.get_session(POOL, session)).chunk_index == 0
    assert worker.tick(session, 0, token=TOKEN).headers["ardiff-frame-shape"] == "9,64,64,3"


async def test_session_on_another_pod_is_421_with_its_endpoint(worker, store, session_spec, place):
    await place()  # the worker's pod holds one session, so least-loaded placement picks the empty one
    other = "fake-worker-elsewhere"
    await store.register_pod(POOL, other, capacity=1, endpoint="http://10.9.8.7:8000", lease_ms=60_000)
    try:
        name = f"s-{uuid.uuid4().hex[:8]}"
        result = await store.place(POOL, session_spec(name, TOKEN))
        assert result.placement.pod == other, "the empty foreign pod should take the session"
        error = error_of(worker.tick(name, 0, token=TOKEN), 421, "misdirected")
        assert error["endpoint"] == "http://10.9.8.7:8000"
        # A request that came through the front door (issue 37: its Envoy's header) is told no Pod address.
        via_front_door = worker.tick(name, 0, token=TOKEN, headers={"ardiff-front-door": "1"})
        assert "endpoint" not in error_of(via_front_door, 421, "misdirected")
        assert "10.9.8.7" not in via_front_door.text
        await store.release(POOL, name, reason="test done")
    finally:
        await store.remove_pod(POOL, other)


async def test_body_over_the_limit_is_413(worker, place):
    session = await place()
    response = worker.client.post(
        f"{worker.url}/v1/sessions/{session}/ticks",
        json={"request_id": "r", "chunk_index": 0, "prompt": "x" * (2 << 20)},
        headers=worker.headers(TOKEN),
    )
    error_of(response, 413, "body_too_large")


async def test_metrics_expose_ticks_frames_capacity_and_errors(worker, place):
    session = await place()
    assert worker.tick(session, 0, token=TOKEN).status_code == 200
    error_of(worker.tick(session, 5, token=TOKEN), 409, "chunk_out_of_order")
    text = worker.client.get(f"{worker.url}/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith("ardiff_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    assert values["ardiff_session_capacity"] == 3
    assert values["ardiff_ticks_total"] >= 1
    assert values["ardiff_frames_total"] >= 9
    assert values['ardiff_tick_errors_total{code="chunk_out_of_order"}'] >= 1
    assert values["ardiff_kv_blocks"] == 27
    assert values["ardiff_worker_ready"] == 1
    assert values['ardiff_tick_latency_seconds_count{stage="forward"}'] >= 1
