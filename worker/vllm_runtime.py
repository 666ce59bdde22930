"""The `vllm` runtime: a model loaded with vllm-omni's own machinery, `DiffusionWorker` with the
`ARDiffusionEngine` backend, so every tick runs through `ARDiffusionModelRunner` and its paged KV cache.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ardiff.worker import cpu_platform
from ardiff.worker.errors import ModelUnavailable
from ardiff.worker.families import ModelFamily, family_for
from ardiff.worker.net import free_port
from ardiff.worker.settings import EMBEDDED_TINY_MODEL, WorkerSettings

log = logging.getLogger(__name__)

ENGINE_BACKEND = "vllm_omni.experimental.ar_diffusion.engine.ARDiffusionEngine"


def prepare_vllm_omni(*, cpu_free_memory_bytes: int) -> bool:
    """Make vllm-omni usable in this process; True when an accelerator is present.

    Without one, the CPU shims go in first (they must precede the first import of LingBot's pipeline). A
    family's tiny-checkpoint factories go in while its pipeline is built (`family.loading`), on every device.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model directory is local
    cpu_platform.skip_cuda_background_builds()  # before vllm (imported by the platform check) imports humming
    on_cpu = cpu_platform.apply_if_needed(free_memory_bytes=cpu_free_memory_bytes)
    return not on_cpu


def model_family(settings: WorkerSettings) -> ModelFamily:
    """The family module serving `settings.pipeline`; `ModelUnavailable` for a pipeline no family serves."""
    try:
        return family_for(settings.pipeline)
    except ValueError as exc:
        raise ModelUnavailable(str(exc)) from None


def checked_model_dir(model: str, family: ModelFamily | None = None) -> Path:
    """A model directory given by `--model`; `ModelUnavailable` unless it has the family's layout."""
    family = family or model_family(WorkerSettings())
    model_dir = Path(model).expanduser()
    if not family.checkpoint_ok(model_dir):
        layout = "no model_index.json" if family.name == "lingbot" else f"not a {family.name} checkpoint"
        raise ModelUnavailable(
            f"model {model!r} is neither {family.embedded_model!r} nor a model directory ({layout})"
        )
    return model_dir


def build_od_config_kwargs(
    settings: WorkerSettings,
    model_dir: Path,
    *,
    accelerator: bool,
    master_port: int,
    family: ModelFamily | None = None,
) -> dict[str, Any]:
    """The `OmniDiffusionConfig` of this worker (dtype as a name; the caller converts it to torch's)."""
    family = family or model_family(settings)
    default_dtype = family.default_dtype or ("bfloat16" if accelerator else "float32")
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "model_class_name": settings.pipeline,
        "dtype": settings.dtype or default_dtype,
        "engine_backend": ENGINE_BACKEND,  # -> DiffusionWorker builds ARDiffusionModelRunner
        "model_config": {
            "ar_diffusion_height": settings.height,
            "ar_diffusion_width": settings.width,
            "ar_diffusion_kv_config": {"gpu_memory_fraction": settings.kv_fraction(accelerator=accelerator)},
        },
        "num_gpus": 1,
        "master_port": master_port,
    }
    extras = family.od_config_extras(settings, model_dir)
    kwargs["model_config"].update(extras.pop("model_config", {}))
    kwargs.update(extras)
    if not accelerator:
        # No torch.compile, no fused Triton VAE path and no weight-loading threads on CPU.
        kwargs.update(enforce_eager=True, vae_fast_path="off", enable_multithread_weight_load=False)
    return kwargs


def load_vllm_runtime(settings: WorkerSettings):
    family = model_family(settings)
    embedded = settings.model in (EMBEDDED_TINY_MODEL, family.embedded_model)
    if embedded and settings.model != family.embedded_model:  # another family's embedded model
        raise ModelUnavailable(
            f"model {settings.model!r} is another family's; {settings.pipeline} serves "
            f"{family.embedded_model!r} or a {family.name} checkpoint"
        )
    model_dir = None if embedded else checked_model_dir(settings.model, family)  # before the slow imports
    accelerator = prepare_vllm_omni(cpu_free_memory_bytes=settings.cpu_free_memory_bytes)
    if model_dir is None:
        model_dir = family.ensure_tiny_model(settings.model_cache)  # generated once, under a file lock
    import torch
    from vllm_omni.diffusion.data import OmniDiffusionConfig
    from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker

    from ardiff.worker.session_adapter import ARDiffusionSessionAdapter

    # Every worker process takes its own rendezvous port; the env var wins over the config in vllm-omni.
    master_port = free_port()
    os.environ["MASTER_PORT"] = str(master_port)
    kwargs = build_od_config_kwargs(
        settings, model_dir, accelerator=accelerator, master_port=master_port, family=family
    )
    kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    od_config = OmniDiffusionConfig(**kwargs)
    log.info(
        "loading %s from %s (%s, %s)",
        settings.pipeline,
        model_dir,
        kwargs["dtype"],
        "accelerator" if accelerator else "CPU",
    )
    try:
        with family.loading(model_dir):
            worker = DiffusionWorker(local_rank=0, rank=0, od_config=od_config)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelUnavailable(f"could not load {model_dir}: {exc}") from exc
    if not accelerator and worker.model_runner is not None:
        for name in family.cpu_float32_modules:
            cpu_platform.run_in_float32(getattr(worker.model_runner.pipeline, name))
    return ARDiffusionSessionAdapter(worker, od_config, family)
