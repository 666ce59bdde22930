"""Checks before work (issue 23 item 4): a robot tick's images are decoded only once the cheap checks passed
(placement, token, one tick in flight, chunk order), off the event loop in a bounded pool, and a session takes
at most `MAX_REQUESTS_PER_SESSION` requests at once (more: 429 `too_many_requests`). Real worker processes
(fake runtime) on the shared Redis; the pod's lease in Redis is what must not lapse."""

from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid

import httpx
import numpy as np
import PIL.Image
import pytest

from ardiff.kv.keys import PoolKeys
from ardiff.kv.records import PoolId
from ardiff.worker.families import dreamzero
from ardiff.worker.placement_guard import MAX_REQUESTS_PER_SESSION
from tests.worker.conftest import launch_fake_pod, suspend_and_wait
from tests.worker.test_continuity import frames_of
from tests.worker.test_http_contract import error_of

POOL = PoolId("default", f"wk-checks-{uuid.uuid4().hex[:6]}")
CAP_POOL = PoolId("default", f"wk-cap-{uuid.uuid4().hex[:6]}")
TOKEN = "checks-token"
LEASE_SECONDS = 1.5


def heavy_png() -> str:
    """A 1024x1024 PNG of 5 KB that takes ~20 ms to decode: cheap to send, dear to read."""
    gradient = np.tile((np.arange(1024) % 256).astype(np.uint8)[None, :, None], (1024, 1, 3))
    buffer = io.BytesIO()
    PIL.Image.fromarray(gradient).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def robot_body(chunk_index: int, image: str) -> dict:
    return {
        "request_id": f"junk-{uuid.uuid4().hex[:6]}",
        "chunk_index": chunk_index,
        "prompt": "stack the cups",
        "observation": {
            "images": {camera: {"encoding": "png", "data": image} for camera in dreamzero.CAMERAS},
            "joint_position": [0.0] * 7,
            "cartesian_position": [0.0] * 6,
            "gripper_position": [0.0],
        },
    }


@pytest.fixture(scope="module")
def robot_pod(launch_worker, redis_url, tiny_model_cache):
    worker = launch_worker(
        runtime="fake",
        pipeline="DreamZeroPipeline",
        model="tiny-dreamzero",
        model_cache=str(tiny_model_cache),
        redis_url=redis_url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name="robot-0",
        fake_capacity=2,
        lease_seconds=LEASE_SECONDS,
        heartbeat_seconds=0.3,
    )
    yield worker
    worker.stop()


async def test_fifty_concurrent_junk_ticks_do_not_delay_the_heartbeat_past_its_lease(
    robot_pod, store, placer
):
    """50 ticks at once, each with three 1024x1024 PNGs: 45 for a chunk the session does not expect and 5 for
    the right one (one of those goes through, the others find it in flight). Before: every image was decoded
    on the event loop before the checks (~3 s of decoding in a row), and the pod's lease ran out (by 659 ms
    here)."""
    session = await placer(POOL, "robot-0", TOKEN)(prompt="stack the cups")
    image = heavy_png()
    pod_key = PoolKeys(POOL).pod("robot-0")
    margins: list[float] = []
    flooding = True

    async def watch_lease() -> None:
        while flooding:
            async with store.client.pipeline(transaction=False) as pipe:
                pipe.hget(pod_key, "lease_expires_ms")
                pipe.time()
                expires, (seconds, micros) = await pipe.execute()
            margins.append(int(expires) - (int(seconds) * 1000 + int(micros) // 1000))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_lease())
    headers = {"authorization": f"Bearer {TOKEN}"}
    url = f"{robot_pod.url}/v1/sessions/{session}/ticks"
    limits = httpx.Limits(max_connections=60)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        bodies = [robot_body(5 if i % 10 else 0, image) for i in range(50)]
        started = time.monotonic()
        answers = await asyncio.gather(*(client.post(url, json=body, headers=headers) for body in bodies))
        took = time.monotonic() - started
    await asyncio.sleep(2 * 0.3)
    flooding = False
    await watcher
    codes = sorted(
        (answer.status_code, answer.json()["error"]["code"] if answer.status_code != 200 else "ok")
        for answer in answers
    )
    assert codes.count((200, "ok")) == 1, codes
    assert {code for code in codes if code != (200, "ok")} <= {
        (409, "chunk_out_of_order"),
        (409, "tick_in_progress"),
        (429, "too_many_requests"),
    }, codes
    assert min(margins) > 0, f"the lease lapsed by {-min(margins)} ms during the flood ({took:.1f} s)"
    assert len(margins) > 10


async def test_requests_beyond_the_cap_for_one_session_get_429_at_once(
    launch_worker, redis_url, store, session_spec, tmp_path
):
    """A migrating session's ticks wait on its old pod for the new placement (up to 5 s, polling the store).
    Twenty at once: only `MAX_REQUESTS_PER_SESSION` wait, the rest are told 429 without touching Redis."""
    pod = launch_fake_pod(launch_worker, redis_url, CAP_POOL, "cap-0", suspend_dir=str(tmp_path))
    try:
        name = f"s-{uuid.uuid4().hex[:8]}"
        assert (await store.place(CAP_POOL, session_spec(name, TOKEN))).placement.pod == "cap-0"
        frames_of(pod.tick(name, 0, token=TOKEN))
        # Suspended for a migration and held here for its new pod to pull (the pool's transfer token), which
        # never comes: its ticks wait here for a placement.
        await suspend_and_wait(store, CAP_POOL, name, reason="migrate")
        url = f"{pod.url}/v1/sessions/{name}/ticks"
        body = {"request_id": f"{name}-1", "chunk_index": 1, "controls": []}
        headers = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=30)) as client:

            async def tick() -> tuple[httpx.Response, float]:
                started = time.monotonic()
                answer = await client.post(url, json=body, headers=headers)
                return answer, time.monotonic() - started

            answers = await asyncio.gather(*(tick() for _ in range(20)))
        refused = [(answer, took) for answer, took in answers if answer.status_code == 429]
        waited = [(answer, took) for answer, took in answers if answer.status_code != 429]
        assert len(waited) == MAX_REQUESTS_PER_SESSION
        assert all(error_of(answer, 503, "resuming") for answer, _ in waited)
        assert len(refused) == 20 - MAX_REQUESTS_PER_SESSION
        assert max(took for _, took in refused) < 2.0  # told at once, not after the 5 s wait
        assert all(error_of(answer, 429, "too_many_requests") for answer, _ in refused)
        # The cap counts requests under way, not a budget: once they ended the session is asked again.
        error_of(pod.tick(name, 1, token=TOKEN), 503, "resuming")
    finally:
        pod.stop()
        await store.remove_pod(CAP_POOL, "cap-0")


def test_parsing_a_robot_tick_decodes_no_image_and_decoding_checks_them() -> None:
    body = robot_body(0, heavy_png())
    body["observation"]["images"]["wrist_image_left"] = {"encoding": "png", "data": "bm90IGEgcG5n"}
    tick = dreamzero.parse_tick("s", body)  # a corrupt picture is not read yet
    assert set(tick.robot_obs) == {
        "observation/joint_position",
        "observation/cartesian_position",
        "observation/gripper_position",
    }
    with pytest.raises(dreamzero.InvalidTick) as refused:
        dreamzero.decode_tick(tick)
    assert refused.value.param == "observation.images.wrist_image_left.data"
    good = dreamzero.decode_tick(dreamzero.parse_tick("s", robot_body(0, heavy_png())))
    assert good.robot_obs["observation/wrist_image_left"].shape == (1024, 1024, 3)
