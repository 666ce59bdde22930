"""The worker process's life: standalone admission, drain on SIGTERM, a prompt exit, lease healing when Redis
loses data.

Each test starts its own worker (they end differently): the `fake` runtime, which starts in about a second, or
a real one stopped while its model is still loading.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

TOKEN = "lifecycle-token"


def _error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_standalone_admits_up_to_capacity_without_auth(launch_worker):
    worker = launch_worker(runtime="fake", fake_capacity=1)
    try:
        assert worker.tick("first", 0, prompt="a forest").status_code == 200
        # fault injection exists only behind ARDIFF_TEST_FAULTS=1: the header is ignored here
        injected = worker.tick("first", 1, prompt="a forest", headers={"ardiff-test-fault": "forward"})
        assert injected.status_code == 200
        full = worker.tick("second", 0, prompt="a forest")
        assert full.status_code == 429
        assert _error_code(full) == "at_capacity"
        assert worker.client.delete(f"{worker.url}/v1/sessions/first").status_code == 200
        assert worker.tick("second", 0, prompt="a forest").status_code == 200
        listing = worker.client.get(f"{worker.url}/v1/sessions").json()
        assert listing["capacity"] == 1
        assert [s["session_id"] for s in listing["sessions"]] == ["second"]
    finally:
        worker.stop()


async def test_sigterm_drains_finishes_the_tick_in_flight_then_exits(launch_worker, redis_url, session_spec):
    pool = PoolId("default", f"wk-drain-{uuid.uuid4().hex[:6]}")
    worker = launch_worker(
        runtime="fake",
        redis_url=redis_url,
        pool=pool.name,
        pod_name="drain-pod",
        fake_tick_seconds=1.5,
        heartbeat_seconds=0.5,
        lease_seconds=5,
    )
    async with PlacementStore.from_url(redis_url) as store:
        for name in ("busy", "late"):
            assert (await store.place(pool, session_spec(name, TOKEN))).placement.pod == "drain-pod"
        async with httpx.AsyncClient(base_url=worker.url, timeout=30) as client:
            body = {"request_id": "r0", "chunk_index": 0, "controls": []}
            headers = {"authorization": f"Bearer {TOKEN}"}
            in_flight = asyncio.create_task(
                client.post("/v1/sessions/busy/ticks", json=body, headers=headers)
            )
            await asyncio.sleep(0.5)
            worker.signal()
            await asyncio.sleep(0.3)
            late = await client.post("/v1/sessions/late/ticks", json=body, headers=headers)
            assert late.status_code == 503
            assert _error_code(late) == "not_ready"
            readyz = await client.get("/readyz")
            assert readyz.status_code == 503
            finished = await in_flight
        assert finished.status_code == 200  # the tick in flight completed
        assert finished.headers["ardiff-frame-shape"] == "9,64,64,3"
        assert (await store.get_pod(pool, "drain-pod")).draining
        assert (await store.get_session(pool, "busy")).chunk_index == 1
        assert worker.process.wait(timeout=20) == 0
        await store.delete_pool(pool)


def test_sigterm_while_the_model_loads_exits_without_waiting_for_the_load(launch_worker, tiny_model_cache):
    worker = launch_worker(model_cache=tiny_model_cache, wait=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # /healthz answers while the runtime loads on the forward thread
        try:
            if worker.client.get(f"{worker.url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    assert (
        worker.client.get(f"{worker.url}/readyz").json()["error"]["message"]
        == "worker is not ready (loading)"
    )
    signalled = time.monotonic()
    worker.signal()
    assert worker.process.wait(timeout=10) == 0, worker.log()
    assert time.monotonic() - signalled < 3, worker.log()  # the load alone takes ~15 s on CPU
    assert "stopped while the model was loading: exiting without waiting for the load" in worker.log()
    worker.stop()


async def test_heartbeat_recreates_the_pod_record_after_redis_loses_it(launch_worker):
    pool = PoolId("default", "wk-heal")
    with RedisServer() as redis:
        worker = launch_worker(
            runtime="fake",
            redis_url=redis.url,
            pool=pool.name,
            pod_name="heal-pod",
            heartbeat_seconds=0.3,
            lease_seconds=3,
            fake_capacity=2,
        )
        try:
            async with PlacementStore.from_url(redis.url) as store:
                before = await store.get_pod(pool, "heal-pod")
                assert before is not None
            redis.restart()  # no persistence: every key is gone, and the function library with them
            async with PlacementStore.from_url(redis.url) as store:
                await asyncio.sleep(1)  # three heartbeats: each meets no library, and the worker loads none
                assert await store.get_pod(pool, "heal-pod") is None
                assert (
                    "placement_functions_not_loaded" in worker.log() or "no function library" in worker.log()
                )
                await store.load_library()  # what the operator's next pool round does
                deadline = time.monotonic() + 10
                healed = None
                while healed is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    healed = await store.get_pod(pool, "heal-pod")
                assert healed is not None, worker.log()
                assert healed.epoch == before.epoch
                assert healed.capacity == 2
                assert healed.endpoint == worker.url
                # the consumer group was healed too: a close event reaches the worker again
                assert worker.client.get(f"{worker.url}/readyz").status_code == 200
        finally:
            worker.stop()


async def test_a_worker_answers_a_retryable_503_while_redis_has_no_library_and_goes_on_once_loaded(
    launch_worker, session_spec
):
    """Issue 42 item 4: Redis lost the function library under a running worker (an empty restart, a failover
    to a node without it; here FUNCTION FLUSH, the data kept): the worker may not load it, so a tick is a 503
    `not_ready` with Retry-After, the session kept; once the operator has loaded it the same tick goes on."""
    pool = PoolId("default", "wk-nolib")
    with RedisServer() as redis:
        worker = launch_worker(
            runtime="fake",
            redis_url=redis.url,
            pool=pool.name,
            pod_name="nolib-pod",
            heartbeat_seconds=0.3,
            lease_seconds=5,
            fake_capacity=2,
        )
        try:
            async with PlacementStore.from_url(redis.url, loads_library=True) as operator:
                assert (await operator.place(pool, session_spec("s-nolib", TOKEN))).placement is not None
                assert worker.tick("s-nolib", 0, token=TOKEN).status_code == 200
                redis.cli("FUNCTION", "FLUSH")
                missing = worker.tick("s-nolib", 1, token=TOKEN)
                assert (missing.status_code, _error_code(missing)) == (503, "not_ready"), missing.text
                assert missing.headers["retry-after"] == "1"
                record = await operator.get_session(pool, "s-nolib")
                assert (record.state.value, record.chunk_index) == ("placed", 1)  # type: ignore[union-attr]
                assert await operator.load_library() == [""]
                # The chunk stood (its record could not be written): the retry replays it, the next goes on.
                again = worker.tick("s-nolib", 1, token=TOKEN)
                assert again.status_code == 200, again.text
                assert json.loads(again.headers["ardiff-chunk-metadata"])["chunk_index"] == 1
                assert worker.tick("s-nolib", 2, token=TOKEN).status_code == 200
                deadline = time.monotonic() + 5  # the tick's record is written after its answer
                while (await operator.get_session(pool, "s-nolib")).chunk_index != 3:  # type: ignore[union-attr]
                    assert time.monotonic() < deadline, worker.log()
                    await asyncio.sleep(0.05)
        finally:
            worker.stop()


def test_the_fake_runtime_path_never_imports_torch():
    code = """
import sys, time
from fastapi.testclient import TestClient
from ardiff.worker.app import create_app
from ardiff.worker.server import load_runtime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings
settings = WorkerSettings(runtime="fake")
with TestClient(create_app(WorkerService(settings, lambda: load_runtime(settings)))) as client:
    while client.get("/readyz").status_code != 200:
        time.sleep(0.01)
    tick = {"request_id": "r", "chunk_index": 0, "prompt": "a forest"}
    assert client.post("/v1/sessions/s/ticks", json=tick).status_code == 200
print(sorted(name for name in ("torch", "vllm", "vllm_omni") if name in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (["--height", "50"], "invalid_settings", "height must be a positive multiple of 16, got 50"),
        (["--model", "{tmp}/nope"], "model_unavailable", "nor a model directory"),  # before slow imports
    ],
)
def test_bad_settings_fail_fast_without_traceback(tmp_path, flags, code, message):
    command = [sys.executable, "-m", "ardiff.cli", "worker", "serve", "--host", "127.0.0.1", "--port", "0"]
    out = subprocess.run(
        command + [flag.format(tmp=tmp_path) for flag in flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 1
    assert f"error: {code}:" in out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


async def test_a_drained_worker_exits_promptly_after_sigterm(launch_worker, redis_url, session_spec):
    """Heartbeats every 20 ms keep a Redis call in flight most of the time, so SIGTERM often cancels the
    heartbeat mid-call: the case where Python 3.11's `asyncio.wait_for` (inside redis-py) used to drop the
    cancel and the worker hung at "Waiting for application shutdown" until it was killed."""
    pool = PoolId("default", f"wk-exit-{uuid.uuid4().hex[:6]}")
    async with PlacementStore.from_url(redis_url) as store:
        for attempt in range(4):
            pod = f"exit-pod-{attempt}"
            worker = launch_worker(
                runtime="fake",
                redis_url=redis_url,
                pool=pool.name,
                pod_name=pod,
                heartbeat_seconds=0.02,
                lease_seconds=5,
            )
            session = f"exit-{attempt}"
            assert (await store.place(pool, session_spec(session, TOKEN))).placement.pod == pod
            # a keep-alive connection stays open across the SIGTERM
            assert worker.tick(session, 0, token=TOKEN).status_code == 200
            await asyncio.sleep(0.1 * attempt)
            signalled = time.monotonic()
            worker.signal()
            try:
                returncode = worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"worker still running 10 s after SIGTERM:\n{worker.log()}") from None
            exit_seconds = time.monotonic() - signalled
            assert returncode == 0, worker.log()
            assert exit_seconds < 3, f"exit took {exit_seconds:.1f}s:\n{worker.log()}"
            assert "Application shutdown complete" in worker.log()
            worker.stop()
        await store.delete_pool(pool)


def test_without_cuda_no_background_kernel_builds_are_spawned():
    """vllm imports humming-kernels, whose import starts two CUDA builds in child processes (by default)."""
    code = """
import os, sys, psutil
from ardiff.worker.vllm_runtime import prepare_vllm_omni
prepare_vllm_omni(cpu_free_memory_bytes=1 << 30)
builds = [p for p in psutil.Process().children() if "import humming" in " ".join(p.cmdline())]
print("humming" in sys.modules, os.environ["HUMMING_DISABLE_PARALLEL_BUILD"], len(builds))
"""
    env = {k: v for k, v in os.environ.items() if k != "HUMMING_DISABLE_PARALLEL_BUILD"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=180
    )
    assert out.stdout.splitlines()[-1].split() == ["True", "1", "0"], out.stderr[
        -3000:
    ]  # vllm logs to stdout
