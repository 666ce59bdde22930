"""Model families: what differs between the pipelines the worker serves, one module per family.

The worker serves any pipeline with vllm-omni's AR-diffusion capability (`SupportsARDiffusionPipeline`);
the runner, the paged KV, admission, order, idempotence, auth and placement are the same for all of them
(`WorkerService`). A family module says what differs: the tick body and how it is validated, how the answer
is encoded, the pipeline's own per-session state in an export (`SessionState`), the checkpoint layout and its
tiny config. `ModelFamily` is that seam; each family module satisfies it (`family_for` checks, a test too).
A third family is one more module here, one line in `_families` and its pipelines in
`ardiff.model_families` (the pipeline -> family map the operator reads without torch).

The seam runs one way. Once the pipeline is loaded, the runtime binds its family to it (`ModelFamily.bind`)
and gets a `FamilyRunner`: how a tick becomes the runner's request (the pipeline's own pre-process) and what
a chunk gives back (frames, actions), from the pipeline and the `TickGeometry` alone. The runtime calls it;
it never calls back into the runtime. `ardiff.worker.runtime.run_tick` is where a forward and its decode meet.

Family modules are light: the HTTP layer imports them (for the tick body) before any torch import; whatever
needs torch or vllm-omni is imported inside the function that needs it (LingBot's session state is its own
heavy module, `lingbot_state`). Only the session adapter touches the runner's private state; a family's
runner reads its own pipeline's members (decoders, private keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

    from ardiff.worker.conditioning import Conditioning
    from ardiff.worker.runtime import ChunkOutput, PreparedTick
    from ardiff.worker.session_book import CachedChunk
    from ardiff.worker.session_export import TensorPart
    from ardiff.worker.settings import WorkerSettings


@dataclass(frozen=True)
class TickGeometry:
    """One tick on the loaded pipeline: its frames' size, and the frames one AR block asks of the model (pixel
    frames through the causal VAE's time factor, and latent frames)."""

    height: int
    width: int
    frames_per_tick: int
    latent_frames_per_tick: int

    def __post_init__(self) -> None:
        for field, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"tick geometry {field} must be a positive int, got {value!r}")

    @property
    def frame_size(self) -> tuple[int, int]:
        return self.height, self.width


class FamilyRunner(Protocol):
    """A family bound to one loaded pipeline (`ModelFamily.bind`): it owns a tick's preparation and its
    chunk's decoding. It holds no session state of its own and never calls the runtime that holds it."""

    @property
    def geometry(self) -> TickGeometry: ...

    def prepare(self, tick: Any, conditioning: Conditioning) -> PreparedTick:
        """The engine request of a tick, through the pipeline's own pre-process; `InvalidTick` names the
        field. May run on any thread, concurrently with a forward: it must not touch session state."""
        ...

    def decode(self, prepared: PreparedTick, output: Any, forward_s: float) -> ChunkOutput:
        """The chunk of the runner's `output` for `prepared` (its forward took `forward_s`); on the forward
        thread, right after that forward (the session's streaming decoder holds its state)."""
        ...


@runtime_checkable
class SessionState(Protocol):
    """The pipeline's own per-session state in a session export (contracts §9): the export state's sections
    beside the runner's KV (`kv_branches`, `cross_attention`, the adapter's), and their tensors."""

    def serves(self, pipeline: Any) -> bool:
        """Whether this is the pipeline whose session state it knows (else its sessions do not export)."""

    def holds(self, pipeline: Any, session_id: str) -> bool: ...

    def capture(self, pipeline: Any, session_id: str, parts: list[TensorPart]) -> dict[str, Any]:
        """An idle session's sections (JSON); their tensors appended to `parts`. Read-only."""

    def tensor_names(self, state: dict[str, Any]) -> set[str]:
        """The tensor names the export's sections may carry (shapes not checked)."""

    def restore(
        self, pipeline: Any, session_id: str, state: dict[str, Any], tensors: dict[str, torch.Tensor]
    ) -> None: ...


@runtime_checkable
class ModelFamily(Protocol):
    """What one model family module provides (module-level names; checked once by `family_for`)."""

    name: str  # "lingbot", "dreamzero": the session's and the pool's `family`
    pipelines: tuple[str, ...]  # vllm-omni pipeline class names of this family
    embedded_model: str  # the name of its tiny model (`ARDIFF_MODEL`)
    tick_body: type[BaseModel]  # the HTTP tick's body
    max_body_bytes: int  # the largest tick body the worker reads
    default_dtype: str | None  # None: bfloat16 on an accelerator, float32 on CPU
    # The pipeline's modules that run in float32 on CPU whatever the dtype (worker/cpu_platform.py).
    cpu_float32_modules: tuple[str, ...]
    frame_size: tuple[int, int] | None  # the frames' (height, width); None: the pipeline's configured size

    def checkpoint_ok(self, model_dir: Path) -> bool: ...

    def ensure_tiny_model(self, cache_dir: str | Path, *, seed: int = 0) -> Path: ...

    def write_tiny_model(self, directory: str | Path, *, seed: int = 0) -> Path: ...

    def od_config_extras(self, settings: WorkerSettings, model_dir: Path) -> dict[str, Any]: ...

    def loading(self, model_dir: Path) -> AbstractContextManager[None]: ...

    def check_pipeline(self, pipeline: Any) -> None:
        """`TypeError` unless the loaded pipeline has what this family's ticks use."""

    def session_state(self) -> SessionState | None:
        """The pipeline's session state in an export (imported when asked); None: its sessions do not export
        (they keep reset-on-evict)."""

    def parse_tick(self, session_id: str, body: Mapping[str, Any] | BaseModel) -> Any:
        """The tick's cheap checks (a 400 names the field); run on the event loop, before the order checks.
        `body`: its `tick_body` as validated (read as it is), or a mapping; parsed once either way."""

    def decode_tick(self, tick: Any) -> Any:
        """What is dear to read (pictures): run in the worker's decode pool once the tick passed its order
        checks; a 400 names the field."""

    def bind(self, pipeline: Any, od_config: Any, geometry: TickGeometry) -> FamilyRunner:
        """This family's ticks on the loaded `pipeline` (built from `od_config`), once per runtime."""

    def choose_media_type(self, accept: str | None) -> str: ...

    def encode(self, chunk: CachedChunk, media_type: str) -> tuple[bytes, dict[str, str]]: ...


def _families() -> dict[str, ModelFamily]:
    from ardiff.worker.families import dreamzero, lingbot

    return {module.name: cast(ModelFamily, module) for module in (lingbot, dreamzero)}


def family_names() -> tuple[str, ...]:
    return tuple(_families())


def family_named(name: str) -> ModelFamily:
    families = _families()
    if name not in families:
        raise ValueError(f"model family must be one of {sorted(families)}, got {name!r}")
    return families[name]


def family_for(pipeline: str) -> ModelFamily:
    """The family module serving the pipeline class `pipeline`; ValueError names the known ones."""
    for module in _families().values():
        if pipeline in module.pipelines:
            missing = [name for name in ModelFamily.__annotations__ if not hasattr(module, name)]
            missing += [
                name
                for name, value in vars(ModelFamily).items()
                if isinstance(value, Callable) and not name.startswith("_") and not hasattr(module, name)
            ]
            if missing:
                raise TypeError(f"model family {module.name} lacks {sorted(missing)}")
            return module
    known = sorted(p for module in _families().values() for p in module.pipelines)
    raise ValueError(f"worker pipeline must be one of {known} (a model family serves it), got {pipeline!r}")
