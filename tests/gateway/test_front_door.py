"""The front door end to end on loopback (issue 37): real Envoy and the endpoint picker in front of real
fake-runtime workers on the shared Redis. Every answer a client gets through it: the pod's own for a placed
session; the edge's (the worker's envelope, no worker seeing the request) for a wrong token, a route that is
not a session's, a suspended, gone or closed session, Redis away, the picker away; a worker's 421 with no Pod
address in it; a stream and vllm-omni's realtime video socket with in-band auth passing through."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ardiff.devcluster.front_door import LocalFrontDoor, gateway_venv
from ardiff.devcluster.pki import CertificateAuthority
from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.acl import PoolUsers, gateway_username
from ardiff.kv.connection import with_user
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState, token_sha256
from tests.worker.conftest import CAMERA, launch_fake_pod, suspend_and_wait

POOL = PoolId("default", f"fd-{uuid.uuid4().hex[:6]}")
POD = "fd-worker-0"
TOKEN = "front-door-token"


@pytest.fixture(scope="module")
def worker(launch_worker, redis_url, tmp_path_factory):
    process = launch_fake_pod(
        launch_worker, redis_url, POOL, POD, suspend_dir=str(tmp_path_factory.mktemp("fd-tier"))
    )
    yield process
    process.stop()


@pytest.fixture
async def place(placer, worker, store: PlacementStore):
    await store.write_pool(POOL)  # what the operator's round writes
    return placer(POOL, POD, TOKEN)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as http:
        yield http


def tick(client: httpx.Client, base: str, session: str, chunk: int, token: str | None = TOKEN, **body):
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    payload = {"request_id": f"{session}-{chunk}", "chunk_index": chunk, "controls": [CAMERA], **body}
    return client.post(f"{base}/v1/sessions/{session}/ticks", json=payload, headers=headers)


def error_of(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    return error


def worker_requests(worker) -> float:
    """Ticks answered plus errors answered by the worker (its /metrics)."""
    text = worker.client.get(f"{worker.url}/metrics").text
    return sum(
        float(value)
        for value in re.findall(r"^ardiff_(?:ticks_total|tick_errors_total\{[^}]*\}) (\S+)$", text, re.M)
    )


async def test_a_tick_through_the_front_door_is_the_pods_own_answer(front_door, worker, place, client):
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name)
    through = tick(client, base, session, 0)
    assert through.status_code == 200, through.text
    direct = tick(client, worker.url, session, 0)  # the same request id: the worker replays the chunk
    assert direct.status_code == 200
    assert through.content == direct.content
    assert len(through.content) > 0
    for header in ("ardiff-chunk-metadata", "ardiff-frame-shape"):
        assert through.headers[header] == direct.headers[header]
    assert tick(client, base, session, 1).status_code == 200
    read = client.get(f"{base}/v1/sessions/{session}", headers={"authorization": f"Bearer {TOKEN}"})
    assert read.status_code == 200
    assert read.json()["next_chunk_index"] == 2


async def test_a_wrong_token_an_unknown_session_and_a_malformed_name_are_one_401_no_worker_sees(
    front_door, worker, place, client
):
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name)
    before = worker_requests(worker)
    answers = [
        tick(client, base, session, 0, token="not-the-token"),
        tick(client, base, session, 0, token=None),
        tick(client, base, "no-such-session", 0),
        tick(client, base, "Bad_Name", 0),
        client.delete(f"{base}/v1/sessions/{session}", headers={"authorization": "Bearer nope"}),
    ]
    messages = {json.dumps(error_of(answer, 401, "unauthorized"), sort_keys=True) for answer in answers}
    assert len(messages) == 1
    assert worker_requests(worker) == before
    assert tick(client, base, session, 0).status_code == 200  # and the session is untouched
    # A pool the store has no record of: the store lost its data (or the pool is not served), retryable.
    error_of(
        tick(client, front_door.url("no-such-ns", "no-such-pool"), session, 0), 503, "placement_recovering"
    )


@pytest.mark.parametrize(
    "path",
    [
        "/metrics",
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/v1/sessions",
        "/pools/default/{pool}/v1/sessions",
        "/pools/default/{pool}/metrics",
        "/pools/default/{pool}/internal/v1/sessions/x/export",
        "/pools/default/{pool}/internal/v1/kept/x/1",
        "/pools/default/{pool}/v1/sessions/x/ticks",  # a GET
    ],
)
def test_only_session_routes_pass_the_edge(front_door, worker, client, path):
    before = worker_requests(worker)
    answer = client.get(f"http://127.0.0.1:{front_door.port}{path.format(pool=POOL.name)}")
    error_of(answer, 404, "not_found")
    assert worker_requests(worker) == before


async def test_a_suspended_session_is_resuming_at_the_edge_and_its_demand_recorded(
    front_door, worker, place, client, store: PlacementStore
):
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name)
    assert tick(client, base, session, 0).status_code == 200
    suspended = await suspend_and_wait(store, POOL, session, reason="evicted")
    assert suspended.resume_requested_ms == 0
    answer = tick(client, base, session, 1)
    error_of(answer, 503, "resuming")
    assert answer.headers["retry-after"] == "1"
    record = await store.get_session(POOL, session)
    assert record is not None
    assert record.state is SessionState.SUSPENDED
    assert record.resume_requested_ms > 0


async def test_closed_sessions_are_gone_at_the_edge_and_a_delete_stays_idempotent(
    front_door, worker, place, client, store: PlacementStore
):
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name)
    assert tick(client, base, session, 0).status_code == 200
    auth = {"authorization": f"Bearer {TOKEN}"}
    assert client.delete(f"{base}/v1/sessions/{session}", headers=auth).status_code == 200
    await store.release(POOL, session, reason="deleted")
    error_of(tick(client, base, session, 1), 410, "session_closed")
    again = client.delete(f"{base}/v1/sessions/{session}", headers=auth)  # answered by a live pod
    assert again.status_code == 200, again.text
    assert again.json()["state"] == "closed"


async def test_a_session_whose_pod_is_gone_is_a_retryable_503(front_door, client, store: PlacementStore):
    pool = PoolId("default", f"fd-gone-{uuid.uuid4().hex[:6]}")
    await store.register_pod(
        pool, "gone", capacity=1, endpoint="http://10.9.9.9:8000", lease_ms=200, address="10.9.9.9:8000"
    )
    await store.place(pool, SessionSpec("lapsed", token_sha256(TOKEN)))
    await store.write_pool(pool)
    await asyncio.sleep(0.3)
    answer = tick(client, front_door.url(pool.namespace, pool.name), "lapsed", 0)
    error_of(answer, 503, "not_ready")
    assert answer.headers["retry-after"] == "1"


class _Moved(http.server.BaseHTTPRequestHandler):
    """A pod that always answers 421, naming another pod's address (a session moved in flight)."""

    def do_POST(self) -> None:
        body = json.dumps({"error": {"code": "misdirected", "endpoint": "http://10.1.2.3:8000"}}).encode()
        self.send_response(421)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


async def test_a_workers_421_leaves_the_edge_as_an_immediate_retry_without_a_pod_address(
    front_door, client, store: PlacementStore
):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pool = PoolId("default", f"fd-moved-{uuid.uuid4().hex[:6]}")
        address = f"127.0.0.1:{server.server_port}"
        await store.register_pod(
            pool, "mover", capacity=1, endpoint=f"http://{address}", lease_ms=60_000, address=address
        )
        await store.place(pool, SessionSpec("moving", token_sha256(TOKEN)))
        await store.write_pool(pool)
        answer = tick(client, front_door.url(pool.namespace, pool.name), "moving", 0)
        error_of(answer, 503, "resuming")
        assert answer.headers["retry-after"] == "0"
        assert "10.1.2.3" not in answer.text
        assert str(server.server_port) not in answer.text
    finally:
        server.shutdown()


async def test_a_body_over_the_edge_bound_is_413_before_any_worker(front_door, worker, place, client):
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name)
    before = worker_requests(worker)
    answer = client.post(
        f"{base}/v1/sessions/{session}/ticks",
        content=b"x" * (5 << 20),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    error_of(answer, 413, "body_too_large")
    assert worker_requests(worker) == before


async def test_a_stream_passes_with_its_token_in_band_and_a_wrong_one_is_refused_by_the_worker(
    front_door, worker, place
):
    session = await place()
    url = front_door.url(POOL.namespace, POOL.name).replace("http://", "ws://")
    async with connect(f"{url}/v1/sessions/{session}/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "auth", "token": TOKEN}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert (ready["type"], ready["next_chunk_index"]) == ("ready", 0)
        await ws.send(
            json.dumps({"type": "tick", "request_id": "r0", "chunk_index": 0, "controls": [CAMERA]})
        )
        chunk = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert chunk["type"] == "chunk"
        images = [await asyncio.wait_for(ws.recv(), 30) for _ in range(chunk["frames"])]
        assert all(isinstance(image, bytes) and image[:2] == b"\xff\xd8" for image in images)
    async with connect(f"{url}/v1/sessions/{session}/stream", max_size=None) as ws:
        await ws.send(json.dumps({"type": "auth", "token": "wrong"}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert error["error"]["code"] == "unauthorized"
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 30)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4401


async def test_vllm_omnis_realtime_video_socket_passes_with_its_token_in_session_start(
    front_door, worker, place, monkeypatch
):
    """vllm-omni's realtime client appends /v1/realtime/video to the base URL and names the session in the
    query: through the front door it gets the session's stream (the token in session.start), and a wrong
    token is the worker's 401 in vllm-omni's shape."""
    from tests.worker import realtime_client
    from tests.worker.realtime_client import RealtimeClient, decode

    # The worker's first realtime stream imports vllm-omni's request model and encoder (~20 s, more loaded).
    monkeypatch.setattr(realtime_client, "RECEIVE_SECONDS", 300.0)
    session = await place()
    base = front_door.url(POOL.namespace, POOL.name).replace("http://", "ws://")
    url = f"{base}/v1/realtime/video?session={session}"
    async with RealtimeClient.connect(url) as client:
        start = await client.start(prompt="a walk in the forest", session_token=TOKEN)
        assert start["type"] == "video.start", start
        assert (start["session"]["id"], start["session"]["chunk_index"]) == (session, 0)
        metadata, segment = await client.chunk()
        assert metadata["generation_chunk_index"] == 0
        assert segment
        done = await client.stop()
        assert done["type"] == "session.done", done
        frames = decode(client.segments)
        assert frames.shape[0] == sum(chunk["num_frames"] for chunk in client.chunks()) - 1
    async with RealtimeClient.connect(url) as client:
        refused = await client.start(prompt="x", session_token="wrong")
        assert (refused["type"], refused["code"]) == ("error", "unauthorized"), refused
        with pytest.raises(ConnectionClosed) as closed:
            await client.receive()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4401


def test_the_picker_away_fails_closed_with_a_code_and_the_front_door_recovers(redis_url, client):
    with LocalFrontDoor(redis_url) as door:
        base = door.url("default", "any-pool")
        error_of(tick(client, base, "s", 0), 503, "placement_recovering")  # the picker answers
        door.stop_picker()
        answer = tick(client, base, "s", 0)
        error_of(answer, 503, "not_ready")
        assert answer.headers["retry-after"] == "1"
        door.start_picker()
        error_of(tick(client, base, "s", 0), 503, "placement_recovering")


async def test_redis_away_is_a_retryable_503_and_a_store_that_lost_its_data_is_recovering(client):
    with RedisServer() as redis, LocalFrontDoor(redis.url) as door:
        pool = PoolId("default", "lossy")
        async with PlacementStore.from_url(redis.url) as store:
            await store.register_pod(
                pool,
                "p",
                capacity=1,
                endpoint="http://10.9.9.9:8000",
                lease_ms=60_000,
                address="10.9.9.9:8000",
            )
            await store.place(pool, SessionSpec("s", token_sha256(TOKEN)))
            await store.write_pool(pool)
        base = door.url(pool.namespace, pool.name)
        redis.stop()
        error_of(tick(client, base, "s", 0), 503, "not_ready")
        # The gateway stays ready (it answers with codes: a Service emptied of every replica would refuse
        # connections instead); its metrics say the store is down.
        metrics = door.picker_metrics_url
        deadline = time.monotonic() + 10
        while "ardiff_gateway_store_up 0.0" not in client.get(metrics).text:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert client.get(metrics.replace("/metrics", "/readyz")).status_code == 200
        redis.start()  # empty: the store lost its data, and its function library
        error_of(tick(client, base, "s", 0), 503, "not_ready")  # no library: retryable, never a 4xx or 500
        redis.load_functions()  # what the operator's next pool round does (kv/scripts.py `load_library`)
        deadline = time.monotonic() + 10
        while (answer := tick(client, base, "s", 0)).json()["error"]["code"] == "not_ready":
            assert time.monotonic() < deadline, answer.text  # the picker reconnects
            await asyncio.sleep(0.1)
        error_of(answer, 503, "placement_recovering")
        assert answer.headers["retry-after"] == "1"


def test_the_picker_speaks_the_health_service_and_passes_streamed_bodies_on(front_door, tmp_path):
    """What a third-party GIE gateway may send: the gRPC health checks, a streamed request body, response
    headers (a 421 among them). Driven with the gateway venv's own stubs (`xds-protos`)."""
    script = f"""
import asyncio, grpc, json
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep, external_processor_pb2_grpc as epg
from grpc_health.v1 import health_pb2, health_pb2_grpc

def headers(*pairs):
    return ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]))

async def main():
    async with grpc.aio.insecure_channel("127.0.0.1:{front_door.picker_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        out = {{}}
        for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            out[service] = (await health.Check(health_pb2.HealthCheckRequest(service=service))).status
        async def requests():
            yield ep.ProcessingRequest(request_headers=headers((":method", "GET"), (":path", "/metrics")))
            yield ep.ProcessingRequest(request_body=ep.HttpBody(body=b"abc", end_of_stream=False))
            yield ep.ProcessingRequest(request_body=ep.HttpBody(body=b"def", end_of_stream=True))
            yield ep.ProcessingRequest(response_headers=headers((":status", "421")))
            yield ep.ProcessingRequest(response_body=ep.HttpBody(body=b"x", end_of_stream=True))
        kinds = []
        async for response in epg.ExternalProcessorStub(channel).Process(requests()):
            kind = response.WhichOneof("response")
            detail = response.immediate_response.status.code if kind == "immediate_response" else None
            kinds.append([kind, detail])
        out["kinds"] = kinds
    print(json.dumps(out))

asyncio.run(main())
"""
    done = subprocess.run(  # not from the checkout: its `operator/` would shadow the standard library's
        [str(gateway_venv() / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    serving = 1
    assert (
        out["liveness"] == out["readiness"] == out["envoy.service.ext_proc.v3.ExternalProcessor"] == serving
    )
    assert out["kinds"] == [
        ["immediate_response", 404],
        ["request_body", None],
        ["request_body", None],
        ["immediate_response", 503],
        ["response_body", None],
    ]


async def test_a_tls_pools_pods_are_reached_over_https_verifying_its_ca_and_the_pods_name(
    front_door, launch_worker, redis_url, client, store: PlacementStore, session_spec, tmp_path
):
    """The pool's CA in its record (the operator's `write_pool`) becomes an Envoy cluster that verifies the
    pod's certificate for its DNS name (SNI and SAN: `localhost` here); a pool whose record holds another CA
    gets no answer from its pod (retryable), one without a CA is refused before any connection."""
    ca = CertificateAuthority(tmp_path / "pool-ca", common_name="pool-ca")
    other = CertificateAuthority(tmp_path / "other-ca", common_name="other-ca")
    pair = ca.issue("worker", common_name="localhost", server=True, dns_names=["localhost"])
    pool = PoolId("default", f"fd-tls-{uuid.uuid4().hex[:6]}")
    worker = launch_fake_pod(
        launch_worker,
        redis_url,
        pool,
        "tls-0",
        tls_cert_file=str(pair.cert),
        tls_key_file=str(pair.key),
        tls_ca_file=str(ca.cert_path),
    )
    try:
        session = f"s-{uuid.uuid4().hex[:8]}"
        await store.place(pool, session_spec(session, TOKEN))
        base = front_door.url(pool.namespace, pool.name)
        await store.write_pool(pool)  # no CA: the edge cannot verify the pod
        error_of(tick(client, base, session, 0), 503, "not_ready")
        await store.write_pool(pool, tls_ca=other.cert_path.read_text())
        error_of(tick(client, base, session, 0), 503, "not_ready")  # the pod's certificate is not trusted
        await store.write_pool(pool, tls_ca=ca.cert_path.read_text())  # rotated to the right one
        through = tick(client, base, session, 0)
        assert through.status_code == 200, through.text
        assert through.content == tick(worker.client, worker.url, session, 0).content
    finally:
        await store.release(pool, session, reason="test done")
        worker.stop()


async def test_the_picker_takes_up_a_rewritten_url_file_without_a_restart(client, tmp_path):
    """The chart mounts the gateway's Redis Secret as a file (a rotated password reaches the Pod's file, not
    its env): the picker reads the URL again and uses a new client once it changed."""
    with RedisServer() as redis:
        pool = PoolId("default", "rotated")
        async with PlacementStore.from_url(redis.url) as store:
            await store.write_pool(pool)
        users = PoolUsers.from_url(redis.url)
        url_file = tmp_path / "url"
        try:
            await users.ensure_gateway("release", ["default"], "first-password-of-enough-length")
            url_file.write_text(
                with_user(redis.url, gateway_username("release"), "first-password-of-enough-length")
            )
            with LocalFrontDoor(redis_url_file=url_file) as door:
                base = door.url(pool.namespace, pool.name)
                error_of(tick(client, base, "s", 0), 401, "unauthorized")  # the picker reads the store
                redis.cli("ACL", "DELUSER", gateway_username("release"))  # its connections go with it
                error_of(tick(client, base, "s", 0), 503, "not_ready")
                await users.ensure_gateway("release", ["default"], "second-password-of-enough-length")
                url_file.write_text(
                    with_user(redis.url, gateway_username("release"), "second-password-of-enough-length")
                )
                deadline = time.monotonic() + 10
                while (answer := tick(client, base, "s", 0)).status_code == 503:
                    assert time.monotonic() < deadline, answer.text
                    await asyncio.sleep(0.2)
                error_of(answer, 401, "unauthorized")
        finally:
            await users.close()
