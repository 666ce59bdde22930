"""The session adapter: the one module that touches the runner's and the pipeline's per-session state.

vllm-omni's `ARDiffusionModelRunner` owns each session's paged KV (created lazily at its first tick,
released on reset, close, failed forward or silent LRU eviction); LingBot-World's pipeline owns the rest
(chunk counter, RNG state, camera tail, encoder cache, the per-session streaming VAE decoder). Everything
the worker needs from either (run a tick, decode its frames, reset, close, list residents, count free KV
blocks) goes through `ARDiffusionSessionAdapter`, so suspend/resume/migrate (DESIGN §10) has one place to
export and import from. What differs per model family (the request a tick becomes, what a chunk gives back)
is the family module's (`ardiff.worker.families`); it asks this adapter for anything private (LingBot's
camera key and streaming decoder, each branch's blocks).

It implements `ardiff.worker.runtime.SessionRuntime`. Private vllm-omni members used here, on purpose and
nowhere else: `runner._sessions`, `runner._session_capacity`, `runner._ar_diffusion_kv_cache_spec`,
`pipeline._decode_chunk_to_pixels` (the streaming decoder), and LingBot's pre-processed camera key; for export
and import (LingBot-World only, docs/contracts.md §9) also `runner._get_or_create_session`,
`runner._release_session`, the KV state's `_closed`, `_paged_pending` and `_committed`, the adapters'
`_prefill`, the pipeline's `_ar_diffusion_kv_state`, `_ar_sessions` (`_LingBotARSessionState`),
`_streaming_decode_states` and `_streaming_decoder()`. Export reads one idle session (between ticks) part by
part; import installs the KV straight into the pool as each part arrives and the rest once the checksum held.
What a session is made of and why each piece is needed: `shared/reference/session-migration/README.md`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vllm_omni
import vllm_omni.diffusion.models.lingbot_world.pipeline as lingbot_pipeline
from vllm_omni.diffusion.data import OmniDiffusionConfig
from vllm_omni.diffusion.models.lingbot_world.camera import (
    CameraTrajectory,
)
from vllm_omni.diffusion.registry import get_diffusion_pre_process_func
from vllm_omni.diffusion.request import OmniDiffusionRequest
from vllm_omni.diffusion.worker.diffusion_worker import DiffusionWorker

from ardiff.worker.conditioning import Conditioning
from ardiff.worker.errors import (
    ExportCorrupt,
    ExportDuplicateSession,
    ExportNoCapacity,
    ExportNotIdle,
    ExportUnsupported,
    SessionExportError,
)
from ardiff.worker.runtime import ChunkOutput, KVBlocks, PreparedTick
from ardiff.worker.session_book import SessionBook
from ardiff.worker.session_export import (
    BOOK_FRAMES,
    ExportReader,
    Readable,
    ReadTensor,
    TensorCheck,
    TensorPart,
    Writable,
    check_book_frames,
    check_identity,
    refuse_tensor,
    write_export,
)

log = logging.getLogger(__name__)


# safetensors dtype codes of the tensors a session holds.
_DTYPE_CODES = {
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
_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
# The fixed tensors of LingBot's session state (`pipe/<name>`, written by `_capture_pipeline` when present).
_PIPELINE_TENSORS = (
    "generator_state",
    "condition_fixed_point",
    "camera_tail/poses",
    "camera_tail/intrinsics",
)
# LingBot's `_LingBotARSessionState` fields this exporter carries; one it does not know refuses the export.
_PIPELINE_FIELDS = frozenset(
    {
        "next_chunk_index",
        "text_cache_key",
        "text_cache_dirty",
        "generator_state",
        "encoder_cache",
        "pending_encoder_cache",
        "condition_fixed_point",
        "camera_tail",
        "camera_pitch",
    }
)


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


def _host_bytes(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes in host memory: one device-to-host copy (none on CPU when already contiguous)."""
    host = tensor.detach().to("cpu").contiguous()
    return memoryview(host.reshape(-1).view(torch.uint8).numpy())


def _part(name: str, tensor: torch.Tensor) -> TensorPart:
    return TensorPart(
        name, _DTYPE_CODES[tensor.dtype], tuple(tensor.shape), functools.partial(_host_bytes, tensor)
    )


def _tensor(read: ReadTensor) -> torch.Tensor:
    if not read.data:
        return torch.empty(read.shape, dtype=_DTYPES[read.dtype])
    return torch.frombuffer(read.data, dtype=torch.uint8).view(_DTYPES[read.dtype]).reshape(read.shape)


def _pack_list(entries: list[Any] | None, prefix: str, parts: list[TensorPart]) -> list[Any] | None:
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
            parts.append(_part(f"{prefix}/{i}", entry))
            layout.append({"t": f"{prefix}/{i}"})
        else:
            raise ExportUnsupported(f"cache entry {prefix}[{i}] is a {type(entry).__name__}")
    return layout


def _unpack_list(
    layout: list[Any] | None, tensors: dict[str, torch.Tensor], device: torch.device
) -> list[Any] | None:
    if layout is None:
        return None
    return [
        None if entry is None else entry["str"] if "str" in entry else tensors[entry["t"]].to(device)
        for entry in layout
    ]


class ARDiffusionSessionAdapter:
    def __init__(self, worker: DiffusionWorker, od_config: OmniDiffusionConfig, family: Any = None) -> None:
        from ardiff.worker.families import family_for

        runner = worker.model_runner
        pipeline = runner.pipeline if runner is not None else None
        spec = getattr(runner, "_ar_diffusion_kv_cache_spec", None)
        if runner is None or runner.kv_cache is None or spec is None:
            raise TypeError("the worker's runner is not an ARDiffusionModelRunner with a KV cache")
        self._family = family or family_for(type(pipeline).__name__)
        streaming = callable(getattr(pipeline, "_decode_chunk_to_pixels", None))
        if self._family.name == "lingbot" and not streaming:
            raise TypeError(f"{type(pipeline).__name__} has no per-session streaming decoder")
        self._worker = worker
        self._od_config = od_config
        self._runner = runner
        self._pipeline = pipeline
        self._pre_process = get_diffusion_pre_process_func(od_config)
        model_config = od_config.model_config
        self._height, self._width = getattr(self._family, "FRAME_SIZE", None) or (
            int(model_config["ar_diffusion_height"]),
            int(model_config["ar_diffusion_width"]),
        )
        # One request is one AR block: `frames_per_block` latent frames through the causal VAE's time factor.
        self._latent_frames = spec.frames_per_block
        temporal = int(getattr(pipeline, "vae_scale_factor_temporal", 4))
        self._num_frames = (spec.frames_per_block - 1) * temporal + 1
        self._resident: tuple[str, ...] = ()
        log.info(
            "session adapter: %s (%s) capacity=%d kv_blocks=%d frames_per_tick=%d at %dx%d",
            type(pipeline).__name__,
            self._family.name,
            self.capacity,
            self.kv_blocks().total,
            self._num_frames,
            self._height,
            self._width,
        )

    # ---------------------------------------------------------------- SessionRuntime

    @property
    def capacity(self) -> int:
        return int(self._runner._session_capacity)

    @property
    def frame_size(self) -> tuple[int, int]:
        return self._height, self._width

    def prepare(self, tick: Any, conditioning: Conditioning) -> PreparedTick:
        return self._family.prepare(self, tick, conditioning)

    def forward(self, prepared: PreparedTick, *, inject_fault: bool = False) -> ChunkOutput:
        session_id, family = prepared.session_id, self._family
        started = time.perf_counter()
        try:
            with self._failing_pipeline() if inject_fault else contextlib.nullcontext():
                output = self._worker.execute_model(family.request_of(prepared), self._od_config)
            if getattr(output, "error", None):
                raise RuntimeError(f"the runner reported: {output.error}")
            with torch.inference_mode():
                chunk = family.chunk_output(self, session_id, output, started, prepared)
        except Exception:
            # The runner already released a failed forward's KV; a failed decode leaves it: close either way.
            self.close(session_id)
            raise
        if family.close_after(prepared):
            self.close(session_id)
        self._refresh()
        return chunk

    # ---------------------------------------------------------------- what families ask of the pipeline

    @property
    def frames_per_tick(self) -> int:
        return self._num_frames

    @property
    def latent_frames_per_tick(self) -> int:
        return self._latent_frames

    def pre_process(self, request: OmniDiffusionRequest) -> OmniDiffusionRequest:
        """The pipeline's own pre-process (`get_diffusion_pre_process_func`), where it has one."""
        return request if self._pre_process is None else self._pre_process(request)

    def lingbot_camera_trajectory(self, request: OmniDiffusionRequest) -> Any:
        """LingBot's pre-processed camera trajectory of a request (a private extra-args key), or None."""
        return request.sampling_params.extra_args.get(lingbot_pipeline._PREPROCESSED_CAMERA_KEY)

    def decode_streaming_chunk(self, latents: Any, session_id: str) -> np.ndarray:
        """LingBot: a chunk's latents through the session's own streaming VAE decoder (uint8 F,H,W,3)."""
        return self._pipeline._decode_chunk_to_pixels(latents, session_id=session_id)

    def decode_predicted_frames(self, video: Any) -> np.ndarray:
        """DreamZero: a chunk's predicted latents `(B, C, T, h, w)` decoded to uint8 `(T, H, W, 3)`."""
        pixels = self._pipeline.decode_video_latents(video)  # (B, 3, T, H, W) in [-1, 1]
        frames = ((pixels[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return np.ascontiguousarray(frames.permute(1, 2, 3, 0).cpu().numpy())

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
        return KVBlocks(free=cache.manager.block_pool.get_num_free_blocks(), total=cache.num_blocks - 1)

    def shutdown(self) -> None:
        self._worker.shutdown()

    # ---------------------------------------------------------------- export / import (contracts §9)

    def export_session(self, session_id: str, out: Writable, *, book: SessionBook) -> int:
        self._check_exportable()
        state, parts = self._capture(session_id)
        return write_export(
            out, session_id=session_id, identity=self.identity, book=book, state=state, tensors=parts
        )

    def import_session(self, source: Readable) -> SessionBook:
        self._check_exportable()
        reader = ExportReader(source)
        check_identity(reader.identity, self.identity)
        session_id, state = reader.session_id, reader.state
        pipe = self._pipeline
        if (
            session_id in self._runner._sessions
            or session_id in pipe._ar_sessions
            or session_id in pipe._streaming_decode_states
        ):
            raise ExportDuplicateSession(f"session {session_id!r} is already resident on this worker")
        if len(self._runner._sessions) >= self.capacity:
            # The runner would silently evict its least recently used session to make room.
            raise ExportNoCapacity(f"this worker holds {self.capacity} sessions, its capacity")
        check = self._tensor_check(state)
        needed = sum(int(b["num_blocks"]) for b in state["kv_branches"].values())
        free = self.kv_blocks().free
        if needed > free:
            raise ExportNoCapacity(f"the session needs {needed} KV blocks, this worker has {free} free")
        try:
            book = self._install(reader, check)
        except BaseException as exc:
            self._runner._release_session(
                session_id, reset_model=False, reason="import_failed", suppress_errors=True
            )
            self._refresh()
            if isinstance(exc, SessionExportError) or not isinstance(exc, Exception):
                raise
            raise ExportCorrupt(f"session {session_id!r} could not be installed: {exc}") from exc
        self._refresh()
        return book

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """What an importing worker must match (docs/contracts.md §9); the weights are hashed once."""
        kv, spec = self._runner.kv_cache, self._runner._ar_diffusion_kv_cache_spec
        model_dir = Path(self._od_config.model)
        return {
            "runtime": "vllm-omni",
            "versions": {"vllm_omni": vllm_omni.__version__},
            "model": model_dir.name,
            "pipeline": type(self._pipeline).__name__,
            "height": self._height,
            "width": self._width,
            "dtype": str(kv.dtype).removeprefix("torch."),
            "weights_sha256": model_fingerprint(model_dir),
            "geometry": {
                "num_layers": int(spec.num_layers),
                "num_kv_heads": int(spec.num_kv_heads),
                "head_size": int(spec.head_size),
                "tokens_per_frame": int(spec.tokens_per_frame),
                "frames_per_block": int(spec.frames_per_block),
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
    def family(self) -> Any:
        return self._family

    @property
    def supports_export(self) -> bool:
        return self._family.supports_export and isinstance(
            self._pipeline, lingbot_pipeline.LingBotWorldCausalDMDPipeline
        )

    def _check_exportable(self) -> None:
        if not self.supports_export:
            raise ExportUnsupported(
                f"{type(self._pipeline).__name__} sessions cannot be exported (LingBot-World only): "
                "they keep reset-on-evict"
            )

    def _capture(self, session_id: str) -> tuple[dict[str, Any], list[TensorPart]]:
        """One idle session's bookkeeping (JSON) and its tensors (read when written). Read-only."""
        runner, kv, pipe = self._runner, self._runner.kv_cache, self._pipeline
        session = runner._sessions.get(session_id)
        if session is None or session._closed:
            raise ExportNotIdle(f"session {session_id!r} is not resident on this worker")
        if pipe._ar_diffusion_kv_state is not None or any(
            c is not None for c in session._paged_pending.values()
        ):
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
                parts.append(_part(f"kv/{name}/k/{layer}", kv.key_cache(layer).index_select(0, ids)))
                parts.append(_part(f"kv/{name}/v/{layer}", kv.value_cache(layer).index_select(0, ids)))
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
                        parts.append(_part(f"cross/{cache_name}/{branch.name}/k/{layer}", pair["k"]))
                        parts.append(_part(f"cross/{cache_name}/{branch.name}/v/{layer}", pair["v"]))
        state = {
            "kv_branches": branches,
            "cross_attention": cross,
            "pipeline": self._capture_pipeline(session_id, parts),
            "decoder": None,
        }
        decoder = pipe._streaming_decode_states.get(session_id)
        if decoder is not None:
            state["decoder"] = {
                "feat_map": _pack_list(decoder.feat_map, "dec/feat_map", parts),
                "conv_idx": [int(i) for i in decoder.conv_idx],
                "frames_decoded": int(decoder.frames_decoded),
                "chunks_decoded": int(decoder.chunks_decoded),
            }
        return state, parts

    def _capture_pipeline(self, session_id: str, parts: list[TensorPart]) -> dict[str, Any] | None:
        state = self._pipeline._ar_sessions.get(session_id)
        if state is None:
            return None
        unknown = {f.name for f in dataclasses.fields(state)} - _PIPELINE_FIELDS
        if unknown:
            raise ExportUnsupported(
                f"LingBot's session state has fields this exporter does not know: {sorted(unknown)}"
            )
        if state.pending_encoder_cache is not None:
            raise ExportNotIdle(f"session {session_id!r} has a chunk in flight (pending encoder cache)")
        for name, tensor in (
            ("pipe/generator_state", state.generator_state),
            ("pipe/condition_fixed_point", state.condition_fixed_point),
            ("pipe/camera_tail/poses", state.camera_tail.poses if state.camera_tail is not None else None),
            (
                "pipe/camera_tail/intrinsics",
                state.camera_tail.intrinsics if state.camera_tail is not None else None,
            ),
        ):
            if tensor is not None:
                parts.append(_part(name, tensor))
        return {
            "next_chunk_index": int(state.next_chunk_index),
            "text_cache_key": list(state.text_cache_key) if state.text_cache_key is not None else None,
            "text_cache_dirty": bool(state.text_cache_dirty),
            "camera_pitch": float(state.camera_pitch),
            "encoder_cache": _pack_list(state.encoder_cache, "pipe/encoder_cache", parts),
        }

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
            named = {
                entry["t"]
                for section, key in (("pipeline", "encoder_cache"), ("decoder", "feat_map"))
                for entry in ((state[section] or {}).get(key) or [])
                if isinstance(entry, dict) and "t" in entry
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ExportCorrupt(f"session export state lacks its KV branches or caches: {exc}") from None
        if not set(blocks) <= set(branches) or any(n < 0 for n in blocks.values()):
            raise ExportCorrupt(f"session export KV branches {blocks} do not fit this runner's {branches}")
        named |= {f"pipe/{name}" for name in _PIPELINE_TENSORS}
        code, page, layers = _DTYPE_CODES[kv.dtype], tuple(kv.key_cache(0).shape[1:]), range(kv.num_layers)
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
            if name == BOOK_FRAMES:
                check_book_frames(name, dtype, shape, self.frame_size)
            elif name not in named:
                expected = spec.get(name)
                if expected is None:
                    refuse_tensor(name, dtype, shape, "the tensors of its KV branches, caches and pipeline")
                if (dtype, shape) != expected:
                    refuse_tensor(name, dtype, shape, f"{expected[0]} {list(expected[1])}")

        return check

    def _install(self, reader: ExportReader, check: TensorCheck) -> SessionBook:
        """Build the session from `reader`: its KV blocks allocated first; the tensors read (each declared one
        checked against `check` before anything is read); the KV pages written only once every part is in and
        the checksum held, then the rest. The caller releases it on any failure."""
        kv, pipe, state = self._runner.kv_cache, self._pipeline, reader.state
        session_id = reader.session_id
        session = self._runner._get_or_create_session(session_id)
        block_ids = {}
        for name, branch in state["kv_branches"].items():
            adapter = session.adapter(name)
            if branch["num_blocks"]:
                kv.allocate_token_slots(adapter, branch["num_blocks"] * kv.block_size)  # from position 0
            table = kv.block_table(adapter)
            if len(table) != branch["num_blocks"]:
                raise ExportCorrupt(
                    f"branch {name}: allocated {len(table)} blocks, expected {branch['num_blocks']}"
                )
            block_ids[name] = torch.tensor(table, dtype=torch.long, device=kv.device)
        pages: list[tuple[str, torch.Tensor]] = []  # written once the checksum held: never an altered page
        rest: dict[str, torch.Tensor] = {}
        for part in reader.tensors(check):
            if part.name.startswith("kv/"):
                pages.append((part.name, _tensor(part)))
            else:
                rest[part.name] = _tensor(part)
        for name, tensor in pages:
            branch, kind, layer = name.removeprefix("kv/").rsplit("/", 2)
            pool = kv.key_cache(int(layer)) if kind == "k" else kv.value_cache(int(layer))
            pool.index_copy_(0, block_ids[branch], tensor.to(kv.device))
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
        if state["pipeline"] is not None:
            pipe._ar_sessions[session_id] = self._pipeline_state(state["pipeline"], rest)
        if state["decoder"] is not None:
            pipe._streaming_decode_states[session_id] = self._decoder_state(
                session_id, state["decoder"], rest
            )
        return book

    def _pipeline_state(self, value: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
        device = self._pipeline.device
        poses, intrinsics = tensors.get("pipe/camera_tail/poses"), tensors.get("pipe/camera_tail/intrinsics")
        fixed_point = tensors.get("pipe/condition_fixed_point")
        return lingbot_pipeline._LingBotARSessionState(
            next_chunk_index=value["next_chunk_index"],
            text_cache_key=tuple(value["text_cache_key"]) if value["text_cache_key"] is not None else None,
            text_cache_dirty=value["text_cache_dirty"],
            generator_state=tensors.get("pipe/generator_state"),  # set_state wants a CPU ByteTensor
            encoder_cache=_unpack_list(value["encoder_cache"], tensors, device),
            pending_encoder_cache=None,
            condition_fixed_point=fixed_point.to(device) if fixed_point is not None else None,
            camera_tail=(
                CameraTrajectory(poses=poses.to(device), intrinsics=intrinsics.to(device))
                if poses is not None and intrinsics is not None
                else None
            ),
            camera_pitch=value["camera_pitch"],
        )

    def _decoder_state(self, session_id: str, value: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
        decoder = self._pipeline._streaming_decoder()
        if decoder is None:
            raise ExportCorrupt("the export has streaming-decoder state but this VAE cannot stream")
        state = decoder.new_decode_state(session_id)
        if len(state.feat_map) != len(value["feat_map"]):
            raise ExportCorrupt(
                f"decoder cache has {len(value['feat_map'])} slots, this VAE {len(state.feat_map)}"
            )
        state.feat_map = _unpack_list(value["feat_map"], tensors, self._pipeline.device)
        state.conv_idx = list(value["conv_idx"])
        state.frames_decoded = value["frames_decoded"]
        state.chunks_decoded = value["chunks_decoded"]
        return state

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
