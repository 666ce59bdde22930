"""A DreamZero pool through the real operator (issue 15 item 5): worker Pods running the real worker app over
the fake runtime's DreamZero mode (the pool's `model.pipeline` is DreamZeroPipeline). A robot session is
placed through Redis, ticked with its token (HTTP `Authorization: Bearer`, the OpenPI WebSocket's `Api-Key`),
evicted by a newcomer (its two branches' blocks released; without a tier to suspend to it starts over:
reset-on-evict), or with one suspended and resumed without a reset, its cached actions travelling with it
(issue 26); and a session whose family is not its pool's fails with `FamilyMismatch` and an Event."""

from __future__ import annotations

import base64
import json

import httpx
import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from tests.operator.conftest import FAKE_WORKER_ENV, Cluster

pytestmark = pytest.mark.slow

CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
DREAMZERO_MODEL = {"name": "tiny-dreamzero", "pipeline": "DreamZeroPipeline", "height": 64, "width": 64}
ONE_SLOT_ENV = [e for e in FAKE_WORKER_ENV if e["name"] != "ARDIFF_FAKE_CAPACITY"] + [
    {"name": "ARDIFF_FAKE_CAPACITY", "value": "1"}
]


def observation(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    images = {
        camera: {
            "encoding": "raw",
            "shape": [32, 48, 3],
            "data": base64.b64encode(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8).tobytes()).decode(),
        }
        for camera in CAMERAS
    }
    return {
        "images": images,
        "joint_position": rng.uniform(-1, 1, 7).tolist(),
        "cartesian_position": rng.uniform(-1, 1, 6).tolist(),
        "gripper_position": [0.5],
    }


def robot_tick(
    cluster: Cluster,
    session: str,
    chunk: int,
    *,
    token: str | None = None,
    endpoint: str | None = None,
    **body,
) -> httpx.Response:
    endpoint = endpoint or cluster.status(session)["endpoint"]
    payload = {
        "request_id": f"{session}-{chunk}",
        "chunk_index": chunk,
        "observation": observation(chunk),
        **body,
    }
    return cluster.http.post(
        f"{endpoint}/v1/sessions/{session}/ticks",
        json=payload,
        headers={"Authorization": f"Bearer {token or cluster.token(session)}"},
        timeout=30,
    )


def pack_array(value):
    """openpi-client's msgpack-numpy markers (its published wire format)."""
    if isinstance(value, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": value.tobytes(),
            b"dtype": value.dtype.str,
            b"shape": value.shape,
        }
    return value


def unpack_array(value):
    if b"__ndarray__" in value:
        return np.ndarray(buffer=value[b"data"], dtype=np.dtype(value[b"dtype"]), shape=value[b"shape"])
    return value


def openpi_observation(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        **{f"observation/{c}": rng.integers(0, 255, (32, 48, 3), dtype=np.uint8) for c in CAMERAS},
        "observation/joint_position": rng.uniform(-1, 1, 7),
        "observation/cartesian_position": rng.uniform(-1, 1, 6),
        "observation/gripper_position": np.array([0.2]),
        "prompt": "pick up the red cup",
    }


def kv_blocks(cluster: Cluster, endpoint: str) -> dict[str, int]:
    return cluster.http.get(f"{endpoint}/v1/sessions").json()["kv_blocks"]


def test_a_robot_session_is_placed_ticked_with_its_token_and_evicted_to_start_over(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    cluster.create_pool(model=DREAMZERO_MODEL, env=ONE_SLOT_ENV)
    cluster.create_session("arm", family="dreamzero")
    status = cluster.wait_phase("arm", "Ready")
    endpoint = status["endpoint"]
    empty = kv_blocks(cluster, endpoint)
    assert empty["free"] == empty["total"] == 2 * 9  # one slot, two branches of 9 blocks

    first = robot_tick(cluster, "arm", 0)
    assert first.status_code == 200, first.text
    assert first.json()["action_shape"] == [24, 8]
    assert robot_tick(cluster, "arm", 0).json() == first.json()  # a retried request: the same chunk
    assert robot_tick(cluster, "arm", 1, token="not-its-token").status_code == 401
    used = kv_blocks(cluster, endpoint)
    assert empty["total"] - used["free"] == 2 * 3  # one chunk: 3 blocks on each branch

    # OpenPI: the same session, its token under openpi's Api-Key scheme; the worker keeps the order (chunk 1).
    ws_url = endpoint.replace("http://", "ws://") + "/v1/sessions/arm/openpi"
    packb = lambda value: msgpack.packb(value, default=pack_array)  # noqa: E731
    unpackb = lambda data: msgpack.unpackb(data, object_hook=unpack_array)  # noqa: E731
    with connect(ws_url, additional_headers={"Authorization": f"Api-Key {cluster.token('arm')}"}) as ws:
        assert unpackb(ws.recv())["needs_wrist_camera"] is True
        ws.send(packb(openpi_observation(1)))
        actions = unpackb(ws.recv())
        assert (actions.shape, actions.dtype) == ((24, 8), np.float32)
    with connect(ws_url, additional_headers={"Authorization": "Api-Key wrong"}) as ws:
        assert json.loads(ws.recv())["error"]["code"] == "unauthorized"  # an openpi client raises it
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 4401
    view = cluster.worker_session("arm", endpoint).json()
    assert view["next_chunk_index"] == 2

    # A newcomer on the full pool (max 1, one slot) evicts it: its blocks are released on the worker, and
    # the pool has no tier to suspend to, so it is Evicted (not Suspended) and starts over when placed again.
    cluster.create_session("gripper", family="dreamzero", priority=5)
    evicted = cluster.wait_phase("arm", "Evicted")
    assert "gripper" in evicted.get("message", "")
    cluster.wait_phase("gripper", "Ready")
    wait_until(
        lambda: kv_blocks(cluster, endpoint)["free"] == empty["total"], timeout=10, what="arm's blocks freed"
    )
    gone = robot_tick(cluster, "arm", 2, endpoint=endpoint)
    assert (gone.status_code, gone.json()["error"]["code"]) == (410, "session_evicted")
    assert any(e["involvedObject"]["name"] == "arm" for e in cluster.events("Evicted"))

    cluster.delete("ardiffusionsessions", "gripper")
    again = cluster.wait_phase("arm", "Ready", timeout=60, resetRequired=True)
    stale = robot_tick(cluster, "arm", 2)
    assert (stale.status_code, stale.json()["error"]["code"]) == (409, "reset_required")
    restart = robot_tick(cluster, "arm", 0, reset=True)
    assert restart.status_code == 200, restart.text
    assert restart.json() == first.json()  # chunk 0 of the same observation and seed: the same actions
    assert again["pod"] == status["pod"]


def test_with_a_shared_tier_a_robot_session_is_suspended_and_resumes_without_reset(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    """Before: DreamZero pods registered `exports=0` whatever their tier, so this session was Evicted."""
    tier = cluster.shared_tier()
    cluster.create_pool(model=DREAMZERO_MODEL, env=[*ONE_SLOT_ENV, tier.env], **tier.pool_spec)
    cluster.create_session("arm", family="dreamzero")
    endpoint = cluster.wait_phase("arm", "Ready")["endpoint"]
    ticked = [robot_tick(cluster, "arm", chunk) for chunk in (0, 1)]
    assert [r.status_code for r in ticked] == [200, 200], ticked[-1].text
    cluster.create_session("gripper", family="dreamzero", priority=5)
    suspended = cluster.wait_phase("arm", "Suspended", reason="SuspendedForCapacity")
    assert (suspended["tier"], suspended["resetRequired"]) == ("shared", False)
    assert suspended["bytes"] > 0
    assert len(list(tier.host_path.rglob("*.ardsess"))) == 1
    cluster.wait_phase("gripper", "Ready")
    cluster.delete("ardiffusionsessions", "gripper")
    demand = robot_tick(cluster, "arm", 2, endpoint=endpoint)  # a tick for it is a demand to resume it
    assert (demand.status_code, demand.json()["error"]["code"]) == (503, "resuming"), demand.text
    cluster.wait_phase("arm", "Ready", timeout=60, resetRequired=False)
    retried = robot_tick(cluster, "arm", 1)  # the book moved with it: the cached actions, not a new chunk
    assert (retried.status_code, retried.json()) == (200, ticked[1].json())
    after = robot_tick(cluster, "arm", 2)
    assert after.status_code == 200, after.text
    assert after.json()["action_shape"] == [24, 8]
    assert cluster.worker_session("arm", cluster.status("arm")["endpoint"]).json()["next_chunk_index"] == 3


def test_a_session_of_another_family_fails_with_family_mismatch(
    cluster: Cluster, operator_process: OperatorProcess
) -> None:
    """Both ways: a LingBot session (the default family) on a DreamZero pool at admission, and a DreamZero
    session created before its (LingBot) pool, failed once the pool appears."""
    cluster.create_session("early-robot", pool="world", family="dreamzero")
    cluster.wait_phase("early-robot", "Failed", reason="UnknownPool")
    cluster.create_pool(model=DREAMZERO_MODEL)
    cluster.create_session("walker")  # family: lingbot by default
    failed = cluster.wait_phase("walker", "Failed", reason="FamilyMismatch")
    assert "'lingbot' differs from pool pool's family 'dreamzero'" in failed["message"]
    cluster.create_pool("world")
    late = cluster.wait_phase("early-robot", "Failed", timeout=30, reason="FamilyMismatch")
    assert "(its model.pipeline LingBotWorldCausalDMDPipeline)" in late["message"]

    def mismatch_events() -> set[str] | None:  # kopf posts events in the background
        names = {
            e["involvedObject"]["name"] for e in cluster.events("Failed") if "FamilyMismatch" in e["message"]
        }
        return names if names == {"walker", "early-robot"} else None

    wait_until(mismatch_events, timeout=10, what="a Failed event per mismatched session")
    assert "pod" not in failed  # never placed
    assert "pod" not in late
    assert cluster.pool_status().get("sessions", 0) == 0
