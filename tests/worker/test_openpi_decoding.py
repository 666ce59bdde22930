"""OpenPI decoding refuses what it cannot bound (issue 23 item 2): a real DreamZero worker process (fake
runtime, standalone) takes hostile msgpack-numpy observations over its `/openpi` WebSocket; each gets a clear
`invalid_tick` and the worker's peak memory (its kernel high-water mark, `VmHWM`) stays put. Then the decoder
itself, message by message, without a worker."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
from websockets.sync.client import connect

from ardiff.worker.errors import InvalidTick
from ardiff.worker.openpi import MAX_MESSAGE_BYTES, observation_of, tick_of, unpack

MiB = 1 << 20
CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")


def ndarray(array: np.ndarray) -> dict:
    """openpi-client's msgpack-numpy marker of an array."""
    return {b"__ndarray__": True, b"data": array.tobytes(), b"dtype": array.dtype.str, b"shape": array.shape}


def npgeneric(dtype: str, data) -> dict:
    return {b"__npgeneric__": True, b"data": data, b"dtype": dtype}


def observation(**overrides) -> dict:
    rng = np.random.default_rng(0)
    message = {
        **{
            f"observation/{camera}": ndarray(rng.integers(0, 255, (180, 320, 3), dtype=np.uint8))
            for camera in CAMERAS
        },
        "observation/joint_position": ndarray(np.zeros(7)),
        "observation/cartesian_position": ndarray(np.zeros(6)),
        "observation/gripper_position": ndarray(np.zeros(1)),
        "prompt": "stack the cups",
    }
    message.update(overrides)
    return message


def packed(message: dict) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def peak_rss_bytes(pid: int) -> int:
    """The process's resident-memory high-water mark (what the OOM killer would have seen)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


@pytest.fixture(scope="module")
def robot_worker(launch_worker, tiny_model_cache):
    worker = launch_worker(
        runtime="fake",
        pipeline="DreamZeroPipeline",
        model="tiny-dreamzero",
        model_cache=str(tiny_model_cache),
    )
    yield worker
    worker.stop()


def answers(worker, messages: list[bytes]) -> list:
    """Each message's answer on one `/openpi` connection: an error envelope (text) or the actions."""
    url = worker.url.replace("http://", "ws://") + "/v1/sessions/robot/openpi"
    replies = []
    with connect(url, max_size=16 * MiB) as ws:
        msgpack.unpackb(ws.recv())  # the policy metadata
        for message in messages:
            ws.send(message)
            reply = ws.recv(timeout=60)
            replies.append(json.loads(reply)["error"] if isinstance(reply, str) else msgpack.unpackb(reply))
    return replies


def test_the_reported_void_scalars_get_a_clear_error_and_cost_no_memory(robot_worker):
    """The reproduction: ~500 KB whose joint_position holds four `V8` scalars claiming 400,000,000 bytes
    each. Before: the worker's peak memory grew by 1.3 GB (np.void(400000000), then np.asarray of them)."""
    pid = robot_worker.process.pid
    good = answers(robot_worker, [packed(observation())])  # a valid tick first: the baseline is warm
    assert isinstance(good[0], dict)  # the actions (a msgpack ndarray marker)
    before = peak_rss_bytes(pid)
    hostile = packed(observation(**{"observation/joint_position": [npgeneric("V8", 400_000_000)] * 4}))
    assert 400_000 < len(hostile) < 600_000
    (error,) = answers(robot_worker, [hostile])
    assert error["code"] == "invalid_tick"
    assert error["param"] == "observation/joint_position"
    assert "dtype" in error["message"]
    grown = peak_rss_bytes(pid) - before
    assert grown < 64 * MiB, f"peak memory grew by {grown / MiB:.0f} MiB"
    # The session is unharmed: the next good observation is its next tick.
    assert isinstance(answers(robot_worker, [packed(observation())])[0], dict)


def test_hostile_messages_each_get_an_error_and_the_worker_stays_small(robot_worker):
    pid = robot_worker.process.pid
    before = peak_rss_bytes(pid)
    hostile = [
        packed(observation(**{"observation/joint_position": npgeneric("<i8", 2**64 - 1)})),  # overflows int64
        packed(observation(**{"observation/joint_position": npgeneric("<f8", b"\x00" * 8)})),  # no number
        packed(observation(**{"observation/gripper_position": ndarray(np.zeros(3, dtype="<M8[s]"))})),
        packed(observation(**{"observation/wrist_image_left": ndarray(np.zeros((2, 2), dtype="<U4"))})),
        packed(observation(**{"observation/cartesian_position": [0.0] * 100_000})),
        packed({f"k{i}": None for i in range(400_000)}),  # a map of 400,000 entries
        b"\x91" * 200_000 + b"\x00",  # 200,000 nested arrays
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
        b"\xc7\x05\x01abcde",  # an extension type
    ]
    replies = answers(robot_worker, hostile)
    assert [reply["code"] for reply in replies] == ["invalid_tick"] * len(hostile)
    grown = peak_rss_bytes(pid) - before
    assert grown < 64 * MiB, f"peak memory grew by {grown / MiB:.0f} MiB"
    assert isinstance(answers(robot_worker, [packed(observation())])[0], dict)


# ---- the decoder alone ------------------------------------------------------------------------------------


def test_an_openpi_observation_decodes_to_arrays_views_of_the_message() -> None:
    message = packed(observation(**{"observation/gripper_position": npgeneric("<f4", 0.5)}))
    decoded = unpack(message)
    camera = decoded["observation/wrist_image_left"]
    assert (camera.dtype, camera.shape) == (np.uint8, (180, 320, 3))
    assert not camera.flags.owndata  # a view of the message's bytes: nothing copied
    assert decoded["observation/gripper_position"] == np.float32(0.5)
    assert decoded["prompt"] == "stack the cups"
    obs = observation_of(decoded)
    assert sorted(obs["images"]) == sorted(CAMERAS)
    assert obs["joint_position"].tolist() == [0.0] * 7


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        (packed({"a": npgeneric("V8", 400_000_000)}), "dtype"),
        (packed({"a": npgeneric("<c16", 1.0)}), "dtype"),
        (packed({"a": npgeneric("<i2", 1 << 40)}), "out of range"),
        (packed({"a": npgeneric("<i8", [1, 2])}), "scalar"),
        (packed({"a": {**ndarray(np.zeros(4)), b"shape": (5,)}}), "shape"),
        (packed({"a": {**ndarray(np.zeros(4)), b"shape": (-1,)}}), "shape"),
        (packed({"a": {**ndarray(np.zeros(4)), b"dtype": "<f16"}}), "dtype"),
        (packed({"a": npgeneric("<f1", 1.0)}), "dtype"),
        (packed({"a": {**ndarray(np.zeros(4)), b"dtype": "|O"}}), "dtype"),
        (packed([1, 2]), "mapping"),
        (b"\x81\xa1a" + b"\x91" * 10 + b"\x00", "deep"),
        (b"\xdf\x00\x01\x00\x00", "entries"),
        (b"\xc1", "msgpack"),
        (b"\xd9\x10abc", "truncated"),
    ],
)
def test_the_decoder_refuses_what_it_cannot_bound(message: bytes, needle: str) -> None:
    with pytest.raises(InvalidTick, match=needle):
        unpack(message)


@pytest.mark.parametrize(
    ("name", "value", "param"),
    [
        ("joint_position", [npgeneric("V8", 8)] * 7, "observation/joint_position"),
        ("joint_position", [0.0] * 65, "observation/joint_position"),
        ("joint_position", "seven", "observation/joint_position"),
        ("gripper_position", ndarray(np.zeros((65,))), "observation/gripper_position"),
        ("wrist_image_left", "a picture", "observation/wrist_image_left"),
        ("wrist_image_left", ndarray(np.zeros((4, 4, 3), dtype=np.float32)), "observation/wrist_image_left"),
        ("prompt", 42, "prompt"),
    ],
)
def test_an_observation_refuses_fields_it_cannot_bound(name: str, value, param: str) -> None:
    key = name if name == "prompt" else f"observation/{name}"
    message = packed(observation(**{key: value}))
    with pytest.raises(InvalidTick) as refused:
        tick_of(unpack(message), request_id="r", chunk_index=0, reset=True)
    assert refused.value.param == param


def test_the_message_limit_is_the_decoded_limit() -> None:
    big = packed({"a": ndarray(np.zeros(MAX_MESSAGE_BYTES // 8 + 1))})
    with pytest.raises(InvalidTick, match="at most"):
        unpack(big)
