"""vllm-omni on a host without an accelerator: every CPU-only shim the real runner needs, in one place.

On such a host vllm-omni resolves `UnspecifiedOmniPlatform`, whose hooks raise `NotImplementedError`
(synchronize, free memory, attention backend, ...). `apply()` patches that class, in this process only,
so the real `DiffusionWorker` -> `ARDiffusionModelRunner` -> LingBot-World path runs unchanged on CPU:

1. a `torchvision` stand-in (LingBot's module imports Wan 2.2's, which imports torchvision at module level;
   the CPU venv has none, because PyPI's builds cannot load beside the CPU torch): inert, except the four
   transforms DreamZero calls at run time (`Compose`, `Normalize` in its image encoder, `CenterCrop` and
   `Resize` in its DROID view transform), written with torchvision's own arithmetic on tensors;
2. platform hooks: gloo, one "device", no-op synchronize/set_device/cache calls, and a configurable
   "free device memory" (it sizes the KV pool);
3. SDPA on CPU (the backend dispatches on platform and has no CPU branch, though its body is plain torch);
4. RoPE broadcast: `RotaryEmbeddingWan.forward_native` needs cos/sin with a head axis that LingBot omits
   (only the CUDA/HIP/NPU kernels accept it without).

Nothing here runs when an accelerator platform is resolved (`needs_cpu_platform()` is False). Before vllm is
imported at all, `skip_cuda_background_builds()` stops a kernel library's CUDA builds on a host without CUDA.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import psutil

log = logging.getLogger(__name__)

_STUB_MODULES = (
    "torchvision",
    "torchvision.transforms",
    "torchvision.transforms.functional",
    "torchvision.transforms.v2",
    "torchvision.io",
)


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
    # Libraries that probe for torchvision must do so before the stub exists, so they record it as absent.
    import diffusers.models.autoencoders.autoencoder_kl_wan  # noqa: F401
    import transformers.models.auto.image_processing_auto  # noqa: F401
    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform as platform

    install_torchvision_stub()
    _patch_platform(platform, free_memory_bytes)
    _patch_sdpa()
    _patch_wan_rope()


def install_torchvision_stub() -> None:
    """Register an inert `torchvision` whose attributes fail only when used (LingBot never uses them)."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return

    class Missing:
        def __init__(self, name: str) -> None:
            self._name = name

        def __getattr__(self, item: str) -> Missing:
            return Missing(f"{self._name}.{item}")

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise ImportError(f"{self._name} needs torchvision, which is not installed on this CPU host")

    class StubModule(types.ModuleType):
        def __getattr__(self, item: str) -> Missing:
            if item.startswith("__"):
                raise AttributeError(item)
            return Missing(f"{self.__name__}.{item}")

    for name in _STUB_MODULES:
        module = StubModule(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__path__ = []  # a package, so `import torchvision.x` resolves from sys.modules
        sys.modules[name] = module
    for name in ("torchvision.transforms", "torchvision.transforms.v2"):
        for transform in (Compose, Normalize, CenterCrop, Resize, InterpolationMode):
            setattr(sys.modules[name], transform.__name__, transform)
    for name in _STUB_MODULES[1:]:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, sys.modules[name])


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


# ---------------------------------------------------------------------------- the transforms DreamZero calls


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


class Compose:
    """torchvision's `Compose`: the transforms applied in order; `.transforms` lists them."""

    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = list(transforms)

    def __call__(self, value: Any) -> Any:
        for transform in self.transforms:
            value = transform(value)
        return value


class Normalize:
    """`(x - mean) / std` per channel of a `(..., C, H, W)` tensor, in the tensor's dtype (not in place)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean, self.std = list(mean), list(std)

    def __call__(self, tensor: Any) -> Any:
        import torch

        mean = torch.as_tensor(self.mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
        return tensor.sub(mean).div(std)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)


class CenterCrop:
    """The centred `(h, w)` window of a `(..., H, W)` tensor (torchvision's rounding of the offsets)."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _pair(size)

    def __call__(self, tensor: Any) -> Any:
        height, width = tensor.shape[-2:]
        crop_h, crop_w = self.size
        if crop_h > height or crop_w > width:
            raise ValueError(f"CenterCrop {self.size} is larger than the image {(height, width)}")
        top = round((height - crop_h) / 2.0)
        left = round((width - crop_w) / 2.0)
        return tensor[..., top : top + crop_h, left : left + crop_w]


class Resize:
    """A float `(N, C, H, W)` tensor resized to `(h, w)` as torchvision does (`interpolate`, no corners)."""

    def __init__(
        self,
        size: Sequence[int],
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        antialias: bool | None = True,
    ) -> None:
        self.size = _pair(size)
        self.mode = InterpolationMode(interpolation).value
        self.antialias = bool(antialias) and self.mode != "nearest"

    def __call__(self, tensor: Any) -> Any:
        import torch.nn.functional as F

        kwargs: dict[str, Any] = {"size": self.size, "mode": self.mode}
        if self.mode != "nearest":
            kwargs.update(align_corners=False, antialias=self.antialias)
        return F.interpolate(tensor, **kwargs)
