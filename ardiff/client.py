"""The Python client: create a session, wait for it, tick it, reset it, close it.

Two parts, so that a caller that already has an endpoint and a token needs no Kubernetes client:

- `SessionClient` (httpx only) ticks one session on its worker: `POST /v1/sessions/{id}/ticks` with the
  session's bearer token (docs/contracts.md §4), and rewinds it to a kept chunk (`rewind(n)`, issue 26). It
  keeps the next chunk index, follows a 421 `misdirected` to the endpoint the worker names, decodes the raw
  frames (`FxHxWx3` uint8, shape in `ardiff-frame-shape`) and turns every error envelope into a typed
  exception (`WorkerAPIError` subclasses, one per code, carrying the HTTP status and the envelope's extras
  such as `expected_chunk_index`). A session whose KV is gone answers
  `ResetRequired`; only an explicit `reset()` starts it over — the client never resets on its own.
- `KubeSessions` (the `kubernetes` package) handles the `ARDiffusionSession` resources: create, wait for
  `Ready`, read `status.endpoint` and the token Secret (`status.tokenSecretRef`), and `connect()` a
  `SessionClient`; deleting the resource closes the session and frees its KV. `fork(parent, child, at=n)`
  creates a session that starts at a kept chunk of another (`spec.forkFrom`, issue 26).

    sessions = KubeSessions("default")
    sessions.create("walk", pool="tiny-world", prompt="a misty forest", keep_chunks=16)
    with sessions.connect("walk") as walk:        # waits for Ready
        chunk = walk.tick([camera("w", "w", "wj")])
        chunk.frames.shape                         # (F, H, W, 3), uint8
    sessions.fork("walk", "walk-b", at=12)        # walk's state before its chunk 12, as a new session
    sessions.delete("walk")

`camera(...)` builds LingBot-World camera controls; `write_mp4()` writes frames as an H.264 MP4.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self, TypedDict, Unpack

import httpx
import numpy as np

from ardiff.errors import ArdiffError
from ardiff.wire import GROUP, OCTET_STREAM, SESSION_PLURAL, VERSION, ErrorCode, WireError

LINGBOT_CAMERA_SCHEMA = "lingbot.camera_actions.v1"
LINGBOT_CAMERA_KEYS = frozenset("wasdijkl")  # W/A/S/D move, I/J/K/L look
LINGBOT_FRAMES_PER_CHUNK = 3  # key states per tick: one per latent frame of an AR block
MAX_MISDIRECTIONS = 3
DEFAULT_RETRY_SECONDS = 30.0  # how long SessionClient retries retryable answers (503) before it gives up
TERMINAL_PHASES = ("Failed", "Expired")


def is_ready(status: Mapping[str, Any]) -> bool:
    """A session's status says it can be ticked: `Ready` with an endpoint."""
    return status.get("phase") == "Ready" and bool(status.get("endpoint"))


def base_url(status: Mapping[str, Any]) -> str:
    """Where a Ready session's routes go: `status.url`, its base at the front door (the same whichever Pod
    holds it; issue 37), else `status.endpoint`, its Pod's own address (reachable inside the cluster)."""
    return str(status.get("url") or status["endpoint"])


# ----------------------------------------------------------------------------------------------- errors


class WorkerAPIError(WireError):
    """An error answer of a worker (`{"error": {code, message, type, param, ...extras}}`). A subclass per
    `ErrorCode` (`ardiff.wire`: its code, status and `retryable`, the codes `SessionClient` retries within
    `retry_seconds`); an answer with an unknown code or no envelope is a `WorkerAPIError` itself."""

    code = "worker_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        extra: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status  # type: ignore[misc]  # the answer's own status, if it differs
        self.param = param
        self.extra = dict(extra or {})
        self.retry_after = retry_after  # seconds, from the answer's `Retry-After`


class InvalidTick(WorkerAPIError, wire=ErrorCode.INVALID_TICK):
    """The tick's body or a header is malformed; `param` names the field."""


class Unauthorized(WorkerAPIError, wire=ErrorCode.UNAUTHORIZED):
    """The token is not the session's (or the session does not exist)."""


class UnknownSession(WorkerAPIError, wire=ErrorCode.UNKNOWN_SESSION):
    """No such session on that worker."""


class ChunkOutOfOrder(WorkerAPIError, wire=ErrorCode.CHUNK_OUT_OF_ORDER):
    """The tick's `chunk_index` is not the next one: `expected_chunk_index` is."""

    @property
    def expected_chunk_index(self) -> int:
        return int(self.extra["expected_chunk_index"])


class ResetRequired(WorkerAPIError, wire=ErrorCode.RESET_REQUIRED):
    """The session's KV cache is gone (pod lost, evicted, failed forward): call `reset()` to start over."""


class TickInProgress(WorkerAPIError, wire=ErrorCode.TICK_IN_PROGRESS):
    """Another tick of the session is under way."""


class MaxChunksReached(WorkerAPIError, wire=ErrorCode.MAX_CHUNKS_REACHED):
    """The session reached its `max_chunks`."""

    @property
    def max_chunks(self) -> int:
        return int(self.extra["max_chunks"])


class SessionEvicted(WorkerAPIError, wire=ErrorCode.SESSION_EVICTED):
    """The session left this pod (evicted or its pod lost); it is re-placed, then needs a reset."""


class SessionClosed(WorkerAPIError, wire=ErrorCode.SESSION_CLOSED):
    """The session was closed."""


class BodyTooLarge(WorkerAPIError, wire=ErrorCode.BODY_TOO_LARGE):
    """The request body exceeds the worker's limit."""


class Misdirected(WorkerAPIError, wire=ErrorCode.MISDIRECTED):
    """The session is on another pod: `endpoint` (`SessionClient` follows it); None when the answer came
    through a front door, which names no Pod (the same base is asked again)."""

    @property
    def endpoint(self) -> str | None:
        endpoint = self.extra.get("endpoint")
        return str(endpoint) if endpoint else None


class AtCapacity(WorkerAPIError, wire=ErrorCode.AT_CAPACITY):
    """The worker holds as many sessions as it can."""


class TooManyRequests(WorkerAPIError, wire=ErrorCode.TOO_MANY_REQUESTS):
    """The session has as many requests under way on its worker as it takes at once (final for this one)."""


class NotReady(WorkerAPIError, wire=ErrorCode.NOT_READY):
    """The worker is loading or draining, or cannot reach the placement store (retryable)."""


class PlacementRecovering(WorkerAPIError, wire=ErrorCode.PLACEMENT_RECOVERING):
    """The placement store lost its data and the session's binding is being rebuilt (retryable)."""


class Resuming(WorkerAPIError, wire=ErrorCode.RESUMING):
    """The session is suspended and is being resumed (retryable; its new pod may then answer 421)."""


class Rewound(WorkerAPIError, wire=ErrorCode.REWOUND):
    """The session resumed from an older snapshot: it continues at `expected_chunk_index`; chunks the caller
    holds from that index on are superseded (ticking again with the same controls gives the same frames)."""

    @property
    def expected_chunk_index(self) -> int:
        return int(self.extra["expected_chunk_index"])


class ChunkNotKept(WorkerAPIError, wire=ErrorCode.CHUNK_NOT_KEPT):
    """A rewind named a chunk the session does not keep (its message lists the kept ones; a session keeps
    chunks only with `spec.history.keepChunks`, and never chunk 0: that is a `reset()`)."""

    @property
    def kept_chunks(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.extra["kept_chunks"])


class ForwardFailed(WorkerAPIError, wire=ErrorCode.FORWARD_FAILED):
    """The forward failed; the worker closed the session, which now needs a reset."""


# Every class above, by its code (a test checks it covers `ErrorCode`, and the worker's answers, exactly).
ERRORS_BY_CODE: dict[str, type[WorkerAPIError]] = {cls.code: cls for cls in WorkerAPIError.__subclasses__()}


class WorkerUnreachable(ArdiffError):
    """No answer from the endpoint (its pod is gone or restarting); the session's status says where next."""

    code = "worker_unreachable"


class SessionFailed(ArdiffError):
    """The session resource reached a phase it does not leave by itself (`Failed`, `Expired`)."""

    code = "session_failed"


class WaitTimeout(ArdiffError):
    code = "timeout"


class KubernetesError(ArdiffError):
    """The Kubernetes API refused a request (`status` is its HTTP status; 422 for an invalid resource)."""

    code = "kubernetes_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class SessionNotFound(KubernetesError):
    code = "session_not_found"


class InvalidSession(KubernetesError):
    code = "invalid_session"


def error_from_response(response: httpx.Response) -> WorkerAPIError:
    """The typed exception of an error answer; an answer without the envelope keeps its status."""
    try:
        envelope = response.json()["error"]
        code, message = str(envelope["code"]), str(envelope["message"])
    except (ValueError, KeyError, TypeError):
        text = response.text[:200].strip() or response.reason_phrase
        return WorkerAPIError(f"HTTP {response.status_code}: {text}", status=response.status_code)
    extra = {k: v for k, v in envelope.items() if k not in ("code", "message", "type", "param")}
    cls = ERRORS_BY_CODE.get(code, WorkerAPIError)
    retry_after = response.headers.get("retry-after", "")
    error = cls(
        message,
        status=response.status_code,
        param=envelope.get("param"),
        extra=extra,
        retry_after=float(retry_after) if retry_after.isdigit() else None,
    )
    if cls is WorkerAPIError:
        error.code = code
    return error


# ---------------------------------------------------------------------------------------------- controls


def camera(*frames: str | Iterable[str]) -> dict[str, Any]:
    """One tick's LingBot-World camera control: the keys held in each latent frame.

    `camera("w", "w", "wj")`: forward, forward, forward while turning left. Each frame is a string of keys
    or a list of keys; `""` holds nothing. Keys: W/A/S/D move, I/J/K/L look (up/left/down/right).
    """
    states = [
        sorted(set(keys.lower() if isinstance(keys, str) else (k.lower() for k in keys))) for keys in frames
    ]
    if len(states) != LINGBOT_FRAMES_PER_CHUNK:
        raise ValueError(
            f"camera frames must hold {LINGBOT_FRAMES_PER_CHUNK} key states (one per latent frame), "
            f"got {len(states)}"
        )
    unknown = sorted({k for keys in states for k in keys} - LINGBOT_CAMERA_KEYS)
    if unknown:
        raise ValueError(f"camera keys must be among {''.join(sorted(LINGBOT_CAMERA_KEYS))}, got {unknown}")
    return {"track": "camera", "schema": LINGBOT_CAMERA_SCHEMA, "data": {"mode": "frames", "frames": states}}


def hold(keys: str) -> dict[str, Any]:
    """A camera control holding the same keys for the whole tick (`hold("w")`: walk forward)."""
    return camera(*[keys] * LINGBOT_FRAMES_PER_CHUNK)


# A short walk for demos: forward, look around, strafe.
CAMERA_TOUR: tuple[dict[str, Any], ...] = (
    hold("w"),
    camera("w", "wj", "wj"),
    hold("j"),
    camera("w", "w", "wl"),
    hold("d"),
    camera("wl", "wl", "w"),
    hold("i"),
    camera("s", "s", ""),
)


# ------------------------------------------------------------------------------------------------ frames


def decode_frames(body: bytes, shape_header: str) -> np.ndarray:
    """The raw body as `FxHxWx3` uint8, checked against `ardiff-frame-shape` (`F,H,W,3`)."""
    try:
        shape = tuple(int(n) for n in shape_header.split(","))
    except ValueError:
        raise ValueError(f"ardiff-frame-shape must be F,H,W,3, got {shape_header!r}") from None
    if len(shape) != 4 or shape[3] != 3 or min(shape) <= 0:
        raise ValueError(f"ardiff-frame-shape must be F,H,W,3 with positive sizes, got {shape_header!r}")
    expected = shape[0] * shape[1] * shape[2] * shape[3]
    if len(body) != expected:
        raise ValueError(f"a {shape_header} chunk has {expected} bytes, the body has {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def parse_server_timing(header: str) -> dict[str, float]:
    """`queue;dur=1.2, forward;dur=80.0` as {stage: milliseconds}."""
    stages = {}
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "dur" and name:
                stages[name] = float(value)
    return stages


@dataclass(frozen=True)
class ChunkMetadata:
    """The worker's echo of the tick (vllm-omni's `ARDiffusionChunkMetadata`)."""

    session_id: str
    request_id: str
    chunk_index: int
    applied_event_ids: tuple[int, ...]

    @classmethod
    def from_header(cls, header: str) -> ChunkMetadata:
        data = json.loads(header)
        return cls(
            session_id=str(data["session_id"]),
            request_id=str(data["request_id"]),
            chunk_index=int(data["chunk_index"]),
            applied_event_ids=tuple(int(i) for i in data.get("applied_event_ids") or ()),
        )


@dataclass(frozen=True)
class Chunk:
    """One tick's output: its frames, the metadata echo, the worker's timings (ms) and the round trip (s)."""

    frames: np.ndarray
    metadata: ChunkMetadata
    server_timing: Mapping[str, float]
    latency_s: float
    endpoint: str

    @property
    def server_ms(self) -> float:
        """Time spent inside the worker (queue + forward + decode + encode)."""
        return sum(self.server_timing.values())


def write_mp4(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], fps: int | None = None) -> Path:
    """Write `FxHxWx3` uint8 frames (or a sequence of chunks) as an H.264 MP4 (PyAV: the client extra)."""
    try:
        from ardiff.worker.encoding import FPS, encode_mp4
    except ImportError as exc:  # PyAV
        raise ArdiffError(f"writing MP4 needs PyAV ({exc}); pip install 'ardiff[client]'") from None
    video = np.concatenate(list(frames)) if not isinstance(frames, np.ndarray) else frames
    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8 or not len(video):
        raise ValueError(f"frames must be a non-empty FxHxWx3 uint8 array, got {video.dtype} {video.shape}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(encode_mp4(video, fps or FPS))
    return target


def write_strip(path: str | Path, frames: np.ndarray | Sequence[np.ndarray], count: int = 8) -> Path:
    """Write `count` frames taken evenly from the video (or a sequence of chunks) side by side as one PNG:
    a look at a rollout without a video player."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ArdiffError(f"writing PNG needs Pillow ({exc}); pip install 'ardiff[client]'") from None
    video = np.concatenate(list(frames)) if not isinstance(frames, np.ndarray) else frames
    if video.ndim != 4 or video.shape[-1] != 3 or video.dtype != np.uint8 or not len(video):
        raise ValueError(f"frames must be a non-empty FxHxWx3 uint8 array, got {video.dtype} {video.shape}")
    if count < 1:
        raise ValueError(f"strip count must be >= 1, got {count}")
    picks = np.linspace(0, len(video) - 1, num=min(count, len(video))).round().astype(int)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate(list(video[picks]), axis=1)).save(target, format="PNG")
    return target


# ----------------------------------------------------------------------------------- the tick part (HTTP)


@dataclass(frozen=True)
class RobotChunk:
    """One robot tick's output (a DreamZero session): its action chunk (float32, steps x 8: 7 joints and the
    gripper), the metadata echo, the worker's timings (ms) and the round trip (s)."""

    actions: np.ndarray
    metadata: ChunkMetadata
    server_timing: Mapping[str, float]
    latency_s: float


@dataclass(frozen=True)
class Rewind:
    """A rewind's answer: the session, the chunk it generates next, and the chunks it keeps now."""

    session: str
    chunk_index: int
    kept_chunks: tuple[int, ...]

    @classmethod
    def of_answer(cls, answer: Mapping[str, Any]) -> Rewind:
        return cls(
            session=str(answer["session"]),
            chunk_index=int(answer["chunk_index"]),
            kept_chunks=tuple(int(n) for n in answer["kept_chunks"]),
        )


@dataclass
class SessionClient:
    """Ticks one session; needs only its base URL (`endpoint`: the front door's `status.url`, or the pod's
    `status.endpoint`) and the session's token. An `https://` base is verified against `ca_file` (a pool
    with `spec.tls`: the CA that signed the pool's certificate, its Secret's `ca.crt`), else against the
    system's CAs or `SSL_CERT_FILE`. Through the front door a session that moves is retried there at once
    (its 503 `resuming` with `Retry-After: 0`); at a pod, a 421 is followed to the endpoint it names."""

    session_id: str
    endpoint: str
    token: str
    next_chunk_index: int = 0
    timeout: float = 120.0
    retry_seconds: float = DEFAULT_RETRY_SECONDS  # 0: never retry
    ca_file: str | Path | None = None
    http: httpx.Client = field(init=False, repr=False)
    transport_retries: int = field(default=0, init=False)  # requests sent again after a transport error

    def __post_init__(self) -> None:
        if not self.session_id or not self.endpoint or not self.token:
            raise ValueError(
                "session client session_id, endpoint and token must be non-empty, got "
                f"{self.session_id!r}, {self.endpoint!r}, {'<token>' if self.token else repr(self.token)}"
            )
        self.endpoint = self.endpoint.rstrip("/")
        verify = True if self.ca_file is None else ssl.create_default_context(cafile=str(self.ca_file))
        self.http = httpx.Client(timeout=None, verify=verify)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def _request(
        self, method: str, path: str, *, json_body: Any = None, headers: Mapping[str, str] | None = None
    ) -> httpx.Response:
        """One call, following `misdirected` answers to the endpoint they name and retrying retryable ones
        (`Retry-After` apart) for up to `retry_seconds`; errors become exceptions."""
        misdirections = 0
        give_up_at: float | None = None
        transport_failed = False
        while misdirections <= MAX_MISDIRECTIONS:
            url = f"{self.endpoint}/v1/sessions/{self.session_id}{path}"
            try:
                response = self.http.request(
                    method,
                    url,
                    json=json_body,
                    headers={"Authorization": f"Bearer {self.token}", **(headers or {})},
                    timeout=self.timeout,
                )
            except httpx.TransportError as exc:
                # Once at once (the request is idempotent): a front door's replica that went away leaves
                # another behind its address; a Pod that went away answers nothing the second time either.
                if not transport_failed and not isinstance(exc, httpx.TimeoutException):
                    transport_failed = True
                    self.transport_retries += 1
                    continue
                raise WorkerUnreachable(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
            if response.status_code < 400:
                return response
            error = error_from_response(response)
            if isinstance(error, Misdirected):
                misdirections += 1
                self.endpoint = (error.endpoint or self.endpoint).rstrip("/")
                continue
            if isinstance(error, Rewound):
                self.next_chunk_index = error.expected_chunk_index  # the caller ticks on from there
            # Sent again after a transport error: the first copy may still be under way (its answer was
            # lost, not its work); once it is done, the same request replays its chunk.
            in_flight_twice = transport_failed and isinstance(error, TickInProgress)
            if not error.retryable and not in_flight_twice:
                raise error
            now = time.monotonic()
            give_up_at = now + self.retry_seconds if give_up_at is None else give_up_at
            pause = error.retry_after if error.retry_after is not None else 0.1 if in_flight_twice else 1.0
            if self.retry_seconds <= 0 or now + pause > give_up_at:
                raise type(error)(
                    f"{error.message} (still {error.code} after retrying for {self.retry_seconds:g} s, "
                    "the client's retry_seconds)",
                    status=error.status,
                    param=error.param,
                    extra=error.extra,
                    retry_after=error.retry_after,
                ) from error
            time.sleep(pause)
        raise Misdirected(
            f"session {self.session_id} was still misdirected after {MAX_MISDIRECTIONS} redirections",
            status=Misdirected.status,
            extra={"endpoint": self.endpoint},
        )

    def tick(
        self,
        controls: Sequence[Mapping[str, Any]] = (),
        *,
        prompt: str | None = None,
        applied_event_ids: Sequence[int] = (),
        request_id: str | None = None,
        close_session: bool = False,
        buffer_ms: int | None = None,
    ) -> Chunk:
        """Generate the next chunk. A retry with the same `request_id` replays the last chunk. `buffer_ms`:
        the play time the caller has buffered and not yet shown (the worker's deadline for this chunk; a
        `Player` sends it); None sends none (no deadline: arrival order)."""
        body: dict[str, Any] = {
            "request_id": request_id or f"{self.session_id}-{self.next_chunk_index}-{uuid.uuid4().hex[:8]}",
            "chunk_index": self.next_chunk_index,
            "applied_event_ids": list(applied_event_ids),
            "controls": [dict(c) for c in controls],
            "close_session": close_session,
        }
        if prompt is not None:
            body["prompt"] = prompt
        if buffer_ms is not None:
            body["buffer_ms"] = buffer_ms
        started = time.perf_counter()
        response = self._request("POST", "/ticks", json_body=body, headers={"Accept": OCTET_STREAM})
        latency = time.perf_counter() - started
        metadata = ChunkMetadata.from_header(response.headers["ardiff-chunk-metadata"])
        chunk = Chunk(
            frames=decode_frames(response.content, response.headers["ardiff-frame-shape"]),
            metadata=metadata,
            server_timing=parse_server_timing(response.headers.get("server-timing", "")),
            latency_s=latency,
            endpoint=self.endpoint,
        )
        self.next_chunk_index = metadata.chunk_index + 1
        return chunk

    def robot_tick(
        self, observation: Mapping[str, Any], *, prompt: str | None = None, request_id: str | None = None
    ) -> RobotChunk:
        """A DreamZero session's next chunk: `observation` as the robot tick's body says (three cameras and
        the joint/cartesian/gripper vectors, docs/contracts.md §4); the action chunk comes back as float32."""
        body: dict[str, Any] = {
            "request_id": request_id or f"{self.session_id}-{self.next_chunk_index}-{uuid.uuid4().hex[:8]}",
            "chunk_index": self.next_chunk_index,
            "observation": dict(observation),
        }
        if prompt is not None:
            body["prompt"] = prompt
        started = time.perf_counter()
        response = self._request("POST", "/ticks", json_body=body, headers={"Accept": "application/json"})
        latency = time.perf_counter() - started
        answer = response.json()
        metadata = ChunkMetadata.from_header(response.headers["ardiff-chunk-metadata"])
        actions = np.asarray(answer["actions"], dtype=np.float32).reshape(answer["action_shape"])
        self.next_chunk_index = metadata.chunk_index + 1
        return RobotChunk(
            actions, metadata, parse_server_timing(response.headers.get("server-timing", "")), latency
        )

    def reset(self) -> dict[str, Any]:
        """Start the session over (its KV is dropped); the next tick is chunk 0."""
        view = self._request("POST", "/reset").json()
        self.next_chunk_index = 0
        return view

    def rewind(self, chunk: int) -> Rewind:
        """Put the session back at its kept chunk `chunk` (its state after chunks 0..chunk-1): the next
        tick is chunk `chunk`, and with the same controls it is the chunk generated before. Kept chunks after
        it are dropped. `ChunkNotKept` when the session does not keep it."""
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"rewind chunk must be an integer >= 1 (0 is a reset()), got {chunk!r}")
        rewind = Rewind.of_answer(self._request("POST", "/rewind", json_body={"chunk": chunk}).json())
        self.next_chunk_index = rewind.chunk_index
        return rewind

    def describe(self) -> dict[str, Any]:
        """The worker's view of the session: state, next chunk index, ticks, residency."""
        return self._request("GET", "").json()

    def sync(self) -> dict[str, Any]:
        """Continue where the session is: take the worker's next chunk index (e.g. in a new process)."""
        view = self.describe()
        self.next_chunk_index = int(view["next_chunk_index"])
        return view

    def close(self) -> dict[str, Any]:
        """Close the session on its worker now (a fast path; deleting the resource frees the slot)."""
        return self._request("DELETE", "").json()


# ------------------------------------------------------------------------------- the Kubernetes part


@dataclass(frozen=True)
class SessionEvent:
    """One Kubernetes Event about a session (`KubeSessions.events`)."""

    reason: str
    type: str
    message: str
    count: int
    time: datetime | None


class SessionOptions(TypedDict, total=False):
    """The optional fields of a session's spec (`KubeSessions.create` and `fork`); unset ones are the
    defaults (a fork's: its parent's seed and image)."""

    seed: int
    priority: int
    eviction_policy: str
    idle_timeout_seconds: int
    max_chunks: int
    image: Mapping[str, Any]
    keep_chunks: int  # the chunk boundaries its worker keeps (the last ones), to rewind to or fork from


# Each option's place in the spec.
OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "seed": ("seed",),
    "priority": ("priority",),
    "eviction_policy": ("evictionPolicy",),
    "idle_timeout_seconds": ("idleTimeoutSeconds",),
    "max_chunks": ("maxChunks",),
    "image": ("image",),
    "keep_chunks": ("history", "keepChunks"),
}


class KubeSessions:
    """`ARDiffusionSession` resources of one namespace, through the `kubernetes` package.

    Credentials: an explicit `kubeconfig` file, else `KUBECONFIG`/`~/.kube/config`, else the in-cluster
    service account.
    """

    def __init__(
        self, namespace: str = "default", *, kubeconfig: str | Path | None = None, context: str | None = None
    ) -> None:
        try:
            import kubernetes
        except ImportError:
            raise KubernetesError(
                "the client's Kubernetes part needs the `kubernetes` package: pip install 'ardiff[client]'"
            ) from None
        import urllib3  # the kubernetes package's HTTP library

        self.namespace = namespace
        self._kubernetes = kubernetes
        # Connection refused, DNS, TLS, timeouts: urllib3's errors (after its retries) and the OS's.
        self._unreachable = (urllib3.exceptions.HTTPError, OSError)
        try:
            if kubeconfig is None and context is None:
                try:
                    kubernetes.config.load_kube_config()
                    api_client = kubernetes.client.ApiClient()
                except kubernetes.config.ConfigException:
                    kubernetes.config.load_incluster_config()
                    api_client = kubernetes.client.ApiClient()
            else:
                config_file = None if kubeconfig is None else str(kubeconfig)
                api_client = kubernetes.config.new_client_from_config(
                    config_file=config_file, context=context
                )
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise KubernetesError(f"no usable Kubernetes credentials: {exc}") from None
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A Kubernetes call with its ApiException turned into a typed `KubernetesError`."""
        try:
            return fn(*args, **kwargs)
        except self._kubernetes.client.ApiException as exc:
            try:
                message = json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                message = exc.reason
            cls = {404: SessionNotFound, 422: InvalidSession}.get(exc.status, KubernetesError)
            raise cls(f"{what}: {message}", status=exc.status) from None
        except self._kubernetes.client.exceptions.OpenApiException as exc:
            raise KubernetesError(f"{what}: {exc}") from None
        except self._unreachable as exc:
            raise KubernetesError(f"{what}: cannot reach the Kubernetes API: {exc}") from None

    def create(
        self, name: str, *, pool: str, prompt: str, **options: Unpack[SessionOptions]
    ) -> dict[str, Any]:
        """Create the session resource with the `SessionOptions` given (the API server validates it:
        `InvalidSession` on a bad spec)."""
        return self._create(name, {"poolRef": pool, "prompt": prompt}, options)

    def fork(
        self,
        parent: str,
        child: str,
        at: int | None = None,
        *,
        prompt: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> dict[str, Any]:
        """Create `child` at `parent`'s kept chunk `at` (its state after chunks 0..at-1; None: the parent's
        latest kept chunk when the child is placed): its next chunk with the same controls is the parent's.
        The child is in the parent's pool and family; the prompt, seed and image it is not given are the
        parent's. The parent must keep the chunk (its `keep_chunks`), else the child ends `Failed`
        (`ChunkNotKept`, `ForkSourceNotFound`, `ForkPoolMismatch`: `wait_ready` raises `SessionFailed`)."""
        source = self.get(parent).get("spec") or {}
        spec: dict[str, Any] = {
            "poolRef": source["poolRef"],
            "forkFrom": {"session": parent, **({} if at is None else {"chunk": at})},
        }
        if source.get("family") is not None:
            spec["family"] = source["family"]
        if prompt is not None:
            spec["prompt"] = prompt
        return self._create(child, spec, options)

    def _create(self, name: str, spec: Mapping[str, Any], options: SessionOptions) -> dict[str, Any]:
        """Create the resource with `spec` and the `options` given, as their spec fields."""
        unknown = set(options) - set(OPTION_FIELDS)
        if unknown:
            raise TypeError(f"unknown session options {sorted(unknown)}; known: {sorted(OPTION_FIELDS)}")
        fields: dict[str, Any] = {}
        for option, value in options.items():
            if value is not None:
                path = OPTION_FIELDS[option]
                leaf = fields
                for part in path[:-1]:
                    leaf = leaf.setdefault(part, {})
                leaf[path[-1]] = dict(value) if isinstance(value, Mapping) else value
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ARDiffusionSession",
            "metadata": {"name": name},
            "spec": {**spec, **fields},
        }
        return self._call(
            f"create session {name}",
            self._custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
            body,
        )

    def get(self, name: str) -> dict[str, Any]:
        return self._call(
            f"get session {name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
            name,
        )

    def list(self) -> list[dict[str, Any]]:
        listing = self._call(
            "list sessions",
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
        )
        return list(listing["items"])

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def delete(self, name: str, *, wait: bool = False, timeout: float = 60) -> None:
        """Delete the session (its slot and KV are freed); a missing session counts as deleted."""
        try:
            self._call(
                f"delete session {name}",
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                SESSION_PLURAL,
                name,
            )
        except SessionNotFound:
            return
        deadline = time.monotonic() + timeout
        while wait:
            try:
                self.get(name)
            except SessionNotFound:
                return
            if time.monotonic() > deadline:
                raise WaitTimeout(f"session {name} still exists {timeout}s after its deletion")
            time.sleep(0.2)

    def wait_for(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        timeout: float = 300,
        what: str = "a status",
        on_status: Callable[[dict[str, Any]], None] | None = None,
        poll: float = 0.2,
    ) -> dict[str, Any]:
        """Poll the status until `predicate(status)` holds; `SessionFailed` on Failed/Expired."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while True:
            status = self.status(name)
            if on_status is not None:
                on_status(status)
            if predicate(status):
                return status
            if status.get("phase") in TERMINAL_PHASES:
                raise SessionFailed(
                    f"session {name} is {status['phase']}: {status.get('reason')}: {status.get('message')}"
                )
            if time.monotonic() > deadline:
                phase = status.get("phase", "without status")
                raise WaitTimeout(
                    f"session {name} did not reach {what} within {timeout}s; it is {phase} "
                    f"({status.get('reason')}: {status.get('message')})"
                )
            time.sleep(poll)

    def wait_ready(
        self, name: str, *, timeout: float = 300, on_status: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Until `status.phase` is `Ready` (with an endpoint); returns the status."""
        return self.wait_for(
            name,
            is_ready,
            timeout=timeout,
            what="Ready",
            on_status=on_status,
        )

    def events(self, name: str) -> list[SessionEvent]:
        """The session's Kubernetes Events, oldest first: the operator's news (`Lost`, `Evicted`,
        `Replaced`, `Expired`, `Failed`). A status poll can miss `Lost`: the same round places it again."""
        listing = self._call(
            f"list the events of session {name}",
            self._core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.kind=ARDiffusionSession,involvedObject.name={name}",
        )
        events = [
            SessionEvent(
                reason=event.reason or "",
                type=event.type or "",
                message=event.message or "",
                count=event.count or 1,
                time=event.last_timestamp or event.event_time or event.metadata.creation_timestamp,
            )
            for event in listing.items
        ]
        return sorted(events, key=lambda event: (event.time is None, event.time))

    def token(self, name: str, status: Mapping[str, Any] | None = None) -> str:
        """The session's bearer token, from the Secret its status names."""
        ref = (status if status is not None else self.status(name)).get("tokenSecretRef") or {}
        if not ref.get("name"):
            raise KubernetesError(f"session {name} has no status.tokenSecretRef yet")
        secret = self._call(
            f"read the token of session {name}",
            self._core.read_namespaced_secret,
            ref["name"],
            self.namespace,
        )
        key = ref.get("key", "token")
        encoded = (secret.data or {}).get(key)
        if not encoded:
            raise KubernetesError(f"secret {ref['name']} has no key {key!r}")
        return base64.b64decode(encoded).decode()

    def connect(self, name: str, *, timeout: float = 300, **client_options: Any) -> SessionClient:
        """Wait for `Ready`, then a `SessionClient` at the session's `base_url` (the front door's `status.url`
        when the operator writes one, else `status.endpoint`) that continues at the session's next chunk (a
        session that needs a reset stays that way: its first tick raises `ResetRequired`)."""
        status = self.wait_ready(name, timeout=timeout)
        client = SessionClient(name, base_url(status), self.token(name, status), **client_options)
        client.sync()
        return client
