"""The planner on its own: validation, knobs, the budget terms by hand, explanations and pod plans."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types

import pytest

from ardiff.errors import ArdiffError
from ardiff.kv.capacity import (
    GIB,
    BindingLimit,
    CrossAttentionCache,
    InvalidKVSpec,
    KVBranch,
    KVCacheSpec,
    KVDoesNotFit,
    KVKnobs,
    build_footprint,
    format_bytes,
    plan_capacity,
)
from ardiff.kv.pod_plan import ModelProfile, plan_for_pool
from tests.kv.worked_examples import TINY


def test_planner_imports_neither_torch_nor_vllm() -> None:
    """The operator image has no torch: the planner, presets and CLI must not pull it in."""
    code = (
        "import sys, ardiff.kv.capacity, ardiff.kv.presets, ardiff.kv.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'vllm', 'vllm_omni'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_layers": 0}, "KV spec num_layers must be a positive integer, got 0"),
        ({"head_size": True}, "KV spec head_size must be a positive integer, got True"),
        ({"window_frames": 2.0}, "KV spec window_frames must be a positive integer, got 2.0"),
        ({"sink_frames": -1}, "KV spec sink_frames must be a non-negative integer, got -1"),
        (
            {"model_owned_state_bytes_per_session": -5},
            "model_owned_state_bytes_per_session must be a non-negative",
        ),
        ({"kv_branches": ()}, "KV spec kv_branches must be a non-empty tuple of KVBranch"),
        ({"kv_branches": [KVBranch("main", 0)]}, "KV spec kv_branches must be a non-empty tuple of KVBranch"),
        (
            {"kv_branches": (KVBranch("a", 0), KVBranch("a", 1))},
            "kv_branches names must be unique, got \\['a', 'a'\\]",
        ),
        (
            {"kv_branches": (KVBranch("a", 0), KVBranch("b", 2))},
            "local_index values must be contiguous from 0",
        ),
        (
            {"cross_attention": (CrossAttentionCache("t", 1), CrossAttentionCache("t", 2))},
            "cross_attention names must be unique",
        ),
        ({"reset_at_boundary": 1}, "KV spec reset_at_boundary must be a bool, got 1"),
    ],
)
def test_bad_specs_are_refused_with_the_field_and_value(change: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidKVSpec, match=message) as refusal:
        dataclasses.replace(TINY, **change)
    assert isinstance(refusal.value, ValueError)
    assert isinstance(refusal.value, ArdiffError)
    assert refusal.value.code == "invalid_kv_spec"


def test_bad_parts_and_planning_inputs_are_refused() -> None:
    with pytest.raises(InvalidKVSpec, match="KV branch name must be a non-empty string, got ''"):
        KVBranch("", 0)
    with pytest.raises(InvalidKVSpec, match="KV branch local_index must be a non-negative integer, got -1"):
        KVBranch("main", -1)
    with pytest.raises(
        InvalidKVSpec, match="cross-attention cache num_tokens must be a positive integer, got 0"
    ):
        CrossAttentionCache("text", 0)
    with pytest.raises(InvalidKVSpec, match="cross-attention cache num_kv_heads must be a positive integer"):
        CrossAttentionCache("text", 4, 0)
    with pytest.raises(InvalidKVSpec, match="KV knobs window_frames must be a positive integer, got 0"):
        KVKnobs(window_frames=0)
    with pytest.raises(
        InvalidKVSpec, match="scratch_blocks_per_branch must be a non-negative integer, got -2"
    ):
        KVKnobs(scratch_blocks_per_branch=-2)
    with pytest.raises(InvalidKVSpec, match="dtype must be one of \\['bfloat16', 'float16', 'float32'\\]"):
        plan_capacity(TINY, dtype="fp8", available_bytes=128, gpu_memory_fraction=1.0)
    for fraction in (0, -0.1, 1.01, float("nan"), True):
        with pytest.raises(InvalidKVSpec, match="gpu_memory_fraction must be in \\(0, 1\\]"):
            plan_capacity(TINY, dtype="float32", available_bytes=128, gpu_memory_fraction=fraction)
    with pytest.raises(InvalidKVSpec, match="available_bytes must be a non-negative integer, got -1"):
        plan_capacity(TINY, dtype="float32", available_bytes=-1, gpu_memory_fraction=1.0)


def test_knobs_from_a_deployment_mirror_the_runner_merge() -> None:
    knobs = KVKnobs.from_deployment(
        {"window_chunks": 0, "sink_chunks": 2, "reuse_history_staging": True, "gpu_memory_fraction": 0.5},
        {"AR_DIFFUSION_KV_SCRATCH_BLOCKS_PER_BRANCH": "7", "VLLM_OMNI_AR_DIFFUSION_KV_GATHER": "1"},
    )
    # window_chunks=0 is falsy, so the runner keeps the pipeline's window.
    assert knobs == KVKnobs(
        window_frames=None,
        sink_frames=2,
        reuse_history_staging=True,
        contiguous_kv_gather=True,
        scratch_blocks_per_branch=7,
    )
    assert (
        KVKnobs.from_deployment({}, {"VLLM_OMNI_AR_DIFFUSION_KV_GATHER": "true"}).contiguous_kv_gather
        is False
    )
    with pytest.raises(
        InvalidKVSpec, match=r"ar_diffusion_kv_config keys must be among .*, got \['window'\]"
    ):
        KVKnobs.from_deployment({"window": 3}, {})
    with pytest.raises(
        InvalidKVSpec, match="AR_DIFFUSION_KV_SCRATCH_BLOCKS_PER_BRANCH must be an integer, got 'x'"
    ):
        KVKnobs.from_deployment({}, {"AR_DIFFUSION_KV_SCRATCH_BLOCKS_PER_BRANCH": "x"})


def test_budget_terms_by_hand() -> None:
    """Every term with knobs on: overrides, scratch tokens and env, history staging, shared CFG slots."""
    spec = KVCacheSpec(
        num_layers=2,
        num_kv_heads=3,
        head_size=4,
        tokens_per_frame=5,
        frames_per_block=2,
        window_frames=4,
        sink_frames=1,
        kv_branches=(KVBranch("positive", 0), KVBranch("negative", 0)),
        session_capacity=8,
        cross_attention=(CrossAttentionCache("text", 6), CrossAttentionCache("image", 7, num_kv_heads=1)),
        max_scratch_tokens_per_branch=11,
        model_owned_state_bytes_per_session=1000,
    )
    knobs = KVKnobs(
        window_frames=6, reuse_history_staging=True, contiguous_kv_gather=True, scratch_blocks_per_branch=3
    )
    fp = build_footprint(spec, dtype="bfloat16", knobs=knobs)
    assert (fp.window_frames, fp.sink_frames) == (6, 1)
    assert fp.page_bytes == 2 * 5 * 3 * 4 * 2 * 2  # K and V x T x H x D x b x L = 480
    assert fp.scratch_blocks_per_branch == 5  # max(2 + ceil(11 / 5), 3)
    assert fp.scratch_blocks == 5  # one shared slot
    assert fp.history_staging_tokens == (6 + 1 + 1) * 5
    assert fp.history_staging_bytes == 2 * 2 * 40 * 3 * 4 * 2
    # Both logical branches reserve cross-attention even though they share a slot.
    assert fp.cross_attention_bytes_per_session == 2 * 2 * (6 * 3 + 7 * 1) * 4 * 2 * 2
    assert fp.pages_per_session == 7
    assert fp.managed_blocks_for(3) == 3 * 7 + 2 + 2
    assert fp.required_bytes(3) == 5 * 480 + 3840 + 3 * 1600 + 3 * 1000 + 25 * 480
    # Without the gather path, staging is neither used nor budgeted.
    assert (
        build_footprint(
            spec, dtype="bfloat16", knobs=KVKnobs(reuse_history_staging=True)
        ).history_staging_bytes
        == 0
    )
    # The env override only ever raises the scratch floor (5 here).
    for override, pages in ((1, 5), (8, 8)):
        scratch_knobs = KVKnobs(scratch_blocks_per_branch=override)
        assert build_footprint(spec, dtype="bfloat16", knobs=scratch_knobs).scratch_blocks == pages

    plan = plan_capacity(
        spec,
        dtype="bfloat16",
        available_bytes=fp.required_bytes(3) + 479,
        gpu_memory_fraction=1.0,
        knobs=knobs,
    )
    assert (plan.capacity, plan.binding_limit) == (3, BindingLimit.KV_BUDGET)
    budget_left = plan.budget_bytes - fp.scratch_bytes - fp.history_staging_bytes - 3 * (1600 + 1000)
    assert plan.managed_blocks == budget_left // 480 == fp.managed_blocks_for(3)


def test_does_not_fit_carries_the_numbers() -> None:
    with pytest.raises(KVDoesNotFit) as refusal:
        plan_capacity(TINY, dtype="float32", available_bytes=127, gpu_memory_fraction=1.0)
    assert refusal.value.code == "kv_does_not_fit"
    assert (refusal.value.required_bytes, refusal.value.available_bytes) == (128, 127)
    assert str(refusal.value) == (
        "one session needs 128 bytes (128 B) but 127 bytes (127 B) are available; "
        "R(1) = scratch 24 + history staging 0 + cross-attention 16 + model-owned 0 "
        "+ 11 managed pages x 8 bytes"
    )


def test_explain_walks_through_the_budget() -> None:
    plan = plan_capacity(TINY, dtype="float32", available_bytes=128, gpu_memory_fraction=0.1)
    assert plan.explain() == [
        "geometry: 1 layers x 1 KV heads x head 1, 1 tokens per frame, float32 (4 B per element)",
        "page (K and V of one frame, all layers): 8 B (8 B)",
        "window: sink 3 + recent 3 frames, 3 frames per block",
        "branches: main/0 in 1 local slot(s): 6 pages per session (48 B), 3 in flight per pod",
        "scratch: 3 pages per slot, 3 in all (24 B)",
        "cross-attention per session: text 2 tokens x 1 heads x 1 branch(es) = 16 B",
        "model-owned state per session: 0 B",
        "history staging: none",
        "one session needs R(1) = 128 B (128 B), each further one 64 B",
        "free memory A = 128 B; int(A x 0.1) = 12 B, raised to R(1) for one session",
        "capacity: 1 of 2 requested, limited by the KV budget (R(2) = 192 B > 128 B)",
        "pool: 11 managed blocks (M(1) = 11 needed) + 3 scratch = 14 pages allocated at load (112 B)",
        "reserved, allocated per session: cross-attention 16 B, model-owned 0 B",
        "left for activations: 0 B",
    ]
    roomy = plan_capacity(TINY, dtype="float32", available_bytes=1000, gpu_memory_fraction=0.5)
    assert roomy.capacity == 2
    assert (
        "capacity: 2, the pipeline's session_capacity (R(2) = 192 B within the budget 500 B)"
        in roomy.explain()
    )


def test_spec_copies_a_vllm_omni_spec_by_attribute() -> None:
    branch = types.SimpleNamespace(name="main", local_index=0)
    cache = types.SimpleNamespace(name="text", num_tokens=2, num_kv_heads=None)
    real = types.SimpleNamespace(
        **{**dataclasses.asdict(TINY), "kv_branches": (branch,), "cross_attention": (cache,)}
    )
    assert KVCacheSpec.from_vllm_omni(real) == TINY


def test_pod_plan_subtracts_weights_and_applies_the_pool_cap() -> None:
    model = ModelProfile(
        name="toy",
        description="a toy",
        spec=TINY,
        dtype="float32",
        weights_bytes=1000,
        runtime_overhead_bytes=24,
    )
    plan = plan_for_pool(model, device_memory_bytes=1024 + 192, gpu_memory_fraction=1.0)
    assert plan.kv.available_bytes == 192
    assert (plan.sessions, plan.binding_limit) == (2, BindingLimit.PIPELINE_SESSION_CAPACITY)
    capped = plan_for_pool(
        model, device_memory_bytes=1024 + 192, gpu_memory_fraction=1.0, pool_session_capacity=1
    )
    assert (capped.sessions, capped.binding_limit) == (1, BindingLimit.POOL_SESSION_CAPACITY)
    assert (
        capped.explain()[1]
        == "device 1.19 KiB - weights 1000 B - runtime overhead 24 B = 192 B free when the pool is sized"
    )
    assert capped.explain()[-2:] == [
        "the pool's kv.sessionCapacity caps the pod at 1",
        "sessions per pod: 1 (binding limit: pool_session_capacity)",
    ]
    with pytest.raises(
        KVDoesNotFit, match=r"toy on a 1.00 KiB device \(weights 1000 B, runtime overhead 24 B\)"
    ):
        plan_for_pool(model, device_memory_bytes=1024, gpu_memory_fraction=1.0)
    with pytest.raises(
        InvalidKVSpec, match="pool plan pool_session_capacity must be a positive integer, got 0"
    ):
        plan_for_pool(model, device_memory_bytes=GIB, gpu_memory_fraction=1.0, pool_session_capacity=0)
    with pytest.raises(InvalidKVSpec, match="model profile weights_bytes must be a non-negative integer"):
        dataclasses.replace(model, weights_bytes=-1)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 3 << 20, 45 * GIB + GIB // 2)] == [
        "0 B",
        "1023 B",
        "1.00 KiB",
        "3.00 MiB",
        "45.50 GiB",
    ]
