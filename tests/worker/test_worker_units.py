"""Fast tests of the worker's pure parts: settings, tick rules, session book, conditioning, encoding."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import time

import av
import numpy as np
import PIL.Image
import pytest

from ardiff.worker.background import cancel_and_wait
from ardiff.worker.conditioning import conditioning_image, seed_image
from ardiff.worker.encoding import MP4, RAW, choose_media_type, encode_mp4
from ardiff.worker.errors import ChunkOutOfOrder, InvalidTick, Misdirected
from ardiff.worker.session_book import CachedChunk, SessionBook, SessionStatus
from ardiff.worker.settings import WorkerSettings, add_settings_arguments, build_settings
from ardiff.worker.tick_rules import param_for, parse_tick


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return parser.parse_args(argv)


def test_settings_flags_win_over_env_which_win_over_defaults():
    env = {
        "ARDIFF_HEIGHT": "128",
        "ARDIFF_WIDTH": "96",
        "ARDIFF_RUNTIME": "fake",
        "ARDIFF_PORT": "9001",
        "ARDIFF_SESSION_CAPACITY": "",
        "ARDIFF_TEST_FAULTS": "1",
        "ARDIFF_POD_NAME": "pod-a",
    }
    settings = build_settings(_parse(["--height", "32", "--kv-memory-fraction", "0.5"]), env)
    assert (settings.height, settings.width, settings.port) == (32, 96, 9001)
    assert settings.runtime == "fake"
    assert settings.kv_memory_fraction == 0.5
    assert settings.session_capacity is None  # an empty env value is unset
    assert settings.test_faults is True
    assert settings.advertised_endpoint == "http://127.0.0.1:9001"
    assert settings.standalone
    defaults = build_settings({}, {"ARDIFF_POD_NAME": "pod-a"})
    assert defaults.model == "tiny-lingbot-world"
    assert defaults.kv_fraction(accelerator=True) == 0.9
    assert defaults.kv_fraction(accelerator=False) == 0.1
    assert defaults.cpu_free_memory_bytes == 8 << 30


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"height": 50}, "worker height must be a positive multiple of 16, got 50"),
        ({"fake_capacity": 0}, "worker fake_capacity must be positive, got 0"),
        ({"kv_memory_fraction": 1.5}, "worker kv_memory_fraction must be in (0, 1], got 1.5"),
        ({"heartbeat_seconds": 20}, "worker heartbeat_seconds must be shorter than lease_seconds"),
        ({"redis_url": "redis://x", "pod_name": "Bad_Name"}, "pod must be a DNS-1123 label"),
    ],
)
def test_settings_reject_bad_values_with_a_clear_message(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        WorkerSettings(**{"pod_name": "pod-a", **values})


def test_a_worker_with_tls_advertises_https_at_its_dns_name(monkeypatch):
    """Issue 23 item 9: a certificate names DNS names, not pod IPs that change. In a Pod with hostname and
    subdomain the kubelet's /etc/hosts gives the FQDN under the headless Service (tests/operator/test_tls)."""
    fqdn = "tiny-ab12c.tiny-workers.worlds.svc.cluster.local"
    monkeypatch.setattr("socket.getfqdn", lambda *_: fqdn)
    tls = {"tls_cert_file": "/etc/ardiff/tls/tls.crt", "tls_key_file": "/etc/ardiff/tls/tls.key"}
    settings = build_settings(
        {}, {f"ARDIFF_{k.upper()}": v for k, v in tls.items()} | {"ARDIFF_POD_IP": "10.0.0.7"}
    )
    assert settings.tls
    assert settings.advertised_endpoint == f"https://{fqdn}:8000"
    assert WorkerSettings(pod_ip="10.0.0.7").advertised_endpoint == "http://10.0.0.7:8000"
    assert (
        WorkerSettings(endpoint="https://w.example:8443", **tls).advertised_endpoint
        == "https://w.example:8443"
    )
    monkeypatch.setattr("socket.getfqdn", lambda *_: "tiny-ab12c")
    with pytest.raises(ValueError, match="has no domain"):
        WorkerSettings(**tls).advertised_endpoint  # noqa: B018
    with pytest.raises(ValueError, match="worker tls_cert_file and tls_key_file must be set together"):
        WorkerSettings(tls_cert_file="/etc/ardiff/tls/tls.crt")


def test_settings_reject_unparsable_env():
    with pytest.raises(ValueError, match="worker port must be a int, got 'http'"):
        build_settings({}, {"ARDIFF_PORT": "http", "ARDIFF_POD_NAME": "pod-a"})


def test_tick_rules_are_vllm_omnis_and_name_the_field():
    tick = parse_tick(
        "s1",
        {
            "request_id": "r",
            "chunk_index": 2,
            "applied_event_ids": [1, 4],
            "prompt": "p",
            "controls": [{"track": "camera", "schema": "x", "data": {"k": [1, 2]}}],
        },
    )
    assert (tick.session_id, tick.chunk_index, tick.applied_event_ids) == ("s1", 2, (1, 4))
    assert tick.controls[0].to_dict() == {"track": "camera", "schema": "x", "data": {"k": [1, 2]}}
    cases = {
        "chunk_index": {"request_id": "r", "chunk_index": -3},
        "request_id": {"request_id": " ", "chunk_index": 0},
        "applied_event_ids": {"request_id": "r", "chunk_index": 0, "applied_event_ids": [3, 3]},
        "controls": {
            "request_id": "r",
            "chunk_index": 0,
            "controls": [{"track": "", "schema": "x", "data": {}}],
        },
        "reset": {"request_id": "r", "chunk_index": 0, "reset": "yes"},
    }
    for field, body in cases.items():
        with pytest.raises(InvalidTick) as caught:
            parse_tick("s1", body)
        assert caught.value.param == field, caught.value.message
    with pytest.raises(InvalidTick) as caught:
        parse_tick(" ", {"request_id": "r", "chunk_index": 0})
    assert caught.value.param == "session_id"
    assert param_for("LingBot realtime ticks require exactly one camera control.", "controls") == "controls"
    assert param_for("nothing recognisable", "body") == "body"


def test_error_envelopes_carry_code_param_and_extras():
    assert ChunkOutOfOrder("expected 3", expected_chunk_index=3).envelope() == {
        "error": {
            "code": "chunk_out_of_order",
            "message": "expected 3",
            "type": "Conflict",
            "param": "chunk_index",
            "expected_chunk_index": 3,
        }
    }
    misdirected = Misdirected("elsewhere", endpoint="http://10.0.0.2:8000")
    assert misdirected.status == 421
    assert misdirected.envelope()["error"]["endpoint"] == "http://10.0.0.2:8000"


def test_session_book_transitions_and_round_trip():
    frames = np.arange(2 * 16 * 16 * 3, dtype=np.uint8).reshape(2, 16, 16, 3)
    chunk = CachedChunk(
        "req-0",
        0,
        frames,
        {"session_id": "s", "request_id": "req-0", "chunk_index": 0, "applied_event_ids": []},
    )
    book = SessionBook("s", token_sha256="ab" * 32).advanced(chunk)
    assert (book.next_chunk_index, book.status, book.ticks) == (1, SessionStatus.ACTIVE, 1)
    assert book.retry_of("req-0", 0) is chunk
    assert book.retry_of("req-0", 1) is None
    assert book.retry_of("req-1", 0) is None
    restored = SessionBook.from_dict(book.to_dict())
    assert restored.to_dict() == book.to_dict()
    np.testing.assert_array_equal(restored.last_chunk.frames, frames)
    failed = book.failed()
    assert failed.status is SessionStatus.RESET_REQUIRED
    assert failed.last_chunk is None
    assert failed.holds_slot
    again = failed.after_reset()
    assert (again.status, again.next_chunk_index) == (SessionStatus.ACTIVE, 0)
    assert not book.closed().holds_slot
    assert book.describe() == {
        "session_id": "s",
        "state": "active",
        "next_chunk_index": 1,
        "last_request_id": "req-0",
        "ticks": 1,
    }


def test_conditioning_image_from_seed_or_record_bytes():
    first = seed_image(42, 64, 96)
    assert first.shape == (64, 96, 3)
    assert first.dtype == np.uint8
    np.testing.assert_array_equal(first, seed_image(42, 64, 96))
    assert not np.array_equal(first, seed_image(43, 64, 96))
    np.testing.assert_array_equal(conditioning_image(b"", 42, 64, 96), first)
    png = io.BytesIO()
    PIL.Image.fromarray(np.full((30, 40, 3), (200, 10, 10), np.uint8)).save(png, format="PNG")
    decoded = conditioning_image(png.getvalue(), 0, 32, 48)
    assert decoded.shape == (32, 48, 3)
    assert tuple(decoded[5, 5]) == (200, 10, 10)
    with pytest.raises(InvalidTick) as caught:
        conditioning_image(b"not an image", 0, 32, 32)
    assert caught.value.param == "image"


def test_accept_header_chooses_mp4_or_raw():
    assert choose_media_type(None) == RAW
    assert choose_media_type("video/mp4") == MP4
    assert choose_media_type("application/octet-stream;q=0.5, video/mp4") == MP4
    assert choose_media_type("video/mp4;q=0.1, application/octet-stream") == RAW
    assert choose_media_type("text/html") == RAW


def test_mp4_round_trip_keeps_frame_count_and_size():
    frames = np.stack([np.full((32, 48, 3), 10 * i, np.uint8) for i in range(9)])
    with av.open(io.BytesIO(encode_mp4(frames))) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 9
    assert decoded[4].shape == (32, 48, 3)
    assert abs(int(decoded[4].mean()) - 40) <= 3


def test_od_config_kwargs_for_cpu_and_accelerator(tmp_path):
    from ardiff.worker.vllm_runtime import ENGINE_BACKEND, build_od_config_kwargs

    settings = WorkerSettings(height=128, width=64, pod_name="pod-a", session_capacity=1)
    cpu = build_od_config_kwargs(settings, tmp_path, accelerator=False, master_port=29555)
    assert cpu == {
        "model": str(tmp_path),
        "model_class_name": "LingBotWorldCausalDMDPipeline",
        "dtype": "float32",
        "engine_backend": ENGINE_BACKEND,
        "model_config": {
            "ar_diffusion_height": 128,
            "ar_diffusion_width": 64,
            "ar_diffusion_kv_config": {"gpu_memory_fraction": 0.1},
        },
        "num_gpus": 1,
        "master_port": 29555,
        "enforce_eager": True,
        "vae_fast_path": "off",
        "enable_multithread_weight_load": False,
    }
    gpu = build_od_config_kwargs(settings, tmp_path, accelerator=True, master_port=29555)
    assert gpu["dtype"] == "bfloat16"
    assert gpu["model_config"]["ar_diffusion_kv_config"] == {"gpu_memory_fraction": 0.9}
    assert "enforce_eager" not in gpu


async def test_cancel_and_wait_ends_a_task_that_swallowed_its_first_cancel():
    """What Python 3.11's asyncio.wait_for does inside redis-py when a cancel meets a finishing send."""
    swallowed = asyncio.Event()

    async def heartbeat_like() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # dropped: the loop carries on into its next sleep
        await asyncio.sleep(3600)

    task = asyncio.create_task(heartbeat_like())
    await asyncio.sleep(0)
    started = time.monotonic()
    await cancel_and_wait([task], grace_seconds=5)
    assert swallowed.is_set()
    assert task.cancelled()
    assert time.monotonic() - started < 1


async def test_cancel_and_wait_gives_up_on_a_task_that_never_ends(caplog):
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    started = time.monotonic()
    try:
        await cancel_and_wait([task], grace_seconds=0.3)
        assert 0.3 <= time.monotonic() - started < 1.5
        assert not task.done()
        assert "background tasks still running after 0.3s: ['stubborn']" in caplog.text
    finally:  # a failed assertion must not leave the loop a task it cannot close (the run hung 600 s)
        released.set()
        task.cancel()
        await task


def test_a_module_run_in_float32_convolves_in_float32_under_autocast_in_the_inputs_dtype() -> None:
    import torch

    from ardiff.worker.cpu_platform import run_in_float32

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv3d(4, 6, 3, padding=1), torch.nn.Conv2d(6, 2, 1))
    model.append(torch.nn.GroupNorm(1, 2)).to(torch.bfloat16)
    weights = [layer.weight.float().clone() for layer in model]
    video = torch.randn(1, 4, 2, 6, 6).to(torch.bfloat16)

    assert run_in_float32(model) == 2
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(torch.equal(layer.weight, weight) for layer, weight in zip(model, weights, strict=True))
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        bfloat16_out = model[0](video)
        float32_out = model[0](video.float())
    expected = torch.nn.functional.conv3d(video.float(), weights[0], model[0].bias, padding=1)
    assert bfloat16_out.dtype == torch.bfloat16
    assert torch.equal(bfloat16_out, expected.to(torch.bfloat16))
    assert float32_out.dtype == torch.float32
    assert torch.equal(float32_out, expected)
    image = torch.randn(1, 6, 4, 4)
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        assert model[1](image).dtype == torch.float32  # autocast would have made it bfloat16
