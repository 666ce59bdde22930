"""A `DELETE` answered by a pod for a session that is not on it (issue 23 item 13): suspended, evicted or
lost, its client deletes it through whichever pod it asks. That pod must not keep a closed book for it: a
later session of the same name placed there would get 410 forever (the operator's `close` goes to the pod a
session was placed on, and a suspended, evicted or lost one has none). A real worker process (fake runtime)
and a second pod that exists only in the store, as the operator sees pods."""

from __future__ import annotations

import uuid

import pytest

from ardiff.kv.records import PoolId, SessionState
from tests.worker.conftest import launch_fake_pod
from tests.worker.test_continuity import frames_of
from tests.worker.test_http_contract import error_of

POOL = PoolId("default", f"wk-books-{uuid.uuid4().hex[:6]}")
POD, ELSEWHERE = "books-0", "books-elsewhere"


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url):
    process = launch_fake_pod(launch_worker, redis_url, POOL, POD)
    yield process
    process.stop()


async def elsewhere(store, session_spec, name: str, token: str, state: str) -> None:
    """`name` placed on the other pod, then made `state` there (as the operator and that pod would)."""
    await store.register_pod(
        POOL, ELSEWHERE, capacity=2, endpoint="http://10.0.0.9:8000", lease_ms=60_000, exports=True
    )
    await store.set_draining(POOL, POD, draining=True)
    try:
        placed = await store.place(POOL, session_spec(name, token))
    finally:
        await store.set_draining(POOL, POD, draining=False)
    assert placed.placement.pod == ELSEWHERE
    if state == "suspended":
        assert await store.suspend(POOL, name, reason="evicted")
        await store.mark_suspended(
            POOL,
            name,
            pod=ELSEWHERE,
            epoch=placed.placement.pod_epoch,
            tier="shared",
            location=f"{POOL.namespace}/{POOL.name}/{name}/suspend-1-a.ardsess",
            bytes=100,
            chunk_index=3,
        )
    elif state == "evicted":
        await store.mark_suspended(
            POOL,
            name,
            pod=ELSEWHERE,
            epoch=placed.placement.pod_epoch,
            tier="shared",
            location="",
            bytes=0,
            chunk_index=0,
        )
    await store.remove_pod(
        POOL, ELSEWHERE
    )  # a lost session's pod is gone; for the others it no longer matters
    assert (await store.get_session(POOL, name)).state is SessionState(state)


@pytest.mark.parametrize("state", ["suspended", "evicted", "lost"])
async def test_a_delete_for_a_session_elsewhere_leaves_no_closed_book(
    worker, store, session_spec, state: str
):
    name, first, second = f"s-{uuid.uuid4().hex[:8]}", "first-token", "second-token"
    await elsewhere(store, session_spec, name, first, state)
    deleted = worker.client.delete(f"{worker.url}/v1/sessions/{name}", headers=worker.headers(first))
    assert deleted.status_code == 200, deleted.text
    assert await store.release(POOL, name, reason="deleted") is SessionState(state)  # the operator's part

    # The same name again, a new session (its own token), placed on this pod.
    assert (await store.place(POOL, session_spec(name, second))).placement.pod == POD
    try:
        frames_of(
            worker.tick(name, 0, token=second)
        )  # before: 410 session_closed, for as long as the pod ran
        error_of(worker.tick(name, 1, token=first), 401, "unauthorized")
    finally:
        await store.release(POOL, name, reason="test done")
        worker.client.delete(f"{worker.url}/v1/sessions/{name}", headers=worker.headers(second))
