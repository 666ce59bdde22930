"""The model-family seam (issue 24 item 4): each family module is a `ModelFamily`, each family's session
state a `SessionState` (DreamZero's since issue 26), and a family that lacks part of the seam is refused when
it is looked up."""

from __future__ import annotations

import types

import pytest

from ardiff.worker import families
from ardiff.worker.families import ModelFamily, SessionState, family_for, family_named, family_names


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
