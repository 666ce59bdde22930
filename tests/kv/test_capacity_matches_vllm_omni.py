"""The planner against vllm-omni's own KV budget: the real runner builds the real `ARDiffusionKVCache` on CPU.

Each case goes through `ARDiffusionModelRunner._preallocate_kv_cache` (the runner's config merge,
`resolve_ar_diffusion_kv_config`, the env variables, the cache's budget and pool allocation) and through
`ardiff.kv.capacity` from the same deployment inputs; every budget field must agree, and both must refuse
the same deployments.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ardiff.kv.capacity import (
    GIB,
    KV_GATHER_ENV,
    SCRATCH_BLOCKS_ENV,
    BindingLimit,
    CapacityPlan,
    CrossAttentionCache,
    InvalidKVSpec,
    KVBranch,
    KVCacheSpec,
    KVDoesNotFit,
    KVKnobs,
    build_footprint,
    plan_capacity,
)
from ardiff.kv.pod_plan import ModelProfile, PodPlan, plan_for_pool
from ardiff.kv.presets import PRESETS
from tests.kv.worked_examples import DREAMZERO_LIKE, TINY

# Small enough for real pools on CPU: bytes (as the issue asks) and blocks (vLLM builds one object per block).
MAX_AVAILABLE_BYTES = 64 << 20
MAX_BLOCKS = 50_000
EXAMPLES = 1000


@pytest.fixture(scope="module")
def vllm_omni() -> types.SimpleNamespace:
    """vllm-omni's runner, spec classes and config resolver, imported once (about 15 s)."""
    import torch
    from vllm_omni.experimental.ar_diffusion import capability
    from vllm_omni.experimental.ar_diffusion.runner import (
        ARDiffusionModelRunner,
        resolve_ar_diffusion_kv_config,
    )

    # The runner logs a line per cache built; hundreds of them would only bury a failure.
    for name in (
        "vllm_omni.experimental.ar_diffusion.runner",
        "vllm_omni.experimental.ar_diffusion.kv_cache.manager",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    return types.SimpleNamespace(
        torch=torch,
        capability=capability,
        Runner=ARDiffusionModelRunner,
        resolve=resolve_ar_diffusion_kv_config,
    )


@dataclass(frozen=True)
class Deployment:
    """What a worker is started with: the pipeline's spec, its dtype, free memory, config and environment."""

    spec: KVCacheSpec
    dtype: str
    available_bytes: int
    kv_config: Mapping[str, object]
    environ: Mapping[str, str]

    @property
    def fraction(self) -> float:
        return float(self.kv_config.get("gpu_memory_fraction", 0.1))  # ARDiffusionKVConfig's default

    def plan(self) -> CapacityPlan:
        return plan_capacity(
            self.spec,
            dtype=self.dtype,
            available_bytes=self.available_bytes,
            gpu_memory_fraction=self.fraction,
            knobs=KVKnobs.from_deployment(self.kv_config, self.environ),
        )


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """vllm-omni reads its two KV switches from os.environ; set exactly these for one build."""
    saved = {name: os.environ.pop(name, None) for name in (SCRATCH_BLOCKS_ENV, KV_GATHER_ENV)}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


class _CapablePipeline:
    """The four capability methods; only the spec is ever called while the pool is built."""

    def __init__(self, spec: object) -> None:
        self._spec = spec

    def ar_diffusion_kv_cache_spec(self) -> object:
        return self._spec

    def bind_ar_diffusion_state(self, session_id, state):  # pragma: no cover - never bound here
        raise AssertionError("no forward runs in a budget test")

    def reset_ar_diffusion_session(self, session_id: str) -> None:  # pragma: no cover
        raise AssertionError("no session exists in a budget test")

    def close_ar_diffusion_session(self, session_id: str) -> None:  # pragma: no cover
        raise AssertionError("no session exists in a budget test")


def to_vllm_spec(vllm_omni: types.SimpleNamespace, spec: KVCacheSpec) -> object:
    cap = vllm_omni.capability
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    values["kv_branches"] = tuple(
        cap.ARDiffusionKVBranchSpec(b.name, b.local_index) for b in spec.kv_branches
    )
    values["cross_attention"] = tuple(
        cap.ARDiffusionCrossAttentionKVSpec(c.name, c.num_tokens, c.num_kv_heads)
        for c in spec.cross_attention
    )
    return cap.ARDiffusionKVCacheSpec(**values)


def build_real_cache(vllm_omni: types.SimpleNamespace, deployment: Deployment, *, allocate: bool = True):
    """The runner's own load-time path, on CPU, with the free memory given instead of measured.

    `allocate=False` builds the budget and block manager without the pool tensors (vllm-omni's `device=None`),
    for real model geometries whose pools would not fit this machine.
    """
    torch = vllm_omni.torch
    runner = vllm_omni.Runner.__new__(vllm_omni.Runner)  # no worker, model or device init: only the KV path
    runner.od_config = types.SimpleNamespace(
        step_execution=False,
        max_num_seqs=1,
        dtype=getattr(torch, deployment.dtype),
        ar_diffusion_kv_config=dict(deployment.kv_config),
    )
    runner.ar_diffusion_kv_config = vllm_omni.resolve(runner.od_config)
    runner.pipeline = _CapablePipeline(to_vllm_spec(vllm_omni, deployment.spec))
    runner.device = torch.device("cpu") if allocate else None
    with environment(deployment.environ):
        runner._preallocate_kv_cache(available_bytes=deployment.available_bytes)
    return runner


def assert_same_budget(runner, plan: CapacityPlan) -> None:
    """Every number the budget produces, field by field."""
    cache, footprint = runner.kv_cache, plan.footprint
    assert runner._session_capacity == cache.session_capacity == plan.capacity
    assert cache.managed_num_blocks == plan.managed_blocks
    assert cache.cross_attention_reserved_bytes == plan.cross_attention_reserved_bytes
    assert cache.model_owned_state_reserved_bytes == plan.model_owned_reserved_bytes
    assert cache.cross_attention_bytes_per_session == footprint.cross_attention_bytes_per_session
    assert cache.memory_budget_bytes == plan.budget_bytes
    assert cache.configured_memory_budget_bytes == plan.configured_budget_bytes
    assert cache.scratch_blocks_per_kv_branch == footprint.scratch_blocks_per_branch
    assert cache.scratch_num_blocks == plan.scratch_blocks
    assert cache.scratch_reserved_bytes == footprint.scratch_bytes
    assert cache.history_staging_tokens == footprint.history_staging_tokens
    assert cache.history_staging_reserved_bytes == footprint.history_staging_bytes
    assert cache.spec.page_size_bytes * cache.num_layers == plan.page_bytes
    assert cache.num_blocks_total == plan.total_blocks
    assert runner.ar_diffusion_kv_config.window_chunks == footprint.window_frames
    assert runner.ar_diffusion_kv_config.sink_chunks == footprint.sink_frames
    assert runner.ar_diffusion_kv_config.reset_at_boundary == footprint.reset_at_boundary
    if cache._allocate_tensors:  # the pool really holds that many pages (K and V of every layer)
        assert cache.key_cache(0).numel() * cache.key_cache(0).element_size() * 2 * cache.num_layers == (
            plan.total_blocks * plan.page_bytes
        )


def compare(vllm_omni: types.SimpleNamespace, deployment: Deployment, *, allocate: bool = True) -> str:
    """Build both; assert they agree; return the outcome's category."""
    refusal: KVDoesNotFit | None = None
    try:
        plan = deployment.plan()
    except KVDoesNotFit as exc:
        refusal = exc
    if refusal is not None:
        with pytest.raises(ValueError, match="cannot fit one session") as real_refusal:
            build_real_cache(vllm_omni, deployment)
        assert f"available={refusal.available_bytes} bytes" in str(real_refusal.value)
        assert f"required={refusal.required_bytes} bytes" in str(real_refusal.value)
        return "does_not_fit"
    assert_same_budget(build_real_cache(vllm_omni, deployment, allocate=allocate), plan)
    return plan.binding_limit.value + ("+raised" if plan.budget_raised else "")


# ---- random deployments ----


@st.composite
def deployments(draw: st.DrawFn) -> Deployment:
    branch_count = draw(st.integers(1, 3))
    slots = draw(st.integers(1, branch_count))  # CFG-parallel-style sharing when slots < branches
    indices = list(range(slots)) + [draw(st.integers(0, slots - 1)) for _ in range(branch_count - slots)]
    indices = draw(st.permutations(indices))
    caches = draw(st.lists(st.tuples(st.integers(1, 48), st.none() | st.integers(1, 4)), max_size=2))
    spec = KVCacheSpec(
        num_layers=draw(st.integers(1, 4)),
        num_kv_heads=draw(st.integers(1, 4)),
        head_size=draw(st.integers(1, 32)),
        tokens_per_frame=draw(st.integers(1, 24)),
        frames_per_block=draw(st.integers(1, 4)),
        window_frames=draw(st.integers(1, 8)),
        sink_frames=draw(st.integers(0, 4)),
        kv_branches=tuple(KVBranch(f"branch-{i}", index) for i, index in enumerate(indices)),
        session_capacity=draw(st.integers(1, 64)),
        reset_at_boundary=draw(st.booleans()),
        cross_attention=tuple(CrossAttentionCache(f"cache-{i}", n, h) for i, (n, h) in enumerate(caches)),
        max_model_len=draw(st.sampled_from([1 << 20, 4096])),
        max_scratch_tokens_per_branch=draw(st.sampled_from([0, 0]) | st.integers(1, 64)),
        model_owned_state_bytes_per_session=draw(st.just(0) | st.integers(1, 256 << 10)),
    )
    dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    kv_config: dict[str, object] = {
        "warmup_cudagraph": False,
        "reset_at_boundary": draw(st.booleans()),
        "reuse_history_staging": draw(st.booleans()),
    }
    fraction = draw(st.none() | st.sampled_from([1.0, 0.9, 0.5, 0.1]) | st.floats(0.01, 1.0))
    if fraction is not None:
        kv_config["gpu_memory_fraction"] = fraction
    for key, most in (("window_chunks", 8), ("sink_chunks", 4)):
        override = draw(st.none() | st.just(0) | st.integers(1, most))  # 0 exercises the runner's `or` merge
        if override is not None:
            kv_config[key] = override
    environ: dict[str, str] = {}
    scratch_override = draw(st.none() | st.integers(0, 8))
    if scratch_override is not None:
        environ[SCRATCH_BLOCKS_ENV] = str(scratch_override)
    gather = draw(st.sampled_from([None, "0", "1"]))
    if gather is not None:
        environ[KV_GATHER_ENV] = gather

    # Free memory: spread widely, or right at a capacity step (R(k) / f, a few bytes either side), where an
    # off-by-one or a float rounding difference would show.
    footprint = build_footprint(spec, dtype=dtype, knobs=KVKnobs.from_deployment(kv_config, environ))
    f = fraction if fraction is not None else 0.1
    limit = min(MAX_AVAILABLE_BYTES, MAX_BLOCKS * footprint.page_bytes)
    if draw(st.booleans()):
        available = draw(st.integers(0, limit))
    else:
        sessions = draw(st.integers(1, spec.session_capacity + 1))
        scale = draw(st.sampled_from([1.0, f]))  # the fit check uses A itself, the capacity steps A*f
        available = math.ceil(footprint.required_bytes(sessions) / scale) + draw(st.integers(-3, 3))
    return Deployment(spec, dtype, min(max(available, 0), limit), kv_config, environ)


def test_planner_matches_vllm_omni_on_random_deployments(vllm_omni: types.SimpleNamespace) -> None:
    outcomes: collections.Counter[str] = collections.Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # a fixed seed: no flaky draws, nothing remembered between runs
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(deployment=deployments())
    def check(deployment: Deployment) -> None:
        outcomes[compare(vllm_omni, deployment)] += 1

    started = time.perf_counter()
    check()
    elapsed = time.perf_counter() - started
    total = sum(outcomes.values())
    print(f"\n{total} deployments, 0 mismatches, {elapsed:.1f} s: {dict(outcomes)}")
    assert total == EXAMPLES
    # The cases reach every branch of the budget, not just the easy middle.
    fits = {outcome.split("+")[0] for outcome in outcomes if outcome != "does_not_fit"}
    assert fits == {BindingLimit.KV_BUDGET.value, BindingLimit.PIPELINE_SESSION_CAPACITY.value}
    assert outcomes["does_not_fit"] >= 40
    assert sum(count for outcome, count in outcomes.items() if outcome.endswith("+raised")) >= 40
    assert outcomes[BindingLimit.KV_BUDGET.value] >= 40
    assert outcomes[BindingLimit.PIPELINE_SESSION_CAPACITY.value] >= 40


# ---- worked examples (notes/vllm-omni-ar-diffusion.md §2) ----


def test_tiny_worked_example(vllm_omni: types.SimpleNamespace) -> None:
    deployment = Deployment(TINY, "float32", 128, {"gpu_memory_fraction": 1.0}, {})
    plan = deployment.plan()
    assert plan.page_bytes == 8  # 1 layer x 1 head x 1 token x 2 x 1 x 4 B
    assert plan.scratch_blocks == 3
    assert plan.footprint.scratch_bytes == 24
    assert plan.footprint.cross_attention_bytes_per_session == 16  # 2 x 1 branch x 2 tokens x 1 x 1 x 4 B x 1
    assert plan.footprint.managed_blocks_for(1) == 11
    assert plan.footprint.required_bytes(1) == 128
    assert plan.footprint.required_bytes(2) == 192
    assert plan.budget_bytes == 128
    assert plan.capacity == 1
    assert plan.binding_limit is BindingLimit.KV_BUDGET
    assert plan.managed_blocks == 11
    assert plan.cross_attention_reserved_bytes == 16
    assert plan.model_owned_reserved_bytes == 0
    assert_same_budget(build_real_cache(vllm_omni, deployment), plan)

    with pytest.raises(KVDoesNotFit, match="needs 128 bytes") as refusal:
        Deployment(TINY, "float32", 127, {"gpu_memory_fraction": 1.0}, {}).plan()
    assert (refusal.value.required_bytes, refusal.value.available_bytes, refusal.value.code) == (
        128,
        127,
        "kv_does_not_fit",
    )
    assert (
        compare(vllm_omni, Deployment(TINY, "float32", 127, {"gpu_memory_fraction": 1.0}, {}))
        == "does_not_fit"
    )


def test_tiny_one_session_is_admitted_even_when_the_fraction_is_too_small(
    vllm_omni: types.SimpleNamespace,
) -> None:
    deployment = Deployment(TINY, "float32", 128, {"gpu_memory_fraction": 0.1}, {})
    plan = deployment.plan()
    assert (plan.configured_budget_bytes, plan.budget_bytes, plan.capacity) == (12, 128, 1)
    assert plan.budget_raised
    assert_same_budget(build_real_cache(vllm_omni, deployment), plan)


def test_dreamzero_like_worked_example(vllm_omni: types.SimpleNamespace) -> None:
    page = 65_536  # 2 layers x 4 heads x 16 tokens x 2 x 64 x 4 B
    deployment = Deployment(DREAMZERO_LIKE, "float32", 44 * page, {"gpu_memory_fraction": 1.0}, {})
    plan = deployment.plan()
    assert plan.page_bytes == page
    assert plan.scratch_blocks == 8  # 2 slots x 4 frames per block
    assert plan.footprint.cross_attention_bytes_per_session == page  # 2 x 2 branches x 8 x 4 x 64 x 4 B x 2
    assert plan.footprint.managed_blocks_for(2) == 34
    assert plan.footprint.required_bytes(2) == 44 * page
    assert plan.footprint.required_bytes(3) == 57 * page
    assert plan.capacity == 2
    assert plan.binding_limit is BindingLimit.KV_BUDGET
    assert plan.cross_attention_reserved_bytes == 2 * page
    assert plan.managed_blocks == 34
    assert_same_budget(build_real_cache(vllm_omni, deployment), plan)


# ---- the presets at real GPU sizes ----


# Device sizes per preset: real GPUs, and for the tiny CPU model sizes that keep vLLM's block list small.
PRESET_DEVICE_GIB = {name: (8, 24, 80, 141) for name in PRESETS} | {"tiny-lingbot-64x64": (0.03, 0.1, 0.5)}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_plans_match_vllm_omni_at_real_gpu_sizes(
    vllm_omni: types.SimpleNamespace, preset: str
) -> None:
    """What `ardiff kv plan` prints is what vllm-omni computes for the real geometry (pools not allocated)."""
    model = PRESETS[preset]
    outcomes = set()
    for gib in PRESET_DEVICE_GIB[preset]:
        device_bytes = int(gib * GIB)
        for fraction in (0.5, 0.6, 0.9):
            pod = plan_or_refusal(model, device_bytes, fraction)
            available = max(0, device_bytes - model.weights_bytes - model.runtime_overhead_bytes)
            deployment = Deployment(model.spec, model.dtype, available, {"gpu_memory_fraction": fraction}, {})
            outcome = compare(vllm_omni, deployment, allocate=False)
            assert (pod is None) == (outcome == "does_not_fit")
            assert pod is None or pod.kv == deployment.plan()  # the pod plan is the runner's budget
            outcomes.add(outcome)
    assert outcomes - {"does_not_fit"}, "every preset fits some device"
    assert "does_not_fit" in outcomes, "and some device is too small"


def plan_or_refusal(model: ModelProfile, device_bytes: int, fraction: float) -> PodPlan | None:
    try:
        return plan_for_pool(model, device_memory_bytes=device_bytes, gpu_memory_fraction=fraction)
    except KVDoesNotFit:
        return None


# ---- bad input: both refuse ----


@pytest.mark.parametrize(
    ("kv_config", "environ", "message"),
    [
        ({"gpu_memory_fraction": 0.0}, {}, "gpu_memory_fraction must be in \\(0, 1\\]"),
        ({"gpu_memory_fraction": 1.5}, {}, "gpu_memory_fraction must be in \\(0, 1\\]"),
        (
            {"gpu_memory_fraction": 0.5},
            {SCRATCH_BLOCKS_ENV: "-1"},
            "scratch_blocks_per_branch must be a non-neg",
        ),
    ],
)
def test_bad_knobs_are_refused_by_both(
    vllm_omni: types.SimpleNamespace, kv_config: dict[str, object], environ: dict[str, str], message: str
) -> None:
    deployment = Deployment(TINY, "float32", 1 << 20, kv_config, environ)
    with pytest.raises(InvalidKVSpec, match=message):
        deployment.plan()
    with pytest.raises(ValueError):  # noqa: PT011 - vllm-omni's messages are its own
        build_real_cache(vllm_omni, deployment)
