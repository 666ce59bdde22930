"""The model-family seam (issue 24 item 4): each family module is a `ModelFamily`, each family's session
state a `SessionState` (DreamZero's since issue 26), and a family that lacks part of the seam is refused when
it is looked up."""

from __future__ import annotations

import types
from typing import Any

import pytest

from ardiff.worker import families, tick_rules
from ardiff.worker.conditioning import Conditioning
from ardiff.worker.fake_runtime import FakeRuntime
from ardiff.worker.families import (
    ModelFamily,
    SessionState,
    TickGeometry,
    family_for,
    family_named,
    family_names,
)
from ardiff.worker.runtime import run_tick


def test_every_family_module_satisfies_the_seam() -> None:
    for name in family_names():
        family = family_named(name)
        assert isinstance(family, ModelFamily), name
        for pipeline in family.pipelines:
            assert family_for(pipeline) is family
    for name in family_names():
        assert isinstance(family_named(name).session_state(), SessionState), name


def test_a_module_lacking_part_of_the_seam_is_neither_a_family_nor_served(monkeypatch) -> None:
    lingbot = family_named("lingbot")
    partial = types.ModuleType("partial")
    partial.__dict__.update(
        {k: v for k, v in vars(lingbot).items() if k not in ("session_state", "frame_size")}
    )
    assert not isinstance(partial, ModelFamily)
    monkeypatch.setattr(families, "_families", lambda: {"lingbot": partial})
    with pytest.raises(TypeError, match=r"lacks \['frame_size', 'session_state'\]"):
        family_for(lingbot.pipelines[0])


def test_lingbot_session_state_is_the_export_seam() -> None:
    """Imported when asked (torch, vllm-omni): the adapter exports LingBot's own state through it."""
    state = family_named("lingbot").session_state()
    assert isinstance(state, SessionState)
    assert not state.serves(object())
    assert state.tensor_names(
        {"pipeline": None, "decoder": {"feat_map": [None, {"t": "dec/feat_map/1"}]}}
    ) == {
        "dec/feat_map/1",
        "pipe/generator_state",
        "pipe/condition_fixed_point",
        "pipe/camera_tail/poses",
        "pipe/camera_tail/intrinsics",
    }


def test_dreamzero_session_state_is_the_export_seam() -> None:
    """Its tensors are those its `pipeline` section names: the single ones listed, the lists' entries."""
    state = family_named("dreamzero").session_state()
    assert not state.serves(object())
    assert state.tensor_names({"pipeline": None}) == set()
    section = {
        "tensors": ["language", "prompt_embeds", "not_a_field"],
        "stitched_buffer": [{"t": "dz/stitched_buffer/0"}],
        "vae_enc_feat_map": [None, {"t": "dz/vae_enc_feat_map/1"}, {"str": "Rep"}],
        "video_latents_across_time": [],
    }
    assert state.tensor_names({"pipeline": section}) == {
        "dz/language",
        "dz/prompt_embeds",
        "dz/stitched_buffer/0",
        "dz/vae_enc_feat_map/1",
    }


def test_tick_geometry_names_a_field_that_is_not_a_positive_int() -> None:
    assert TickGeometry(48, 64, 9, 3).frame_size == (48, 64)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=rf"tick geometry latent_frames_per_tick .* got {bad!r}"):
            TickGeometry(48, 64, 9, bad)  # type: ignore[arg-type]


def test_run_tick_closes_the_session_when_the_decode_fails(monkeypatch) -> None:
    """A forward that went through and a decode that did not: the session is closed all the same (the
    runner would keep the KV of a chunk nobody saw)."""
    runtime = FakeRuntime(height=8, width=8, capacity=1)
    tick = tick_rules.parse_tick("s", {"request_id": "s-0", "chunk_index": 0})
    prepared = runtime.ticks.prepare(tick, Conditioning(seed=1, prompt="a forest"))

    def fail(prepared: Any, output: Any, forward_s: float) -> Any:
        raise RuntimeError("decode failed")

    monkeypatch.setattr(runtime, "_ticks", types.SimpleNamespace(decode=fail))
    with pytest.raises(RuntimeError, match="decode failed"):
        run_tick(runtime, prepared)
    assert runtime.resident_sessions() == ()
