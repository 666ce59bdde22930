"""`SessionClient`: one session ticked over HTTP at its base URL with its bearer token (docs/contracts.md §4):
ticks (frames or a robot's actions), reset, rewind, describe, close; misdirections followed, retryable answers
retried, every error answer a typed exception."""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import numpy as np

from ardiff.client.errors import (
    Misdirected,
    Rewound,
    TickInProgress,
    WorkerUnreachable,
    error_from_response,
)
from ardiff.client.media import decode_frames
from ardiff.wire import OCTET_STREAM, SERVED_BY_HEADER, ServedBy

MAX_MISDIRECTIONS = 3
DEFAULT_RETRY_SECONDS = 30.0  # how long SessionClient retries retryable answers (503) before it gives up
MAX_RECONNECT_PAUSE = 1.0  # seconds; a refused connection's backoff doubles from 0.05 up to this


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


def served_by_of(response: httpx.Response) -> ServedBy | None:
    """The Pod and epoch an answer names (`SERVED_BY_HEADER`); None when it names none."""
    value = response.headers.get(SERVED_BY_HEADER)
    return ServedBy.parse(value) if value else None


@dataclass(frozen=True)
class Chunk:
    """One tick's output: its frames, the metadata echo, the worker's timings (ms) and the round trip (s)."""

    frames: np.ndarray
    metadata: ChunkMetadata
    server_timing: Mapping[str, float]
    latency_s: float
    endpoint: str
    served_by: ServedBy | None = None  # the Pod and epoch that answered (None: a worker from before it)

    @property
    def server_ms(self) -> float:
        """Time spent inside the worker (queue + forward + decode + encode)."""
        return sum(self.server_timing.values())


@dataclass(frozen=True)
class RobotChunk:
    """One robot tick's output (a DreamZero session): its action chunk (float32, steps x 8: 7 joints and the
    gripper), the metadata echo, the worker's timings (ms) and the round trip (s)."""

    actions: np.ndarray
    metadata: ChunkMetadata
    server_timing: Mapping[str, float]
    latency_s: float
    served_by: ServedBy | None = None


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
    (its 503 `resuming` with `Retry-After: 0`); at a pod, a 421 is followed to the endpoint it names.
    `reconnect_seconds`: how long a refused connection is tried again, with backoff. Nothing was sent, so
    it is safe; it is for a front door, whose Service may still lead a new connection to a replica that went
    away until its endpoints update. At a pod's own address (0, the default) a refusal is final after one
    retry: the session moved, and its status names where."""

    session_id: str
    endpoint: str
    token: str
    next_chunk_index: int = 0
    timeout: float = 120.0
    retry_seconds: float = DEFAULT_RETRY_SECONDS  # 0: never retry
    ca_file: str | Path | None = None
    reconnect_seconds: float = 0.0
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
        reconnect_until: float | None = None
        reconnect_pause = MAX_RECONNECT_PAUSE / 20
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
                if isinstance(exc, httpx.ConnectError) and self.reconnect_seconds > 0:
                    # Nothing was sent; a front door's Service may lead new connections to a replica that went
                    # away until its endpoints update.
                    now = time.monotonic()
                    if reconnect_until is None:
                        reconnect_until = now + self.reconnect_seconds
                    if now < reconnect_until:
                        self.transport_retries += 1
                        time.sleep(min(reconnect_pause, reconnect_until - now))
                        reconnect_pause = min(2 * reconnect_pause, MAX_RECONNECT_PAUSE)
                        continue
                    raise WorkerUnreachable(
                        f"{method} {url}: still refused after {self.reconnect_seconds:g} s (the client's "
                        f"reconnect_seconds): {type(exc).__name__}: {exc}"
                    ) from exc
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
            served_by=served_by_of(response),
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
            actions,
            metadata,
            parse_server_timing(response.headers.get("server-timing", "")),
            latency,
            served_by_of(response),
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
