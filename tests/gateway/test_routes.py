"""The front door's decisions from headers alone (`ardiff.gateway.routes`, issue 37): which requests are
session requests, and what each state of a session makes the edge do. Pure functions, no processes."""

from __future__ import annotations

import hashlib

import pytest

from ardiff.gateway.routes import (
    MOVED,
    NO_POD,
    NOT_A_SESSION_ROUTE,
    RECOVERING,
    REFUSED,
    Answer,
    Forward,
    RouteKind,
    decide,
    parse_request,
)
from ardiff.kv.placement_gateway import SessionRoute
from ardiff.kv.records import PodRecord, SessionState
from ardiff.wire import ErrorCode, front_door_url

TOKEN = "the-token"
TOKEN_SHA = hashlib.sha256(TOKEN.encode()).hexdigest()
BASE = "/pools/tenant-a/worlds"
NOW = 1_000_000


def pod(name: str = "w-1", *, epoch: int = 7, lease: int = NOW + 5_000, endpoint: str = "") -> PodRecord:
    return PodRecord(
        name=name,
        capacity=2,
        used=1,
        endpoint=endpoint or f"http://10.0.0.9:8000/{name}",
        epoch=epoch,
        lease_expires_ms=lease,
        draining=False,
        address="10.0.0.9:8000",
    )


def route(state: SessionState | None, *, on: PodRecord | None = None, bound: str = "w-1", known=True):
    return SessionRoute(
        session="walk",
        state=state,
        bound_pod=bound if state is not None else "",
        pod_epoch=7,
        token_sha256=TOKEN_SHA if state is not None else "",
        pod=on,
        now_ms=NOW,
        pool_ca_sha256="" if known else None,
    )


def request(method: str, path: str, *, token: str | None = TOKEN, websocket: bool = False):
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    if websocket:
        headers["upgrade"] = "websocket"
    return parse_request(method, path, headers)


def test_the_pool_base_is_the_one_the_wire_declares() -> None:
    assert front_door_url("https://worlds.example.com/", "tenant-a", "worlds") == (
        f"https://worlds.example.com{BASE}"
    )


@pytest.mark.parametrize(
    ("method", "path", "kind", "session"),
    [
        ("POST", "/v1/sessions/walk/ticks", RouteKind.TICK, "walk"),
        ("POST", "/v1/sessions/walk/reset", RouteKind.RESET, "walk"),
        ("POST", "/v1/sessions/walk/rewind", RouteKind.REWIND, "walk"),
        ("GET", "/v1/sessions/walk", RouteKind.READ, "walk"),
        ("DELETE", "/v1/sessions/walk", RouteKind.DELETE, "walk"),
        ("GET", "/v1/sessions/walk/stream?format=webp", RouteKind.STREAM, "walk"),
        ("GET", "/v1/sessions/walk/openpi", RouteKind.OPENPI, "walk"),
        ("GET", "/v1/realtime/video?session=walk", RouteKind.REALTIME, "walk"),
    ],
)
def test_every_session_route_is_found_under_the_pool_base(method, path, kind, session) -> None:
    found = request(method, BASE + path)
    assert found is not None
    assert (found.namespace, found.pool, found.session, found.kind) == ("tenant-a", "worlds", session, kind)
    assert found.token_sha256 == TOKEN_SHA
    assert found.names_valid


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/metrics"),
        ("GET", "/healthz"),
        ("GET", f"{BASE}/v1/sessions"),  # the pod's listing
        ("GET", f"{BASE}/metrics"),
        ("GET", f"{BASE}/readyz"),
        ("GET", f"{BASE}/internal/v1/sessions/walk/export"),
        ("POST", f"{BASE}/internal/v1/sessions/walk/prefetch"),
        ("GET", f"{BASE}/internal/v1/kept/walk/3"),
        ("GET", f"{BASE}/v1/sessions/walk/ticks"),  # a tick is a POST
        ("PUT", f"{BASE}/v1/sessions/walk"),
        ("GET", f"{BASE}/v1/sessions/walk/stream/extra"),
        ("GET", f"{BASE}/v1/realtime/video"),  # no session
        ("GET", f"{BASE}/v1/realtime/video?session=a&session=b"),
        ("GET", "/pools/tenant-a/v1/sessions/walk"),  # no pool
        ("GET", "/v1/sessions/walk"),  # no base
    ],
)
def test_anything_else_is_not_a_session_request(method, path) -> None:
    assert request(method, path) is None


def test_a_malformed_name_is_found_but_invalid_and_openpi_keys_count_as_tokens() -> None:
    for path in (f"{BASE}/v1/sessions/Walk_1", "/pools/Tenant/worlds/v1/sessions/walk"):
        found = request("GET", path)
        assert found is not None
        assert not found.names_valid
    api_key = parse_request("GET", f"{BASE}/v1/sessions/walk/openpi", {"authorization": f"Api-Key {TOKEN}"})
    assert api_key is not None
    assert api_key.token_sha256 == TOKEN_SHA
    for header in ("Basic abc", "Bearer ", "Bearer"):
        found = parse_request("GET", f"{BASE}/v1/sessions/walk", {"authorization": header})
        assert found is not None
        assert found.token_sha256 is None


def test_a_placed_session_on_a_live_pod_goes_to_its_address() -> None:
    verdict = decide(request("POST", f"{BASE}/v1/sessions/walk/ticks"), route(SessionState.PLACED, on=pod()))
    assert verdict == Forward("w-1", "10.0.0.9:8000", None)
    tls = pod(endpoint="https://w-1.worlds-workers.tenant-a.svc.cluster.local:8000")
    verdict = decide(request("POST", f"{BASE}/v1/sessions/walk/ticks"), route(SessionState.PLACED, on=tls))
    assert verdict == Forward("w-1", "10.0.0.9:8000", "w-1.worlds-workers.tenant-a.svc.cluster.local")


@pytest.mark.parametrize("token", [None, "another-token"])
@pytest.mark.parametrize("state", [None, *SessionState])
def test_no_token_or_a_wrong_one_is_the_same_401_whatever_the_session(token, state) -> None:
    verdict = decide(request("GET", f"{BASE}/v1/sessions/walk", token=token), route(state, on=pod()))
    assert verdict == REFUSED


def test_a_store_without_the_pools_record_is_recovering_for_every_unknown_name() -> None:
    for token in (TOKEN, None):
        verdict = decide(request("GET", f"{BASE}/v1/sessions/walk", token=token), route(None, known=False))
        assert verdict == RECOVERING
        assert (verdict.status, verdict.retry_after) == (503, 1)


def test_a_suspended_session_is_resuming_with_a_demand_and_a_suspending_one_without() -> None:
    tick = request("POST", f"{BASE}/v1/sessions/walk/ticks")
    suspended = decide(tick, route(SessionState.SUSPENDED))
    assert isinstance(suspended, Answer)
    assert (suspended.status, suspended.body["error"]["code"], suspended.retry_after) == (503, "resuming", 1)
    assert suspended.demand_resume
    suspending = decide(tick, route(SessionState.SUSPENDING, on=pod(lease=NOW - 1)))
    assert isinstance(suspending, Answer)
    assert suspending.body["error"]["code"] == "resuming"
    assert not suspending.demand_resume


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (SessionState.CLOSED, ErrorCode.SESSION_CLOSED),
        (SessionState.EVICTED, ErrorCode.SESSION_EVICTED),
        (SessionState.LOST, ErrorCode.SESSION_EVICTED),
    ],
)
def test_a_session_without_a_slot_is_gone_at_the_edge(state, code) -> None:
    verdict = decide(request("POST", f"{BASE}/v1/sessions/walk/ticks"), route(state))
    assert isinstance(verdict, Answer)
    assert (verdict.status, verdict.body["error"]["code"], verdict.retry_after) == (
        code.status,
        code.code,
        None,
    )


def test_a_placed_session_whose_pod_is_gone_or_replaced_is_retryable() -> None:
    tick = request("POST", f"{BASE}/v1/sessions/walk/ticks")
    for gone in (pod(lease=NOW), pod(epoch=8), None):
        verdict = decide(tick, route(SessionState.PLACED, on=gone))
        assert isinstance(verdict, Answer)
        assert (verdict.status, verdict.body["error"]["code"], verdict.retry_after) == (503, "not_ready", 1)


def test_a_delete_of_a_session_without_a_pod_goes_to_any_live_pod() -> None:
    other = pod("w-2")
    delete = request("DELETE", f"{BASE}/v1/sessions/walk")
    assert delete is not None
    assert delete.any_pod_answers
    assert decide(delete, route(SessionState.CLOSED, on=other)) == Forward("w-2", "10.0.0.9:8000", None)
    assert decide(delete, route(SessionState.CLOSED)) == Answer.of(
        ErrorCode.SESSION_CLOSED, "session 'walk' was closed"
    )


def test_a_socket_without_a_token_is_authenticated_by_the_worker_and_tells_the_edge_nothing() -> None:
    for path in ("/v1/sessions/walk/stream", "/v1/realtime/video?session=walk"):
        socket = request("GET", BASE + path, token=None, websocket=True)
        assert socket is not None
        assert socket.authenticates_in_band
        for state in (None, *SessionState):
            assert decide(socket, route(state, on=pod())) == Forward("w-1", "10.0.0.9:8000", None)
            assert decide(socket, route(state, on=pod(lease=NOW))) == NO_POD
            assert decide(socket, route(state)) == NO_POD
    # Not a socket, or not a route whose first message carries a token: the edge checks it.
    assert not request("GET", f"{BASE}/v1/sessions/walk/stream", token=None).authenticates_in_band
    openpi = request("GET", f"{BASE}/v1/sessions/walk/openpi", token=None, websocket=True)
    assert not openpi.authenticates_in_band
    assert decide(openpi, route(SessionState.PLACED, on=pod())) == REFUSED


def test_the_moved_answer_names_no_pod_and_asks_for_an_immediate_retry() -> None:
    assert (MOVED.status, MOVED.retry_after, MOVED.body["error"]["code"]) == (503, 0, "resuming")
    assert "endpoint" not in MOVED.body["error"]
    assert NOT_A_SESSION_ROUTE.status == 404
