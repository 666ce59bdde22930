"""The embedded default model: a tiny, randomly initialised LingBot-World checkpoint, generated on the spot.

Real architecture and real code path (tokenizer, UMT5 encoder, Wan VAE, causal LingBot DiT, DMD schedule),
meaningless pictures, a few MB, a pure function of its seed. The transformer config carries `TINY_FLAG`;
`install_tiny_transformer_factory()` makes the pipeline build such a checkpoint with the real class, minus
`from_config`'s equality check against the 14B geometry. That factory applies on any device; the CPU shims
(`ardiff.worker.cpu_platform`) are separate.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

log = logging.getLogger(__name__)

TINY_FLAG = "_ardiff_tiny"  # underscore: `from_config` passes only non-underscore keys to the model
TEXT_DIM = 32
VAE_BASE_DIM = 8
TRANSFORMER_CONFIG: dict[str, Any] = {
    "_class_name": "CausalLingBotWorldTransformer3DModel",
    TINY_FLAG: True,
    "patch_size": [1, 2, 2],
    "num_attention_heads": 2,
    "attention_head_dim": 32,  # GPU attention kernels may reject 16
    "in_channels": 36,  # 16 noise + 4 mask + 16 image latent channels, as the real checkpoint
    "out_channels": 16,
    "text_dim": TEXT_DIM,
    "freq_dim": 16,
    "ffn_dim": 64,
    "num_layers": 2,
    "cross_attn_norm": True,
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
    "qk_norm": "rms_norm_across_heads",
    "sink_size": 3,
    "num_frames_per_block": 3,
    "sliding_window_num_frames": 9,
    "local_attn_size": -1,
}
# The flow-matching UniPC contract LingBot's `_validate_scheduler_config` checks.
SCHEDULER_CONFIG: dict[str, Any] = {
    "_class_name": "UniPCMultistepScheduler",
    "num_train_timesteps": 1000,
    "flow_shift": 5.0,
    "prediction_type": "flow_prediction",
    "predict_x0": True,
    "use_flow_sigmas": True,
    "use_dynamic_shifting": False,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
    "final_sigmas_type": "zero",
    "timestep_spacing": "linspace",
    "solver_order": 2,
    "solver_type": "bh2",
    "lower_order_final": True,
    "disable_corrector": [],
}
MODEL_INDEX: dict[str, Any] = {
    "_class_name": "LingBotWorldCausalDMDPipeline",
    "_diffusers_version": "0.40.0",
    "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    "text_encoder": ["transformers", "UMT5EncoderModel"],
    "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
    "transformer": ["vllm_omni", "CausalLingBotWorldTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLWan"],
}
_VOCABULARY = """
a an the of in on at to and with is are move moving walk walking through room forest city street
camera forward left right up down turn sky water tree house car road light dark red green blue world
scene view castle mountain river ocean sunset night day quiet burning
"""


def ensure_tiny_model(cache_dir: str | Path, *, seed: int = 0) -> Path:
    """The embedded model in `cache_dir`, generated once."""
    return ensure_generated(
        Path(cache_dir) / f"tiny-lingbot-world-seed{seed}",
        "model_index.json",
        lambda target: write_tiny_model(target, seed=seed),
    )


def write_tiny_model(directory: str | Path, *, seed: int = 0) -> Path:
    """Write the checkpoint atomically."""

    def fill(staging: Path) -> None:
        vocab_size = _write_tokenizer(staging / "tokenizer")
        _write_text_encoder(staging / "text_encoder", vocab_size, seed)
        _write_vae(staging / "vae", seed)
        _write_transformer(staging / "transformer", seed)
        (staging / "scheduler").mkdir()
        write_json(staging / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
        write_json(staging / "model_index.json", MODEL_INDEX)

    return write_atomically(directory, fill)


def ensure_generated(target: Path, marker: str, write: Callable[[Path], Path]) -> Path:
    """`target`, written once by `write` unless its `marker` file is there; a file lock keeps concurrent
    workers from racing (each embedded model is generated on first use into the model cache)."""
    target = target.expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=600):
        if not (target / marker).is_file():
            log.info("generating the embedded model %s", target)
            write(target)
    return target


def write_atomically(directory: str | Path, fill: Callable[[Path], None]) -> Path:
    """`fill` a sibling temp dir, renamed into `directory` once complete (a crash leaves no half model)."""
    target = Path(directory).expanduser().resolve()
    if target.exists() and any(target.iterdir()):
        from ardiff.worker.errors import ModelUnavailable

        raise ModelUnavailable(f"{target} exists and is not empty; choose a new directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(staging)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _write_tokenizer(path: Path) -> int:
    """A word-level vocabulary that AutoTokenizer loads offline (`<pad>`=0, `</s>`=1 as UMT5 expects)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for word in _VOCABULARY.split():
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=512,
    )
    fast.save_pretrained(path)
    return len(vocab)


def _write_text_encoder(path: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=TEXT_DIM,
        d_kv=TEXT_DIM // 4,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dense_act_fn="gelu_new",
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        pad_token_id=0,
        eos_token_id=1,
    )
    UMT5EncoderModel(config).eval().save_pretrained(path, safe_serialization=True)


def _write_vae(path: Path, seed: int) -> None:
    import torch
    from vllm_omni.diffusion.distributed.autoencoders.autoencoder_kl_wan import DistributedAutoencoderKLWan

    torch.manual_seed(seed + 1)
    vae = DistributedAutoencoderKLWan(
        base_dim=VAE_BASE_DIM,
        z_dim=16,  # the condition needs 4 + 16 channels
        dim_mult=[1, 2, 4, 4],  # spatial factor 8
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=[False, True, True],  # temporal factor 4
        dropout=0.0,
    ).eval()
    vae.save_pretrained(path, safe_serialization=True)


def _write_transformer(path: Path, seed: int, config: dict[str, Any] = TRANSFORMER_CONFIG) -> None:
    """Random weights under the real DiT's parameter names; the checkpoint stores q/k/v unfused."""
    import torch
    from safetensors.torch import save_file
    from vllm_omni.diffusion.models.lingbot_world.transformer import CausalLingBotWorldTransformer3DModel

    with _single_rank_world(path.parent) as vllm_config:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(vllm_config):
            model = CausalLingBotWorldTransformer3DModel(**_transformer_kwargs(config))
    generator = torch.Generator().manual_seed(seed + 2)
    state: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters():
        if name.endswith("bias"):
            value = torch.zeros(parameter.shape)
        elif "norm" in name and parameter.ndim == 1:
            value = torch.ones(parameter.shape)
        else:
            fan_in = parameter[0].numel() if parameter.ndim > 1 else parameter.numel()
            value = torch.randn(parameter.shape, generator=generator) / max(1, fan_in) ** 0.5
        if ".self_attn.qkv." in name:
            for part, chunk in zip("qkv", value.chunk(3, dim=0), strict=True):
                state[name.replace(".self_attn.qkv.", f".self_attn.{part}.")] = chunk.contiguous()
        else:
            state[name] = value.contiguous()
    path.mkdir(parents=True)
    save_file(state, str(path / "diffusion_pytorch_model.safetensors"))
    write_json(path / "config.json", config)


def _transformer_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """The config entries the real DiT's `__init__` takes (no underscore keys), patch_size as a tuple."""
    from vllm_omni.diffusion.models.lingbot_world.transformer import CausalLingBotWorldTransformer3DModel

    accepted = set(inspect.signature(CausalLingBotWorldTransformer3DModel.__init__).parameters)
    kwargs = {name: value for name, value in config.items() if name in accepted}
    kwargs["patch_size"] = tuple(kwargs["patch_size"])
    return kwargs


@contextlib.contextmanager
def _single_rank_world(model_dir: Path) -> Iterator[Any]:
    """A one-process gloo world with vllm-omni's model-parallel groups (the DiT's layers query them).

    `model_dir` is the checkpoint being written (its config resolution needs a local directory)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.distributed.parallel_state import (
        destroy_distributed_env,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm_omni.diffusion.vllm_config import create_diffusion_vllm_config

    from ardiff.worker.net import free_port

    saved = {
        name: os.environ.get(name)
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )
    od_config = OmniDiffusionConfig(model=str(model_dir), dtype=torch.float32, enforce_eager=True)
    vllm_config = create_diffusion_vllm_config(torch.device("cpu"), od_config)
    try:
        with set_current_vllm_config(vllm_config):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
            initialize_model_parallel()
        yield vllm_config
    finally:
        destroy_distributed_env()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def install_tiny_transformer_factory() -> None:
    """Let LingBot's pipeline build a checkpoint marked `TINY_FLAG` (any device); others go unchanged."""
    import vllm_omni.diffusion.models.lingbot_world.pipeline as pipeline_module
    from vllm_omni.diffusion.models.lingbot_world.transformer import CausalLingBotWorldTransformer3DModel

    if getattr(pipeline_module.CausalLingBotWorldTransformer3DModel, "accepts_tiny_checkpoints", False):
        return

    class TinyAwareLingBotTransformer(CausalLingBotWorldTransformer3DModel):
        accepts_tiny_checkpoints = True

        @classmethod
        def from_config(cls, config: dict[str, Any], *, quant_config: Any = None, prefix: str = "") -> Any:
            if not config.get(TINY_FLAG):
                return CausalLingBotWorldTransformer3DModel.from_config(
                    config, quant_config=quant_config, prefix=prefix
                )
            return CausalLingBotWorldTransformer3DModel(
                **_transformer_kwargs(config), quant_config=quant_config, prefix=prefix
            )

    pipeline_module.CausalLingBotWorldTransformer3DModel = TinyAwareLingBotTransformer
