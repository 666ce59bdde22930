"""Presets: the LingBot-World spec port against the real pipeline's methods, and the planned numbers.

Run as a script, this module prints the real `LingBotWorldCausalDMDPipeline.ar_diffusion_kv_cache_spec()` of
the cases below. The pipeline module imports torchvision, which this venv deliberately lacks, so that runs
in a child process behind an inert stub, never in the test process.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from ardiff.kv.capacity import (
    GIB,
    BindingLimit,
    CrossAttentionCache,
    InvalidKVSpec,
    KVBranch,
    KVDoesNotFit,
)
from ardiff.kv.pod_plan import plan_for_pool
from ardiff.kv.presets import (
    DEFAULT_PRESETS,
    PRESETS,
    TINY_LINGBOT_TRANSFORMER,
    TINY_LINGBOT_VAE,
    LingBotTransformerConfig,
    WanVAEConfig,
    get_preset,
    lingbot_world_kv_spec,
)

# (height, width, dtype, tiny model?, Ulysses ranks)
LINGBOT_CASES = [
    (480, 832, "bfloat16", False, 1),
    (480, 832, "bfloat16", False, 4),
    (256, 448, "float16", False, 2),
    (64, 64, "float32", True, 1),
    (128, 192, "float32", True, 1),
]


def _configs(tiny: bool) -> tuple[LingBotTransformerConfig, WanVAEConfig]:
    return (
        (TINY_LINGBOT_TRANSFORMER, TINY_LINGBOT_VAE) if tiny else (LingBotTransformerConfig(), WanVAEConfig())
    )


def _real_pipeline_specs() -> list[dict[str, object]]:
    """Child process: the pipeline's own spec methods over a real meta-device Wan VAE and the geometry."""
    import importlib.machinery
    import types

    import diffusers.models.autoencoders.autoencoder_kl_wan  # noqa: F401 - decides "no torchvision" before the stub
    import torch
    import transformers  # noqa: F401

    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []
        sys.modules[name] = module
    sys.modules["torchvision"].transforms = sys.modules["torchvision.transforms"]
    sys.modules["torchvision.transforms"].functional = sys.modules["torchvision.transforms.functional"]

    from vllm_omni.diffusion.distributed.autoencoders.autoencoder_kl_wan import DistributedAutoencoderKLWan
    from vllm_omni.diffusion.models.lingbot_world.pipeline import LingBotWorldCausalDMDPipeline as Pipeline

    specs = []
    for height, width, dtype, tiny, ranks in LINGBOT_CASES:
        transformer_config, vae_config = _configs(tiny)
        torch_dtype = getattr(torch, dtype)
        with torch.device("meta"):
            vae = DistributedAutoencoderKLWan(
                base_dim=vae_config.base_dim,
                dim_mult=list(vae_config.dim_mult),
                num_res_blocks=vae_config.num_res_blocks,
                temperal_downsample=list(vae_config.temperal_downsample),
            ).to(torch_dtype)
        heads = transformer_config.num_attention_heads
        block = types.SimpleNamespace(
            # What the attention modules compute at TP=1: self-attention splits heads across Ulysses ranks,
            # cross-attention keeps them all.
            self_attn=types.SimpleNamespace(num_sp_heads=heads // ranks),
            cross_attn=types.SimpleNamespace(num_local_heads=heads),
        )
        pipeline = types.SimpleNamespace(
            transformer=types.SimpleNamespace(
                config=types.SimpleNamespace(**dataclasses.asdict(transformer_config)),
                dtype=torch_dtype,
                blocks=[block],
            ),
            vae=vae,
            vae_scale_factor_spatial=vae_config.scale_factor_spatial,
            vae_scale_factor_temporal=vae_config.scale_factor_temporal,
            od_config=types.SimpleNamespace(parallel_config=types.SimpleNamespace(ulysses_degree=ranks)),
            _ar_height=height,
            _ar_width=width,
            _AR_BRANCH=Pipeline._AR_BRANCH,
            _AR_TEXT_CACHE=Pipeline._AR_TEXT_CACHE,
            _streaming_decode_unsupported=False,
            _cached_streaming_decoder=None,
            # What _install_sharded_vae_decode sets on a multi-rank deployment (the default sharding).
            _vae_shard_split_dim="width" if ranks > 1 else None,
            _vae_shard_world_size=ranks,
        )
        for method in (
            "_condition_encoder_cache_bytes",
            "_streaming_decode_bytes_per_session",
            "_streaming_decoder",
        ):
            setattr(pipeline, method, types.MethodType(getattr(Pipeline, method), pipeline))
        spec = Pipeline.ar_diffusion_kv_cache_spec(pipeline)
        specs.append(dataclasses.asdict(spec))
    return specs


@pytest.fixture(scope="module")
def real_lingbot_specs() -> list[dict[str, object]]:
    result = subprocess.run(
        [sys.executable, __file__], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(LINGBOT_CASES)))
def test_lingbot_spec_port_equals_the_pipeline(
    real_lingbot_specs: list[dict[str, object]], case: int
) -> None:
    height, width, dtype, tiny, ranks = LINGBOT_CASES[case]
    transformer_config, vae_config = _configs(tiny)
    ported = lingbot_world_kv_spec(
        height=height,
        width=width,
        dtype=dtype,
        transformer=transformer_config,
        vae=vae_config,
        sequence_parallel=ranks,
    )
    assert json.loads(json.dumps(dataclasses.asdict(ported))) == real_lingbot_specs[case]


def test_lingbot_480x832_geometry() -> None:
    spec = get_preset("lingbot-world-480x832").spec
    assert (spec.tokens_per_frame, spec.frames_per_block, spec.sink_frames, spec.window_frames) == (
        1560,
        3,
        9,
        9,
    )
    assert spec.kv_branches == (KVBranch("main", 0),)
    assert spec.cross_attention == (CrossAttentionCache("text", 512, 40),)
    plan = plan_for_pool(
        get_preset("lingbot-world-480x832"), device_memory_bytes=141 * GIB, gpu_memory_fraction=0.9
    )
    footprint = plan.kv.footprint
    assert footprint.page_bytes == 40 * 40 * 1560 * 2 * 128 * 2  # 1.28 GB, notes/vllm-omni-ar-diffusion.md §2
    assert footprint.cross_attention_bytes_per_session == 2 * 512 * 40 * 128 * 2 * 40  # 0.42 GB
    assert [footprint.managed_blocks_for(c) for c in (1, 2)] == [23, 41]  # M(c) = 18c + 5
    # Camera 3.83 GB + streaming decoder 1,801 MiB + image condition + two encoder histories.
    assert spec.model_owned_state_bytes_per_session == 7_965_984_000
    assert plan.sessions == 2
    assert plan.binding_limit is BindingLimit.PIPELINE_SESSION_CAPACITY


def test_lingbot_does_not_fit_an_80_gib_gpu_without_sequence_parallelism() -> None:
    with pytest.raises(
        KVDoesNotFit, match=r"lingbot-world-480x832 on a 80.00 GiB device \(weights 45.36 GiB"
    ):
        plan_for_pool(
            get_preset("lingbot-world-480x832"), device_memory_bytes=80 * GIB, gpu_memory_fraction=0.9
        )
    sp4 = plan_for_pool(
        get_preset("lingbot-world-480x832-sp4"), device_memory_bytes=80 * GIB, gpu_memory_fraction=0.9
    )
    assert sp4.kv.footprint.page_bytes == 40 * 10 * 1560 * 2 * 128 * 2
    assert sp4.sessions == 2


def test_dreamzero_geometry() -> None:
    spec = get_preset("dreamzero-droid").spec
    assert (spec.num_layers, spec.num_kv_heads, spec.head_size) == (40, 40, 128)
    assert (spec.tokens_per_frame, spec.frames_per_block, spec.window_frames, spec.sink_frames) == (
        880,
        2,
        9,
        0,
    )
    assert spec.kv_branches == (KVBranch("positive", 0), KVBranch("negative", 1))
    assert spec.cross_attention == (CrossAttentionCache("text", 512), CrossAttentionCache("image", 257))
    assert spec.max_scratch_tokens_per_branch == 25
    assert spec.model_owned_state_bytes_per_session == 603 * 1024 * 1024
    assert spec.session_capacity == 64
    cfg2 = get_preset("dreamzero-droid-cfg2").spec
    assert cfg2.kv_branches == (KVBranch("positive", 0), KVBranch("negative", 0))
    assert cfg2.num_local_kv_branches == 1


@pytest.mark.parametrize(
    ("preset", "gib", "fraction", "sessions", "limit"),
    [
        ("dreamzero-droid", 141, 0.9, 5, BindingLimit.KV_BUDGET),
        ("dreamzero-droid", 80, 0.9, 1, BindingLimit.KV_BUDGET),
        # Each CFG rank keeps one slot of pages, but still reserves cross-attention for both branches.
        ("dreamzero-droid-cfg2", 141, 0.9, 10, BindingLimit.KV_BUDGET),
        ("lingbot-world-480x832", 141, 0.6, 1, BindingLimit.KV_BUDGET),
        ("lingbot-world-480x832-sp4", 141, 0.5, 2, BindingLimit.PIPELINE_SESSION_CAPACITY),
        ("tiny-lingbot-64x64", 8, 0.1, 2, BindingLimit.PIPELINE_SESSION_CAPACITY),
    ],
)
def test_sessions_per_pod(preset: str, gib: int, fraction: float, sessions: int, limit: BindingLimit) -> None:
    plan = plan_for_pool(get_preset(preset), device_memory_bytes=gib * GIB, gpu_memory_fraction=fraction)
    assert (plan.sessions, plan.binding_limit) == (sessions, limit)
    assert plan.explain()[-1] == f"sessions per pod: {sessions} (binding limit: {limit})"


def test_weights_are_the_parameter_counts_in_bfloat16() -> None:
    assert get_preset("lingbot-world-480x832").weights_bytes == 2 * (
        18_544_332_864 + 5_680_910_336 + 126_892_531
    )
    assert get_preset("dreamzero-droid").weights_bytes == 2 * (
        16_484_292_448 + 5_680_910_336 + 632_076_801 + 126_892_531
    )
    assert all(PRESETS[name].runtime_overhead_bytes >= GIB for name in DEFAULT_PRESETS)


def test_tiny_preset_is_the_workers_embedded_model() -> None:
    from ardiff.worker.tiny import model as tiny_model

    worker_config = {
        **tiny_model.TRANSFORMER_CONFIG,
        "patch_size": tuple(tiny_model.TRANSFORMER_CONFIG["patch_size"]),
    }
    for field in dataclasses.fields(TINY_LINGBOT_TRANSFORMER):
        assert worker_config[field.name] == getattr(TINY_LINGBOT_TRANSFORMER, field.name), field.name
    assert TINY_LINGBOT_VAE.base_dim == tiny_model.VAE_BASE_DIM


def test_bad_preset_inputs_are_refused() -> None:
    with pytest.raises(InvalidKVSpec, match="KV preset must be one of") as unknown:
        get_preset("lingbot-world-1080p")
    assert unknown.value.code == "invalid_kv_spec"
    with pytest.raises(InvalidKVSpec, match="positive multiples of 16, got 480x830"):
        lingbot_world_kv_spec(height=480, width=830, dtype="bfloat16")
    with pytest.raises(InvalidKVSpec, match="sequence_parallel must divide 40 heads, got 3"):
        lingbot_world_kv_spec(height=480, width=832, dtype="bfloat16", sequence_parallel=3)
    with pytest.raises(InvalidKVSpec, match="dtype must be one of"):
        lingbot_world_kv_spec(height=480, width=832, dtype="int8")
    with pytest.raises(InvalidKVSpec, match="must leave recent frames after the sink"):
        LingBotTransformerConfig(sink_size=18)


if __name__ == "__main__":
    print(json.dumps(_real_pipeline_specs()))
