"""Admission's pure parts: reading a conditioning image out of a ConfigMap or Secret, and which sessions a
pool round looks after."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest

from ardiff.kv.errors import InvalidPlacementArgument
from ardiff.kv.records import MAX_IMAGE_BYTES
from ardiff.operator.admission import AdmissionFailure, build_placement_spec, decode_image, resolve_image
from ardiff.operator.reconcile import needs_reconcile
from ardiff.operator.specs import ImageRef, InvalidSpec, Playout, SessionResourceSpec
from ardiff.operator.status import Reason
from ardiff.operator.views import SessionView

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("source", "ref", "expected"),
    [
        ({"binaryData": {"k": b64(PNG)}}, ImageRef("configMap", "m", "k"), PNG),
        (
            {"data": {"k": "plain text"}},
            ImageRef("configMap", "m", "k"),
            b"plain text",
        ),  # ConfigMap data is text
        ({"data": {"k": b64(PNG)}}, ImageRef("secret", "s", "k"), PNG),  # Secret data is base64
        ({"data": {"other": "x"}}, ImageRef("configMap", "m", "k"), None),
        ({}, ImageRef("secret", "s", "k"), None),
    ],
)
def test_decode_image(source: dict, ref: ImageRef, expected: bytes | None) -> None:
    assert decode_image(source, ref) == expected


def test_decode_image_rejects_bad_base64() -> None:
    with pytest.raises(AdmissionFailure) as failure:
        decode_image({"binaryData": {"k": "not base64!"}}, ImageRef("configMap", "pics", "k"))
    assert failure.value.reason is Reason.INVALID_SPEC
    assert "'k' of pics is not base64" in failure.value.message


async def test_the_image_limit_is_what_a_config_map_holds_and_one_byte_more_is_refused() -> None:
    assert MAX_IMAGE_BYTES == 1 << 20  # a ConfigMap's or Secret's data (the apiserver's MaxSecretSize)
    image = {"size": MAX_IMAGE_BYTES}

    async def get(*_: Any) -> dict[str, Any]:
        return {"binaryData": {"k": b64(b"x" * image["size"])}}

    ctx: Any = SimpleNamespace(kube=SimpleNamespace(get=get))
    ref = ImageRef("configMap", "pics", "k")
    assert len(await resolve_image(ctx, "ns", ref)) == MAX_IMAGE_BYTES
    image["size"] += 1
    with pytest.raises(AdmissionFailure) as failure:
        await resolve_image(ctx, "ns", ref)
    assert failure.value.reason is Reason.INVALID_SPEC
    assert failure.value.message == "image configMap pics/k has 1048577 bytes, max 1048576"
    spec = SessionResourceSpec.from_resource({"poolRef": "p", "prompt": "a forest"})
    with pytest.raises(InvalidPlacementArgument, match="placement image must be at most 1048576 bytes"):
        build_placement_spec(
            "forest", spec, token_sha256="a" * 64, image=b"x" * (MAX_IMAGE_BYTES + 1), playout=Playout()
        )


def test_placement_spec_carries_the_session_fields() -> None:
    spec = SessionResourceSpec.from_resource(
        {
            "poolRef": "p",
            "prompt": "a forest",
            "seed": 3,
            "priority": 9,
            "evictionPolicy": "Never",
            "maxChunks": 5,
            "playout": {"fps": 24},
        }
    )
    pool_default = Playout(fps=16.0, buffer_chunks=3)
    request = build_placement_spec(
        "forest", spec, token_sha256="a" * 64, image=PNG, playout=spec.playout.resolve(pool_default)
    )
    assert (request.name, request.prompt, request.seed, request.priority) == ("forest", "a forest", 3, 9)
    assert (request.eviction_policy, request.max_chunks, request.image) == ("Never", 5, PNG)
    # Its own fps, its pool's buffer.
    assert (request.playout_fps, request.playout_buffer_chunks) == (24.0, 3)


@pytest.mark.parametrize(
    ("playout", "message"),
    [
        ({"fps": 0}, "spec.playout.fps must be in (0, 120], got 0"),
        ({"fps": 121}, "spec.playout.fps must be in (0, 120], got 121"),
        ({"fps": "16"}, "spec.playout.fps must be a number, got '16'"),
        ({"bufferChunks": 0}, "spec.playout.bufferChunks must be an integer >= 1, got 0"),
        ({"bufferChunks": 17}, "spec.playout.bufferChunks must be in 1..16, got 17"),
    ],
)
def test_a_bad_playout_target_is_an_invalid_spec(playout: dict, message: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        SessionResourceSpec.from_resource({"poolRef": "p", "playout": playout})
    assert str(raised.value) == message


def view(status: dict, **meta: object) -> SessionView:
    body = {
        "metadata": {"name": "s", "namespace": "ns", "uid": "u", **meta},
        "spec": {"poolRef": "p", "prompt": "x"},
        "status": status,
    }
    return SessionView.from_body(body)


@pytest.mark.parametrize(
    ("session", "expected"),
    [
        (view({}), False),  # its create handler has not admitted it yet
        (view({"phase": "Ready"}), True),
        (view({"phase": "Pending"}), True),
        (view({"phase": "Lost"}), True),
        (view({"phase": "Evicted"}), True),
        (view({"phase": "Expired"}), False),
        (view({"phase": "Failed", "reason": "InvalidSpec"}), False),
        (view({"phase": "Failed", "reason": "UnknownPool"}), True),  # admitted once its pool exists
        (view({"phase": "Ready"}, deletionTimestamp="2026-01-01T00:00:00Z"), False),
    ],
)
def test_which_sessions_a_pool_round_looks_after(session: SessionView, expected: bool) -> None:
    assert needs_reconcile(session) is expected
