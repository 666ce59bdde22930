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

One module per job, every public name importable from here: `errors` (the typed errors, one per wire code),
`controls` (camera controls), `media` (raw frames, MP4 and PNG), `session` (`SessionClient`, HTTP) and `kube`
(`KubeSessions`, the Kubernetes part).
"""

from __future__ import annotations

from ardiff.client.controls import (
    CAMERA_TOUR,
    LINGBOT_CAMERA_KEYS,
    LINGBOT_CAMERA_SCHEMA,
    LINGBOT_FRAMES_PER_CHUNK,
    camera,
    hold,
)
from ardiff.client.errors import (
    ERRORS_BY_CODE,
    AtCapacity,
    BodyTooLarge,
    ChunkNotKept,
    ChunkOutOfOrder,
    ForwardFailed,
    InvalidSession,
    InvalidTick,
    KubernetesError,
    MaxChunksReached,
    Misdirected,
    NotReady,
    PlacementRecovering,
    ResetRequired,
    Resuming,
    Rewound,
    SessionClosed,
    SessionEvicted,
    SessionFailed,
    SessionNotFound,
    TickInProgress,
    TooManyRequests,
    Unauthorized,
    UnknownSession,
    WaitTimeout,
    WorkerAPIError,
    WorkerUnreachable,
    error_from_response,
)
from ardiff.client.kube import (
    OPTION_FIELDS,
    TERMINAL_PHASES,
    KubeSessions,
    SessionEvent,
    SessionOptions,
    base_url,
    is_ready,
)
from ardiff.client.media import (
    decode_frames,
    write_mp4,
    write_strip,
)
from ardiff.client.session import (
    DEFAULT_RETRY_SECONDS,
    MAX_MISDIRECTIONS,
    Chunk,
    ChunkMetadata,
    Rewind,
    RobotChunk,
    SessionClient,
    parse_server_timing,
)

__all__ = [
    "CAMERA_TOUR",
    "DEFAULT_RETRY_SECONDS",
    "ERRORS_BY_CODE",
    "LINGBOT_CAMERA_KEYS",
    "LINGBOT_CAMERA_SCHEMA",
    "LINGBOT_FRAMES_PER_CHUNK",
    "MAX_MISDIRECTIONS",
    "OPTION_FIELDS",
    "TERMINAL_PHASES",
    "AtCapacity",
    "BodyTooLarge",
    "Chunk",
    "ChunkMetadata",
    "ChunkNotKept",
    "ChunkOutOfOrder",
    "ForwardFailed",
    "InvalidSession",
    "InvalidTick",
    "KubeSessions",
    "KubernetesError",
    "MaxChunksReached",
    "Misdirected",
    "NotReady",
    "PlacementRecovering",
    "ResetRequired",
    "Resuming",
    "Rewind",
    "Rewound",
    "RobotChunk",
    "SessionClient",
    "SessionClosed",
    "SessionEvent",
    "SessionEvicted",
    "SessionFailed",
    "SessionNotFound",
    "SessionOptions",
    "TickInProgress",
    "TooManyRequests",
    "Unauthorized",
    "UnknownSession",
    "WaitTimeout",
    "WorkerAPIError",
    "WorkerUnreachable",
    "base_url",
    "camera",
    "decode_frames",
    "error_from_response",
    "hold",
    "is_ready",
    "parse_server_timing",
    "write_mp4",
    "write_strip",
]
