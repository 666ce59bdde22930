"""OpenPI-compatible WebSocket for robot sessions: `/v1/sessions/{id}/openpi` (docs/contracts.md §4).

What an openpi `WebsocketClientPolicy` speaks: on connect the server sends the policy's metadata
(msgpack); then each binary message is an observation (msgpack with msgpack-numpy markers,
`{"__ndarray__": true, "data", "dtype", "shape"}`), answered with the action chunk (a msgpack ndarray, as
vllm-omni's `/v1/realtime/robot/openpi` answers); `{"endpoint": "reset"}` starts the session over and is
answered `{"status": "reset successful"}`. Auth is openpi's `Authorization: Api-Key <token>` (or `Bearer`).

The protocol has no chunk index or request id: the worker keeps the order itself. Each observation is the
session's next tick (`WorkerService.tick`, so every rule of the HTTP tick applies: admission, placement, the
token, one tick in flight, fail-closed); its chunk index is the session's next one, its request id
`openpi-<connection>-<chunk>`; a session that must be reset is reset by its next observation (chunk 0).
Errors are text messages with the HTTP envelope (an openpi client raises them); those that end what the
connection can do (401, 404, 410, 421, superseded) close it with `4000 + status`, as the stream does.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import msgspec
import numpy as np
from starlette.websockets import WebSocket

from ardiff.worker.errors import InvalidTick, WorkerError
from ardiff.worker.service import WorkerService
from ardiff.worker.stream import _FINAL_STATUSES, SessionSocket, SessionStreams

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 << 20  # three 180x320 cameras x 4 frames are ~2 MB raw
CAMERA_KEYS = {
    "observation/exterior_image_0_left": "exterior_image_0_left",
    "observation/exterior_image_1_left": "exterior_image_1_left",
    "observation/wrist_image_left": "wrist_image_left",
}
VECTOR_KEYS = ("joint_position", "cartesian_position", "gripper_position")


def _marker(value: dict[Any, Any], key: str) -> Any:
    return value.get(key, value.get(key.encode()))


def _decode(value: Any) -> Any:
    """msgpack-numpy markers back to arrays (openpi-client's `__ndarray__`/`__npgeneric__`)."""
    if isinstance(value, dict):
        if _marker(value, "__ndarray__") is True:
            dtype = np.dtype(_text(_marker(value, "dtype")))
            if dtype.kind in "VOc":
                raise ValueError(f"unsupported dtype {dtype}")
            return np.frombuffer(_marker(value, "data"), dtype=dtype).reshape(tuple(_marker(value, "shape")))
        if _marker(value, "__npgeneric__") is True:
            return np.dtype(_text(_marker(value, "dtype"))).type(_marker(value, "data"))
        return {_text(key): _decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode(item) for item in value]
    return value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _encode_hook(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {
            b"__ndarray__": True,
            b"data": array.tobytes(),
            b"dtype": array.dtype.str,
            b"shape": array.shape,
        }
    if isinstance(value, np.generic):
        return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"cannot pack {type(value).__name__}")


def pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value, enc_hook=_encode_hook)


def unpack(data: bytes) -> Any:
    return _decode(msgspec.msgpack.decode(data))


def observation_of(message: dict[str, Any]) -> dict[str, Any]:
    """An openpi observation as the robot tick's `observation` (arrays stay arrays; the family checks)."""
    images = {name: message[key] for key, name in CAMERA_KEYS.items() if key in message}
    missing = [key for key in CAMERA_KEYS if key not in message]
    if missing:
        raise InvalidTick(f"the observation lacks {missing}", param=missing[0])
    observation: dict[str, Any] = {"images": images}
    for name in VECTOR_KEYS:
        value = message.get(f"observation/{name}")
        observation[name] = np.asarray(value) if value is not None else None
    return observation


def authorization_of(header: str | None) -> str | None:
    """openpi's `Api-Key <token>` as the worker's `Bearer <token>`; a Bearer header as it is."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "api-key" and token.strip():
        return f"Bearer {token.strip()}"
    return header


class OpenPIConnection(SessionSocket):
    """The OpenPI protocol over one session's WebSocket (msgpack-numpy observations in, actions out)."""

    def __init__(
        self, websocket: WebSocket, service: WorkerService, streams: SessionStreams, session_id: str
    ) -> None:
        super().__init__(websocket, service, streams, session_id)
        self.connection = uuid.uuid4().hex[:8]

    async def _serve(self) -> None:
        authorization = authorization_of(self.websocket.headers.get("authorization"))
        try:
            view = await self.service.open_stream(self.session_id, authorization)
        except WorkerError as error:
            await self.fail(error)
            return
        await self.streams.claim(self)
        await self._send(pack(dict(self.service.family.POLICY_SERVER_CONFIG)))
        next_index = 0 if view["state"] == "reset_required" else int(view["next_chunk_index"])
        reset = view["state"] == "reset_required" or next_index == 0
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if not data or len(data) > MAX_MESSAGE_BYTES:
                await self.send_error(InvalidTick("messages are msgpack observations of at most 4 MiB"))
                continue
            try:
                request = unpack(data)
                if not isinstance(request, dict):
                    raise ValueError("not a mapping")
            except (ValueError, TypeError, msgspec.DecodeError):
                await self.send_error(
                    InvalidTick("the message is not a msgpack(-numpy) mapping", param="body")
                )
                continue
            try:
                if request.get("endpoint") == "reset":
                    await self.service.reset(self.session_id, authorization)
                    next_index, reset = 0, True
                    await self._send(pack({"status": "reset successful"}))
                    continue
                body = {
                    "request_id": f"openpi-{self.connection}-{next_index}",
                    "chunk_index": next_index,
                    "reset": reset,
                    "prompt": request.get("prompt") or None,
                    "observation": observation_of(request),
                }
                outcome = await self.service.tick(self.session_id, body, authorization=authorization)
            except WorkerError as error:
                if error.status in _FINAL_STATUSES:
                    await self.fail(error)
                    return
                if error.code == "reset_required":
                    next_index, reset = 0, True
                await self.send_error(error)
                continue
            next_index, reset = outcome.chunk.chunk_index + 1, False
            await self._send(pack(outcome.chunk.actions))
