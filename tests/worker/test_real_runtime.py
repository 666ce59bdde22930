"""The worker over the real vllm-omni runner and the tiny LingBot-World model, on CPU, over real HTTP.

One worker process for the module (`--model tiny-lingbot-world`: generated into the model cache on first use),
placement through the real `PlacementStore` on the shared Redis; the last test starts a second one for a
migration pulled pod to pod. Bit-exact isolation and KV-block accounting
at the adapter level are in test_session_adapter.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid

import av
import httpx
import numpy as np
import pytest

from ardiff.kv.records import PoolId, SessionState
from tests.worker.conftest import suspend_and_wait

pytestmark = pytest.mark.slow

POOL = PoolId("default", f"wk-real-{uuid.uuid4().hex[:6]}")
POD = "real-worker-0"
TOKEN = "real-token"
TRANSFER_TOKEN = "real-pool-transfer-token"
HOST_TIER_BYTES = 256 << 20  # evictions wait in the worker's memory (a 64x64 session exports ~4 MB)


def camera(*frames: list[str]) -> dict:
    return {
        "track": "camera",
        "schema": "lingbot.camera_actions.v1",
        "data": {"mode": "frames", "frames": [list(keys) for keys in frames]},
    }


WALK = [camera(["w"], ["w"], ["w", "j"]), camera(["a"], [], ["d"]), camera(["w", "l"], ["w"], [])]


LOADING: dict[str, int] = {}  # what the worker answered while its model was still loading


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    return tmp_path_factory.mktemp("real-shared-tier")


def real_worker(launch_worker, redis_url, tiny_model_cache, tier, pod: str, **settings):
    return launch_worker(
        runtime="vllm",
        model="tiny-lingbot-world",
        model_cache=tiny_model_cache,
        redis_url=redis_url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name=pod,
        cpu_free_memory_bytes=1 << 30,
        lease_seconds=10,
        heartbeat_seconds=1,
        suspend_dir=str(tier),
        transfer_token=TRANSFER_TOKEN,
        **settings,
    )


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url, tiny_model_cache, tier):
    process = real_worker(
        launch_worker,
        redis_url,
        tiny_model_cache,
        tier,
        POD,
        wait=False,
        test_faults=1,
        host_tier_bytes=HOST_TIER_BYTES,
        compute_utilisation=0.9,  # a warm-up forward before it registers (issue 25)
    )
    for _ in range(600):  # HTTP comes up within seconds; loading vllm-omni and the model takes ~20 s more
        try:
            LOADING["healthz"] = process.client.get(f"{process.url}/healthz").status_code
            break
        except httpx.TransportError:
            time.sleep(0.05)
    LOADING["readyz"] = process.client.get(f"{process.url}/readyz").status_code
    LOADING["tick"] = process.tick("anything", 0, token=TOKEN).status_code
    process.wait_ready(timeout=240)
    yield process
    process.stop()


@pytest.fixture
def place(placer, worker):
    return placer(POOL, POD, TOKEN, close_on=worker)


def frames_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    shape = tuple(int(n) for n in response.headers["ardiff-frame-shape"].split(","))
    return np.frombuffer(response.content, dtype=np.uint8).reshape(shape)


def kv_blocks(worker) -> dict:
    return worker.client.get(f"{worker.url}/v1/sessions").json()["kv_blocks"]


def code_of(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


async def test_healthy_but_not_ready_while_the_model_loads(worker):
    assert LOADING == {"healthz": 200, "readyz": 503, "tick": 503}
    assert worker.client.get(f"{worker.url}/readyz").status_code == 200


async def test_registers_the_runners_capacity(worker, store):
    pod = await store.get_pod(POOL, POD)
    assert pod.capacity == 2  # LingBot-World's resident capacity, as the runner reports it after load
    listing = worker.client.get(f"{worker.url}/v1/sessions").json()
    assert listing["capacity"] == 2
    assert listing["kv_blocks"]["free"] == listing["kv_blocks"]["total"] > 0  # the warm-up session is gone
    # The warm-up's full chunks measured the tiny model's forward before the pod registered (issue 25).
    assert pod.tick_ms > 0
    assert pod.compute_fps == pytest.approx(0.9 * 12 / (pod.tick_ms / 1000), rel=1e-2)


async def test_two_sessions_interleaved_produce_real_frames(worker, store, place):
    first, second = await place(seed=11, prompt="walk through the forest"), await place(seed=12)
    shapes = {first: [], second: []}
    for chunk in range(4):
        for session in (first, second):
            response = worker.tick(session, chunk, token=TOKEN, controls=[WALK[chunk % 3]])
            frames = frames_of(response)
            shapes[session].append(frames.shape)
            assert frames.std() > 1  # decoded pictures, not a constant fill
            meta = json.loads(response.headers["ardiff-chunk-metadata"])
            assert meta["session_id"] == session
            assert meta["chunk_index"] == chunk
    expected = [(9, 64, 64, 3), (12, 64, 64, 3), (12, 64, 64, 3), (12, 64, 64, 3)]
    assert shapes == {first: expected, second: expected}
    for session in (first, second):
        assert (await store.get_session(POOL, session)).chunk_index == 4
    resident = {
        s["session_id"]
        for s in worker.client.get(
            f"{worker.url}/v1/sessions", headers=worker.headers(TRANSFER_TOKEN)
        ).json()["sessions"]
        if s["resident"]
    }
    assert resident == {first, second}


@pytest.mark.parametrize(
    "control",
    [
        camera(["w"]),  # one action list for three latent frames
        camera(["w"], ["x"], []),  # not a LingBot key
        {"track": "camera", "schema": "lingbot.unknown.v9", "data": {}},
        {
            "track": "camera",
            "schema": "lingbot.camera_trajectory.v1",
            "data": {"poses": [np.eye(4).tolist()] * 3, "intrinsics": [[100, 100, 32, 32]] * 3},
        },  # < 9 frames
        {
            "track": "camera",
            "schema": "lingbot.camera_trajectory.v1",
            "data": {"poses": [np.eye(4).tolist()] * 9, "intrinsics": [[0, 0, 32, 32]] * 9},
        },  # zero focal length
        {"track": "steering", "schema": "lingbot.camera_actions.v1", "data": {"mode": "frames"}},  # no camera
    ],
)
async def test_malformed_camera_control_is_400_and_never_reaches_the_forward(worker, place, control):
    session = await place()
    response = worker.tick(session, 0, token=TOKEN, controls=[control])
    assert response.status_code == 400, response.text
    assert code_of(response) == "invalid_tick"
    assert response.json()["error"]["param"] == "controls"
    # nothing was run: the session is untouched and starts at chunk 0
    assert frames_of(worker.tick(session, 0, token=TOKEN)).shape == (9, 64, 64, 3)


async def test_a_camera_trajectory_control_is_accepted(worker, place):
    session = await place()
    poses = [np.eye(4).tolist() for _ in range(9)]
    for index, pose in enumerate(poses):
        pose[2][3] = 0.1 * index  # move forward
    trajectory = {
        "track": "camera",
        "schema": "lingbot.camera_trajectory.v1",
        "data": {"poses": poses, "intrinsics": [[60, 60, 32, 32]] * 9},
    }
    assert frames_of(worker.tick(session, 0, token=TOKEN, controls=[trajectory])).shape == (9, 64, 64, 3)


async def test_retried_request_id_returns_the_same_chunk(worker, store, place):
    session = await place()
    first = worker.tick(session, 0, token=TOKEN, request_id="same")
    again = worker.tick(session, 0, token=TOKEN, request_id="same")
    assert again.content == frames_of(first).tobytes()
    assert (await store.get_session(POOL, session)).chunk_index == 1
    assert frames_of(worker.tick(session, 1, token=TOKEN)).shape == (12, 64, 64, 3)


async def test_concurrent_ticks_on_one_session(worker, place):
    session = await place()
    body = {"request_id": "c0", "chunk_index": 0, "controls": [WALK[0]]}
    async with httpx.AsyncClient(base_url=worker.url, timeout=60) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    f"/v1/sessions/{session}/ticks",
                    json={**body, "request_id": f"c{i}"},
                    headers=worker.headers(TOKEN),
                )
                for i in range(3)
            )
        )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 409, 409]
    assert {code_of(r) for r in responses if r.status_code == 409} == {"tick_in_progress"}


async def test_forward_failure_closes_only_that_session_and_frees_its_blocks(worker, store, place):
    failing, healthy = await place(), await place()
    assert frames_of(worker.tick(failing, 0, token=TOKEN)).shape[0] == 9
    assert frames_of(worker.tick(healthy, 0, token=TOKEN)).shape[0] == 9
    held = kv_blocks(worker)
    failed = worker.tick(failing, 1, token=TOKEN, headers={"ardiff-test-fault": "forward"})
    assert failed.status_code == 500
    assert code_of(failed) == "forward_failed"
    after = kv_blocks(worker)
    assert after["free"] > held["free"]  # the failing session's pages went back to the pool
    described = worker.client.get(f"{worker.url}/v1/sessions/{failing}", headers=worker.headers(TOKEN)).json()
    assert described["state"] == "reset_required"
    assert not described["resident"]
    assert (await store.get_session(POOL, failing)).reset_required
    assert frames_of(worker.tick(healthy, 1, token=TOKEN)).shape[0] == 12  # the other session keeps going
    assert code_of(worker.tick(failing, 1, token=TOKEN)) == "reset_required"
    assert frames_of(worker.tick(failing, 0, token=TOKEN, reset=True)).shape[0] == 9
    assert not (await store.get_session(POOL, failing)).reset_required


async def test_reset_and_close_return_every_kv_block(worker, place):
    first, second = await place(), await place()
    for chunk in range(3):
        for session in (first, second):
            frames_of(worker.tick(session, chunk, token=TOKEN))
    blocks = kv_blocks(worker)
    assert blocks["free"] < blocks["total"]
    reset = worker.client.post(f"{worker.url}/v1/sessions/{first}/reset", headers=worker.headers(TOKEN))
    assert reset.json()["next_chunk_index"] == 0
    closed = worker.client.delete(f"{worker.url}/v1/sessions/{second}", headers=worker.headers(TOKEN))
    assert closed.json()["state"] == "closed"
    blocks = kv_blocks(worker)
    assert blocks["free"] == blocks["total"]
    assert frames_of(worker.tick(first, 0, token=TOKEN)).shape[0] == 9


async def test_misdirected_and_evicted_sessions(worker, store, session_spec, place):
    mine = await place()
    other = "real-worker-elsewhere"
    await store.register_pod(POOL, other, capacity=1, endpoint="http://10.1.2.3:8000", lease_ms=60_000)
    try:
        name = f"r-{uuid.uuid4().hex[:8]}"
        assert (await store.place(POOL, session_spec(name, TOKEN))).placement.pod == other
        misdirected = worker.tick(name, 0, token=TOKEN)
        assert misdirected.status_code == 421
        assert misdirected.json()["error"]["endpoint"] == "http://10.1.2.3:8000"
        await store.release(POOL, name, reason="test done")
    finally:
        await store.remove_pod(POOL, other)

    frames_of(worker.tick(mine, 0, token=TOKEN))
    assert await store.evict_lru(POOL, min_idle_ms=0) == mine
    assert (await store.get_session(POOL, mine)).state is SessionState.EVICTED
    evicted = worker.tick(mine, 1, token=TOKEN)
    assert evicted.status_code == 410
    assert code_of(evicted) == "session_evicted"
    for _ in range(100):  # the worker consumes the `evict` event and frees the runner's state
        if kv_blocks(worker)["free"] == kv_blocks(worker)["total"]:
            break
        await asyncio.sleep(0.05)
    assert kv_blocks(worker)["free"] == kv_blocks(worker)["total"]


async def test_mp4_decodes_to_the_chunk_frames(worker, place):
    session = await place()
    response = worker.tick(session, 0, token=TOKEN, accept="video/mp4")
    assert response.status_code == 200
    assert response.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(response.content)) as container:
        decoded = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    assert decoded.shape == (9, 64, 64, 3)
    raw = frames_of(worker.tick(session, 0, token=TOKEN, request_id=f"{session}-0"))  # the retry, raw
    assert np.abs(decoded.astype(int) - raw.astype(int)).mean() < 12  # lossy, but the same pictures


async def test_an_eviction_waits_in_host_memory_and_resumes_bit_identically(worker, store, place):
    """The real runner's state exported into the worker's host tier on eviction (its KV blocks freed) and
    imported back from memory continues exactly as a twin that was never evicted."""
    session, twin = await place(seed=31), await place(seed=31)
    expected = [frames_of(worker.tick(twin, i, token=TOKEN, controls=[WALK[i % 3]])) for i in range(5)]
    for i in range(3):
        np.testing.assert_array_equal(
            frames_of(worker.tick(session, i, token=TOKEN, controls=[WALK[i % 3]])), expected[i]
        )
    taken = kv_blocks(worker)["total"] - kv_blocks(worker)["free"]
    record = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert (record.tier, record.suspended_chunk) == ("host", 3)
    assert record.location.startswith(f"host:{POD}/")
    assert record.bytes > 1_000_000
    for _ in range(100):  # released from the runner right after it reported the export
        if kv_blocks(worker)["total"] - kv_blocks(worker)["free"] < taken:
            break
        await asyncio.sleep(0.05)
    listing = worker.client.get(f"{worker.url}/v1/sessions", headers=worker.headers(TRANSFER_TOKEN)).json()
    assert session not in {s["session_id"] for s in listing["sessions"]}
    assert kv_blocks(worker)["total"] - kv_blocks(worker)["free"] < taken  # its KV blocks are free
    await store.request_resume(POOL, session)
    assert (await store.place(POOL, record.spec())).placement.pod == POD
    for i in (3, 4):
        frames = frames_of(worker.tick(session, i, token=TOKEN, controls=[WALK[i % 3]]))
        np.testing.assert_array_equal(frames, expected[i])  # bit-identical to the twin
    assert worker.metric('ardiff_session_resumes_total{source="host"}') == 1


async def test_a_migration_pulled_pod_to_pod_continues_bit_identically(
    worker, store, place, launch_worker, redis_url, tiny_model_cache, tier
):
    """The real runner's state (paged self KV, cross KV, LingBot's pipeline state, the streaming decoder)
    exported on one worker process and streamed into another over HTTP continues exactly as a twin that
    never moved (same seed, prompt and controls)."""
    session, twin = (
        await place(seed=21, prompt="a walk by the sea"),
        await place(seed=21, prompt="a walk by the sea"),
    )
    target = real_worker(
        launch_worker,
        redis_url,
        tiny_model_cache,
        tier,
        "real-worker-1",
        wait=False,
        transfer_staging_bytes=64 << 20,
    )
    try:
        expected = [frames_of(worker.tick(twin, i, token=TOKEN, controls=[WALK[i % 3]])) for i in range(5)]
        for i in range(3):
            frames = frames_of(worker.tick(session, i, token=TOKEN, controls=[WALK[i % 3]]))
            np.testing.assert_array_equal(frames, expected[i])
        target.wait_ready(timeout=240)
        record = await suspend_and_wait(store, POOL, session, reason="migrate")
        assert record.location.endswith(f"@{POD}.ardsess")
        await store.set_draining(POOL, POD, draining=True)  # as the operator drains the pod it empties
        try:
            assert (await store.place(POOL, record.spec())).placement.pod == "real-worker-1"
        finally:
            await store.set_draining(POOL, POD, draining=False)
        for i in (3, 4):
            frames = frames_of(target.tick(session, i, token=TOKEN, controls=[WALK[i % 3]]))
            np.testing.assert_array_equal(frames, expected[i])  # bit-identical to the twin
        assert target.metric('ardiff_session_transfers_total{direction="in",result="ok"}') == 1
        assert (
            target.metric('ardiff_session_transfer_bytes_total{direction="in"}') == record.bytes > 1_000_000
        )
        assert worker.metric('ardiff_session_transfer_bytes_total{direction="out"}') == record.bytes
        assert target.metric('ardiff_session_resumes_total{source="direct"}') == 1
        # Into the memory the target keeps between pulls: the import left no view of it (every tensor the
        # session keeps was copied out), so it is lent again, not let go.
        assert f"{record.bytes} bytes in" in target.log()
        assert "into the staging memory" in target.log()
        assert "staging memory is still viewed" not in target.log()
        assert not (tier / record.location).exists()
        blocks = kv_blocks(worker)  # the source released what it held: only the twin's blocks are taken
        assert 0 < blocks["total"] - blocks["free"] == kv_blocks(target)["total"] - kv_blocks(target)["free"]
    finally:
        target.stop()
        await store.remove_pod(POOL, "real-worker-1")
