"""A session's torch tensors as parts of the session export (`ardiff.worker.session_export`, torch-free).

The vllm-omni runtimes' side of the format: a tensor becomes a `TensorPart` (its safetensors dtype code and
shape up front, its bytes copied to the host when the part is written), a read part becomes a tensor, and a
cache list (tensors, None before a conv ran, Wan's "Rep" string) becomes JSON plus parts and back. Used by the
session adapter (KV pages, cross-attention) and a family's own session state (`families/lingbot_state`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ardiff.worker.errors import ExportUnsupported
from ardiff.worker.session_export import ReadTensor, TensorPart

# safetensors dtype codes of the tensors a session holds.
DTYPE_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _host_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes in host memory: one device-to-host copy (none on CPU when already contiguous)."""
    host = tensor.detach().to("cpu").contiguous()
    return memoryview(host.reshape(-1).view(torch.uint8).numpy())


def part(name: str, tensor: torch.Tensor) -> TensorPart:
    return TensorPart(
        name, DTYPE_CODES[tensor.dtype], tuple(tensor.shape), functools.partial(_host_bytes, tensor)
    )


def staged(read: ReadTensor) -> torch.Tensor:
    """A read part as a tensor over the bytes it arrived in (no copy), for bytes copied elsewhere at once: KV
    pages, written into the pool."""
    if not read.data:
        return torch.empty(read.shape, dtype=_DTYPES[read.dtype])
    return torch.frombuffer(read.data, dtype=torch.uint8).view(_DTYPES[read.dtype]).reshape(read.shape)


def tensor(read: ReadTensor) -> torch.Tensor:
    """A read part as a tensor the session may keep: one over a view of a download's buffer is copied (the
    buffer goes after the import; a kept tensor must not hold all of it), one over its own buffer is not."""
    wrapped = staged(read)
    return wrapped.clone() if isinstance(read.data, memoryview) else wrapped


def pack_list(entries: list[Any] | None, prefix: str, parts: list[TensorPart]) -> list[Any] | None:
    """A cache list (tensors, None before a conv ran, Wan's "Rep" string) as JSON; tensors go to `parts`."""
    if entries is None:
        return None
    layout: list[Any] = []
    for i, entry in enumerate(entries):
        if entry is None:
            layout.append(None)
        elif isinstance(entry, str):
            layout.append({"str": entry})
        elif isinstance(entry, torch.Tensor):
            parts.append(part(f"{prefix}/{i}", entry))
            layout.append({"t": f"{prefix}/{i}"})
        else:
            raise ExportUnsupported(f"cache entry {prefix}[{i}] is a {type(entry).__name__}")
    return layout


def unpack_list(
    layout: list[Any] | None, tensors: dict[str, torch.Tensor], device: torch.device
) -> list[Any] | None:
    if layout is None:
        return None
    return [
        None if entry is None else entry["str"] if "str" in entry else tensors[entry["t"]].to(device)
        for entry in layout
    ]


def named_tensors(layout: list[Any] | None) -> set[str]:
    """The tensor names a packed cache list refers to (`KeyError`/`TypeError` on a malformed one)."""
    return {entry["t"] for entry in layout or [] if isinstance(entry, dict) and "t" in entry}
