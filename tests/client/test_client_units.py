"""The Python client without a cluster: the error taxonomy against the worker's own envelopes and the
contracts table, frame decoding, camera controls, server timings, MP4 writing, and its boundary checks."""

from __future__ import annotations

import contextlib
import io
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

from ardiff import client, wire
from ardiff.devcluster.kubeconfig import Credentials
from ardiff.devcluster.pki import CertificateAuthority, KeyPair
from ardiff.errors import ArdiffError
from ardiff.worker import errors as worker_errors
from ardiff.worker.net import free_port

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"


def contract_codes() -> dict[str, int]:
    """`code -> status` from the error table of docs/contracts.md §4 (`| 409 | `a` / `b` | extra |`)."""
    table = CONTRACTS.read_text().split("## 4. Worker HTTP API", 1)[1].split("\n## ", 1)[0]
    codes = {}
    for status, cell in re.findall(r"^\| (\d{3}) \| ([^|]+) \|", table, flags=re.MULTILINE):
        for code in re.findall(r"`([a-z_]+)`", cell):
            codes[code] = int(status)
    return codes


def worker_error_instances() -> list[worker_errors.WorkerError]:
    """One instance of every error the worker answers with, built the way the worker builds them."""
    extras = {
        "ChunkOutOfOrder": {"expected_chunk_index": 7},
        "MaxChunksReached": {"max_chunks": 100},
        "Misdirected": {"endpoint": "http://10.0.0.7:8000"},
        "Rewound": {"expected_chunk_index": 4},
        "ChunkNotKept": {"kept_chunks": [3, 4]},
    }
    found = []
    for cls in worker_errors.WorkerError.__subclasses__():
        if cls.__module__ != worker_errors.__name__:
            continue  # e.g. the app's RouteError for unknown URLs (tested below)
        found.append(cls(f"a {cls.code} answer", **extras.get(cls.__name__, {})))
    return found


def answer(error: worker_errors.WorkerError) -> httpx.Response:
    return httpx.Response(error.status, json=error.envelope())


def test_the_client_knows_every_code_of_the_contract_with_its_status() -> None:
    codes = contract_codes()
    assert len(codes) == 19
    assert {code: cls.status for code, cls in client.ERRORS_BY_CODE.items()} == codes


def test_the_worker_and_the_client_declare_the_same_codes() -> None:
    """Every code the worker's envelope can carry has a client exception of that code, status and
    retryability, the client has none the worker never sends, and both are `ardiff.wire.ErrorCode` (issue 24
    item 3: declared once, there)."""
    sent = {}
    for error in worker_error_instances():
        code = error.envelope()["error"]["code"]
        assert code not in sent, f"two worker classes send {code}"
        sent[code] = (error.status, error.retry_after_seconds is not None)
    known = {code: (cls.status, cls.retryable) for code, cls in client.ERRORS_BY_CODE.items()}
    assert sent == known
    assert {member.code: (member.status, member.retryable) for member in wire.ErrorCode} == sent
    assert all(cls.code == code for code, cls in client.ERRORS_BY_CODE.items())


@pytest.mark.parametrize("error", worker_error_instances(), ids=lambda e: e.code)
def test_every_worker_error_becomes_its_typed_exception(error: worker_errors.WorkerError) -> None:
    raised = client.error_from_response(answer(error))
    assert type(raised) is client.ERRORS_BY_CODE[error.code]
    assert isinstance(raised, ArdiffError)
    assert (raised.code, raised.status, raised.message) == (error.code, error.status, error.message)
    assert raised.param == error.param
    assert raised.extra == error.extra


def test_extras_are_typed_attributes() -> None:
    out_of_order = client.error_from_response(
        answer(worker_errors.ChunkOutOfOrder("x", expected_chunk_index=3))
    )
    assert isinstance(out_of_order, client.ChunkOutOfOrder)
    assert out_of_order.expected_chunk_index == 3
    assert out_of_order.param == "chunk_index"
    limited = client.error_from_response(answer(worker_errors.MaxChunksReached("x", max_chunks=5)))
    assert isinstance(limited, client.MaxChunksReached)
    assert limited.max_chunks == 5
    moved = client.error_from_response(answer(worker_errors.Misdirected("x", endpoint="http://pod-b:8000")))
    assert isinstance(moved, client.Misdirected)
    assert moved.endpoint == "http://pod-b:8000"


def test_answers_without_the_envelope_or_with_an_unknown_code_keep_their_status() -> None:
    proxy = client.error_from_response(httpx.Response(502, text="<html>bad gateway</html>"))
    assert type(proxy) is client.WorkerAPIError
    assert (proxy.status, proxy.code) == (502, "worker_error")
    assert "bad gateway" in proxy.message
    newer = client.error_from_response(
        httpx.Response(418, json={"error": {"code": "teapot", "message": "short and stout", "type": "x"}})
    )
    assert type(newer) is client.WorkerAPIError
    assert (newer.status, newer.code, newer.message) == (418, "teapot", "short and stout")
    route = client.error_from_response(
        httpx.Response(404, json={"error": {"code": "not_found", "message": "Not Found", "type": "NotFound"}})
    )
    assert (route.status, route.code) == (404, "not_found")


def test_decode_frames_checks_the_shape_against_the_body() -> None:
    frames = np.arange(2 * 4 * 6 * 3, dtype=np.uint8).reshape(2, 4, 6, 3)
    decoded = client.decode_frames(frames.tobytes(), "2,4,6,3")
    assert decoded.dtype == np.uint8
    assert np.array_equal(decoded, frames)
    for header in ("2,4,6", "2,4,6,4", "a,b,c,3", "0,4,6,3", ""):
        with pytest.raises(ValueError, match="ardiff-frame-shape"):
            client.decode_frames(frames.tobytes(), header)
    with pytest.raises(ValueError, match="the body has 143"):
        client.decode_frames(frames.tobytes()[:-1], "2,4,6,3")


def test_camera_controls_follow_lingbots_schema() -> None:
    control = client.camera("w", "wJ", "")
    assert control == {
        "track": "camera",
        "schema": "lingbot.camera_actions.v1",
        "data": {"mode": "frames", "frames": [["w"], ["j", "w"], []]},
    }
    assert client.camera(["w", "d"], ["w"], ["w"])["data"]["frames"] == [["d", "w"], ["w"], ["w"]]
    assert client.hold("i")["data"]["frames"] == [["i"], ["i"], ["i"]]
    with pytest.raises(ValueError, match="must hold 3 key states"):
        client.camera("w", "w")
    with pytest.raises(ValueError, match=r"got \['q', 'x'\]"):
        client.camera("w", "qx", "")
    assert all(c["data"]["frames"] and len(c["data"]["frames"]) == 3 for c in client.CAMERA_TOUR)


def test_server_timing_is_parsed_to_milliseconds() -> None:
    header = "queue;dur=1.25, forward;dur=80.00, decode;dur=12.5, encode;dur=0.02"
    assert client.parse_server_timing(header) == {
        "queue": 1.25,
        "forward": 80.0,
        "decode": 12.5,
        "encode": 0.02,
    }
    assert client.parse_server_timing("") == {}


def test_write_mp4_writes_every_frame_of_every_chunk(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 255, size=(n, 32, 48, 3), dtype=np.uint8) for n in (9, 12)]
    path = client.write_mp4(tmp_path / "out" / "walk.mp4", chunks)
    with av.open(io.BytesIO(path.read_bytes())) as video:
        decoded = [frame.to_ndarray(format="rgb24") for frame in video.decode(video=0)]
    assert len(decoded) == 21
    assert decoded[0].shape == (32, 48, 3)
    with pytest.raises(ValueError, match="non-empty FxHxWx3 uint8"):
        client.write_mp4(tmp_path / "bad.mp4", np.zeros((2, 32, 32), dtype=np.uint8))


def test_session_client_needs_its_three_values_and_reports_an_unreachable_worker() -> None:
    with pytest.raises(ValueError, match="must be non-empty"):
        client.SessionClient("walk", "http://127.0.0.1:1", "")
    port = free_port()
    with client.SessionClient("walk", f"http://127.0.0.1:{port}/", "t0ken", timeout=5) as session:
        assert session.endpoint == f"http://127.0.0.1:{port}"
        with pytest.raises(client.WorkerUnreachable, match="ConnectError"):
            session.tick([client.hold("w")])
        assert session.next_chunk_index == 0  # nothing advanced


def test_kube_sessions_without_credentials_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(client.KubernetesError, match="no usable Kubernetes credentials"):
        client.KubeSessions("default", kubeconfig=tmp_path / "missing")


def unreachable_kube_sessions(tmp_path: Path) -> client.KubeSessions:
    """Sessions of a kubeconfig as the dev cluster writes one (its CA, a token), naming a port nothing
    listens on."""
    credentials = Credentials(
        server=f"https://127.0.0.1:{free_port()}",
        ca=CertificateAuthority(tmp_path / "pki").cert_path,
        user="tester",
        token="t0ken",
    )
    return client.KubeSessions("default", kubeconfig=credentials.write_kubeconfig(tmp_path / "kubeconfig"))


def test_an_unreachable_kubernetes_api_is_a_clear_error(tmp_path: Path) -> None:
    sessions = unreachable_kube_sessions(tmp_path)
    with pytest.raises(client.KubernetesError, match="get session walk: cannot reach the Kubernetes API"):
        sessions.get("walk")


def test_connect_tries_a_refused_front_door_again_and_not_a_refused_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`KubeSessions.connect` at `status.url` (the front door) sets `reconnect_seconds`; at a Pod's own
    `status.endpoint` a refusal stays final (the session moved; its status names where)."""
    sessions = unreachable_kube_sessions(tmp_path)
    pod = {"phase": "Ready", "endpoint": "http://10.0.0.7:8000"}
    door = {**pod, "url": "http://door.example/pools/default/walkers"}
    statuses = iter([door, pod])
    monkeypatch.setattr(sessions, "wait_ready", lambda name, timeout: next(statuses))
    monkeypatch.setattr(sessions, "token", lambda name, status: "t0ken")
    monkeypatch.setattr(client.SessionClient, "sync", lambda self: {})
    with sessions.connect("walk") as at_door, sessions.connect("walk") as at_pod:
        assert (at_door.endpoint, at_door.reconnect_seconds) == (door["url"], client.DEFAULT_RETRY_SECONDS)
        assert (at_pod.endpoint, at_pod.reconnect_seconds) == (pod["endpoint"], 0)


# ------------------------------------------------------------------------ retries, against a loopback server

Answer = tuple[int, dict[str, object], dict[str, str]]  # status, JSON body, headers
DROP = 0  # an answer's status that drops the connection instead


class ScriptedWorker(ThreadingHTTPServer):
    """A loopback HTTP server that answers each request with the next scripted answer (the last repeats)
    and records the request bodies; with `tls` (a certificate for `localhost`) it speaks https."""

    def __init__(self, answers: list[Answer], tls: KeyPair | None = None, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _ScriptedHandler)
        self.answers = answers
        self.bodies: list[dict[str, object]] = []
        self.tls = tls
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls.cert, tls.key)
            self.socket = context.wrap_socket(self.socket, server_side=True)

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"https://localhost:{self.server_address[1]}"
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ScriptedHandler(BaseHTTPRequestHandler):
    server: ScriptedWorker

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self.server.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
        index = min(len(self.server.bodies), len(self.server.answers)) - 1
        status, body, headers = self.server.answers[index]
        if status == DROP:  # the connection goes without an answer (a front door replica killed)
            self.close_connection = True
            return
        payload = json.dumps(body).encode() if status >= 400 else bytes(9 * 2 * 2 * 3)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def scripted(answers: list[Answer], tls: KeyPair | None = None, port: int = 0) -> Iterator[ScriptedWorker]:
    server = ScriptedWorker(answers, tls, port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def recovering(retry_after: str) -> Answer:
    error = worker_errors.PlacementRecovering("no record yet; retry")
    return error.status, error.envelope(), {"retry-after": retry_after, "content-type": "application/json"}


CHUNK_0: Answer = (
    200,
    {},
    {
        "content-type": "application/octet-stream",
        "ardiff-frame-shape": "9,2,2,3",
        "ardiff-chunk-metadata": json.dumps(
            {"session_id": "walk", "request_id": "r0", "chunk_index": 0, "applied_event_ids": []}
        ),
    },
)


def test_an_https_worker_is_verified_against_the_ca_file(tmp_path: Path) -> None:
    """Issue 23 item 9: a pool with spec.tls answers at https; the client trusts the CA it is given."""
    ca = CertificateAuthority(tmp_path / "pki", common_name="pool-ca")
    pair = ca.issue("worker", common_name="localhost", server=True, dns_names=["localhost"])
    with scripted([CHUNK_0], tls=pair) as server:
        with client.SessionClient("walk", server.url, "t0ken", ca_file=ca.cert_path) as session:
            assert session.tick([client.hold("w")], request_id="r0").metadata.chunk_index == 0
        with (
            client.SessionClient("walk", server.url, "t0ken") as session,
            pytest.raises(client.WorkerUnreachable, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            session.tick([client.hold("w")])
        assert len(server.bodies) == 1


def test_retryable_codes_are_exactly_the_503s_of_the_contract() -> None:
    retryable = {code for code, cls in client.ERRORS_BY_CODE.items() if cls.retryable}
    assert retryable == {code for code, status in contract_codes().items() if status == 503}
    assert retryable == {"not_ready", "placement_recovering", "resuming"}
    for error in worker_error_instances():  # the worker sends Retry-After on exactly those
        assert (error.retry_after_seconds is not None) == (error.code in retryable), error.code


def test_a_retryable_answer_is_retried_with_the_same_request_until_it_succeeds() -> None:
    with scripted([recovering("0"), recovering("0"), CHUNK_0]) as server:
        with client.SessionClient("walk", server.url, "t0ken", retry_seconds=5) as session:
            chunk = session.tick([client.hold("w")], request_id="r0")
        assert chunk.metadata.chunk_index == 0
        assert session.next_chunk_index == 1
        assert len(server.bodies) == 3
        assert all(body == server.bodies[0] for body in server.bodies)  # the same tick: idempotent retries


def test_retries_honour_retry_after_and_give_up_at_the_bound_saying_so() -> None:
    with scripted([recovering("1")]) as server:
        with client.SessionClient("walk", server.url, "t0ken", retry_seconds=2.5) as session:
            started = time.monotonic()
            with pytest.raises(client.PlacementRecovering) as raised:
                session.tick([client.hold("w")])
            waited = time.monotonic() - started
        assert len(server.bodies) == 3  # at 0, 1 and 2 s; a third pause would pass the 2.5 s bound
        assert 2.0 <= waited < 2.5
        assert "after retrying for 2.5 s" in raised.value.message
        assert raised.value.retry_after == 1.0
        assert session.next_chunk_index == 0


def test_no_retry_when_the_bound_is_zero_or_the_code_is_final() -> None:
    with scripted([recovering("0"), CHUNK_0]) as server:
        session = client.SessionClient("walk", server.url, "t0ken", retry_seconds=0)
        with session, pytest.raises(client.PlacementRecovering):
            session.tick([client.hold("w")])
        assert len(server.bodies) == 1
    unknown = worker_errors.UnknownSession("no session 'walk'")
    with scripted([(404, unknown.envelope(), {"content-type": "application/json"}), CHUNK_0]) as server:
        session = client.SessionClient("walk", server.url, "t0ken")
        with session, pytest.raises(client.UnknownSession):
            session.tick([client.hold("w")])
        assert len(server.bodies) == 1


def test_a_session_is_ticked_at_its_front_door_url_when_its_status_has_one() -> None:
    """Issue 37: `status.url` (the front door) wins over `status.endpoint` (the Pod)."""
    ready = {
        "phase": "Ready",
        "endpoint": "http://10.1.2.3:8000",
        "url": "https://worlds.example.com/pools/d/p",
    }
    assert client.base_url(ready) == "https://worlds.example.com/pools/d/p"
    assert client.base_url({**ready, "url": None}) == "http://10.1.2.3:8000"
    assert client.base_url({k: v for k, v in ready.items() if k != "url"}) == "http://10.1.2.3:8000"


def test_a_moved_session_at_the_front_door_is_retried_there_at_once() -> None:
    """The front door answers a session that moved in flight with 503 `resuming`, `Retry-After: 0`, and a
    misdirected error without an endpoint (a front door names no Pod) is asked again at the same base."""
    moved = worker_errors.Resuming("the session moved to another pod; retry now")
    resuming: Answer = (503, moved.envelope(), {"retry-after": "0", "content-type": "application/json"})
    nowhere = (
        421,
        {"error": {"code": "misdirected", "message": "moved"}},
        {"content-type": "application/json"},
    )
    with scripted([resuming, nowhere, CHUNK_0]) as server:
        with client.SessionClient("walk", server.url, "t0ken") as session:
            started = time.monotonic()
            chunk = session.tick([client.hold("w")], request_id="r0")
            assert time.monotonic() - started < 1.0  # no pause: the retry goes out at once
            assert session.endpoint == server.url
        assert chunk.metadata.chunk_index == 0
        assert len(server.bodies) == 3


def test_an_address_that_refuses_for_a_moment_is_tried_again_within_reconnect_seconds() -> None:
    """A front door's Service can lead a new connection to a replica killed a moment ago until its endpoints
    update (issue 37's CI: refused twice in a row). With `reconnect_seconds` a refused connection (nothing
    was sent) is tried again with a short backoff until it answers; without it (a Pod's own address, where
    a refusal means the session moved) the refusal is final at once, after the one retry."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with client.SessionClient("walk", url, "t0ken") as session:
        started = time.monotonic()
        with pytest.raises(client.WorkerUnreachable, match="ConnectError"):
            session.tick([client.hold("w")])
        assert time.monotonic() - started < 1.0
    with client.SessionClient("walk", url, "t0ken", reconnect_seconds=0.5) as session:
        started = time.monotonic()
        with pytest.raises(client.WorkerUnreachable, match=r"still refused after 0\.5 s"):
            session.tick([client.hold("w")])
        assert 0.5 <= time.monotonic() - started < 2.0
    servers: list[ScriptedWorker] = []

    def open_late() -> None:
        servers.append(server := ScriptedWorker([CHUNK_0], port=port))
        server.serve_forever()

    late = threading.Timer(1.0, open_late)
    late.start()
    try:
        with client.SessionClient("walk", url, "t0ken", reconnect_seconds=10) as session:
            chunk = session.tick([client.hold("w")], request_id="r0")
        assert chunk.metadata.chunk_index == 0
        assert session.transport_retries >= 3
        assert len(servers[0].bodies) == 1
    finally:
        late.cancel()
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_connection_lost_in_flight_is_sent_again_once_and_waits_for_the_first_copy() -> None:
    """A front door replica killed mid-request (issue 37): the tick goes out again at once, the worker still
    running the first copy answers `tick_in_progress`, and the client waits for it, then gets the chunk (the
    same request id replays it). A second transport error is final."""
    busy = worker_errors.TickInProgress("another tick of the session is under way")
    in_progress: Answer = (409, busy.envelope(), {"content-type": "application/json"})
    with scripted([(DROP, {}, {}), in_progress, in_progress, CHUNK_0]) as server:
        with client.SessionClient("walk", server.url, "t0ken") as session:
            chunk = session.tick([client.hold("w")], request_id="r0")
        assert chunk.metadata.chunk_index == 0
        assert session.transport_retries == 1
        assert len(server.bodies) == 4
        assert all(body == server.bodies[0] for body in server.bodies)
    with scripted([(DROP, {}, {})]) as server:
        session = client.SessionClient("walk", server.url, "t0ken")
        with session, pytest.raises(client.WorkerUnreachable):
            session.tick([client.hold("w")])
        assert len(server.bodies) == 2
    with scripted([in_progress, CHUNK_0]) as server:  # without a lost connection, tick_in_progress is final
        session = client.SessionClient("walk", server.url, "t0ken")
        with session, pytest.raises(client.TickInProgress):
            session.tick([client.hold("w")])
