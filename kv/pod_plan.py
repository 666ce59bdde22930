"""Sessions per worker pod: a model on a device of a pool, planned with the KV budget of `kv/capacity.py`.

A `ModelProfile` is a model as served (its KV spec, dtype, weights and runtime overhead, named in
`kv/presets.py`); `plan_for_pool` subtracts those from the device's memory, solves the budget
(`plan_from_footprint`) and applies the pool's optional `kv.sessionCapacity` cap. `PodPlan.explain()` says
why, step by step (`ardiff kv plan`, the demo).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ardiff.kv.capacity import (
    BindingLimit,
    CapacityPlan,
    KVCacheSpec,
    KVKnobs,
    build_footprint,
    check_int,
    check_nonempty_name,
    dtype_bytes,
    format_bytes,
    plan_from_footprint,
)


@dataclass(frozen=True)
class ModelProfile:
    """A model as served on one device: its KV spec and what the device holds before the KV pool is sized."""

    name: str
    description: str
    spec: KVCacheSpec
    dtype: str
    weights_bytes: int
    # In use besides the weights when the runner measures free memory (CUDA context, library workspaces).
    runtime_overhead_bytes: int
    knobs: KVKnobs = field(default_factory=KVKnobs)

    def __post_init__(self) -> None:
        check_nonempty_name("model profile", self.name)
        dtype_bytes(self.dtype)
        check_int("model profile", "weights_bytes", self.weights_bytes, minimum=0)
        check_int("model profile", "runtime_overhead_bytes", self.runtime_overhead_bytes, minimum=0)


@dataclass(frozen=True)
class PodPlan:
    """Sessions one worker pod holds: the KV plan on its device, under the pool's optional cap."""

    model: ModelProfile
    device_memory_bytes: int
    kv: CapacityPlan
    pool_session_capacity: int | None = None

    @property
    def sessions(self) -> int:
        return min(self.kv.capacity, self.pool_session_capacity or self.kv.capacity)

    @property
    def binding_limit(self) -> BindingLimit:
        if self.sessions < self.kv.capacity:
            return BindingLimit.POOL_SESSION_CAPACITY
        return self.kv.binding_limit

    def explain(self) -> list[str]:
        model, size = self.model, format_bytes
        lines = [
            f"model: {model.name} ({model.description})",
            f"device {size(self.device_memory_bytes)} - weights {size(model.weights_bytes)} "
            f"- runtime overhead {size(model.runtime_overhead_bytes)} "
            f"= {size(self.kv.available_bytes)} free when the pool is sized",
            *self.kv.explain(),
        ]
        if self.binding_limit is BindingLimit.POOL_SESSION_CAPACITY:
            lines.append(f"the pool's kv.sessionCapacity caps the pod at {self.sessions}")
        lines.append(f"sessions per pod: {self.sessions} (binding limit: {self.binding_limit})")
        return lines


def plan_for_pool(
    model: ModelProfile,
    *,
    device_memory_bytes: int,
    gpu_memory_fraction: float,
    pool_session_capacity: int | None = None,
) -> PodPlan:
    """How many sessions one pod of a pool serving `model` holds, and why (`PodPlan.explain()`).

    `device_memory_bytes` is the GPU's memory; the runner will find it minus the model's weights and runtime
    overhead free. `gpu_memory_fraction` is the pool's `kv.gpuMemoryFraction`; `pool_session_capacity` its
    optional `kv.sessionCapacity`, a cap the worker applies below the runner's capacity.
    A preset by name: `plan_for_pool(ardiff.kv.presets.get_preset(name), ...)`. Raises `KVDoesNotFit` when not
    even one session fits, `InvalidKVSpec` for bad arguments.
    """
    check_int("pool plan", "device_memory_bytes", device_memory_bytes, minimum=1)
    if pool_session_capacity is not None:
        check_int("pool plan", "pool_session_capacity", pool_session_capacity, minimum=1)
    available = max(0, device_memory_bytes - model.weights_bytes - model.runtime_overhead_bytes)
    footprint = build_footprint(model.spec, dtype=model.dtype, knobs=model.knobs)
    kv = plan_from_footprint(
        footprint,
        available_bytes=available,
        gpu_memory_fraction=gpu_memory_fraction,
        context=f"{model.name} on a {format_bytes(device_memory_bytes)} device (weights "
        f"{format_bytes(model.weights_bytes)}, "
        f"runtime overhead {format_bytes(model.runtime_overhead_bytes)})",
    )
    return PodPlan(
        model=model,
        device_memory_bytes=device_memory_bytes,
        kv=kv,
        pool_session_capacity=pool_session_capacity,
    )
