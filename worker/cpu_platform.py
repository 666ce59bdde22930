"""vllm-omni on a host without an accelerator: every CPU-only shim the real runner needs, in one place.

On such a host vllm-omni resolves `UnspecifiedOmniPlatform`, whose hooks raise `NotImplementedError`
(synchronize, free memory, attention backend, ...). `apply()` patches that class, in this process only,
so the real `DiffusionWorker` -> `ARDiffusionModelRunner` -> LingBot-World path runs unchanged on CPU:

1. platform hooks: gloo, one "device", no-op synchronize/set_device/cache calls, and a configurable
   "free device memory" (it sizes the KV pool);
2. SDPA on CPU (the backend dispatches on platform and has no CPU branch, though its body is plain torch);
3. RoPE broadcast: `RotaryEmbeddingWan.forward_native` needs cos/sin with a head axis that LingBot omits
   (only the CUDA/HIP/NPU kernels accept it without);
4. float32 modules (`run_in_float32`, those a family names in `cpu_float32_modules`): a bfloat16 Conv3d on
   a CPU without AVX-512 BF16 takes minutes, under autocast too (one 96-channel 3x90x160 convolution: 239 s
   with oneDNN, 101 s without, 0.32 s in float32 on this project's 2-core machine).

torchvision, torchaudio and torchcodec are PyPI's builds, as vllm pins them: they load beside PyPI's CUDA
torch on CPU too (tests/test_environment.py), so nothing stands in for them any more.

Nothing here runs when an accelerator platform is resolved (`needs_cpu_platform()` is False). Before vllm is
imported at all, `skip_cuda_background_builds()` stops a kernel library's CUDA builds on a host without CUDA.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psutil

log = logging.getLogger(__name__)


def skip_cuda_background_builds() -> bool:
    """Without CUDA, keep humming-kernels from spawning its background builds; True if they are skipped.

    vllm imports `humming` at import time (vllm-omni's platform module already does), and `import humming`
    starts two `python -c import humming...` processes that build CUDA launchers, which cannot succeed without
    CUDA: they only take CPU from the worker's own start-up (benchmarks/startup.py). humming's own switch,
    `HUMMING_DISABLE_PARALLEL_BUILD=1`, skips them and leaves its on-demand builds as they are; a value set
    in the environment wins. Must run before the first import of vllm.
    """
    import torch

    if torch.cuda.is_available():
        return False
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    return os.environ["HUMMING_DISABLE_PARALLEL_BUILD"] == "1"


def needs_cpu_platform() -> bool:
    """True when vllm-omni found no accelerator platform."""
    from vllm_omni.platforms import current_omni_platform
    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform

    return isinstance(current_omni_platform, UnspecifiedOmniPlatform)


def apply_if_needed(*, free_memory_bytes: int) -> bool:
    """Apply the shims when there is no accelerator; True if they were applied."""
    if not needs_cpu_platform():
        return False
    apply(free_memory_bytes=free_memory_bytes)
    return True


def apply(*, free_memory_bytes: int) -> None:
    """Patch the unspecified platform for CPU; idempotent. `free_memory_bytes` caps "free device memory"."""
    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform as platform

    _patch_platform(platform, free_memory_bytes)
    _patch_sdpa()
    _patch_wan_rope()


def _patch_platform(platform: type, free_memory_bytes: int) -> None:
    def free_memory(cls: type, device: Any = None) -> int:
        return min(free_memory_bytes, int(psutil.virtual_memory().available))

    def device_memory(cls: type, device: Any = None) -> tuple[int, int]:
        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def process_memory(cls: type, device: Any = None) -> int:
        return int(psutil.Process().memory_info().rss)

    platform.dist_backend = "gloo"
    platform.get_device_count = classmethod(lambda cls: 1)  # one rank; 0 divides by zero in dist init
    platform.set_device = classmethod(lambda cls, device: None)
    platform.synchronize = classmethod(lambda cls: None)
    platform.get_free_memory = classmethod(free_memory)
    platform.get_device_memory = classmethod(device_memory)
    platform.supports_torch_inductor = classmethod(lambda cls: False)
    platform.get_diffusion_attn_backend_cls = classmethod(
        lambda cls, selected_backend=None, head_size=-1, allow_trtllm_default=False: (
            "vllm_omni.diffusion.attention.backends.sdpa.SDPABackend"
        )
    )
    for name in ("reset_peak_memory_stats", "empty_cache", "seed_everything"):
        setattr(platform, name, staticmethod(lambda *args, **kwargs: None))
    for name in ("max_memory_reserved", "max_memory_allocated", "memory_allocated", "memory_reserved"):
        setattr(platform, name, staticmethod(lambda *args, **kwargs: 0))
    # vllm's own platform answers DeviceMemoryProfiler, which the runner uses around load.
    from vllm.platforms import current_platform

    for cls in {type(current_platform), platform}:
        cls.get_current_memory_usage = classmethod(process_memory)


def _patch_sdpa() -> None:
    from vllm_omni.diffusion.attention.backends.sdpa import SDPAImpl

    def forward(self: Any, query: Any, key: Any, value: Any, attn_metadata: Any = None) -> Any:
        return self._forward_impl(query, key, value, attn_metadata, mask_mode="broadcast_k")

    SDPAImpl.forward = forward


def _patch_wan_rope() -> None:
    from vllm_omni.diffusion.layers.rope import RotaryEmbeddingWan

    native = RotaryEmbeddingWan.forward_native
    if getattr(native, "ardiff_cpu_shim", False):
        return

    def forward_native(self: Any, x: Any, cos: Any, sin: Any) -> Any:
        # cos/sin come as [S, D/2]; x is [..., S, H, D/2]: insert the head axis (math unchanged).
        if cos.dim() == 2 and x.dim() >= 3 and cos.shape[0] == x.shape[-3]:
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return native(self, x, cos, sin)

    forward_native.ardiff_cpu_shim = True  # type: ignore[attr-defined]
    RotaryEmbeddingWan.forward_native = forward_native


def run_in_float32(module: Any) -> int:
    """Make `module` float32, its convolutions outside autocast (whose CPU policy casts them to bfloat16) with
    their input cast to float32 and their output in the input's dtype; returns how many convolutions."""
    import torch

    module.float()  # exact from bfloat16
    count = 0
    for conv in module.modules():
        if isinstance(conv, torch.nn.modules.conv._ConvNd):
            conv._conv_forward = _float32_conv_forward(conv, type(conv)._conv_forward)
            count += 1
    return count


def _float32_conv_forward(conv: Any, conv_forward: Any) -> Any:
    import torch

    def forward(input: Any, weight: Any, bias: Any) -> Any:
        with torch.autocast(device_type=input.device.type, enabled=False):
            out = conv_forward(conv, input.float(), weight, bias)
        return out.to(input.dtype)

    return forward
