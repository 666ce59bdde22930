"""DreamZero, the second model family: the real `DreamZeroPipeline`/`CausalWanModel` with tiny random
weights, loaded by the real loader, on CPU (bfloat16), in this process, behind the session adapter and the
worker's HTTP tick (`create_app` over a `WorkerService` whose runtime is this module's adapter: one load
for the module).

Capacity equals the planner's; both KV branches are allocated per session and freed; two interleaved sessions
give bit-identical actions and latents to one alone; a session exported and imported (or forked beside its
parent, sharing both branches' blocks) continues bit-identically; the robot tick validates every observation
field with a 400 naming it, answers actions as JSON or raw float32 (+ predicted frames), replays a retried
request id and keeps the chunk order.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import PIL.Image
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ardiff.worker.conditioning import Conditioning
from ardiff.worker.runtime import run_tick as run_prepared
from ardiff.worker.session_book import CachedChunk, SessionBook
from ardiff.worker.settings import WorkerSettings

pytestmark = pytest.mark.slow

FREE_BYTES = 2 << 30  # at fraction 0.7: two sessions of 603 MiB model-owned state fit, not three
FRACTION = 0.7
PIPELINE = "DreamZeroPipeline"


def camera_images(seed: int, frames: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (180, 320, 3) if frames == 0 else (frames, 180, 320, 3)
    names = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
    return {name: rng.integers(0, 255, shape, dtype=np.uint8) for name in names}


def observation(seed: int, chunk: int, *, encoding: str = "raw") -> dict:
    images = {}
    for name, pixels in camera_images(seed * 100 + chunk, 0 if chunk == 0 else 4).items():
        if encoding == "raw":
            images[name] = {
                "encoding": "raw",
                "shape": list(pixels.shape),
                "data": base64.b64encode(pixels.tobytes()).decode(),
            }
        else:
            buffer = io.BytesIO()
            PIL.Image.fromarray(pixels if pixels.ndim == 3 else pixels[-1]).save(buffer, format="PNG")
            images[name] = {"encoding": "png", "data": base64.b64encode(buffer.getvalue()).decode()}
    rng = np.random.default_rng(seed + chunk)
    return {
        "images": images,
        "joint_position": rng.uniform(-1, 1, 7).round(3).tolist(),
        "cartesian_position": rng.uniform(-1, 1, 6).round(3).tolist(),
        "gripper_position": [0.5],
    }


@pytest.fixture(scope="module")
def adapter(tiny_model_cache):
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    runtime = load_vllm_runtime(
        WorkerSettings(
            model="tiny-dreamzero",
            pipeline=PIPELINE,
            model_cache=str(tiny_model_cache),
            cpu_free_memory_bytes=FREE_BYTES,
            kv_memory_fraction=FRACTION,
        )
    )
    yield runtime
    runtime.shutdown()


def run_tick(adapter, session: str, chunk: int, seed: int, *, reset: bool = False):
    from ardiff.worker.families import dreamzero

    body = {"request_id": f"{session}-{chunk}", "chunk_index": chunk, "reset": reset}
    tick = dreamzero.decode_tick(
        dreamzero.parse_tick(session, {**body, "observation": observation(seed, chunk)})
    )
    prepared = adapter.ticks.prepare(tick, Conditioning(seed=seed, prompt="pick up the red cup"))
    return run_prepared(adapter, prepared)


def test_capacity_is_the_planners(adapter):
    from ardiff.kv.capacity import KVCacheSpec, plan_capacity

    spec = adapter._runner._ar_diffusion_kv_cache_spec
    plan = plan_capacity(
        KVCacheSpec.from_vllm_omni(spec),
        dtype="bfloat16",
        available_bytes=FREE_BYTES,
        gpu_memory_fraction=FRACTION,
    )
    assert [b.name for b in spec.kv_branches] == ["positive", "negative"]
    assert spec.model_owned_state_bytes_per_session == 603 << 20
    assert adapter.capacity == plan.capacity == 2
    kv = adapter._runner.kv_cache
    assert (kv.num_blocks, kv.cross_attention_reserved_bytes) == (
        plan.managed_blocks,
        plan.capacity * plan.footprint.cross_attention_bytes_per_session,
    )


def test_on_cpu_the_vae_runs_in_float32_and_the_rest_in_bfloat16(adapter):
    import torch

    pipeline = adapter.pipeline
    assert {p.dtype for p in pipeline.vae.parameters()} == {torch.float32}
    assert {p.dtype for p in pipeline.transformer.parameters()} == {torch.bfloat16}


def test_two_branches_per_session_freed_on_reset_and_close(adapter):
    total = adapter.kv_blocks().total
    free_before = adapter.kv_blocks().free
    first = run_tick(adapter, "branches", 0, seed=7, reset=True)
    assert first.actions.shape == (24, 8)
    assert first.actions.dtype == np.float32
    assert np.isfinite(first.actions).all()
    blocks = adapter.branch_blocks("branches")
    assert set(blocks) == {"positive", "negative"}
    assert blocks["positive"] == blocks["negative"] > 0
    assert free_before - adapter.kv_blocks().free == 2 * blocks["positive"]
    run_tick(adapter, "branches", 1, seed=7)
    grown = adapter.branch_blocks("branches")
    assert grown["positive"] == grown["negative"] > blocks["positive"]
    assert free_before - adapter.kv_blocks().free == 2 * grown["positive"]
    adapter.reset("branches")
    assert adapter.branch_blocks("branches") == {}
    assert adapter.kv_blocks().free == free_before
    run_tick(adapter, "branches", 0, seed=7, reset=True)
    assert adapter.kv_blocks().free < free_before
    adapter.close("branches")
    assert adapter.kv_blocks() == type(adapter.kv_blocks())(free=free_before, total=total)
    assert "branches" not in adapter.resident_sessions()


def test_two_branch_isolation_is_bit_exact(adapter):
    alone = [run_tick(adapter, "solo", k, seed=11, reset=k == 0) for k in range(2)]
    adapter.close("solo")
    mixed = []
    for k in range(2):
        mixed.append(run_tick(adapter, "a", k, seed=11, reset=k == 0))
        run_tick(adapter, "b", k, seed=29, reset=k == 0)
    for one, other in zip(alone, mixed, strict=True):
        assert np.array_equal(one.actions, other.actions)
        assert one.latents.dtype == other.latents.dtype
        assert np.array_equal(one.latents.float().numpy(), other.latents.float().numpy())
    assert not np.array_equal(mixed[1].actions, run_tick(adapter, "b", 2, seed=29).actions)
    adapter.close("a")
    adapter.close("b")


# ------------------------------------------------------------------------------------------ export / import


def book_after(session: str, chunk: int, output) -> SessionBook:
    cached = CachedChunk(f"{session}-{chunk}", chunk, output.frames, output.metadata, output.actions)
    return SessionBook(session, token_sha256="ab" * 32).advanced(cached)


def assert_same(got, want) -> None:
    assert np.array_equal(got.actions, want.actions)
    assert got.latents.dtype == want.latents.dtype
    assert np.array_equal(got.latents.float().numpy(), want.latents.float().numpy())


@pytest.fixture(scope="module")
def exported(adapter):
    """Chunk 2 of an uninterrupted session (`twin`); `a` after 2 chunks (resident), its book and export."""
    reference = [run_tick(adapter, "twin", k, seed=13, reset=k == 0) for k in range(3)][2]
    adapter.close("twin")
    for k in range(2):
        last = run_tick(adapter, "a", k, seed=13, reset=k == 0)
    book = book_after("a", 1, last)
    out = io.BytesIO()
    assert adapter.export_session("a", out, book=book) == out.tell()
    return reference, book, out.getvalue()


def self_kv_blocks(adapter, session: str) -> int:
    kv = adapter._runner.kv_cache
    return sum(len(kv.block_table(a)) for a in adapter._runner._sessions[session].adapters.values())


def test_a_fork_on_the_parents_pod_shares_both_branches_and_continues_bit_identically(adapter, exported):
    """The export of `a` imported as `fork` beside it: both KV branches' blocks shared (none taken), the
    cross-attention and the pipeline's `DreamZeroState` copied; child and parent each give chunk 2 exactly as
    the twin did. Before: DreamZero sessions could not export (reset-on-evict)."""
    from ardiff.worker.block_share import shared_blocks

    reference, _, blob = exported
    held, before = self_kv_blocks(adapter, "a"), adapter.kv_blocks().free
    assert set(adapter.branch_blocks("a")) == {"positive", "negative"}
    forked = adapter.import_session(io.BytesIO(blob), as_session="fork", share_with="a")
    assert (forked.session_id, forked.next_chunk_index) == ("fork", 2)
    assert before - adapter.kv_blocks().free == 0
    assert shared_blocks(adapter._runner.kv_cache) == held > 0
    assert_same(run_tick(adapter, "fork", 2, seed=13), reference)
    assert_same(run_tick(adapter, "a", 2, seed=13), reference)
    for session in ("a", "fork"):
        adapter.close(session)
    assert shared_blocks(adapter._runner.kv_cache) == 0


def test_an_export_closed_and_imported_continues_bit_identically(adapter, exported):
    reference, book, blob = exported
    empty = adapter.kv_blocks()
    imported = adapter.import_session(io.BytesIO(blob))
    assert imported.to_dict() == book.to_dict()  # the cached actions travel: a retried tick stays a retry
    assert np.array_equal(imported.retry_of("a-1", 1).actions, book.last_chunk.actions)
    assert adapter.branch_blocks("a")["positive"] == adapter.branch_blocks("a")["negative"] > 0
    assert_same(run_tick(adapter, "a", 2, seed=13), reference)
    adapter.close("a")
    assert adapter.kv_blocks() == empty
    assert "a" not in adapter.pipeline._states


def test_a_corrupt_export_is_refused_and_leaves_nothing(adapter, exported):
    from ardiff.worker.errors import ExportCorrupt

    _, _, blob = exported
    empty = adapter.kv_blocks()
    with pytest.raises(ExportCorrupt, match="checksum mismatch"):
        adapter.import_session(io.BytesIO(blob[:-1] + bytes([blob[-1] ^ 1])))
    assert adapter.resident_sessions() == ()
    assert adapter.kv_blocks() == empty
    assert "a" not in adapter.pipeline._states


def test_with_vllm_omnis_state_manager_its_sessions_do_not_export(adapter, exported, monkeypatch):
    """The opt-in `SessionStateManager` holds the sessions' state where this exporter does not look."""
    from ardiff.worker.errors import ExportUnsupported

    _, _, blob = exported
    monkeypatch.setattr(adapter.pipeline, "_memory_manager", object())
    assert not adapter.supports_export
    with pytest.raises(ExportUnsupported, match="reset-on-evict"):
        adapter.import_session(io.BytesIO(blob))


# ------------------------------------------------------------------------------------------ HTTP


class SharedRuntime:
    """The module's adapter as a worker's runtime; the worker's stop leaves it loaded."""

    def __init__(self, adapter) -> None:
        self._adapter = adapter

    def __getattr__(self, name: str):
        return getattr(self._adapter, name)

    @property
    def capacity(self) -> int:
        return self._adapter.capacity

    @property
    def frame_size(self) -> tuple[int, int]:
        return self._adapter.frame_size

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def http(adapter):
    from ardiff.worker.app import create_app
    from ardiff.worker.service import WorkerService

    settings = WorkerSettings(pipeline=PIPELINE, model="tiny-dreamzero")
    service = WorkerService(settings, lambda: SharedRuntime(adapter))
    with TestClient(create_app(service)) as client:
        for _ in range(200):
            if client.get("/readyz").status_code == 200:
                break
            import time

            time.sleep(0.05)
        yield client


def post(http, session: str, chunk: int, *, accept: str | None = None, **body):
    payload = {"request_id": f"{session}-{chunk}", "chunk_index": chunk, **body}
    payload.setdefault("observation", observation(3, chunk))
    payload.setdefault("prompt", "put the block in the bowl")
    headers = {"accept": accept} if accept else {}
    return http.post(f"/v1/sessions/{session}/ticks", json=payload, headers=headers)


def error(response) -> tuple[int, str, str]:
    envelope = response.json()["error"]
    return response.status_code, envelope["code"], envelope["param"]


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (lambda o: o["images"].pop("wrist_image_left"), "observation.images.wrist_image_left"),
        (
            lambda o: o["images"]["wrist_image_left"].update(shape=[180, 320, 4]),
            "observation.images.wrist_image_left.shape",
        ),
        (
            lambda o: o["images"]["exterior_image_0_left"].update(shape=[90, 320, 3]),
            "observation.images.exterior_image_0_left.shape",
        ),
        (
            lambda o: o["images"]["exterior_image_1_left"].update(dtype="float32"),
            "observation.images.exterior_image_1_left.dtype",
        ),
        (
            lambda o: o["images"]["wrist_image_left"].update(data="not base64!"),
            "observation.images.wrist_image_left.data",
        ),
        (
            lambda o: o["images"]["wrist_image_left"].update(encoding="png"),
            "observation.images.wrist_image_left.shape",
        ),
        (lambda o: o.update(joint_position=[0.0] * 6), "observation.joint_position"),
        (lambda o: o.update(gripper_position=["x"]), "observation.gripper_position.0"),
        (lambda o: o.pop("cartesian_position"), "observation.cartesian_position"),
    ],
)
def test_a_bad_observation_is_400_naming_the_field(http, mutate, param):
    body = observation(5, 0)
    mutate(body)
    response = post(http, "bad-obs", 0, observation=body)
    assert error(response) == (400, "invalid_tick", param), response.json()
    assert http.get("/v1/sessions").json()["admitted"] == 0  # nothing reached the runner


def test_robot_tick_json_raw_retry_and_order(http):
    first = post(http, "robot", 0, reset=True)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "application/json"
    body = first.json()
    assert body["action_shape"] == [24, 8]
    assert np.isfinite(body["actions"]).all()
    assert json.loads(first.headers["ardiff-chunk-metadata"]) == {
        "session_id": "robot",
        "request_id": "robot-0",
        "chunk_index": 0,
        "applied_event_ids": [],
    }
    retried = post(http, "robot", 0, reset=True)
    assert retried.json() == body  # the same request id replays the chunk without advancing
    assert error(post(http, "robot", 5)) == (409, "chunk_out_of_order", "chunk_index")
    raw = post(http, "robot", 1, accept="application/octet-stream", return_frames=True)
    assert raw.status_code == 200
    assert raw.headers["ardiff-action-shape"] == "24,8"
    frame_shape = [int(n) for n in raw.headers["ardiff-frame-shape"].split(",")]
    assert frame_shape[1:] == [352, 640, 3]
    assert frame_shape[0] >= 1
    actions = np.frombuffer(raw.content[: 24 * 8 * 4], dtype="<f4").reshape(24, 8)
    frames = np.frombuffer(raw.content[24 * 8 * 4 :], dtype=np.uint8).reshape(frame_shape)
    assert np.isfinite(actions).all()
    assert frames.std() > 0
    assert error(post(http, "robot", 2, return_frames=True)) == (400, "invalid_tick", "return_frames")
    png = post(http, "robot", 2, observation=observation(3, 2, encoding="png"))
    assert png.status_code == 200
    assert png.json()["action_shape"] == [24, 8]
    assert http.delete("/v1/sessions/robot").status_code == 200
    assert "robot" not in http.get("/v1/sessions").json()["sessions"]


# ------------------------------------------------------------------------------------------ openpi


def pack_array(value):
    """openpi-client's msgpack_numpy encoding (its published wire format), written here from the protocol:
    the package itself pins numpy < 2 and cannot join this environment."""
    if isinstance(value, np.ndarray | np.generic) and value.dtype.kind in "VOc":
        raise ValueError(f"unsupported dtype {value.dtype}")
    if isinstance(value, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": value.tobytes(),
            b"dtype": value.dtype.str,
            b"shape": value.shape,
        }
    if isinstance(value, np.generic):
        return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
    return value


def unpack_array(value):
    if b"__ndarray__" in value:
        return np.ndarray(buffer=value[b"data"], dtype=np.dtype(value[b"dtype"]), shape=value[b"shape"])
    if b"__npgeneric__" in value:
        return np.dtype(value[b"dtype"]).type(value[b"data"])
    return value


def openpi_observation(seed: int, frames: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        **{f"observation/{name}": pixels for name, pixels in camera_images(seed, frames).items()},
        "observation/joint_position": rng.uniform(-1, 1, 7),
        "observation/cartesian_position": rng.uniform(-1, 1, 6),
        "observation/gripper_position": np.array([0.2]),
        "prompt": "pick up the red cup",
    }


def test_an_openpi_client_drives_a_session(http):
    import msgpack

    packb = lambda value: msgpack.packb(value, default=pack_array)  # noqa: E731
    unpackb = lambda data: msgpack.unpackb(data, object_hook=unpack_array)  # noqa: E731
    headers = {"authorization": "Api-Key any-token"}  # openpi's scheme (standalone: not checked)
    with http.websocket_connect("/v1/sessions/policy/openpi", headers=headers) as ws:
        metadata = unpackb(ws.receive_bytes())
        assert metadata["image_resolution"] == [180, 320]
        assert metadata["needs_wrist_camera"] is True
        ws.send_bytes(packb(openpi_observation(1, 0)))
        first = unpackb(ws.receive_bytes())
        assert first.shape == (24, 8)
        assert first.dtype == np.float32
        ws.send_bytes(packb(openpi_observation(2, 4)))
        second = unpackb(ws.receive_bytes())
        assert second.shape == (24, 8)
        view = http.get("/v1/sessions/policy").json()
        assert view["next_chunk_index"] == 2
        assert view["last_request_id"].startswith("openpi-")
        bad = openpi_observation(3, 4)
        del bad["observation/wrist_image_left"]
        ws.send_bytes(packb(bad))
        error = json.loads(ws.receive_text())["error"]
        assert (error["code"], error["param"]) == ("invalid_tick", "observation/wrist_image_left")
        ws.send_bytes(packb({"endpoint": "reset"}))
        assert unpackb(ws.receive_bytes()) == {"status": "reset successful"}
        ws.send_bytes(packb(openpi_observation(1, 0)))
        again = unpackb(ws.receive_bytes())
        assert np.array_equal(again, first)  # chunk 0 again after the reset: the same actions
        assert http.get("/v1/sessions/policy").json()["next_chunk_index"] == 1
    assert http.delete("/v1/sessions/policy").status_code == 200


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)  # what JSON can carry
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
OBSERVATION_PATHS = st.sampled_from(
    [
        ("images",),
        ("joint_position",),
        ("cartesian_position",),
        ("gripper_position",),
        ("surprise",),
        *[
            ("images", camera, field)
            for camera in CAMERAS
            for field in ("encoding", "shape", "data", "dtype")
        ],
    ]
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(path=OBSERVATION_PATHS, value=JSON_VALUES, chunk=st.integers(-1, 2) | st.text(max_size=3))
def test_fuzzed_robot_ticks_get_4xx_never_5xx_and_never_reach_the_runner(http, path, value, chunk):
    body = observation(5, 0)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    response = http.post(
        "/v1/sessions/fuzzed/ticks",
        json={"request_id": "fuzz", "chunk_index": chunk, "observation": body, "prompt": "stack the cups"},
    )
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        assert response.json()["error"]["code"] in {"invalid_tick", "chunk_out_of_order", "body_too_large"}
        assert "fuzzed" not in {s["session_id"] for s in http.get("/v1/sessions").json()["sessions"]}
    else:  # the mutation happened to be valid: the session ticked; start it over for the next example
        assert http.delete("/v1/sessions/fuzzed").status_code == 200
