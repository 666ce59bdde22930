"""What the front door does with one request, from its headers alone (issue 37; docs/contracts.md
"Front door").

`parse_request` finds the session a request names: every route of contracts §4 that names a session, under
the pool's base `/pools/<namespace>/<pool>` (`ardiff.wire.front_door_url`); anything else is not a session
request and is 404 at the edge. `decide` turns what the placement store holds of the session
(`SessionRoute`) into the answer a worker would give, without any worker seeing the request: its pod as the
destination, or an error in the worker's envelope (401 for a wrong or missing token, an unknown session and
a malformed name alike; 503 `resuming` with a resume demand for a suspended session; retryable 503s while
its pod is gone or the store is away; 410 for a session that holds no slot any more). Pure functions: the
gRPC side (`ardiff.gateway.picker`) reads the store and speaks Envoy's protocol.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ardiff.kv.placement_gateway import SessionRoute
from ardiff.kv.records import PoolId, SessionState
from ardiff.wire import FRONT_DOOR_POOLS, ErrorCode, error_envelope

_NAME = r"[^/?#]+"  # a path segment; names are checked against the DNS-label rule afterwards
_BASE = re.compile(rf"^/{FRONT_DOOR_POOLS}/(?P<namespace>{_NAME})/(?P<pool>{_NAME})(?P<rest>/[^?#]*)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class RouteKind(StrEnum):
    """The session routes of docs/contracts.md §4 (and vllm-omni's realtime video socket)."""

    TICK = "tick"
    RESET = "reset"
    REWIND = "rewind"
    READ = "read"
    DELETE = "delete"
    STREAM = "stream"
    OPENPI = "openpi"
    REALTIME = "realtime"


# (method, path under the pool's base with `{id}` for the session, kind); the realtime socket names its
# session in the query (`?session=<id>`), as vllm-omni clients append `/v1/realtime/video` to a base URL.
_ROUTES: tuple[tuple[str, re.Pattern[str], RouteKind], ...] = tuple(
    (method, re.compile(f"^{path.replace('{id}', f'(?P<session>{_NAME})')}$"), kind)
    for method, path, kind in (
        ("POST", "/v1/sessions/{id}/ticks", RouteKind.TICK),
        ("POST", "/v1/sessions/{id}/reset", RouteKind.RESET),
        ("POST", "/v1/sessions/{id}/rewind", RouteKind.REWIND),
        ("GET", "/v1/sessions/{id}", RouteKind.READ),
        ("DELETE", "/v1/sessions/{id}", RouteKind.DELETE),
        ("GET", "/v1/sessions/{id}/stream", RouteKind.STREAM),
        ("GET", "/v1/sessions/{id}/openpi", RouteKind.OPENPI),
        ("GET", "/v1/realtime/video", RouteKind.REALTIME),
    )
)
# The sockets a browser opens: it cannot set `Authorization` on a WebSocket, so its token comes in the first
# message, which the worker reads (the stream's `auth`, the realtime socket's `session.start`).
_IN_BAND_AUTH = frozenset({RouteKind.STREAM, RouteKind.REALTIME})


@dataclass(frozen=True)
class SessionRequest:
    """A request on a session route: its pool and session (as written in the URL: not yet checked), the
    route, and the bearer token's hash (None without one)."""

    namespace: str
    pool: str
    session: str
    kind: RouteKind
    token_sha256: str | None
    upgrade: bool

    @property
    def names_valid(self) -> bool:
        return all(_DNS_LABEL.match(name) for name in (self.namespace, self.pool, self.session))

    @property
    def pool_id(self) -> PoolId:
        return PoolId(self.namespace, self.pool)

    @property
    def authenticates_in_band(self) -> bool:
        """A WebSocket upgrade without a token on a route whose first message may carry it: the worker
        authenticates it, so the edge cannot (it never reads a body)."""
        return self.token_sha256 is None and self.upgrade and self.kind in _IN_BAND_AUTH

    @property
    def any_pod_answers(self) -> bool:
        """A request any live pod of the pool answers as the session's own would, when the session has no
        pod: a `DELETE` (idempotent: 200 for a session closed, evicted or suspended) and an in-band
        authenticated socket (the worker checks the token in its first message)."""
        return self.kind is RouteKind.DELETE or self.authenticates_in_band


def bearer_sha256(authorization: str | None) -> str | None:
    """The SHA-256 hex of the bearer token in an `Authorization` header (`Bearer` or openpi's `Api-Key`);
    None without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() not in ("bearer", "api-key") or not token.strip():
        return None
    return hashlib.sha256(token.strip().encode()).hexdigest()


def parse_request(method: str, path: str, headers: dict[str, str]) -> SessionRequest | None:
    """The session request `method` `path` (with its query) makes, or None: not a session route."""
    parts = urlsplit(path)
    base = _BASE.match(parts.path)
    if base is None:
        return None
    for route_method, pattern, kind in _ROUTES:
        found = pattern.match(base["rest"])
        if found is None or method != route_method:
            continue
        if kind is RouteKind.REALTIME:
            sessions = parse_qs(parts.query).get("session", [])
            if len(sessions) != 1:
                return None
            session = sessions[0]
        else:
            session = found["session"]
        return SessionRequest(
            namespace=base["namespace"],
            pool=base["pool"],
            session=session,
            kind=kind,
            token_sha256=bearer_sha256(headers.get("authorization")),
            upgrade=headers.get("upgrade", "").lower() == "websocket",
        )
    return None


@dataclass(frozen=True)
class Forward:
    """Send the request to this pod: `address` (`<ip>:<port>`) and, for a pod that serves https, the name
    its certificate carries (`tls_host`, the SNI and the name verified); `cluster`: the bundled Envoy's
    cluster to it (the picker's to choose: it knows which clusters exist)."""

    pod: str
    address: str
    tls_host: str | None = None
    cluster: str = ""


@dataclass(frozen=True)
class Answer:
    """Answer at the edge: the HTTP status, the envelope, `Retry-After` (seconds, retryable codes only),
    and whether the answer records a demand to resume the session first."""

    status: int
    body: dict[str, Any]
    retry_after: int | None = None
    demand_resume: bool = False

    @classmethod
    def of(cls, code: ErrorCode, message: str, *, demand_resume: bool = False) -> Answer:
        return cls(
            code.status,
            error_envelope(code.code, code.status, message),
            retry_after=1 if code.retryable else None,
            demand_resume=demand_resume,
        )


NOT_A_SESSION_ROUTE = Answer(
    404, error_envelope("not_found", 404, "not a session route of the front door (docs/contracts.md)")
)
REFUSED = Answer.of(ErrorCode.UNAUTHORIZED, "missing or wrong bearer token for this session")
# Redis away (or not answering): what a worker answers then.
STORE_UNAVAILABLE = Answer.of(ErrorCode.NOT_READY, "the placement store is unavailable; retry")
RECOVERING = Answer.of(
    ErrorCode.PLACEMENT_RECOVERING, "the placement store lost its data and is rebuilding it; retry"
)
# The picker down or failing (Envoy's own answer, `ardiff.gateway.envoy_config`).
PICKER_UNAVAILABLE = Answer.of(ErrorCode.NOT_READY, "the front door cannot place requests right now; retry")
# A worker's 421 (the session moved while the request was in flight), rewritten so that no Pod address leaves
# the front door: the client's retry is placed afresh, at once.
MOVED_FROM_STATUS = ErrorCode.MISDIRECTED.status
MOVED = dataclasses.replace(
    Answer.of(ErrorCode.RESUMING, "the session moved to another pod; retry now"), retry_after=0
)
# A third-party gateway's subset hint (GIE proposal 004) leaves out the session's pod: the protocol's 503.
OUTSIDE_SUBSET = Answer.of(
    ErrorCode.NOT_READY, "the session's pod is not among the endpoints this gateway allows"
)
# A pod serving https, and no cluster trusting its pool's CA (no CA in the pool's record, or a picker
# without a directory for the bundled Envoy's TLS clusters).
NO_TLS_CLUSTER = Answer.of(
    ErrorCode.NOT_READY, "the front door has no way to verify this pool's pods yet; retry"
)
# An in-band authenticated socket when no pod of the pool is serving (the edge cannot tell who asks).
NO_POD = Answer.of(ErrorCode.NOT_READY, "no pod of this pool is serving; retry")


def decide(request: SessionRequest, route: SessionRoute) -> Forward | Answer:
    """What the front door does with `request`, given what the store holds of its session."""
    if request.authenticates_in_band:
        # The worker checks the token in the first message: the edge tells nothing of the session (no
        # oracle of names), it only finds a pod that answers for it.
        if route.pod is not None and route.pod_live:
            return _forward(route)
        return NO_POD
    presented = request.token_sha256
    if route.state is None or presented is None or not hmac.compare_digest(presented, route.token_sha256):
        if route.state is None and not route.pool_known:
            # The store lost its data (or no pod registered yet): the session's own client retries until the
            # operator has rebuilt its record, as at a worker.
            return RECOVERING
        return REFUSED
    if route.served_by_pod or (request.any_pod_answers and route.pod is not None and route.pod_live):
        return _forward(route)
    name, state = request.session, route.state
    if state is SessionState.SUSPENDED or state is SessionState.SUSPENDING:
        return Answer.of(
            ErrorCode.RESUMING,
            f"session {name!r} is {state.value}; it is being resumed, retry",
            demand_resume=state is SessionState.SUSPENDED,
        )
    if state is SessionState.CLOSED:
        return Answer.of(ErrorCode.SESSION_CLOSED, f"session {name!r} was closed")
    if state is SessionState.EVICTED:
        return Answer.of(
            ErrorCode.SESSION_EVICTED, f"session {name!r} was evicted to make room; it is re-placed later"
        )
    if state is SessionState.LOST:
        return Answer.of(
            ErrorCode.SESSION_EVICTED, f"session {name!r} lost its pod; it is re-placed with reset_required"
        )
    # Placed, but its pod's lease lapsed (or the pod was replaced): the operator re-places it within a round.
    return Answer.of(ErrorCode.NOT_READY, f"the pod of session {name!r} is not serving; retry")


def _forward(route: SessionRoute) -> Forward | Answer:
    pod = route.pod
    assert pod is not None
    if not pod.address:
        return Answer.of(
            ErrorCode.NOT_READY, f"pod {pod.name} publishes no address for the front door (an older worker)"
        )
    endpoint = urlsplit(pod.endpoint)
    tls_host = endpoint.hostname if endpoint.scheme == "https" else None
    return Forward(pod.name, pod.address, tls_host)
