"""Known models as `ModelProfile`s: KV geometry, weights and runtime overhead, derived from vllm-omni 0.30.0.

The KV specs are pure-Python ports of the pipelines' own `ar_diffusion_kv_cache_spec()`:
- LingBot-World: `vllm_omni/diffusion/models/lingbot_world/pipeline.py` (`ar_diffusion_kv_cache_spec`,
  `_condition_encoder_cache_bytes`, `_streaming_decode_bytes_per_session`); transformer geometry from
  `transformer.py` (the checkpoint contract of `CausalLingBotWorldTransformer3DModel.from_config`), VAE
  geometry from diffusers' `AutoencoderKLWan` defaults (the Wan 2.1 VAE). tests/kv/test_capacity_presets.py
  runs the real pipeline methods against these ports.
- DreamZero: `vllm_omni/diffusion/models/dreamzero/pipeline_dreamzero.py` (`ar_diffusion_kv_cache_spec`) over
  the DreamZero-DROID checkpoint config (sources at `DREAMZERO_DROID`).

Weights are parameter counts of the real vllm-omni 0.30.0 classes, instantiated on the meta device with these
configs (one rank, TP=1), times the serving dtype: the loader builds every module under the stage dtype.
Runtime overhead is an estimate, not a measurement (no GPU was available): what besides the weights is in use
when the runner measures free memory after load (CUDA context and library workspaces; NCCL buffers with more
than one rank). Activations come later, out of the (1 - fraction) the KV pool leaves.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ardiff.kv.capacity import (
    DTYPE_BYTES,
    GIB,
    CrossAttentionCache,
    InvalidKVSpec,
    KVBranch,
    KVCacheSpec,
    dtype_bytes,
)
from ardiff.kv.pod_plan import ModelProfile

# diffusers.models.autoencoders.autoencoder_kl_wan.CACHE_T: frames every causal convolution keeps.
WAN_CACHE_T = 2
# lingbot_world/pipeline.py _STREAMING_DECODE_BYTES_PER_PIXEL_FP32: measured once upstream on the reference
# checkpoint (37,832 KiB for a 64x64 output), scaled by output pixels and dtype.
LINGBOT_STREAMING_DECODE_BYTES_PER_PIXEL_FP32 = 37832 * 1024 / (64 * 64)
# lingbot_world/pipeline.py _MAX_SEQUENCE_LENGTH: the text cross-attention length.
LINGBOT_TEXT_TOKENS = 512

# Estimates (see the module docstring): a CUDA 12 context with lazy module loading plus cuBLAS/cuDNN
# workspaces, rounded up; NCCL communicators add buffers per process group.
CUDA_RUNTIME_OVERHEAD_BYTES = 1 * GIB
NCCL_OVERHEAD_BYTES = GIB // 2


@dataclass(frozen=True)
class WanVAEConfig:
    """The Wan VAE geometry the encoder cache depends on (`AutoencoderKLWan` arguments; defaults: Wan 2.1)."""

    base_dim: int = 96
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # diffusers' spelling
    in_channels: int = 3
    scale_factor_spatial: int = 8
    scale_factor_temporal: int = 4

    def __post_init__(self) -> None:
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise InvalidKVSpec(
                "Wan VAE temperal_downsample must have len(dim_mult) - 1 entries, "
                f"got {self.temperal_downsample}"
            )
        for name in (
            "base_dim",
            "num_res_blocks",
            "in_channels",
            "scale_factor_spatial",
            "scale_factor_temporal",
        ):
            if getattr(self, name) <= 0:
                raise InvalidKVSpec(f"Wan VAE {name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class LingBotTransformerConfig:
    """`CausalLingBotWorldTransformer3DModel` arguments that shape the cache (defaults: the v2 checkpoint)."""

    num_layers: int = 40
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    out_channels: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    sink_size: int = 9
    num_frames_per_block: int = 3
    sliding_window_num_frames: int = 18
    local_attn_size: int = -1

    def __post_init__(self) -> None:
        window = self.cache_window_frames
        if window - self.sink_size <= 0:
            raise InvalidKVSpec(
                f"LingBot transformer window must leave recent frames after the sink, got window {window} "
                f"and sink {self.sink_size}"
            )
        if self.patch_size[0] != 1:
            raise InvalidKVSpec(
                f"LingBot transformer patch_size must have temporal size 1, got {self.patch_size}"
            )

    @property
    def cache_window_frames(self) -> int:
        return self.local_attn_size if self.local_attn_size != -1 else self.sliding_window_num_frames


def wan_encoder_cache_bytes(vae: WanVAEConfig, *, height: int, width: int, element_bytes: int) -> int:
    """One Wan encoder history: every causal conv's cached input frames (`_condition_encoder_cache_bytes`)."""
    dims = [vae.base_dim * mult for mult in (1, *vae.dim_mult)]
    elements = WAN_CACHE_T * vae.in_channels * height * width  # conv_in
    for level, (in_dim, out_dim) in enumerate(itertools.pairwise(dims)):
        for _ in range(vae.num_res_blocks):  # each residual block caches conv1's and conv2's inputs
            elements += WAN_CACHE_T * (in_dim + out_dim) * height * width
            in_dim = out_dim
        if level != len(vae.dim_mult) - 1:  # a downsample layer
            height, width = height // 2, width // 2
            if vae.temperal_downsample[level]:  # its time conv keeps one frame
                elements += out_dim * height * width
    middle = dims[-1]
    elements += 2 * WAN_CACHE_T * (middle + middle) * height * width  # the middle block's two residual blocks
    elements += WAN_CACHE_T * middle * height * width  # conv_out
    return elements * element_bytes


def lingbot_world_kv_spec(
    *,
    height: int,
    width: int,
    dtype: str,
    transformer: LingBotTransformerConfig = LingBotTransformerConfig(),
    vae: WanVAEConfig = WanVAEConfig(),
    sequence_parallel: int = 1,
    vae_spatial_sharding: bool = True,
) -> KVCacheSpec:
    """LingBot-World's per-rank `ar_diffusion_kv_cache_spec()` at one tick resolution, Ulysses SP ranks."""
    b = dtype_bytes(dtype)
    spatial = vae.scale_factor_spatial
    _, patch_h, patch_w = transformer.patch_size
    if height <= 0 or width <= 0 or height % (spatial * patch_h) or width % (spatial * patch_w):
        raise InvalidKVSpec(
            f"LingBot height and width must be positive multiples of {spatial * patch_h}, "
            f"got {height}x{width}"
        )
    heads = transformer.num_attention_heads
    if sequence_parallel <= 0 or heads % sequence_parallel:
        raise InvalidKVSpec(f"LingBot sequence_parallel must divide {heads} heads, got {sequence_parallel}")
    latent_h, latent_w = height // spatial, width // spatial
    tokens_per_frame = (latent_h // patch_h) * (latent_w // patch_w)
    frames = transformer.num_frames_per_block
    condition_bytes = (
        (vae.scale_factor_temporal + transformer.out_channels) * frames * latent_h * latent_w * b
    )
    # Per layer: scale and shift of the rank-local camera tokens of one block.
    camera_bytes = (
        (2 * transformer.num_layers * math.ceil(tokens_per_frame * frames / sequence_parallel) * heads)
        * transformer.attention_head_dim
        * b
    )
    decode_width = width
    if sequence_parallel > 1 and vae_spatial_sharding:  # the decoder pads, then splits the width across ranks
        decode_width = math.ceil(math.ceil(width / spatial) / sequence_parallel) * spatial
    # Same float expression as WanStreamingDecoder.declared_state_bytes, so the int() truncation agrees.
    decode_bytes = int(LINGBOT_STREAMING_DECODE_BYTES_PER_PIXEL_FP32 * height * decode_width * (b / 4))
    encoder_bytes = wan_encoder_cache_bytes(vae, height=height, width=width, element_bytes=b)
    return KVCacheSpec(
        num_layers=transformer.num_layers,
        num_kv_heads=heads // sequence_parallel,  # self-attention heads are split across Ulysses ranks
        head_size=transformer.attention_head_dim,
        tokens_per_frame=tokens_per_frame,
        frames_per_block=frames,
        window_frames=transformer.cache_window_frames - transformer.sink_size,
        sink_frames=transformer.sink_size,
        kv_branches=(KVBranch("main", 0),),
        session_capacity=2,
        # Cross-attention keeps every head on every rank: the text K/V is replicated, not sharded.
        cross_attention=(CrossAttentionCache("text", LINGBOT_TEXT_TOKENS, num_kv_heads=heads),),
        # Image condition + camera modulation + committed and in-flight encoder histories + decoder cache.
        model_owned_state_bytes_per_session=condition_bytes + camera_bytes + 2 * encoder_bytes + decode_bytes,
    )


def dreamzero_kv_spec(*, cfg_parallel: bool) -> KVCacheSpec:
    """DreamZero-DROID's per-rank `ar_diffusion_kv_cache_spec()` (TP=1; CFG branches on one rank or two)."""
    c = DREAMZERO_DROID
    return KVCacheSpec(
        num_layers=c["num_layers"],
        num_kv_heads=c["num_heads"],
        head_size=c["dim"] // c["num_heads"],
        tokens_per_frame=c["frame_seqlen"],
        frames_per_block=c["num_frame_per_block"],
        # max_attention_size // frame_seqlen, with local_attn_size = max_chunk_size * frames per block + 1.
        window_frames=c["max_chunk_size"] * c["num_frame_per_block"] + 1,
        # Under CFG parallelism each rank runs one branch, so both share storage slot 0.
        kv_branches=(KVBranch("positive", 0), KVBranch("negative", 0 if cfg_parallel else 1)),
        session_capacity=64,  # MAX_DREAMZERO_SESSIONS
        cross_attention=(
            CrossAttentionCache("text", c["text_len"]),
            CrossAttentionCache("image", 257),
        ),  # i2v
        max_scratch_tokens_per_branch=c["num_action_per_block"] + c["num_state_per_block"],
        model_owned_state_bytes_per_session=603 << 20,  # DREAMZERO_MODEL_OWNED_STATE_BYTES_PER_SESSION
    )


# DreamZero-DROID (GEAR-Dreams/DreamZero-DROID): CausalWanModel over Wan2.1-I2V-14B-480P. dim, heads, layers
# and i2v from the DreamZero repo's
# groot/vla/configs/model/dreamzero/action_head/wan_flow_matching_action_tf.yaml;
# frame_seqlen 880 (a 352x640 canvas of three 176x320 camera views), num_frame_per_block 2, 24 actions and
# 1 state per block and max_chunk_size 4 from its scripts/train/droid_training_full_finetune.sh; text_len is
# CausalWanModel's default (vllm-omni's pipeline passes none).
DREAMZERO_DROID = {
    "num_layers": 40,
    "num_heads": 40,
    "dim": 5120,
    "frame_seqlen": 880,
    "num_frame_per_block": 2,
    "max_chunk_size": 4,
    "num_action_per_block": 24,
    "num_state_per_block": 1,
    "text_len": 512,
}

# Parameter counts (see the module docstring for how they were counted).
LINGBOT_DIT_PARAMS = 18_544_332_864  # CausalLingBotWorldTransformer3DModel, v2 checkpoint contract
UMT5_XXL_ENCODER_PARAMS = 5_680_910_336  # UMT5EncoderModel: d_model 4096, 24 layers, vocab 256,384
WAN21_VAE_PARAMS = 126_892_531  # DistributedAutoencoderKLWan with the Wan 2.1 defaults
DREAMZERO_DIT_PARAMS = 16_484_292_448  # CausalWanModel with DREAMZERO_DROID
DREAMZERO_CLIP_PARAMS = 632_076_801  # DreamZeroImageEncoder (open-clip ViT-H/14 visual tower)

# The embedded tiny LingBot-World the worker generates (ardiff.worker.tiny.model; a test keeps them equal):
# 2 layers of 2 x 32 heads, VAE base 8 with one residual block per level; sink 3, window 6, 3-frame blocks.
TINY_LINGBOT_TRANSFORMER = LingBotTransformerConfig(
    num_layers=2, num_attention_heads=2, attention_head_dim=32, sink_size=3, sliding_window_num_frames=9
)
TINY_LINGBOT_VAE = WanVAEConfig(base_dim=8, num_res_blocks=1)


def _lingbot_profile(name: str, *, sequence_parallel: int) -> ModelProfile:
    ranks = f", Ulysses SP={sequence_parallel} (per GPU)" if sequence_parallel > 1 else ", one GPU"
    return ModelProfile(
        name=name,
        description="LingBot-World v2, 480x832 bfloat16" + ranks,
        spec=lingbot_world_kv_spec(
            height=480, width=832, dtype="bfloat16", sequence_parallel=sequence_parallel
        ),
        dtype="bfloat16",
        # Ulysses replicates the weights on every rank.
        weights_bytes=(LINGBOT_DIT_PARAMS + UMT5_XXL_ENCODER_PARAMS + WAN21_VAE_PARAMS)
        * DTYPE_BYTES["bfloat16"],
        runtime_overhead_bytes=CUDA_RUNTIME_OVERHEAD_BYTES
        + (NCCL_OVERHEAD_BYTES if sequence_parallel > 1 else 0),
    )


def _dreamzero_profile(name: str, *, cfg_parallel: bool) -> ModelProfile:
    return ModelProfile(
        name=name,
        description="DreamZero-DROID, 3 x 176x320 views, bfloat16"
        + (", CFG parallel over 2 GPUs (per GPU)" if cfg_parallel else ", one GPU"),
        spec=dreamzero_kv_spec(cfg_parallel=cfg_parallel),
        dtype="bfloat16",
        weights_bytes=(
            DREAMZERO_DIT_PARAMS + UMT5_XXL_ENCODER_PARAMS + DREAMZERO_CLIP_PARAMS + WAN21_VAE_PARAMS
        )
        * DTYPE_BYTES["bfloat16"],
        runtime_overhead_bytes=CUDA_RUNTIME_OVERHEAD_BYTES + (NCCL_OVERHEAD_BYTES if cfg_parallel else 0),
    )


PRESETS: dict[str, ModelProfile] = {
    profile.name: profile
    for profile in (
        _lingbot_profile("lingbot-world-480x832", sequence_parallel=1),
        _lingbot_profile("lingbot-world-480x832-sp4", sequence_parallel=4),
        _dreamzero_profile("dreamzero-droid", cfg_parallel=False),
        _dreamzero_profile("dreamzero-droid-cfg2", cfg_parallel=True),
        ModelProfile(
            name="tiny-lingbot-64x64",
            description="the embedded random-weight LingBot-World at 64x64, float32 on CPU; the worker "
            "reports ARDIFF_CPU_FREE_MEMORY_BYTES as free memory: plan with that as the device memory",
            spec=lingbot_world_kv_spec(
                height=64,
                width=64,
                dtype="float32",
                transformer=TINY_LINGBOT_TRANSFORMER,
                vae=TINY_LINGBOT_VAE,
            ),
            dtype="float32",
            # The CPU worker reports a fixed cap (or the RAM available, if less) as free memory; its weights
            # (a few MB) are not subtracted.
            weights_bytes=0,
            runtime_overhead_bytes=0,
        ),
    )
}
# The real models, planned by `ardiff kv plan` unless told otherwise.
DEFAULT_PRESETS = (
    "lingbot-world-480x832",
    "lingbot-world-480x832-sp4",
    "dreamzero-droid",
    "dreamzero-droid-cfg2",
)


def get_preset(name: str) -> ModelProfile:
    try:
        return PRESETS[name]
    except KeyError:
        raise InvalidKVSpec(f"KV preset must be one of {sorted(PRESETS)}, got {name!r}") from None
