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
import math
import re
import struct
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
from starlette.websockets import WebSocket

from ardiff.worker.errors import InvalidTick, WorkerError
from ardiff.worker.service import WorkerService
from ardiff.worker.stream import SessionSocket, SessionStreams, ends_stream

log = logging.getLogger(__name__)

# The largest message decoded, and so the most its arrays (views of it, never copies) can hold: three
# 180x320 cameras x 4 frames are ~2 MB raw.
MAX_MESSAGE_BYTES = 4 << 20
# What a message may nest, fixed before anything is allocated: an observation is a map of ~8 keys whose values
# are arrays (a marker map with a shape list inside: depth 3), scalars, strings or short lists.
MAX_DEPTH = 3
MAX_ENTRIES = 64  # per map or list; also the longest vector an observation may carry
MAX_ITEMS = 4096  # values in one message, all containers together
MAX_DIMS = 8
# numpy's `dtype.str` of the numbers openpi sends: bool, int, uint and float, nothing else (no void, object,
# string, complex or datetime: their size is not the data's, or they are not numbers).
NUMERIC_DTYPE = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248])")
CAMERA_KEYS = {
    "observation/exterior_image_0_left": "exterior_image_0_left",
    "observation/exterior_image_1_left": "exterior_image_1_left",
    "observation/wrist_image_left": "wrist_image_left",
}
VECTOR_KEYS = ("joint_position", "cartesian_position", "gripper_position")

_MAPS = {0xDE: 2, 0xDF: 4}  # map16, map32: the size of their count
_ARRAYS = {0xDC: 2, 0xDD: 4}
_STRINGS = {0xD9: 1, 0xDA: 2, 0xDB: 4}
_BINARIES = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_NUMBERS = {
    0xCA: struct.Struct(">f"),
    0xCB: struct.Struct(">d"),
    0xCC: struct.Struct(">B"),
    0xCD: struct.Struct(">H"),
    0xCE: struct.Struct(">I"),
    0xCF: struct.Struct(">Q"),
    0xD0: struct.Struct(">b"),
    0xD1: struct.Struct(">h"),
    0xD2: struct.Struct(">i"),
    0xD3: struct.Struct(">q"),
}
_CONSTANTS = {0xC0: None, 0xC2: False, 0xC3: True}


class _Decoder:
    """msgpack as openpi sends it (maps, lists, str, bin, numbers, nil, bool), every count checked against the
    bounds above before a container is made; bin values are views of the message. Extension types and the
    reserved byte are refused. `param` names the top-level key being decoded (what an error names)."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0
        self._items = 0
        self.param = "body"

    def message(self) -> dict[str, Any]:
        value = self._value(0)
        if self._at != len(self._data):
            raise self._refuse(f"{len(self._data) - self._at} bytes follow the message")
        if not isinstance(value, dict):
            raise InvalidTick("the message is not a msgpack(-numpy) mapping", param="body")
        return value

    def _refuse(self, why: str) -> InvalidTick:
        return InvalidTick(f"{self.param}: {why}", param=self.param)

    def _take(self, size: int) -> memoryview:
        if self._at + size > len(self._data):
            raise self._refuse("the msgpack message is truncated")
        view = self._data[self._at : self._at + size]
        self._at += size
        return view

    def _count(self, width: int) -> int:
        return int.from_bytes(self._take(width), "big")

    def _value(self, depth: int) -> Any:
        self._items += 1
        if self._items > MAX_ITEMS:
            raise self._refuse(f"the message holds more than {MAX_ITEMS} values")
        tag = self._take(1)[0]
        if tag <= 0x7F or tag >= 0xE0:  # positive and negative fixint
            return tag if tag <= 0x7F else tag - 0x100
        if tag in _CONSTANTS:
            return _CONSTANTS[tag]
        if tag in _NUMBERS:
            number = _NUMBERS[tag]
            return number.unpack(self._take(number.size))[0]
        if 0xA0 <= tag <= 0xBF or tag in _STRINGS:
            size = tag & 0x1F if tag <= 0xBF else self._count(_STRINGS[tag])
            try:
                return str(self._take(size), "utf-8")
            except UnicodeDecodeError:
                raise self._refuse("a msgpack string is not UTF-8") from None
        if tag in _BINARIES:
            return self._take(self._count(_BINARIES[tag]))
        if 0x80 <= tag <= 0x8F or tag in _MAPS:
            return self._map(tag & 0x0F if tag <= 0x8F else self._count(_MAPS[tag]), depth + 1)
        if 0x90 <= tag <= 0x9F or tag in _ARRAYS:
            return self._list(tag & 0x0F if tag <= 0x9F else self._count(_ARRAYS[tag]), depth + 1)
        raise self._refuse(f"msgpack type 0x{tag:02x} is not part of an observation (no extension types)")

    def _container(self, entries: int, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise self._refuse(f"the message nests deeper than {MAX_DEPTH} containers")
        if entries > MAX_ENTRIES:
            raise self._refuse(f"a map or list of {entries} entries (at most {MAX_ENTRIES})")

    def _list(self, entries: int, depth: int) -> list[Any]:
        self._container(entries, depth)
        return [self._value(depth) for _ in range(entries)]

    def _map(self, entries: int, depth: int) -> Any:
        self._container(entries, depth)
        value: dict[str, Any] = {}
        for _ in range(entries):
            key = self._value(depth)
            if isinstance(key, memoryview):
                key = str(key, "utf-8", "replace")
            if not isinstance(key, str):
                raise self._refuse("map keys must be strings")
            if depth == 1:
                self.param = key
            value[key] = self._value(depth)
        return _marker(value, self._refuse)


def _marker(value: dict[str, Any], refuse: Callable[[str], InvalidTick]) -> Any:
    """openpi-client's msgpack-numpy markers as numpy values: an `__ndarray__` becomes a view of the message
    (its size is its data's, checked against its shape and dtype), an `__npgeneric__` a numpy scalar of a
    number given as a number. Other maps stay maps."""
    if value.get("__ndarray__") is True:
        dtype, data, shape = _dtype(value.get("dtype"), refuse), value.get("data"), value.get("shape")
        if not isinstance(data, memoryview):
            raise refuse("an array's data must be msgpack bin")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
            or math.prod(shape) * dtype.itemsize != data.nbytes
        ):
            raise refuse(f"an array's shape {shape} does not fit its {data.nbytes} bytes of {dtype}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if value.get("__npgeneric__") is True:
        dtype, data = _dtype(value.get("dtype"), refuse), value.get("data")
        if not isinstance(data, bool | int | float):
            raise refuse(f"a numpy scalar must carry a number, got {type(data).__name__}")
        try:
            return dtype.type(data)
        except OverflowError:
            raise refuse(f"{data} is out of range for {dtype}") from None
    return value


def _dtype(name: Any, refuse: Callable[[str], InvalidTick]) -> np.dtype:
    if not isinstance(name, str) or not NUMERIC_DTYPE.fullmatch(name):
        raise refuse(f"dtype {name!r} is not a bool, int, uint or float of 1 to 8 bytes")
    return np.dtype(name)


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


def unpack(data: bytes) -> dict[str, Any]:
    """One client message as a mapping, msgpack-numpy markers as numpy values; `InvalidTick` (naming the
    top-level key) for anything outside the bounds, before it is allocated."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise InvalidTick(f"messages are msgpack observations of at most {MAX_MESSAGE_BYTES} bytes")
    return _Decoder(data).message()


def _vector(key: str, value: Any) -> np.ndarray | None:
    """A vector as a small float64 array: a list of at most `MAX_ENTRIES` numbers, or a numeric array or
    scalar of at most that many elements; the family checks its length and that it is finite."""
    if value is None:
        return None
    if isinstance(value, np.ndarray | np.generic):
        numeric = value.dtype.kind in "biuf" and value.size <= MAX_ENTRIES
    else:
        numeric = isinstance(value, list) and all(_is_number(item) for item in value)
    if not numeric:
        raise InvalidTick(f"{key} must be a list or array of at most {MAX_ENTRIES} numbers", param=key)
    try:
        return np.asarray(value, dtype=np.float64).reshape(-1)
    except OverflowError:  # a Python int beyond float64
        raise InvalidTick(f"{key} must be a list or array of numbers", param=key) from None


def _is_number(item: Any) -> bool:
    return isinstance(item, bool | int | float) or (
        isinstance(item, np.generic) and item.dtype.kind in "biuf"
    )


def observation_of(message: dict[str, Any]) -> dict[str, Any]:
    """An openpi observation as the robot tick's `observation`: the cameras as the arrays they are (uint8;
    the family checks their shapes), the vectors bounded and converted."""
    missing = [key for key in CAMERA_KEYS if key not in message]
    if missing:
        raise InvalidTick(f"the observation lacks {missing}", param=missing[0])
    images = {}
    for key, name in CAMERA_KEYS.items():
        image = message[key]
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
            raise InvalidTick(f"{key} must be a uint8 msgpack-numpy array", param=key)
        images[name] = image
    observation: dict[str, Any] = {"images": images}
    for name in VECTOR_KEYS:
        key = f"observation/{name}"
        observation[name] = _vector(key, message.get(key))
    return observation


def tick_of(message: dict[str, Any], *, request_id: str, chunk_index: int, reset: bool) -> dict[str, Any]:
    """The robot tick body of one observation message (the worker keeps the order: its chunk and id)."""
    prompt = message.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidTick("prompt must be a string", param="prompt")
    return {
        "request_id": request_id,
        "chunk_index": chunk_index,
        "reset": reset,
        "prompt": prompt or None,
        "observation": observation_of(message),
    }


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
            view = (await self.service.open_stream(self.session_id, authorization)).view
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
            try:
                if not data:
                    raise InvalidTick("messages are binary msgpack observations", param="body")
                request = unpack(data)
                if request.get("endpoint") == "reset":
                    await self.service.reset(self.session_id, authorization)
                    next_index, reset = 0, True
                    await self._send(pack({"status": "reset successful"}))
                    continue
                request_id = f"openpi-{self.connection}-{next_index}"
                body = tick_of(request, request_id=request_id, chunk_index=next_index, reset=reset)
                outcome = await self.service.tick(self.session_id, body, authorization=authorization)
            except WorkerError as error:
                if ends_stream(error):
                    await self.fail(error)
                    return
                if error.code == "reset_required":
                    next_index, reset = 0, True
                await self.send_error(error)
                continue
            next_index, reset = outcome.chunk.chunk_index + 1, False
            await self._send(pack(outcome.chunk.actions))
