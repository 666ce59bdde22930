"""What a client of vllm-omni's realtime video protocol sends (`WS /v1/realtime/video`, docs/contracts.md §4
"Realtime video"): its limits, `session.start` bound to the session it names, the control messages, and the
`error` message's shape.

vllm-omni 0.30.0 serves the protocol in `vllm_omni/entrypoints/openai/serving_video_output_stream.py`; the
rules and messages here are its own, so a client written for it talks to a session unchanged. Its request
model (`VideoGenerationRequest`), the way it folds `sampling_params` into it and its encoder
(`create_streaming_video_encoder`) are used as they are (`upstream()`); importing them runs
`vllm_omni/__init__` (~600 vllm modules and torch): free on a vllm runtime, which has done it, and done on
first use on the fake runtime, whose tick path stays torch-free. What differs is the binding to a session:
the bearer token may come in `session.start` (`session_token`), whose sampling fields must be the session's,
and an interaction may carry the session's camera controls (`event.controls`, our extension).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ardiff.worker import tick_rules
from ardiff.worker.errors import BodyTooLarge, InvalidTick, Unauthorized, WorkerError
from ardiff.worker.messages import ControlBody
from ardiff.worker.stream import MAX_MESSAGE_BYTES

# vllm-omni's limits (serving_video_output_stream.py; a test pins them to its values). Its start and stall
# clocks are the worker's settings `realtime_start_timeout_seconds` / `realtime_stall_timeout_seconds`.
MAX_START_BYTES = 4 * 1024 * 1024
MAX_CONTROL_BYTES = 128 * 1024
STREAM_FORMAT = "m4s"
# vllm-omni's encoder options for the stream (its `_stream_video_bytes` default): x264 at its fastest, no
# frame lookahead, so a chunk's frames leave with the chunk.
VIDEO_CODEC_OPTIONS = {"preset": "ultrafast", "threads": "0", "tune": "zerolatency"}
# The fields of `session.start` that bind nothing and are taken as they are; every other field must be the
# session's (width, height, fps, seed, model, checked against it) or left at its default.
_FREE_FIELDS = frozenset({"prompt", "user", "return_stage_metrics"})
_TERM_FIELDS = frozenset({"model", "seed", "width", "height", "size", "fps", "video_params"})
_CONTROLS = TypeAdapter(list[ControlBody])


# LingBot's camera before any input: held still, as a live `state` event (its ticks need exactly one camera
# control; vllm-omni's reducer samples the held keys into each chunk's per-latent-frame `frames`).
IDLE_CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "state", "transitions": [{"actions": []}]},
}


@dataclass(frozen=True)
class Upstream:
    """vllm-omni's pieces of the protocol, and of its realtime session model that a stream's controls go
    through (the route serves LingBot-World pools: its camera reducer)."""

    request_model: Any  # VideoGenerationRequest
    request_data: Callable[[dict[str, Any]], dict[str, Any]]  # session.start -> the request's fields
    create_encoder: Callable[..., Any]  # create_streaming_video_encoder
    control_reducer: Callable[
        [], Any
    ]  # LingBotCameraControlReducer: live camera events -> a chunk's controls
    session_event: Any  # ARDiffusionSessionEvent: one interaction, as the reducer reads it
    control_input: Any  # ARDiffusionControlInput


_upstream: Upstream | None = None
_upstream_lock = threading.Lock()


@contextlib.contextmanager
def _process_logging_kept() -> Iterator[None]:
    """The root logger's level and its handlers' as they were before the block.

    vllm's OpenAI entrypoints import `model_hosting_container_standards`, whose import sets both to its
    SageMaker default (`LOG_LEVEL`, else ERROR): from a process's first realtime stream on, every warning the
    worker logged was dropped.
    """
    root = logging.getLogger()
    levels = [(root, root.level), *((handler, handler.level) for handler in root.handlers)]
    try:
        yield
    finally:
        for item, level in levels:
            item.setLevel(level)


def upstream() -> Upstream:
    """vllm-omni's request model and encoder, imported once (seconds on a fake runtime: call it off the event
    loop)."""
    global _upstream
    with _upstream_lock:
        if _upstream is None:
            with _process_logging_kept():
                from vllm_omni.diffusion.models.lingbot_world.actions import LingBotCameraControlReducer
                from vllm_omni.entrypoints.openai.protocol.videos import VideoGenerationRequest
                from vllm_omni.entrypoints.openai.serving_video_output_stream import (
                    OmniStreamingVideoOutputHandler,
                )
                from vllm_omni.entrypoints.openai.video_api_utils import create_streaming_video_encoder
                from vllm_omni.experimental.ar_diffusion.session import ARDiffusionSessionEvent
                from vllm_omni.experimental.ar_diffusion.tick_protocol import ARDiffusionControlInput

            _upstream = Upstream(
                VideoGenerationRequest,
                OmniStreamingVideoOutputHandler._coerce_request_data,
                create_streaming_video_encoder,
                LingBotCameraControlReducer,
                ARDiffusionSessionEvent,
                ARDiffusionControlInput,
            )
        return _upstream


@dataclass(frozen=True)
class SessionTerms:
    """What the session fixes, that `session.start` may repeat but not change."""

    model: str  # the pool's `model`: a directory (a shipped model's name resolves to one) or a name
    seed: int
    width: int
    height: int
    fps: float


@dataclass(frozen=True)
class StreamStart:
    """A bound `session.start`: the prompt to generate with (None: the session's own) and the request as
    vllm-omni echoes it in `video.start`'s `config`."""

    prompt: str | None
    config: dict[str, Any]


@dataclass(frozen=True)
class Interaction:
    """A `session.interaction`: what changes from the next chunk on (None: unchanged)."""

    event_id: str
    prompt: str | None
    controls: tuple[dict[str, Any], ...] | None  # the session's control events (LingBot: the camera's)
    transition_chunks: int | None


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ping:
    pass


Control = Interaction | Stop | Ping


def _text(message: dict[str, Any], limit: int, what: str) -> str:
    """A message's text within `limit` bytes (vllm-omni's size checks); `InvalidTick` for a binary one."""
    raw = message.get("text")
    if raw is None:
        raise InvalidTick(f"{what} messages are JSON text, not binary", param="body")
    if len(raw) > limit or len(raw.encode()) > limit:
        raise BodyTooLarge(f"{what} message too large (at most {limit} bytes)")
    return raw


def _json_object(raw: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidTick(f"Invalid JSON in {what}", param="body") from None
    if not isinstance(value, dict):
        raise InvalidTick(f"{what} must be a JSON object", param="body")
    return value


def read_start(message: dict[str, Any]) -> dict[str, Any]:
    """The first message as a `session.start` object (size, JSON, type: vllm-omni's checks, in its order)."""
    start = _json_object(_text(message, MAX_START_BYTES, "session.start"), "session.start")
    if start.get("type") != "session.start":
        raise InvalidTick(f"Expected session.start, got: {start.get('type')}", param="type")
    return start


def start_token(start: dict[str, Any]) -> str:
    """The bearer token a `session.start` carries (`session_token`), for a socket without `Authorization`."""
    token = start.get("session_token")
    if not isinstance(token, str) or not 0 < len(token) <= 4096:
        raise Unauthorized("without an Authorization header, session.start must carry the session_token")
    return token


def bind_start(start: dict[str, Any], terms: SessionTerms, protocol: Upstream) -> StreamStart:
    """`session.start` validated by vllm-omni's request model, then against the session: sampling fields that
    differ from its spec are `InvalidTick` naming the field (the stream cannot honour them)."""
    fields = {name: value for name, value in start.items() if name != "session_token"}
    if fields.pop("format", STREAM_FORMAT) != STREAM_FORMAT:
        raise InvalidTick("Invalid session.start format: expected 'm4s'.", param="format")
    try:
        data = protocol.request_data(fields)
    except (TypeError, ValueError):  # vllm-omni folds sampling_params into extra_params with dict()
        raise InvalidTick(
            "Invalid session.start: extra_params must be an object", param="extra_params"
        ) from None
    try:
        request = protocol.request_model(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise InvalidTick(
            f"Invalid session.start: {param}: {first.get('msg', 'invalid')}", param=param
        ) from None
    if request.model is not None and request.model not in (terms.model, PurePath(terms.model).name):
        raise InvalidTick(
            f"Model mismatch: request specifies '{request.model}' but server is running '{terms.model}'.",
            param="model",
        )
    _check_terms(request, terms)
    if len(request.prompt.encode()) > MAX_MESSAGE_BYTES:  # it goes into every chunk's tick
        raise BodyTooLarge(f"session.start prompt holds at most {MAX_MESSAGE_BYTES} bytes, as a tick's body")
    prompt = request.prompt if request.prompt.strip() else None
    return StreamStart(prompt, request.model_dump(exclude_none=True))


def _check_terms(request: Any, terms: SessionTerms) -> None:
    video = request.resolve_video_params(default_fps=None)
    bound = {"width": (video.width, terms.width), "height": (video.height, terms.height)}
    bound |= {"fps": (video.fps, terms.fps), "seed": (request.seed, terms.seed)}
    for name, (asked, fixed) in bound.items():
        if asked is not None and asked != fixed:
            raise InvalidTick(
                f"session.start {name} {asked!r} differs from the session's {fixed!r} (fixed by its spec)",
                param=name,
            )
    if video.num_frames is not None:
        raise InvalidTick("session.start num_frames: a session's stream has no length", param="num_frames")
    for name in sorted(request.model_fields_set - _FREE_FIELDS - _TERM_FIELDS):
        field = type(request).model_fields[name]
        if getattr(request, name) != field.get_default(call_default_factory=True):
            raise InvalidTick(
                f"session.start {name}: a session's sampling is fixed by its spec (leave it out)", param=name
            )


def read_control(message: dict[str, Any], session_id: str) -> Control:
    """A message after `session.start`: `session.stop`, `session.ping` or `session.interaction` (vllm-omni's
    checks and messages, and the `controls` extension checked by vllm-omni's tick rules)."""
    value = _json_object(_text(message, MAX_CONTROL_BYTES, "control"), "WebSocket message")
    kind = value.get("type")
    if kind == "session.stop":
        return Stop()
    if kind == "session.ping":
        return Ping()
    if kind == "session.interaction":
        return _interaction(value.get("interaction"), session_id)
    raise InvalidTick(f"Unknown message type: {kind}", param="type")


def _interaction(interaction: Any, session_id: str) -> Interaction:
    if not isinstance(interaction, dict):
        raise InvalidTick("session.interaction requires an interaction object", param="interaction")
    event_id = interaction.get("event_id")
    if event_id is None:
        event_id = uuid.uuid4().hex
    elif not isinstance(event_id, str) or not event_id:
        raise InvalidTick(
            "session.interaction event_id must be a non-empty string", param="interaction.event_id"
        )
    event = interaction.get("event")
    if not isinstance(event, dict):
        raise InvalidTick("session.interaction requires event object", param="interaction.event")
    prompt, controls = event.get("prompt"), event.get("controls")
    has_prompt = isinstance(prompt, str) and bool(prompt.strip())
    if "prompt" in event and prompt is not None and not has_prompt:
        raise InvalidTick(
            "session.interaction event.prompt must be a non-empty string when provided",
            param="interaction.event.prompt",
        )
    if event.get("multi_modal_data"):
        raise InvalidTick(
            "session.interaction multi_modal_data is not supported: a session is conditioned by its spec's "
            "image",
            param="interaction.event.multi_modal_data",
        )
    if event.get("negative_prompt") is not None:
        raise InvalidTick(
            "session.interaction negative_prompt is not supported in this release",
            param="interaction.event.negative_prompt",
        )
    unknown = sorted(set(event) - {"prompt", "controls", "multi_modal_data", "negative_prompt"})
    if unknown:
        raise InvalidTick(
            f"session.interaction event.{unknown[0]} is not something a session takes",
            param=f"interaction.event.{unknown[0]}",
        )
    if not has_prompt and controls is None:
        raise InvalidTick(
            "session.interaction requires a non-empty event.prompt and/or event.controls",
            param="interaction.event",
        )
    return Interaction(
        event_id,
        prompt if has_prompt else None,
        None if controls is None else _controls(controls, session_id),
        _transition_chunks(interaction.get("transition_chunks")),
    )


def _controls(controls: Any, session_id: str) -> tuple[dict[str, Any], ...]:
    """The session's control events (a tick's `controls` shape: track, schema, data), checked now by
    vllm-omni's tick rules (their values by its reducer, `EventBook.queue`), so that a bad one is refused at
    once instead of at the chunk it would shape."""
    try:
        tracks = [control.model_dump(by_alias=True) for control in _CONTROLS.validate_python(controls)]
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidTick(
            f"session.interaction event.controls: {first.get('msg', 'invalid')}",
            param="interaction.event.controls",
        ) from None
    if not tracks:
        raise InvalidTick(
            "session.interaction event.controls must hold at least one control",
            param="interaction.event.controls",
        )
    try:
        tick_rules.parse_tick(session_id, {"request_id": "interaction", "chunk_index": 0, "controls": tracks})
    except InvalidTick as exc:
        message = f"session.interaction event.controls: {exc}"
        raise InvalidTick(message, param="interaction.event.controls") from None
    return tuple(tracks)


def _transition_chunks(value: Any) -> int | None:
    """vllm-omni's check of `transition_chunks` (an integer >= 0; a session applies an event at the next
    chunk whatever it says)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
        raise InvalidTick(
            "session.interaction transition_chunks must be an integer", param="interaction.transition_chunks"
        )
    if value < 0:
        raise InvalidTick(
            "session.interaction transition_chunks must be >= 0", param="interaction.transition_chunks"
        )
    return int(value)


def error_message(
    error: WorkerError, *, request_id: str | None = None, event_id: str | None = None
) -> dict[str, Any]:
    """vllm-omni's `error` message (`type`, `message`, `code`, `request_id`, `event_id`) with our wire code
    as its `code`, and the envelope's `param` and extras (`endpoint`, `expected_chunk_index`, ...) beside
    them, `retry_after` where the code is retryable."""
    message: dict[str, Any] = {"type": "error", "message": error.message, "code": error.code}
    if error.param is not None:
        message["param"] = error.param
    message.update(error.extra)
    if error.retry_after_seconds is not None:
        message["retry_after"] = error.retry_after_seconds
    if request_id is not None:
        message["request_id"] = request_id
    if event_id is not None:
        message["event_id"] = event_id
    return message
