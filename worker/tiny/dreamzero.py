"""A tiny, randomly initialised DreamZero checkpoint (`ardiff worker make-tiny-model --family dreamzero`).

The real `DreamZeroPipeline` and `CausalWanModel` classes, loaded by the real loader from DreamZero's own
layout (a root `config.json` whose `action_head_cfg` builds the DiT, one `model.safetensors` of
`action_head.*` tensors under the checkpoint's names, which the pipeline's `load_weights` remaps; `vae/` with
the tiny Wan VAE; `tokenizer/`; `experiment_cfg/metadata.json` with DROID normalisation statistics).
Meaningless actions.

`DreamZeroPipeline.__init__` hard-codes a UMT5-XXL text encoder and a ViT-H/14 image tower. The root config
carries `TINY_FLAG` with smaller sizes, and `tiny_encoders(model_dir)` lets the pipeline build those with the
same classes while it loads (`UMT5Config` and `DreamZeroVisionTransformer` get the tiny sizes; every other
argument stays the pipeline's). The image tower keeps width 1280 (the DiT's `img_emb` projects from 1280) and
the 257 tokens of a 224-pixel image at patch 14 (the KV spec reserves 257 image tokens); it has one layer,
which DreamZero skips (it reads the penultimate layer's output), so the tower is a patch embedding.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ardiff.worker.tiny.model import ensure_generated, write_atomically, write_json

log = logging.getLogger(__name__)

TINY_FLAG = "_ardiff_tiny"
TEXT_DIM = 32
# CausalWanModel's own keyword arguments (`action_head_cfg.config.diffusion_model_cfg`). frame_seqlen is what
# the roboarena/DROID transform's canvas gives: three 176x320 views stitched to 352x640, latents 44x80,
# patches 22x40 = 880 (the real checkpoint's value).
DIFFUSION_MODEL_CFG: dict[str, Any] = {
    "_target_": "groot.vla.model.dreamzero.modules.wan_video_dit_action_casual_chunk.CausalWanModel",
    "model_type": "i2v",
    "patch_size": [1, 2, 2],
    "frame_seqlen": 880,
    "text_len": 512,
    "in_dim": 36,  # 16 noise + 4 mask + 16 image latent channels
    "dim": 64,
    "ffn_dim": 128,
    "freq_dim": 32,
    "text_dim": TEXT_DIM,
    "out_dim": 16,
    "num_heads": 2,  # head size 32 (GPU attention kernels may reject 16)
    "num_layers": 2,
    "max_chunk_size": 4,  # window 4 x 2 + 1 = 9 frames, as DreamZero-DROID
    "sink_size": 0,
    "qk_norm": True,
    "cross_attn_norm": True,
    "eps": 1e-6,
    "hidden_size": 64,
    "num_action_per_block": 24,
    "num_state_per_block": 1,
}
ACTION_HEAD_CONFIG: dict[str, Any] = {
    "diffusion_model_cfg": DIFFUSION_MODEL_CFG,
    "action_dim": 32,
    "max_action_dim": 32,
    "max_state_dim": 64,
    "num_frame_per_block": 2,
    "num_frames": 9,  # the first image's conditioning clip (DreamZero-DROID: 33)
    "action_horizon": 24,
    "decouple_inference_noise": False,
    "video_inference_final_noise": 0.0,
}
TINY_TEXT_ENCODER = {"d_model": TEXT_DIM, "d_ff": 64, "d_kv": 8, "num_heads": 4, "num_layers": 2}
TINY_IMAGE_ENCODER = {"dim": 1280, "num_heads": 2, "num_layers": 1, "mlp_ratio": 0.25, "out_dim": 16}
# Inference settings the worker passes as `model_config` for a tiny checkpoint (fewer denoising steps).
TINY_INFERENCE = {"num_inference_steps": 2, "cfg_scale": 5.0}
VAE_CONFIG = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,  # DreamZero's VAE key map names three resnets per decoder stage
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}
# DROID's joint (7) and gripper (1) ranges: the pipeline normalises state and denormalises actions with them.
METADATA = {
    "oxe_droid": {
        "statistics": {
            kind: {
                "joint_position": {"q01": [-2.5] * 7, "q99": [2.5] * 7},
                "gripper_position": {"q01": [0.0], "q99": [1.0]},
            }
            for kind in ("action", "state")
        }
    }
}
_VOCABULARY = """
a an the of in on at to and with is are robot arm gripper pick place put cup block bowl table left right
up down open close drawer move grasp lift red green blue view camera video shows that from wrist
exterior bottom top
"""


def root_config(seed: int) -> dict[str, Any]:
    return {
        "architectures": ["VLA"],
        "model_type": "dreamzero",
        "action_head_cfg": {"config": ACTION_HEAD_CONFIG},
        TINY_FLAG: {
            "seed": seed,
            "text_encoder": TINY_TEXT_ENCODER,
            "image_encoder": TINY_IMAGE_ENCODER,
            "inference": TINY_INFERENCE,
        },
    }


def is_dreamzero_checkpoint(model_dir: Path) -> bool:
    """DreamZero's layout: a root config.json with `action_head_cfg` (no model_index.json)."""
    return _action_head_config(model_dir) is not None


def _action_head_config(model_dir: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and "action_head_cfg" in config else None


def tiny_settings(model_dir: Path) -> dict[str, Any] | None:
    """The `TINY_FLAG` block of a DreamZero checkpoint, None for a real one."""
    config = _action_head_config(model_dir) or {}
    value = config.get(TINY_FLAG)
    return value if isinstance(value, dict) else None


@contextlib.contextmanager
def tiny_encoders(model_dir: Path) -> Iterator[None]:
    """While a tiny checkpoint's pipeline is built: its encoders take the tiny sizes (no-op otherwise)."""
    tiny = tiny_settings(model_dir)
    if tiny is None:
        yield
        return
    import vllm_omni.diffusion.models.dreamzero.image_encoder as image_module
    import vllm_omni.diffusion.models.dreamzero.pipeline_dreamzero as pipeline_module

    real_config, real_tower = pipeline_module.UMT5Config, image_module.DreamZeroVisionTransformer
    text, image = dict(tiny["text_encoder"]), dict(tiny["image_encoder"])
    vocab_size = len(_vocabulary())

    def umt5_config(**kwargs: Any) -> Any:
        return real_config(**{**kwargs, **text, "vocab_size": vocab_size})

    def vision_tower(**kwargs: Any) -> Any:
        return real_tower(**{**kwargs, **image})

    pipeline_module.UMT5Config = umt5_config
    image_module.DreamZeroVisionTransformer = vision_tower
    try:
        yield
    finally:
        pipeline_module.UMT5Config = real_config
        image_module.DreamZeroVisionTransformer = real_tower


# ------------------------------------------------------------------------------------------ writing


def ensure_tiny_dreamzero(cache_dir: str | Path, *, seed: int = 0) -> Path:
    return ensure_generated(
        Path(cache_dir) / f"tiny-dreamzero-seed{seed}",
        "config.json",
        lambda target: write_tiny_dreamzero(target, seed=seed),
    )


def write_tiny_dreamzero(directory: str | Path, *, seed: int = 0) -> Path:
    """Write the checkpoint atomically."""

    def fill(staging: Path) -> None:
        _write_tokenizer(staging / "tokenizer")
        vae = _write_vae(staging / "vae", seed)
        state = _checkpoint_tensors(staging, vae, seed)
        from safetensors.torch import save_file

        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "experiment_cfg").mkdir()
        write_json(staging / "experiment_cfg" / "metadata.json", METADATA)
        write_json(staging / "config.json", root_config(seed))

    return write_atomically(directory, fill)


def _vocabulary() -> dict[str, int]:
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in _VOCABULARY.split():
        vocab.setdefault(word, len(vocab))
    return vocab


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=_vocabulary(), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=512,
    ).save_pretrained(path)


def _write_vae(path: Path, seed: int) -> Any:
    import torch
    from vllm_omni.diffusion.distributed.autoencoders.autoencoder_kl_wan import DistributedAutoencoderKLWan

    torch.manual_seed(seed + 1)
    vae = DistributedAutoencoderKLWan(**VAE_CONFIG).eval()
    vae.save_pretrained(path, safe_serialization=True)
    return vae


def _random(shape: Any, name: str, generator: Any) -> Any:
    import torch

    if name.endswith("bias"):
        return torch.zeros(shape)
    if ("norm" in name or name.endswith("gamma")) and len(shape) <= 1:
        return torch.ones(shape)
    fan_in = 1
    for size in tuple(shape)[1:]:
        fan_in *= size
    return torch.randn(shape, generator=generator) / max(1, fan_in if len(shape) > 1 else 1) ** 0.5


def _checkpoint_tensors(staging: Path, vae: Any, seed: int) -> dict[str, Any]:
    """Every parameter of the tiny pipeline under DreamZero's checkpoint names (`action_head.*`)."""
    import torch
    from transformers import UMT5Config, UMT5EncoderModel
    from vllm_omni.diffusion.models.dreamzero.causal_wan_model import CausalWanModel
    from vllm_omni.diffusion.models.dreamzero.image_encoder import DreamZeroImageEncoder
    from vllm_omni.diffusion.models.dreamzero.pipeline_dreamzero import DreamZeroPipeline

    from ardiff.worker.tiny.model import _single_rank_world

    generator = torch.Generator().manual_seed(seed + 2)
    state: dict[str, torch.Tensor] = {}
    with _single_rank_world(staging) as vllm_config:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(vllm_config):
            kwargs = {k: v for k, v in DIFFUSION_MODEL_CFG.items() if not k.startswith("_")}
            kwargs["patch_size"] = tuple(kwargs["patch_size"])
            for name in ("action_dim", "max_state_dim", "num_frame_per_block"):
                kwargs[name] = ACTION_HEAD_CONFIG[name]
            transformer = CausalWanModel(**kwargs)
    for name, parameter in transformer.named_parameters():
        value = _random(parameter.shape, name, generator)
        source = (
            name.replace("img_emb.norm1.", "img_emb.proj.0.")
            .replace("img_emb.fc1.", "img_emb.proj.1.")
            .replace("img_emb.fc2.", "img_emb.proj.3.")
            .replace("img_emb.norm2.", "img_emb.proj.4.")
        )
        if ".self_attn.qkv." in source:  # the checkpoint stores q/k/v unfused
            for part, chunk in zip("qkv", value.chunk(3, dim=0), strict=True):
                state["action_head.model." + source.replace(".self_attn.qkv.", f".self_attn.{part}.")] = chunk
        else:
            state["action_head.model." + source] = value
    text = UMT5EncoderModel(
        UMT5Config(
            **TINY_TEXT_ENCODER,
            vocab_size=len(_vocabulary()),
            relative_attention_num_buckets=32,
            relative_attention_max_distance=128,
            dense_act_fn="gelu_new",
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
        )
    )
    for name, parameter in text.named_parameters():
        source = _text_encoder_source(name)
        if DreamZeroPipeline._remap_text_encoder_key(source) != name:
            raise AssertionError(f"text encoder key {name} has no DreamZero checkpoint name")
        state[source] = _random(parameter.shape, name, generator)
    with tiny_encoders_for_writing():
        image = DreamZeroImageEncoder()
    for name, parameter in image.named_parameters():
        state["action_head.image_encoder." + name] = _random(parameter.shape, name, generator)
    for name, parameter in vae.named_parameters():
        source = _vae_source(name)
        if DreamZeroPipeline._remap_vae_key(source) != name:
            raise AssertionError(f"VAE key {name} has no DreamZero checkpoint name (tried {source})")
        state[source] = parameter.detach().clone()
    return {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in state.items()}


@contextlib.contextmanager
def tiny_encoders_for_writing() -> Iterator[None]:
    import vllm_omni.diffusion.models.dreamzero.image_encoder as image_module

    real_tower = image_module.DreamZeroVisionTransformer
    image_module.DreamZeroVisionTransformer = lambda **kwargs: real_tower(**{**kwargs, **TINY_IMAGE_ENCODER})
    try:
        yield
    finally:
        image_module.DreamZeroVisionTransformer = real_tower


_TEXT_LEAVES = {
    "layer.0.SelfAttention.q.weight": "attn.q.weight",
    "layer.0.SelfAttention.k.weight": "attn.k.weight",
    "layer.0.SelfAttention.v.weight": "attn.v.weight",
    "layer.0.SelfAttention.o.weight": "attn.o.weight",
    "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
    "layer.0.layer_norm.weight": "norm1.weight",
    "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
    "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
    "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight",
    "layer.1.layer_norm.weight": "norm2.weight",
}


def _text_encoder_source(name: str) -> str:
    prefix = "action_head.text_encoder."
    if name == "shared.weight":
        return prefix + "token_embedding.weight"
    if name == "encoder.final_layer_norm.weight":
        return prefix + "norm.weight"
    match = re.fullmatch(r"encoder\.block\.(\d+)\.(.*)", name)
    if match and match.group(2) in _TEXT_LEAVES:
        return f"{prefix}blocks.{match.group(1)}.{_TEXT_LEAVES[match.group(2)]}"
    return prefix + name


_RESNET_LEAVES = {
    "norm1.gamma": "residual.0.gamma",
    "conv1.weight": "residual.2.weight",
    "conv1.bias": "residual.2.bias",
    "norm2.gamma": "residual.3.gamma",
    "conv2.weight": "residual.6.weight",
    "conv2.bias": "residual.6.bias",
    "conv_shortcut.weight": "shortcut.weight",
    "conv_shortcut.bias": "shortcut.bias",
}
_PREFIXES = {
    "encoder.conv_in.": "encoder.conv1.",
    "encoder.norm_out.": "encoder.head.0.",
    "encoder.conv_out.": "encoder.head.2.",
    "decoder.conv_in.": "decoder.conv1.",
    "decoder.norm_out.": "decoder.head.0.",
    "decoder.conv_out.": "decoder.head.2.",
    "quant_conv.": "conv1.",
    "post_quant_conv.": "conv2.",
}


def _vae_source(name: str) -> str:
    prefix = "action_head.vae.model."
    for target, source in _PREFIXES.items():
        if name.startswith(target):
            return prefix + source + name[len(target) :]
    if match := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.*)", name):
        part, index, leaf = match.groups()
        return f"{prefix}{part}.middle.{0 if index == '0' else 2}.{_RESNET_LEAVES.get(leaf, leaf)}"
    if match := re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)", name):
        return f"{prefix}{match.group(1)}.middle.1.{match.group(2)}"
    if match := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.(.*)", name):
        index, leaf = match.groups()
        return f"{prefix}encoder.downsamples.{index}.{_RESNET_LEAVES.get(leaf, leaf)}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", name):
        stage, index, leaf = match.groups()
        return f"{prefix}decoder.upsamples.{4 * int(stage) + int(index)}.{_RESNET_LEAVES.get(leaf, leaf)}"
    if match := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", name):
        return f"{prefix}decoder.upsamples.{4 * int(match.group(1)) + 3}.{match.group(2)}"
    return prefix + name
