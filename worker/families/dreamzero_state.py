"""DreamZero's own per-session state in a session export (docs/contracts.md §9): heavy, imported lazily.

What the pipeline holds per session beside the runner's two KV branches and their cross-attention:
`_states[session]` (`DreamZeroState`: the last stitched camera frames, the call and frame counters, the
tokenized prompt and its embeddings, the first frame's CLIP features and conditioning latents, the VAE
encoder's stream cache and its accumulated output, and every chunk's predicted latents). The session adapter
exports and imports the KV and asks this module (`dreamzero.session_state()`, the `SessionState` seam) for the
rest: the `pipeline` section of the export's state and its tensors. There is no RNG to carry: the pipeline
seeds a fresh generator every forward. Private vllm-omni members used here: the pipeline's `_states` and
`_memory_manager` (its opt-in `SessionStateManager`, whose sessions this module does not know: they do not
export). A state field this module does not know refuses the export.

vllm-omni's default state keeps the VAE encoder's output and the predicted latents of every chunk until the
session resets (its window resets keep the latents); an export carries them as they are, so it grows by a
chunk's latents per chunk (~236 KiB at DROID's size: `benchmarks/dreamzero_export.py`, docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from vllm_omni.diffusion.distributed.utils import get_local_device
from vllm_omni.diffusion.models.dreamzero.state_dreamzero import FRAMES_PER_CHUNK, DreamZeroState

from ardiff.worker.errors import ExportCorrupt, ExportUnsupported
from ardiff.worker.session_export import TensorPart
from ardiff.worker.session_tensors import named_tensors, pack_list, part, unpack_list

# The single tensors of DreamZero's session state (`dz/<name>`, written when present).
_TENSORS = ("language", "prompt_embeds", "clip_feas", "ys", "vae_encoder_out", "vae_pending_body_frames")
# Its lists (`dz/<name>/<i>`): the stitched frames (uint8, at most FRAMES_PER_CHUNK), the VAE encoder's cache,
# every chunk's predicted latents.
_LISTS = ("stitched_buffer", "vae_enc_feat_map", "video_latents_across_time")
_SCALARS = ("call_count", "current_start_frame", "vae_stream_initialized", "vae_encoder_window")
_FIELDS = frozenset(_TENSORS + _LISTS + _SCALARS)


def serves(pipeline: Any) -> bool:
    """Whether `pipeline` is DreamZero's with its own per-session states (not the opt-in state manager)."""
    from vllm_omni.diffusion.models.dreamzero.pipeline_dreamzero import DreamZeroPipeline

    return isinstance(pipeline, DreamZeroPipeline) and getattr(pipeline, "_memory_manager", None) is None


def holds(pipeline: Any, session_id: str) -> bool:
    """Whether the pipeline holds state of `session_id` (an import would overwrite it)."""
    return session_id in pipeline._states


def capture(pipeline: Any, session_id: str, parts: list[TensorPart]) -> dict[str, Any]:
    """An idle session's `pipeline` section of the export state; its tensors to `parts`."""
    state = pipeline._states.get(session_id)
    if state is None:
        return {"pipeline": None}
    fields = vars(state).keys() | {"vae_encoder_window"}  # a class attribute unless the state bounds it
    unknown = fields - _FIELDS
    if unknown:
        raise ExportUnsupported(
            f"DreamZero's session state has fields this exporter does not know: {sorted(unknown)}"
        )
    present = [name for name in _TENSORS if getattr(state, name) is not None]
    parts.extend(part(f"dz/{name}", getattr(state, name)) for name in present)
    stitched = [torch.from_numpy(frame) for frame in state.stitched_buffer]
    return {
        "pipeline": {
            "call_count": int(state.call_count),
            "current_start_frame": int(state.current_start_frame),
            "vae_stream_initialized": bool(state.vae_stream_initialized),
            "vae_encoder_window": state.vae_encoder_window,
            "tensors": sorted(present),
            "stitched_buffer": pack_list(stitched, "dz/stitched_buffer", parts),
            "vae_enc_feat_map": pack_list(state.vae_enc_feat_map, "dz/vae_enc_feat_map", parts),
            "video_latents_across_time": pack_list(
                state.video_latents_across_time, "dz/video_latents_across_time", parts
            ),
        }
    }


def tensor_names(state: dict[str, Any]) -> set[str]:
    """The tensors the export's `pipeline` section may carry (shapes of the model's internals, not checked);
    `KeyError`/`TypeError`/`AttributeError` on a malformed section."""
    section = state["pipeline"]
    if section is None:
        return set()
    named = {f"dz/{name}" for name in section["tensors"] if name in _TENSORS}
    for name in _LISTS:
        named |= named_tensors(section[name])
    return named


def restore(pipeline: Any, session_id: str, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Install the export's `pipeline` section (its tensors read, the checksum held)."""
    section = state["pipeline"]
    if section is None:
        return
    device = get_local_device()  # where the pipeline's forward puts its tensors
    stitched = unpack_list(section["stitched_buffer"], tensors, torch.device("cpu")) or []
    if len(stitched) > FRAMES_PER_CHUNK:
        raise ExportCorrupt(
            f"DreamZero state has {len(stitched)} stitched frames, at most {FRAMES_PER_CHUNK}"
        )
    restored = DreamZeroState()
    restored.stitched_buffer = deque((frame.numpy() for frame in stitched), maxlen=FRAMES_PER_CHUNK)
    restored.call_count = int(section["call_count"])
    restored.current_start_frame = int(section["current_start_frame"])
    restored.vae_stream_initialized = bool(section["vae_stream_initialized"])
    if section["vae_encoder_window"] is not None:
        restored.vae_encoder_window = int(section["vae_encoder_window"])
    for name in _TENSORS:
        value = tensors.get(f"dz/{name}")
        setattr(restored, name, value.to(device) if value is not None else None)
    restored.vae_enc_feat_map = unpack_list(section["vae_enc_feat_map"], tensors, device)
    # vllm-omni keeps the predicted latents on the host (`append_video_latents`).
    restored.video_latents_across_time = (
        unpack_list(section["video_latents_across_time"], tensors, torch.device("cpu")) or []
    )
    pipeline._states[session_id] = restored
