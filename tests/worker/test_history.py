"""Kept history (issue 26): rewind to a kept chunk and fork from one, bit-identically, on the real vllm-omni
runner and the tiny LingBot-World model on CPU, over real HTTP, placed through the real `PlacementStore` on
the shared Redis. Two worker processes: forks on the parent's pod (read from its history) and on another
(pulled over `GET /internal/v1/kept/...`). `KeptChunks` itself is tested first, without a model.
"""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import pytest

from ardiff.kv.records import PoolId, kept_location
from ardiff.worker.history import HistoryFull, KeptChunks
from ardiff.worker.transfer import KEPT_PATH
from tests.worker.conftest import PodPlacer

pytestmark = pytest.mark.slow

POOL = PoolId("default", f"wk-hist-{uuid.uuid4().hex[:6]}")
POD_A, POD_B = "hist-worker-0", "hist-worker-1"
TOKEN = "history-token"
TRANSFER_TOKEN = "history-pool-transfer-token"


def camera(*frames: list[str]) -> dict:
    return {
        "track": "camera",
        "schema": "lingbot.camera_actions.v1",
        "data": {"mode": "frames", "frames": [list(keys) for keys in frames]},
    }


WALK = [camera(["w"], ["w"], ["w", "j"]), camera(["a"], [], ["d"]), camera(["w", "l"], ["w"], [])]


# ---------------------------------------------------------------------------------------- KeptChunks alone


def writer(size: int, fill: int):
    def export(out) -> int:
        out.write(bytes([fill]) * size)
        return size

    return export


def test_kept_chunks_keep_the_last_k_within_the_budget_and_drop_what_a_rewind_passes() -> None:
    kept = KeptChunks(budget_bytes=1000, pod="p")
    for chunk in range(1, 6):
        kept.keep("s", chunk, 3, writer(100, chunk))
    assert kept.chunks("s") == [3, 4, 5]
    assert kept.used_bytes == 300
    copy = kept.get("s", 4)
    assert copy is not None
    assert copy.location == kept_location("p", "s", 4)
    assert b"".join(copy.pieces) == bytes([4]) * 100
    assert kept.get("s", 2) is None
    kept.keep("s", 4, 3, writer(50, 9))  # a boundary kept again (after a rewind) replaces the old one
    assert kept.chunks("s") == [3, 4, 5]
    assert kept.used_bytes == 250
    with pytest.raises(HistoryFull):  # another session's chunk that does not fit: not kept, nothing changes
        kept.keep("t", 1, 3, writer(800, 1))
    assert kept.chunks("t") == []
    assert kept.used_bytes == 250
    assert kept.drop_after("s", 3) == [3]
    assert kept.used_bytes == 100
    kept.drop("s")
    assert kept.chunks("s") == []
    assert kept.used_bytes == 0


# ------------------------------------------------------------------------------------ the real tiny LingBot


def real_worker(launch_worker, redis_url, tiny_model_cache, pod: str):
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
        transfer_token=TRANSFER_TOKEN,
        wait=False,
    )


@pytest.fixture(scope="module")
def workers(launch_worker, redis_url, tiny_model_cache):
    a = real_worker(launch_worker, redis_url, tiny_model_cache, POD_A)
    b = real_worker(launch_worker, redis_url, tiny_model_cache, POD_B)
    a.wait_ready(timeout=300)
    b.wait_ready(timeout=300)
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
async def place(store, session_spec, workers):
    """`place(pod, keep=K, fork_from="")`: a session on `pod` (seed 41, one prompt: twins); released after."""
    placer = PodPlacer(store, session_spec, POOL, TOKEN, workers, {"seed": 41, "prompt": "a walk by the sea"})
    yield placer
    await placer.release_all()


def frames_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    shape = tuple(int(n) for n in response.headers["ardiff-frame-shape"].split(","))
    return np.frombuffer(response.content, dtype=np.uint8).reshape(shape)


def walk(worker, session: str, chunks: range) -> list[np.ndarray]:
    return [frames_of(worker.tick(session, i, token=TOKEN, controls=[WALK[i % 3]])) for i in chunks]


def rewind(worker, session: str, body, token: str | None = TOKEN) -> httpx.Response:
    return worker.client.post(
        f"{worker.url}/v1/sessions/{session}/rewind", json=body, headers=worker.headers(token)
    )


def metric(worker, sample: str) -> float:
    for line in worker.client.get(f"{worker.url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_rewind_to_a_kept_chunk_generates_it_again_bit_identically(workers, store, place):
    """K=3: after chunks 0..4 the boundaries 3, 4, 5 are kept (the record lists them); a rewind to 3 puts the
    session back there (the record's chunk_index too), drops 4 and 5, and chunks 3 and 4 with the same
    controls come out byte for byte as the first time. A retried request id of chunk 2 replays it."""
    worker, _ = workers
    session = await place(POD_A, keep=3)
    before = metric(worker, "ardiff_worker_history_bytes")
    first = walk(worker, session, range(5))
    record = await store.get_session(POOL, session)
    assert (record.chunk_index, record.kept_chunks) == (5, (3, 4, 5))
    kept_bytes = metric(worker, "ardiff_worker_history_bytes") - before
    per_chunk = kept_bytes / 3
    print(f"tiny LingBot (64x64) kept chunk: {per_chunk:.0f} bytes")  # the measured cost per kept chunk
    assert 1_000_000 < per_chunk < 20_000_000

    answer = rewind(worker, session, {"chunk": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"session": session, "chunk_index": 3, "kept_chunks": [3]}
    record = await store.get_session(POOL, session)
    assert (record.chunk_index, record.kept_chunks) == (3, (3,))
    assert 0 < metric(worker, "ardiff_worker_history_bytes") - before < kept_bytes / 2  # 4 and 5 dropped
    ahead = worker.tick(session, 5, token=TOKEN, controls=[WALK[2]])
    assert (ahead.status_code, ahead.json()["error"]["expected_chunk_index"]) == (409, 3)
    replay = worker.tick(session, 2, token=TOKEN, controls=[WALK[2]])  # the book's cached chunk came back
    np.testing.assert_array_equal(frames_of(replay), first[2])
    again = walk(worker, session, range(3, 5))
    np.testing.assert_array_equal(again[0], first[3])
    np.testing.assert_array_equal(again[1], first[4])
    assert (await store.get_session(POOL, session)).kept_chunks == (3, 4, 5)
    assert metric(worker, "ardiff_session_rewinds_total") >= 1


async def test_rewind_refusals_are_clear_and_harm_nothing(workers, store, place):
    """A chunk not kept is 404 `chunk_not_kept` listing the kept ones; a bad body is 400 (`chunk` an int
    >= 1); no token is 401 whatever the body. With K=0 nothing is kept: no export, no record entry. The
    session goes on after every refusal."""
    worker, _ = workers
    kept, plain = await place(POD_A, keep=2), await place(POD_A)
    before = metric(worker, "ardiff_worker_history_kept_total")
    walk(worker, kept, range(3))
    walk(worker, plain, range(3))
    assert metric(worker, "ardiff_worker_history_kept_total") - before == 3  # the K=2 session's three only
    assert (await store.get_session(POOL, kept)).kept_chunks == (2, 3)
    assert (await store.get_session(POOL, plain)).kept_chunks == ()

    for session, chunk, listed in ((kept, 1, [2, 3]), (kept, 9, [2, 3]), (plain, 2, [])):
        answer = rewind(worker, session, {"chunk": chunk})
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["kept_chunks"]) == ("chunk_not_kept", listed)
        assert f"keeps no chunk {chunk}" in error["message"]
    for body in ({"chunk": 0}, {"chunk": "2"}, {"chunk": 2.0}, {}, {"chunk": 2, "extra": 1}, [2]):
        answer = rewind(worker, kept, body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (400, "invalid_tick"), body
    assert rewind(worker, kept, {"chunk": "not a chunk"}, token=None).status_code == 401
    assert rewind(worker, kept, {"chunk": 2}, token="wrong").status_code == 401
    assert walk(worker, kept, range(3, 4))[0].shape == (12, 64, 64, 3)  # untouched by the refusals
    assert frames_of(worker.tick(plain, 3, token=TOKEN, controls=[WALK[0]])).shape == (12, 64, 64, 3)
    reset = worker.client.post(f"{worker.url}/v1/sessions/{kept}/reset", headers=worker.headers(TOKEN))
    assert reset.status_code == 200, reset.text
    assert rewind(worker, kept, {"chunk": 3}).json()["error"]["kept_chunks"] == []  # a reset drops history


async def test_a_fork_on_the_parents_pod_and_on_another_continues_bit_identically(workers, store, place):
    """Forks at kept chunk 3 of a parent, one on the parent's pod (read from its history), one on the other
    pod (pulled over the kept endpoint with the pool's token): each one's chunks 3 and 4 are the parent's,
    byte for byte, under its own id; the parent keeps its chunk and ticks on. A fork of a chunk kept nowhere
    needs a reset. The kept endpoint refuses a wrong token and a chunk not kept."""
    a, b = workers
    parent = await place(POD_A, keep=3)
    expected = walk(a, parent, range(3))
    here = await place(POD_A, fork_from=kept_location(POD_A, parent, 3))
    there = await place(POD_B, fork_from=kept_location(POD_A, parent, 3))
    expected += walk(a, parent, range(3, 5))  # the parent ticks on; chunk 3 stays kept for the forks
    for worker, fork in ((a, here), (b, there)):
        chunks = walk(worker, fork, range(3, 5))
        np.testing.assert_array_equal(chunks[0], expected[3])
        np.testing.assert_array_equal(chunks[1], expected[4])
        assert (await store.get_session(POOL, fork)).chunk_index == 5
    assert metric(a, 'ardiff_session_resumes_total{source="fork"}') >= 1
    assert metric(b, 'ardiff_session_resumes_total{source="fork"}') >= 1
    assert (await store.get_session(POOL, parent)).kept_chunks == (3, 4, 5)

    url = a.url + KEPT_PATH.format(session_id=parent, chunk=4)
    assert a.client.get(url, headers=a.headers("wrong")).status_code == 401
    gone = a.client.get(
        a.url + KEPT_PATH.format(session_id=parent, chunk=2), headers=a.headers(TRANSFER_TOKEN)
    )
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "chunk_not_kept")
    kept_chunk = a.client.get(url, headers=a.headers(TRANSFER_TOKEN))
    assert len(kept_chunk.content) > 1_000_000
    # Its length declared (the puller then provides its buffer at once), not a bound: the history budget.
    assert kept_chunk.headers["content-length"] == str(len(kept_chunk.content))

    orphan = await place(POD_B, fork_from=kept_location(POD_A, parent, 2))  # dropped since (K=3)
    answer = b.tick(orphan, 2, token=TOKEN, controls=[WALK[2]])
    assert (answer.status_code, answer.json()["error"]["code"]) == (409, "reset_required"), answer.text
