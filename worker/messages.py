"""The messages clients send the worker: the HTTP tick's body and the stream's messages (contracts §4).

Both carry the same tick (vllm-omni's `ARDiffusionTickRequest` minus `session_id`); pydantic checks their
shape, `tick_rules` the rules vllm-omni and the pipeline apply, before anything reaches the forward.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The most play time a client may claim to hold (10 minutes): more is not a buffer, it is a mistake.
MAX_BUFFER_MS = 600_000


class ControlBody(BaseModel):
    """One control track of a tick (vllm-omni's `ARDiffusionControlInput`)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    track: str = Field(min_length=1, examples=["camera"])
    schema_: str = Field(alias="schema", min_length=1, examples=["lingbot.camera_actions.v1"])
    data: dict[str, Any] = Field(examples=[{"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]}])


# A valid LingBot tick: the schema's example, and the body of the warm-up forwards (worker/service.py).
EXAMPLE_TICK = {
    "request_id": "tick-0",
    "chunk_index": 0,
    "prompt": "camera moving forward through a forest",
    "controls": [
        {
            "track": "camera",
            "schema": "lingbot.camera_actions.v1",
            "data": {"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]},
        }
    ],
}


class TickBody(BaseModel):
    """vllm-omni's `ARDiffusionTickRequest` minus `session_id` (the URL names the session)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [EXAMPLE_TICK]})
    request_id: str = Field(
        min_length=1, description="correlation id; a retry with the same id replays the chunk"
    )
    chunk_index: int = Field(ge=0, description="the session's next chunk (0 after a reset)")
    applied_event_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    prompt: str | None = Field(default=None, description="overrides the session's prompt for this tick")
    controls: list[ControlBody] = Field(default_factory=list)
    reset: bool = False
    close_session: bool = False
    buffer_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_BUFFER_MS,
        description="the play time (ms) the client has buffered and not yet shown when it sent the tick: the "
        "chunk's deadline (absent: no deadline, arrival order)",
    )


class StreamTick(TickBody):
    """A tick on the stream: the HTTP tick's fields and `type: "tick"`."""

    type: Literal["tick"]


class StreamAuth(BaseModel):
    """The first message of a stream opened without an `Authorization` header (browsers cannot set one)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["auth"]
    token: str = Field(min_length=1, max_length=4096)


# ------------------------------------------------------------------------------------ robot ticks (DreamZero)

CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")


class CameraImage(BaseModel):
    """One camera's picture: a PNG/JPEG file, or raw uint8 pixels `[H, W, 3]` (or `[T, H, W, 3]`), base64."""

    model_config = ConfigDict(extra="forbid", strict=True)
    encoding: Literal["png", "jpeg", "raw"]
    data: str = Field(min_length=1, description="base64 of the file or of the raw pixels")
    shape: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None, min_length=3, max_length=4, description="raw only: [H, W, 3] or [T, H, W, 3]"
    )
    dtype: Literal["uint8"] = "uint8"


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class RobotObservation(BaseModel):
    """What DreamZero's DROID/RoboArena transform reads: three cameras and the arm's state."""

    model_config = ConfigDict(extra="forbid", strict=True)
    images: dict[Literal[CAMERAS], CameraImage] = Field(  # type: ignore[valid-type]
        description="exterior_image_0_left, exterior_image_1_left, wrist_image_left (all three)"
    )
    joint_position: list[FiniteFloat] = Field(min_length=7, max_length=7)
    cartesian_position: list[FiniteFloat] = Field(min_length=6, max_length=6)
    gripper_position: list[FiniteFloat] = Field(min_length=1, max_length=1)


class RobotTickBody(BaseModel):
    """A DreamZero tick: vllm-omni's tick fields (no controls) and the robot's observation."""

    model_config = ConfigDict(extra="forbid", strict=True)
    request_id: str = Field(min_length=1, description="correlation id; a retry with the same id replays it")
    chunk_index: int = Field(ge=0, description="the session's next chunk (0 after a reset)")
    applied_event_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    prompt: str | None = Field(default=None, description="overrides the session's prompt for this tick")
    observation: RobotObservation
    return_frames: bool = Field(default=False, description="also answer the chunk's predicted frames")
    reset: bool = False
    close_session: bool = False


class RewindBody(BaseModel):
    """`POST /v1/sessions/{id}/rewind` (issue 26): the kept chunk boundary to go back to."""

    model_config = ConfigDict(extra="forbid", strict=True)
    chunk: int = Field(ge=1, description="a kept chunk boundary: the next chunk generated is this one")


class StreamRewind(RewindBody):
    """A rewind on the stream: the HTTP rewind's body and `type: "rewind"`."""

    type: Literal["rewind"]
