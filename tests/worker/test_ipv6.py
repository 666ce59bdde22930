"""IPv6 and dual-stack (issue 11 item 6): a worker whose pod IP is IPv6 advertises a bracketed endpoint and,
with the default host, listens on [::] for both families."""

from __future__ import annotations

import uuid

import httpx

from ardiff.kv.records import PoolId
from ardiff.worker.net import ANY_HOST, ipv6_available
from ardiff.worker.settings import WorkerSettings

POOL = PoolId("default", f"wk-ipv6-{uuid.uuid4().hex[:6]}")
POD = "ipv6-worker-0"
TOKEN = "s3cret-token"


def test_an_ipv6_pod_ip_is_bracketed_in_the_endpoint() -> None:
    assert (
        WorkerSettings(pod_ip="fd00:10:244::7", port=8000).advertised_endpoint
        == "http://[fd00:10:244::7]:8000"
    )
    assert WorkerSettings(pod_ip="10.244.0.7", port=8000).advertised_endpoint == "http://10.244.0.7:8000"
    assert WorkerSettings().host == ANY_HOST


async def test_a_worker_on_an_ipv6_pod_ip_registers_a_bracketed_endpoint_and_ticks_there(
    launch_worker, redis_url, store, placer
) -> None:
    assert ipv6_available(), "this test needs IPv6 loopback (::1), which every CI machine of the project has"
    worker = launch_worker(
        runtime="fake",
        redis_url=redis_url,
        namespace=POOL.namespace,
        pool=POOL.name,
        pod_name=POD,
        host=ANY_HOST,  # the default: dual-stack
        pod_ip="::1",
    )
    try:
        pod = await store.get_pod(POOL, POD)
        assert pod is not None
        assert pod.endpoint == f"http://[::1]:{worker.port}"
        session = await placer(POOL, POD, TOKEN)()
        async with httpx.AsyncClient(timeout=30) as client:
            tick = await client.post(
                f"{pod.endpoint}/v1/sessions/{session}/ticks",
                json={"request_id": "r0", "chunk_index": 0, "controls": [_camera()]},
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            assert tick.status_code == 200, tick.text
            assert tick.headers["ardiff-frame-shape"] == "9,64,64,3"
            # Dual-stack: IPv4 clients reach the same listener.
            assert (await client.get(f"http://127.0.0.1:{worker.port}/healthz")).json() == {"status": "ok"}
            assert (await client.get(f"{pod.endpoint}/healthz")).json() == {"status": "ok"}
    finally:
        worker.stop()


def _camera() -> dict:
    from tests.worker.conftest import CAMERA

    return CAMERA
