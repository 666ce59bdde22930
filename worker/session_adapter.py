"""The session adapter: the one module that touches the runner's per-session state.

vllm-omni's `ARDiffusionModelRunner` owns each session's paged KV (created lazily at its first tick,
released on reset, close, failed forward or silent LRU eviction); the pipeline owns the rest (LingBot-World:
chunk counter, RNG state, camera tail, encoder cache, the per-session streaming VAE decoder). Everything the
worker needs (run a tick, decode its frames, reset, close, list residents, count free KV blocks) goes through
`ARDiffusionSessionAdapter`, so suspend/resume/migrate (DESIGN §10) has one place to export and import from.
What differs per model family is the family module's (`ardiff.worker.families`, the `ModelFamily` seam): the
adapter binds the family to the loaded pipeline once (`ticks`, its `FamilyRunner`: the request a tick
becomes, what a chunk gives back) and never calls the family on a tick; `ardiff.worker.runtime.run_tick`
runs this adapter's `forward` and then the runner's `decode`. The pipeline's own session state in an export
is the family's too (`SessionState`: `families/lingbot_state.py`, `families/dreamzero_state.py`).

It implements `ardiff.worker.runtime.SessionRuntime`. Private vllm-omni members used here, on purpose (the
runner has no public view of its sessions): `runner._sessions` (the residents, their KV branches); for
export and import (docs/contracts.md §9) also `runner._get_or_create_session`, `runner._release_session`,
the KV state's `_closed`, `_paged_pending` (its contexts' `commit_current` and `_committed`) and
`_committed`, the adapters' `_prefill` and the pipeline's `_ar_diffusion_kv_state`. The capacity and the KV
geometry are the KV cache's public members. Export reads one idle session (between ticks) part by
part; import installs the KV straight into the pool as each part arrives and the rest once the checksum held.
What a session is made of and why each piece is needed: `shared/reference/session-migration/README.md`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import vllm_omni
from vllm_omni.diffusion.data import OmniDiffusionConfig
from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker

from ardiff.worker import block_share
from ardiff.worker.errors import (
    ExportCorrupt,
    ExportDuplicateSession,
    ExportNoCapacity,
    ExportNotIdle,
    ExportUnsupported,
    SessionExportError,
)
from ardiff.worker.families import FamilyRunner, ModelFamily, SessionState, TickGeometry, family_for
from ardiff.worker.runtime import Forwarded, KVBlocks, PreparedTick
from ardiff.worker.session_book import SessionBook
from ardiff.worker.session_export import (
    ExportReader,
    Readable,
    TensorCheck,
    TensorPart,
    Writable,
    check_book_tensor,
    check_identity,
    refuse_tensor,
    write_export,
)
from ardiff.worker.session_tensors import DTYPE_CODES, part, staged, tensor

log = logging.getLogger(__name__)


def model_fingerprint(root: Path) -> str:
    """SHA-256 over every file of a model directory: relative path, size and content (read in 8 MiB parts)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        content = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(8 << 20):
                content.update(block)
        digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
        digest.update(content.digest())
    return digest.hexdigest()


def _uncommitted(context: Any) -> bool:
    """Whether a branch's pending paged context holds a chunk not yet committed (a tick in flight). A
    context that never commits (DreamZero's denoising steps write scratch blocks only) stays pending after
    the tick."""
    return context is not None and context.commit_current and not context._committed


class ARDiffusionSessionAdapter:
    def __init__(
        self, worker: DiffusionWorker, od_config: OmniDiffusionConfig, family: ModelFamily | None = None
    ) -> None:
        runner = worker.model_runner
        pipeline = runner.pipeline if runner is not None else None
        kv = getattr(runner, "kv_cache", None)
        if kv is None:
            raise TypeError("the worker's runner is not an ARDiffusionModelRunner with a KV cache")
        self._family = family or family_for(type(pipeline).__name__)
        self._family.check_pipeline(pipeline)
        self._state = self._family.session_state()
        self._worker = worker
        self._od_config = od_config
        self._runner = runner
        self._pipeline = pipeline
        model_config = od_config.model_config
        height, width = self._family.frame_size or (
            int(model_config["ar_diffusion_height"]),
            int(model_config["ar_diffusion_width"]),
        )
        # One request is one AR block: `frames_per_block` latent frames through the causal VAE's time factor.
        temporal = int(getattr(pipeline, "vae_scale_factor_temporal", 4))
        geometry = TickGeometry(
            height=height,
            width=width,
            frames_per_tick=(kv.frames_per_block - 1) * temporal + 1,
            latent_frames_per_tick=kv.frames_per_block,
        )
        self._ticks = self._family.bind(pipeline, od_config, geometry)
        self._resident: tuple[str, ...] = ()
        log.info(
            "session adapter: %s (%s) capacity=%d kv_blocks=%d frames_per_tick=%d at %dx%d",
            type(pipeline).__name__,
            self._family.name,
            self.capacity,
            self.kv_blocks().total,
            geometry.frames_per_tick,
            height,
            width,
        )

    # ---------------------------------------------------------------- SessionRuntime

    @property
    def capacity(self) -> int:
        return int(self._runner.kv_cache.session_capacity)

    @property
    def frame_size(self) -> tuple[int, int]:
        return self._ticks.geometry.frame_size

    @property
    def ticks(self) -> FamilyRunner:
        return self._ticks

    def forward(self, prepared: PreparedTick, *, inject_fault: bool = False) -> Forwarded:
        started = time.perf_counter()
        try:
            with self._failing_pipeline() if inject_fault else contextlib.nullcontext():
                output = self._worker.execute_model(prepared.request, self._od_config)
        finally:
            self._refresh()  # the runner may have created, evicted or released a session
        if getattr(output, "error", None):
            raise RuntimeError(f"the runner reported: {output.error}")
        return Forwarded(output, time.perf_counter() - started)

    def branch_blocks(self, session_id: str) -> dict[str, int]:
        """KV blocks each branch of a resident session holds now (empty when it is not resident)."""
        session = self._runner._sessions.get(session_id)
        if session is None:
            return {}
        kv = self._runner.kv_cache
        return {
            name: sum(1 for block in kv.block_table(adapter) if block != kv.null_block_id)
            for name, adapter in session.adapters.items()
        }

    def reset(self, session_id: str) -> None:
        self._runner.reset_session(session_id)
        self._refresh()

    def close(self, session_id: str) -> None:
        self._runner.close_session(session_id)
        self._refresh()

    def resident_sessions(self) -> tuple[str, ...]:
        return self._resident

    def kv_blocks(self) -> KVBlocks:
        cache = self._runner.kv_cache
        # Block 0 is vLLM's null block; the rest of the pool is what sessions draw from.
        return KVBlocks(
            free=cache.manager.block_pool.get_num_free_blocks(),
            total=cache.num_blocks - 1,
            shared=block_share.shared_blocks(cache),
        )

    def shutdown(self) -> None:
        self._worker.shutdown()

    # ---------------------------------------------------------------- export / import (contracts §9)

    def export_session(self, session_id: str, out: Writable, *, book: SessionBook) -> int:
        state, parts = self._capture(session_id)
        return write_export(
            out, session_id=session_id, identity=self.identity, book=book, state=state, tensors=parts
        )

    def import_session(
        self, source: Readable, *, as_session: str | None = None, share_with: str | None = None
    ) -> SessionBook:
        exporter = self._exporter
        reader = ExportReader(source)
        check_identity(reader.identity, self.identity)
        session_id, state = as_session or reader.session_id, reader.state
        if session_id in self._runner._sessions or exporter.holds(self._pipeline, session_id):
            raise ExportDuplicateSession(f"session {session_id!r} is already resident on this worker")
        if len(self._runner._sessions) >= self.capacity:
            # The runner would silently evict its least recently used session to make room.
            raise ExportNoCapacity(f"this worker holds {self.capacity} sessions, its capacity")
        check = self._tensor_check(state)
        shared = self._shareable(share_with, state)
        needed = sum(int(b["num_blocks"]) for n, b in state["kv_branches"].items() if n not in shared)
        free = self.kv_blocks().free
        if needed > free:
            raise ExportNoCapacity(f"the session needs {needed} KV blocks, this worker has {free} free")
        try:
            book = self._install(reader, check, session_id, shared)
        except BaseException as exc:
            self._runner._release_session(
                session_id, reset_model=False, reason="import_failed", suppress_errors=True
            )
            self._refresh()
            if isinstance(exc, SessionExportError) or not isinstance(exc, Exception):
                raise
            raise ExportCorrupt(f"session {session_id!r} could not be installed: {exc}") from exc
        self._refresh()
        return book if as_session is None else book.forked(as_session)

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """What an importing worker must match (docs/contracts.md §9); the weights are hashed once."""
        kv, (height, width) = self._runner.kv_cache, self.frame_size
        model_dir = Path(self._od_config.model)
        return {
            "runtime": "vllm-omni",
            "versions": {"vllm_omni": vllm_omni.__version__},
            "model": model_dir.name,
            "pipeline": type(self._pipeline).__name__,
            "height": height,
            "width": width,
            "dtype": str(kv.dtype).removeprefix("torch."),
            "weights_sha256": model_fingerprint(model_dir),
            "geometry": {
                "num_layers": int(kv.num_layers),
                "num_kv_heads": int(kv.num_kv_heads),
                "head_size": int(kv.head_size),
                "tokens_per_frame": int(kv.block_size),  # the runner's pages are one frame's tokens
                "frames_per_block": int(kv.frames_per_block),
                "block_size": int(kv.block_size),
                "sink_chunks": int(kv.spec.sink_chunks),
                "window_chunks": int(kv.spec.window_chunks),
                "reset_at_boundary": bool(kv.spec.reset_at_boundary),
                "kv_branches": [[b.name, int(b.local_index)] for b in kv.kv_branches],
                "cross_attention": {
                    name: [int(length), int(kv.cross_attention_kv_heads[name])]
                    for name, length in kv.cross_attention_lengths.items()
                },
            },
        }

    # ---------------------------------------------------------------- helpers

    @property
    def family(self) -> ModelFamily:
        return self._family

    @property
    def pipeline(self) -> Any:
        """The loaded pipeline (tests read its members)."""
        return self._pipeline

    @property
    def supports_export(self) -> bool:
        return self._state is not None and self._state.serves(self._pipeline)

    @property
    def _exporter(self) -> SessionState:
        """The family's session state of this pipeline; `ExportUnsupported` when it has none."""
        if self._state is None or not self._state.serves(self._pipeline):
            raise ExportUnsupported(
                f"{type(self._pipeline).__name__} sessions cannot be exported (no model family knows its "
                "session state): they keep reset-on-evict"
            )
        return self._state

    def _capture(self, session_id: str) -> tuple[dict[str, Any], list[TensorPart]]:
        """One idle session's bookkeeping (JSON) and its tensors (read when written). Read-only."""
        runner, kv, pipe, exporter = self._runner, self._runner.kv_cache, self._pipeline, self._exporter
        session = runner._sessions.get(session_id)
        if session is None or session._closed:
            raise ExportNotIdle(f"session {session_id!r} is not resident on this worker")
        if pipe._ar_diffusion_kv_state is not None or any(map(_uncommitted, session._paged_pending.values())):
            raise ExportNotIdle(f"session {session_id!r} is inside a tick; export only between ticks")
        parts: list[TensorPart] = []
        branches = {}
        for name, adapter in session.adapters.items():
            table = kv.block_table(adapter)
            # At a tick boundary the table is compacted: no null block, one block per computed frame.
            if kv.null_block_id in table or adapter.num_computed_tokens != len(table) * kv.block_size:
                raise ExportNotIdle(f"session {session_id!r} branch {name} is not at a tick boundary")
            ids = torch.tensor(table, dtype=torch.long, device=kv.device)
            for layer in range(kv.num_layers if table else 0):
                parts.append(part(f"kv/{name}/k/{layer}", kv.key_cache(layer).index_select(0, ids)))
                parts.append(part(f"kv/{name}/v/{layer}", kv.value_cache(layer).index_select(0, ids)))
            branches[name] = {
                "prefill": int(adapter._prefill),
                "completed_chunks": int(adapter.completed_chunks),
                "compacted_tokens": int(adapter.compacted_tokens),
                "num_computed_tokens": int(adapter.num_computed_tokens),
                "num_blocks": len(table),
                "committed_tokens": int(session._committed.get(name, 0)),
            }
        cross = []
        for cache_name in kv.cross_attention_lengths:
            for branch in kv.kv_branches:
                if kv.is_cross_attention_populated(session_id, cache_name, branch.name):
                    cross.append([cache_name, branch.name])
                    for layer in range(kv.num_layers):
                        pair = kv.read_cross_attention_kv(session_id, cache_name, layer, branch.name)
                        parts.append(part(f"cross/{cache_name}/{branch.name}/k/{layer}", pair["k"]))
                        parts.append(part(f"cross/{cache_name}/{branch.name}/v/{layer}", pair["v"]))
        sections = exporter.capture(pipe, session_id, parts)  # after the KV's tensors
        return {"kv_branches": branches, "cross_attention": cross, **sections}, parts

    def _tensor_check(self, state: dict[str, Any]) -> TensorCheck:
        """This runtime's spec of an export's tensors, from its KV geometry and the export's own state
        (checked first: its branches are this runner's, its block counts whole numbers): every KV page tensor
        is `(blocks, *page)` of the pool's dtype, every cross-attention one `(1, length, heads, head_size)`,
        the book's frames this worker's size. The pipeline's and decoder's caches (shapes of the model's
        internals) are only those the state names; the reader holds no more of them than arrives."""
        kv = self._runner.kv_cache
        branches = [branch.name for branch in kv.kv_branches]
        try:
            blocks = {name: int(branch["num_blocks"]) for name, branch in state["kv_branches"].items()}
            named = self._exporter.tensor_names(state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ExportCorrupt(f"session export state lacks its KV branches or caches: {exc}") from None
        if not set(blocks) <= set(branches) or any(n < 0 for n in blocks.values()):
            raise ExportCorrupt(f"session export KV branches {blocks} do not fit this runner's {branches}")
        code, page, layers = DTYPE_CODES[kv.dtype], tuple(kv.key_cache(0).shape[1:]), range(kv.num_layers)
        spec = {
            f"kv/{branch}/{kind}/{layer}": (code, (count, *page))
            for branch, count in blocks.items()
            for kind in ("k", "v")
            for layer in layers
        }
        spec |= {
            f"cross/{cache}/{branch}/{kind}/{layer}": (code, (1, int(length), heads, int(kv.head_size)))
            for cache, length in kv.cross_attention_lengths.items()
            for heads in (int(kv.cross_attention_kv_heads[cache]),)
            for branch in branches
            for kind in ("k", "v")
            for layer in layers
        }

        def check(name: str, dtype: str, shape: tuple[int, ...]) -> None:
            if not check_book_tensor(name, dtype, shape, self.frame_size) and name not in named:
                expected = spec.get(name)
                if expected is None:
                    refuse_tensor(name, dtype, shape, "the tensors of its KV branches, caches and pipeline")
                if (dtype, shape) != expected:
                    refuse_tensor(name, dtype, shape, f"{expected[0]} {list(expected[1])}")

        return check

    def _shareable(self, share_with: str | None, state: dict[str, Any]) -> dict[str, Any]:
        """The KV branches of the export `state` whose blocks the resident idle session `share_with` holds
        as they are in the export, by name: its adapters (worker/block_share.py)."""
        parent = self._runner._sessions.get(share_with) if share_with else None
        if parent is None or parent._closed:
            return {}
        kv = self._runner.kv_cache
        return {
            name: parent.adapters[name]
            for name, branch in state["kv_branches"].items()
            if name in parent.adapters
            and not _uncommitted(parent._paged_pending.get(name))
            and block_share.branch_matches(kv, parent.adapters[name], branch)
        }

    def _install(
        self, reader: ExportReader, check: TensorCheck, session_id: str, shared: dict[str, Any]
    ) -> SessionBook:
        """Build the session `session_id` from `reader`: its KV blocks allocated first (or, for the
        branches in `shared`, the parent's blocks held too: their pages are read for the checksum only); the
        tensors read (each declared one checked against `check` before anything is read); the KV pages written
        only once every part is in and the checksum held, then the rest. The caller releases it on any
        failure."""
        kv, pipe, state = self._runner.kv_cache, self._pipeline, reader.state
        session = self._runner._get_or_create_session(session_id)
        block_ids = {}
        for name, branch in state["kv_branches"].items():
            adapter = session.adapter(name)
            if name in shared:
                block_share.share_blocks(kv, shared[name], adapter)
            elif branch["num_blocks"]:
                kv.allocate_token_slots(adapter, branch["num_blocks"] * kv.block_size)  # from position 0
            table = kv.block_table(adapter)
            if len(table) != branch["num_blocks"]:
                raise ExportCorrupt(
                    f"branch {name}: allocated {len(table)} blocks, expected {branch['num_blocks']}"
                )
            block_ids[name] = torch.tensor(table, dtype=torch.long, device=kv.device)
        pages: list[tuple[str, torch.Tensor]] = []  # written once the checksum held: never an altered page
        rest: dict[str, torch.Tensor] = {}
        for read in reader.tensors(check):
            if read.name.startswith("kv/"):
                if read.name.removeprefix("kv/").rsplit("/", 2)[0] not in shared:
                    pages.append((read.name, staged(read)))
            else:
                rest[read.name] = tensor(read)
        for name, page in pages:
            branch, kind, layer = name.removeprefix("kv/").rsplit("/", 2)
            pool = kv.key_cache(int(layer)) if kind == "k" else kv.value_cache(int(layer))
            pool.index_copy_(0, block_ids[branch], page.to(kv.device))
        book = reader.book()
        for name, branch in state["kv_branches"].items():
            adapter = session.adapter(name)
            if adapter._prefill != branch["prefill"]:
                raise ExportCorrupt(
                    f"branch {name}: prefill {branch['prefill']}, this runner has {adapter._prefill}"
                )
            for _ in range(branch["completed_chunks"]):
                adapter.on_chunk_committed()
            adapter.compacted_tokens = branch["compacted_tokens"]
            if adapter.num_computed_tokens != branch["num_computed_tokens"]:
                raise ExportCorrupt(f"branch {name}: position {adapter.num_computed_tokens} after import")
            session._committed[name] = branch["committed_tokens"]
        for cache_name, branch in state["cross_attention"]:
            prefix = f"cross/{cache_name}/{branch}"
            session.populate_cross_attention(
                branch,
                cache_name,
                (
                    (rest[f"{prefix}/k/{layer}"].to(kv.device), rest[f"{prefix}/v/{layer}"].to(kv.device))
                    for layer in range(kv.num_layers)
                ),
            )
        self._exporter.restore(pipe, session_id, state, rest)
        return book

    def _refresh(self) -> None:
        # A snapshot the event loop may read while the forward thread mutates the runner's dict.
        self._resident = tuple(self._runner._sessions)

    @contextlib.contextmanager
    def _failing_pipeline(self) -> Iterator[None]:
        """Test-only (ARDIFF_TEST_FAULTS): the pipeline's forward raises inside the runner's bound session."""

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("injected forward fault (ARDIFF_TEST_FAULTS)")

        self._pipeline.forward = fail
        try:
            yield
        finally:
            del self._pipeline.forward
