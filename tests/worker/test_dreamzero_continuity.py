"""DreamZero sessions move, rewind and fork like LingBot's (issue 26): the real `DreamZeroPipeline` with tiny
random weights in two worker processes on CPU, over real HTTP, placed through the real `PlacementStore` on
the shared Redis. What travels is both KV branches (positive and negative), their text and image
cross-attention and the pipeline's own `DreamZeroState`; each continuation's actions equal, byte for byte,
those of a session that never moved (DreamZero's noise is seeded per forward by the model, so any session
given the same prompt and observations is a twin). The actions are denoised jointly with the chunk's video
latents, over both branches; that the latents are bit-identical too is test_dreamzero.py's (decoding them to
frames here would cost ~10 s a tick).
"""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from ardiff.kv.records import PoolId, kept_location
from tests.worker.conftest import PodPlacer, suspend_and_wait
from tests.worker.test_dreamzero import observation

pytestmark = pytest.mark.slow

POOL = PoolId("default", f"wk-dz-{uuid.uuid4().hex[:6]}")
POD_A, POD_B = "dz-worker-0", "dz-worker-1"
TOKEN = "robot-token"
TRANSFER_TOKEN = "robot-pool-transfer-token"
RAW = "application/octet-stream"


def real_worker(launch_worker, redis_url, tiny_model_cache, tier, pod: str):
    return launch_worker(
        runtime="vllm",
        model="tiny-dreamzero",
        pipeline="DreamZeroPipeline",
        model_cache=tiny_model_cache,
        redis_url=redis_url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name=pod,
        cpu_free_memory_bytes=2 << 30,  # two sessions of 603 MiB model-owned state at fraction 0.7
        kv_memory_fraction=0.7,
        lease_seconds=10,
        heartbeat_seconds=1,
        suspend_dir=str(tier),
        transfer_token=TRANSFER_TOKEN,
        wait=False,
    )


@pytest.fixture(scope="module")
def workers(launch_worker, redis_url, tiny_model_cache, tmp_path_factory):
    tier = tmp_path_factory.mktemp("dz-shared-tier")
    a = real_worker(launch_worker, redis_url, tiny_model_cache, tier, POD_A)
    b = real_worker(launch_worker, redis_url, tiny_model_cache, tier, POD_B)
    a.wait_ready(timeout=400)
    b.wait_ready(timeout=400)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
async def place(store, session_spec, workers):
    """`place(pod, keep=K, fork_from="")`: a robot session on `pod`; released and closed after the test."""
    placer = PodPlacer(store, session_spec, POOL, TOKEN, workers, {"prompt": "pick up the red cup"})
    yield placer
    await placer.release_all()


def robot_tick(worker, session: str, chunk: int) -> np.ndarray:
    """Chunk `chunk`'s actions, the session given the observations every session here gets."""
    body = {"request_id": f"{session}-{chunk}", "chunk_index": chunk, "observation": observation(5, chunk)}
    answer = worker.client.post(
        f"{worker.url}/v1/sessions/{session}/ticks", json=body, headers=worker.headers(TOKEN, accept=RAW)
    )
    assert answer.status_code == 200, answer.text
    shape = tuple(int(n) for n in answer.headers["ardiff-action-shape"].split(","))
    assert answer.headers["ardiff-frame-shape"] == "0,352,640,3"
    return np.frombuffer(answer.content, dtype="<f4").reshape(shape)


def rewind(worker, session: str, chunk: int) -> httpx.Response:
    return worker.client.post(
        f"{worker.url}/v1/sessions/{session}/rewind", json={"chunk": chunk}, headers=worker.headers(TOKEN)
    )


async def test_a_rewind_and_a_fork_on_another_pod_continue_bit_identically(workers, store, place):
    """K=2: a parent's chunks 0..3 keep boundaries 3 and 4; rewound to 3 it gives its chunk 3 again, and so
    does a fork of boundary 3 on the other pod (pulled over the kept endpoint). Before: DreamZero sessions
    could not export, so nothing was kept, a rewind was `chunk_not_kept` and a fork needed a reset."""
    a, b = workers
    parent = await place(POD_A, keep=2)
    expected = [robot_tick(a, parent, chunk) for chunk in range(4)]
    assert expected[3].shape == (24, 8)
    assert not np.array_equal(expected[2], expected[3])  # a chunk's actions are its own
    assert (await store.get_session(POOL, parent)).kept_chunks == (3, 4)
    answer = rewind(a, parent, 3)
    assert answer.status_code == 200, answer.text
    assert answer.json()["chunk_index"] == 3
    fork = await place(POD_B, fork_from=kept_location(POD_A, parent, 3))
    np.testing.assert_array_equal(robot_tick(b, fork, 3), expected[3])
    np.testing.assert_array_equal(robot_tick(a, parent, 3), expected[3])
    assert (await store.get_session(POOL, fork)).chunk_index == 4


async def test_a_migration_pulled_pod_to_pod_continues_bit_identically(workers, store, place):
    a, b = workers
    twin, session = await place(POD_A), await place(POD_A)
    expected = [robot_tick(a, twin, chunk) for chunk in range(3)]
    for chunk in range(2):
        np.testing.assert_array_equal(robot_tick(a, session, chunk), expected[chunk])
    record = await suspend_and_wait(store, POOL, session, reason="migrate")
    assert record.location.endswith(f"@{POD_A}.ardsess")
    await store.set_draining(POOL, POD_A, draining=True)  # as the operator drains the pod it empties
    try:
        assert (await store.place(POOL, record.spec())).placement.pod == POD_B
    finally:
        await store.set_draining(POOL, POD_A, draining=False)
    retried = robot_tick(b, session, 1)  # a retry: the book came along with its cached chunk
    np.testing.assert_array_equal(retried, expected[1])
    np.testing.assert_array_equal(robot_tick(b, session, 2), expected[2])
    assert (await store.get_session(POOL, session)).chunk_index == 3
