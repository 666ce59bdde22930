"""How many sessions fit on one worker: a pure-Python port of vllm-omni 0.30.0's AR-diffusion KV budget.

Source of truth: `ARDiffusionKVCache.__init__` (vllm_omni/experimental/ar_diffusion/kv_cache/manager.py) after
the config merge in `ARDiffusionModelRunner._preallocate_kv_cache` (.../ar_diffusion/runner.py).
Notation (notes/vllm-omni-ar-diffusion.md §2): L layers, H KV heads, D head size, T tokens per frame (also the
paged block size), b bytes per element, F frames per block, S sink and W window frames after the merge,
Bl local KV branch slots, Bn logical branches, A available bytes, f the memory fraction.

    P    = L*H*T*2D*b                                  one page: one frame of K and V in every layer
    Ns   = Bl*max(F + ceil(scratch_tokens/T), env)     scratch pages, outside the block manager
    X    = sum over caches of 2*Bn*tokens*H_c*D*b*L    cross-attention bytes per session
    Hs   = 2*L*(W*T + S*T + T)*H*D*b                   history staging (reuse_history_staging + KV gather)
    M(c) = Bl*(c*(S+W) + F) + 2                        managed blocks; F once, +2 covers the null block
    R(c) = Ns*P + Hs + c*X + c*model_owned + M(c)*P
    R(1) > A: does not fit.   budget = max(int(A*f), R(1)).
    capacity = max c <= session_capacity with R(c) <= budget
    managed = (budget - Ns*P - Hs - capacity*(X + model_owned)) // P

Nothing here imports torch or vllm: the operator plans pools with it. Every input is explicit; the two
environment variables vllm-omni reads are fields of `KVKnobs`, never read from this process's environment.
tests/kv/test_capacity_matches_vllm_omni.py checks the port against the real `ARDiffusionKVCache`.
The authoritative capacity of a running pod is what its runner reports after load; this is for planning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from ardiff.errors import ArdiffError

# Bytes per element of the dtypes the AR-diffusion runner serves in (`od_config.dtype`).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

# The fields of vllm-omni's `ARDiffusionKVConfig`, the `ar_diffusion_kv_config` mapping of a deployment.
KV_CONFIG_KEYS = frozenset(
    {
        "enable",
        "chunk_size",
        "window_chunks",
        "sink_chunks",
        "reset_at_boundary",
        "gpu_memory_fraction",
        "warmup_cudagraph",
        "reuse_history_staging",
        "warmup_capture_reset",
    }
)
SCRATCH_BLOCKS_ENV = "AR_DIFFUSION_KV_SCRATCH_BLOCKS_PER_BRANCH"
KV_GATHER_ENV = "VLLM_OMNI_AR_DIFFUSION_KV_GATHER"

GIB = 1 << 30
MIB = 1 << 20


def format_bytes(value: int) -> str:
    """Binary units for tables and explanations."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


class InvalidKVSpec(ArdiffError, ValueError):
    """A spec, knob or planning input that vllm-omni would reject, or that cannot be planned."""

    code = "invalid_kv_spec"


class KVDoesNotFit(ArdiffError):
    """Not even one session fits: vllm-omni refuses to load (`ValueError`). The message says by how much."""

    code = "kv_does_not_fit"

    def __init__(
        self, *, required_bytes: int, available_bytes: int, breakdown: str, context: str = ""
    ) -> None:
        self.required_bytes = required_bytes
        self.available_bytes = available_bytes
        prefix = f"{context}: " if context else ""
        super().__init__(
            f"{prefix}one session needs {required_bytes:,} bytes ({format_bytes(required_bytes)}) but "
            f"{available_bytes:,} bytes ({format_bytes(available_bytes)}) are available; {breakdown}"
        )


def _invalid(component: str, name: str, rule: str, value: object) -> InvalidKVSpec:
    return InvalidKVSpec(f"{component} {name} must be {rule}, got {value!r}")


def check_int(component: str, name: str, value: object, *, minimum: int) -> None:
    # bool is an int in Python; a True layer count is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        rule = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise _invalid(component, name, rule, value)


def _check_bool(component: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _invalid(component, name, "a bool", value)


def check_nonempty_name(component: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise _invalid(component, "name", "a non-empty string", value)


def check_fraction(value: object) -> float:
    """vllm-omni's rule for `gpu_memory_fraction` (`compute_num_blocks`): in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value <= 1.0:
        raise _invalid("KV plan", "gpu_memory_fraction", "in (0, 1]", value)
    return float(value)


def dtype_bytes(dtype: object) -> int:
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise _invalid("KV plan", "dtype", f"one of {sorted(DTYPE_BYTES)}", dtype)
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class KVBranch:
    """A logical KV branch (e.g. one CFG side) and its worker-local slot: `ARDiffusionKVBranchSpec`."""

    name: str
    local_index: int

    def __post_init__(self) -> None:
        check_nonempty_name("KV branch", self.name)
        check_int("KV branch", "local_index", self.local_index, minimum=0)


@dataclass(frozen=True)
class CrossAttentionCache:
    """Fixed-length cross-attention K/V per layer and branch: `ARDiffusionCrossAttentionKVSpec`.

    `num_kv_heads=None` means the self-attention head count, as in vllm-omni.
    """

    name: str
    num_tokens: int
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        check_nonempty_name("cross-attention cache", self.name)
        check_int("cross-attention cache", "num_tokens", self.num_tokens, minimum=1)
        if self.num_kv_heads is not None:
            check_int("cross-attention cache", "num_kv_heads", self.num_kv_heads, minimum=1)


@dataclass(frozen=True)
class KVCacheSpec:
    """A pipeline's KV geometry and session policy: the fields and defaults of `ARDiffusionKVCacheSpec`."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens_per_frame: int
    frames_per_block: int
    window_frames: int
    kv_branches: tuple[KVBranch, ...]
    session_capacity: int
    sink_frames: int = 0
    reset_at_boundary: bool = False
    cross_attention: tuple[CrossAttentionCache, ...] = ()
    max_model_len: int = 1 << 20
    max_scratch_tokens_per_branch: int = 0
    model_owned_state_bytes_per_session: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "num_kv_heads",
            "head_size",
            "tokens_per_frame",
            "frames_per_block",
            "window_frames",
            "session_capacity",
            "max_model_len",
        ):
            check_int("KV spec", name, getattr(self, name), minimum=1)
        for name in ("sink_frames", "max_scratch_tokens_per_branch", "model_owned_state_bytes_per_session"):
            check_int("KV spec", name, getattr(self, name), minimum=0)
        _check_bool("KV spec", "reset_at_boundary", self.reset_at_boundary)
        branches = self.kv_branches
        if (
            not isinstance(branches, tuple)
            or not branches
            or not all(isinstance(b, KVBranch) for b in branches)
        ):
            raise _invalid("KV spec", "kv_branches", "a non-empty tuple of KVBranch", branches)
        names = [branch.name for branch in branches]
        if len(names) != len(set(names)):
            raise _invalid("KV spec", "kv_branches names", "unique", names)
        indices = {branch.local_index for branch in branches}
        if indices != set(range(max(indices) + 1)):
            raise _invalid("KV spec", "kv_branches local_index values", "contiguous from 0", sorted(indices))
        caches = self.cross_attention
        if not isinstance(caches, tuple) or not all(isinstance(c, CrossAttentionCache) for c in caches):
            raise _invalid("KV spec", "cross_attention", "a tuple of CrossAttentionCache", caches)
        cache_names = [cache.name for cache in caches]
        if len(cache_names) != len(set(cache_names)):
            raise _invalid("KV spec", "cross_attention names", "unique", cache_names)

    @property
    def num_local_kv_branches(self) -> int:
        """Bl: storage slots on this worker (branches on different CFG ranks may share one)."""
        return max(branch.local_index for branch in self.kv_branches) + 1

    @classmethod
    def from_vllm_omni(cls, spec: object) -> KVCacheSpec:
        """Copy a vllm-omni `ARDiffusionKVCacheSpec`, read by attribute so vllm-omni is not imported here."""
        values = {name: getattr(spec, name) for name in cls.__dataclass_fields__}
        values["kv_branches"] = tuple(KVBranch(b.name, b.local_index) for b in values["kv_branches"])
        values["cross_attention"] = tuple(
            CrossAttentionCache(c.name, c.num_tokens, c.num_kv_heads) for c in values["cross_attention"]
        )
        return cls(**values)


@dataclass(frozen=True)
class KVKnobs:
    """What a deployment sets besides the spec: `ar_diffusion_kv_config` overrides and two env variables.

    The memory fraction is not a knob here: every planning call takes it explicitly.
    """

    # window_chunks / sink_chunks. The runner merges with `or`, so 0 never overrides; None: the pipeline's.
    window_frames: int | None = None
    sink_frames: int | None = None
    # OR'd with the spec's; it changes eviction, not the budget.
    reset_at_boundary: bool = False
    # Budgeted only when the contiguous-gather path (the env switch below) consumes it.
    reuse_history_staging: bool = False
    contiguous_kv_gather: bool = False  # VLLM_OMNI_AR_DIFFUSION_KV_GATHER == "1"
    scratch_blocks_per_branch: int | None = None  # AR_DIFFUSION_KV_SCRATCH_BLOCKS_PER_BRANCH, None when unset

    def __post_init__(self) -> None:
        for name in ("window_frames", "sink_frames"):
            if getattr(self, name) is not None:
                check_int("KV knobs", name, getattr(self, name), minimum=1)
        for name in ("reset_at_boundary", "reuse_history_staging", "contiguous_kv_gather"):
            _check_bool("KV knobs", name, getattr(self, name))
        if self.scratch_blocks_per_branch is not None:
            check_int("KV knobs", "scratch_blocks_per_branch", self.scratch_blocks_per_branch, minimum=0)

    @classmethod
    def from_deployment(cls, kv_config: Mapping[str, object], environ: Mapping[str, str]) -> KVKnobs:
        """The knobs of a worker from its `ar_diffusion_kv_config` mapping and its environment (passed in).

        `gpu_memory_fraction` stays with the caller; unknown keys are rejected as `ARDiffusionKVConfig(**raw)`
        would reject them.
        """
        unknown = sorted(set(kv_config) - KV_CONFIG_KEYS)
        if unknown:
            raise _invalid(
                "KV knobs", "ar_diffusion_kv_config keys", f"among {sorted(KV_CONFIG_KEYS)}", unknown
            )
        scratch = environ.get(SCRATCH_BLOCKS_ENV)
        try:
            scratch_blocks = int(scratch) if scratch is not None else None
        except ValueError:
            raise _invalid("KV knobs", SCRATCH_BLOCKS_ENV, "an integer", scratch) from None
        return cls(
            # The runner's `cfg.window_chunks or spec.window_frames`: 0 means "the pipeline's".
            window_frames=kv_config.get("window_chunks") or None,  # type: ignore[arg-type]
            sink_frames=kv_config.get("sink_chunks") or None,  # type: ignore[arg-type]
            reset_at_boundary=bool(kv_config.get("reset_at_boundary", False)),
            reuse_history_staging=bool(kv_config.get("reuse_history_staging", False)),
            contiguous_kv_gather=environ.get(KV_GATHER_ENV, "0") == "1",
            scratch_blocks_per_branch=scratch_blocks,
        )


@dataclass(frozen=True)
class KVFootprint:
    """The budget terms that do not depend on free memory: R(c) = fixed_bytes + c * bytes_per_session."""

    spec: KVCacheSpec
    dtype: str
    window_frames: int
    sink_frames: int
    reset_at_boundary: bool
    page_bytes: int
    scratch_blocks_per_branch: int
    scratch_blocks: int
    history_staging_tokens: int
    history_staging_bytes: int
    cross_attention_bytes_per_session: int

    @property
    def scratch_bytes(self) -> int:
        return self.scratch_blocks * self.page_bytes

    @property
    def model_owned_bytes_per_session(self) -> int:
        return self.spec.model_owned_state_bytes_per_session

    @property
    def pages_per_session(self) -> int:
        """Resident pages of one session: sink + window frames in every local branch slot."""
        return self.spec.num_local_kv_branches * (self.sink_frames + self.window_frames)

    @property
    def in_flight_pages(self) -> int:
        """Pages of the block in flight, counted once per pod: one sequence runs at a time."""
        return self.spec.num_local_kv_branches * self.spec.frames_per_block

    @property
    def bytes_per_session(self) -> int:
        return (
            self.pages_per_session * self.page_bytes
            + self.cross_attention_bytes_per_session
            + self.model_owned_bytes_per_session
        )

    @property
    def fixed_bytes(self) -> int:
        """R(0): scratch, history staging, the in-flight block and the two extra managed blocks."""
        return self.scratch_bytes + self.history_staging_bytes + (self.in_flight_pages + 2) * self.page_bytes

    def managed_blocks_for(self, sessions: int) -> int:
        """M(c): the blocks the manager needs for `sessions` resident sessions."""
        return sessions * self.pages_per_session + self.in_flight_pages + 2

    def required_bytes(self, sessions: int) -> int:
        """R(c): the budget `sessions` resident sessions need."""
        return self.fixed_bytes + sessions * self.bytes_per_session

    def breakdown(self) -> str:
        """R(1) term by term, for error messages."""
        return (
            f"R(1) = scratch {self.scratch_bytes:,} + history staging {self.history_staging_bytes:,} "
            f"+ cross-attention {self.cross_attention_bytes_per_session:,} "
            f"+ model-owned {self.model_owned_bytes_per_session:,} "
            f"+ {self.managed_blocks_for(1)} managed pages x {self.page_bytes:,} bytes"
        )


def build_footprint(spec: KVCacheSpec, *, dtype: str, knobs: KVKnobs = KVKnobs()) -> KVFootprint:
    """The budget terms of `spec` served in `dtype`, with the `knobs` merged as the runner merges them."""
    b = dtype_bytes(dtype)
    window = knobs.window_frames or spec.window_frames
    sink = knobs.sink_frames or spec.sink_frames
    tokens = spec.tokens_per_frame
    # vLLM's AttentionSpec.page_size_bytes (K and V of one T-token block) times the layers sharing the table.
    page_bytes = 2 * tokens * spec.num_kv_heads * spec.head_size * b * spec.num_layers
    # One block per current frame plus pages for action/state tokens; the env override can only raise it.
    minimum_scratch = spec.frames_per_block + math.ceil(spec.max_scratch_tokens_per_branch / tokens)
    scratch_per_branch = max(minimum_scratch, knobs.scratch_blocks_per_branch or 0)
    staging_tokens = (
        (window + sink + 1) * tokens if knobs.reuse_history_staging and knobs.contiguous_kv_gather else 0
    )
    cross_bytes = sum(
        2
        * len(spec.kv_branches)
        * cache.num_tokens
        * (cache.num_kv_heads or spec.num_kv_heads)
        * spec.head_size
        for cache in spec.cross_attention
    )
    return KVFootprint(
        spec=spec,
        dtype=dtype,
        window_frames=window,
        sink_frames=sink,
        reset_at_boundary=knobs.reset_at_boundary or spec.reset_at_boundary,
        page_bytes=page_bytes,
        scratch_blocks_per_branch=scratch_per_branch,
        scratch_blocks=spec.num_local_kv_branches * scratch_per_branch,
        history_staging_tokens=staging_tokens,
        history_staging_bytes=2 * spec.num_layers * staging_tokens * spec.num_kv_heads * spec.head_size * b,
        cross_attention_bytes_per_session=cross_bytes * b * spec.num_layers,
    )


class BindingLimit(StrEnum):
    """What stops a pod from holding one more session."""

    KV_BUDGET = "kv_budget"
    PIPELINE_SESSION_CAPACITY = "pipeline_session_capacity"
    POOL_SESSION_CAPACITY = "pool_session_capacity"


@dataclass(frozen=True)
class CapacityPlan:
    """The KV pool `ARDiffusionKVCache` builds for one footprint and amount of free memory."""

    footprint: KVFootprint
    available_bytes: int
    gpu_memory_fraction: float
    configured_budget_bytes: int  # int(A*f)
    budget_bytes: int  # raised to R(1) when one session fits A but not A*f
    capacity: int
    managed_blocks: int

    @property
    def requested_capacity(self) -> int:
        return self.footprint.spec.session_capacity

    @property
    def binding_limit(self) -> BindingLimit:
        if self.capacity == self.requested_capacity:
            return BindingLimit.PIPELINE_SESSION_CAPACITY
        return BindingLimit.KV_BUDGET

    @property
    def page_bytes(self) -> int:
        return self.footprint.page_bytes

    @property
    def scratch_blocks(self) -> int:
        return self.footprint.scratch_blocks

    @property
    def total_blocks(self) -> int:
        """Pages allocated eagerly at load: managed + scratch."""
        return self.managed_blocks + self.footprint.scratch_blocks

    @property
    def cross_attention_reserved_bytes(self) -> int:
        return self.capacity * self.footprint.cross_attention_bytes_per_session

    @property
    def model_owned_reserved_bytes(self) -> int:
        return self.capacity * self.footprint.model_owned_bytes_per_session

    @property
    def budget_raised(self) -> bool:
        return self.budget_bytes > self.configured_budget_bytes

    def explain(self) -> list[str]:
        """The budget step by step, in words and numbers."""
        fp, spec = self.footprint, self.footprint.spec
        size = format_bytes
        branches = ", ".join(f"{branch.name}/{branch.local_index}" for branch in spec.kv_branches)
        caches = ", ".join(
            f"{cache.name} {cache.num_tokens} tokens x {cache.num_kv_heads or spec.num_kv_heads} heads"
            for cache in spec.cross_attention
        )
        lines = [
            f"geometry: {spec.num_layers} layers x {spec.num_kv_heads} KV heads x head {spec.head_size}, "
            f"{spec.tokens_per_frame} tokens per frame, {fp.dtype} ({DTYPE_BYTES[fp.dtype]} B per element)",
            f"page (K and V of one frame, all layers): {fp.page_bytes:,} B ({size(fp.page_bytes)})",
            f"window: sink {fp.sink_frames} + recent {fp.window_frames} frames, "
            f"{spec.frames_per_block} frames per block"
            + (", reset after the sink at chunk boundaries" if fp.reset_at_boundary else ""),
            f"branches: {branches} in {spec.num_local_kv_branches} local slot(s): {fp.pages_per_session} "
            f"pages per session ({size(fp.pages_per_session * fp.page_bytes)}), "
            f"{fp.in_flight_pages} in flight per pod",
            f"scratch: {fp.scratch_blocks_per_branch} pages per slot, {fp.scratch_blocks} in all "
            f"({size(fp.scratch_bytes)})",
            f"cross-attention per session: {caches or 'none'}"
            + (
                f" x {len(spec.kv_branches)} branch(es) = {size(fp.cross_attention_bytes_per_session)}"
                if caches
                else ""
            ),
            f"model-owned state per session: {size(fp.model_owned_bytes_per_session)}",
            f"history staging: {fp.history_staging_tokens} tokens ({size(fp.history_staging_bytes)})"
            if fp.history_staging_bytes
            else "history staging: none",
            f"one session needs R(1) = {fp.required_bytes(1):,} B ({size(fp.required_bytes(1))}), "
            f"each further one {size(fp.bytes_per_session)}",
            f"free memory A = {size(self.available_bytes)}; int(A x {self.gpu_memory_fraction:g}) = "
            f"{size(self.configured_budget_bytes)}"
            + (", raised to R(1) for one session" if self.budget_raised else ""),
        ]
        if self.binding_limit is BindingLimit.PIPELINE_SESSION_CAPACITY:
            lines.append(
                f"capacity: {self.capacity}, the pipeline's session_capacity (R({self.capacity}) = "
                f"{size(fp.required_bytes(self.capacity))} within the budget {size(self.budget_bytes)})"
            )
        else:
            lines.append(
                f"capacity: {self.capacity} of {self.requested_capacity} requested, limited by the KV budget "
                f"(R({self.capacity + 1}) = {size(fp.required_bytes(self.capacity + 1))} "
                f"> {size(self.budget_bytes)})"
            )
        lines += [
            f"pool: {self.managed_blocks} managed blocks (M({self.capacity}) = "
            f"{fp.managed_blocks_for(self.capacity)} needed) + {fp.scratch_blocks} scratch "
            f"= {self.total_blocks} pages allocated at load ({size(self.total_blocks * fp.page_bytes)})",
            f"reserved, allocated per session: cross-attention {size(self.cross_attention_reserved_bytes)}, "
            f"model-owned {size(self.model_owned_reserved_bytes)}",
            f"left for activations: {size(self.available_bytes - self.budget_bytes)}",
        ]
        return lines


def plan_from_footprint(
    footprint: KVFootprint, *, available_bytes: int, gpu_memory_fraction: float, context: str = ""
) -> CapacityPlan:
    """Solve the budget; raises `KVDoesNotFit` (prefixed by `context`) when one session needs more than
    `available_bytes`."""
    check_int("KV plan", "available_bytes", available_bytes, minimum=0)
    fraction = check_fraction(gpu_memory_fraction)
    one_session = footprint.required_bytes(1)
    if one_session > available_bytes:
        raise KVDoesNotFit(
            required_bytes=one_session,
            available_bytes=available_bytes,
            breakdown=footprint.breakdown(),
            context=context,
        )
    configured = int(available_bytes * fraction)
    budget = max(configured, one_session)
    # R(c) is affine in c, so the runner's downward search from session_capacity has a closed form.
    capacity = min(
        footprint.spec.session_capacity, (budget - footprint.fixed_bytes) // footprint.bytes_per_session
    )
    per_session_reserved = (
        footprint.cross_attention_bytes_per_session + footprint.model_owned_bytes_per_session
    )
    self_attention_budget = (
        budget - footprint.scratch_bytes - footprint.history_staging_bytes - capacity * per_session_reserved
    )
    return CapacityPlan(
        footprint=footprint,
        available_bytes=available_bytes,
        gpu_memory_fraction=fraction,
        configured_budget_bytes=configured,
        budget_bytes=budget,
        capacity=capacity,
        managed_blocks=self_attention_budget // footprint.page_bytes,
    )


def plan_capacity(
    spec: KVCacheSpec,
    *,
    dtype: str,
    available_bytes: int,
    gpu_memory_fraction: float,
    knobs: KVKnobs = KVKnobs(),
) -> CapacityPlan:
    """The pool `ARDiffusionKVCache` builds for `spec` with `available_bytes` free after the model loads."""
    footprint = build_footprint(spec, dtype=dtype, knobs=knobs)
    return plan_from_footprint(
        footprint, available_bytes=available_bytes, gpu_memory_fraction=gpu_memory_fraction
    )
