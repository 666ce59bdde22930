"""LingBot-World's own per-session state in a session export (docs/contracts.md §9): heavy, imported lazily.

What the pipeline holds per session beside the runner's KV: `_ar_sessions` (`_LingBotARSessionState`: chunk
counter, RNG state, text-cache key, encoder cache, condition fixed point, camera tail and pitch) and
`_streaming_decode_states` (the session's streaming VAE decoder cache). The session adapter exports and
imports the KV and asks this module (`lingbot.session_state()`, the `SessionState` seam) for the rest: the
`pipeline` and `decoder` sections of the export's state and their tensors. Private vllm-omni members used
here: the pipeline's `_ar_sessions`, `_streaming_decode_states`, `_streaming_decoder()` and
`_LingBotARSessionState`. A state field this module does not know refuses the export.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import vllm_omni.diffusion.models.lingbot_world.pipeline as lingbot_pipeline
from vllm_omni.diffusion.models.lingbot_world.camera import CameraTrajectory

from ardiff.worker.errors import ExportCorrupt, ExportNotIdle, ExportUnsupported
from ardiff.worker.session_export import TensorPart
from ardiff.worker.session_tensors import named_tensors, pack_list, part, unpack_list

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


def serves(pipeline: Any) -> bool:
    """Whether `pipeline` is LingBot-World's, the one whose session state this module knows."""
    return isinstance(pipeline, lingbot_pipeline.LingBotWorldCausalDMDPipeline)


def holds(pipeline: Any, session_id: str) -> bool:
    """Whether the pipeline holds state of `session_id` (an import would overwrite it)."""
    return session_id in pipeline._ar_sessions or session_id in pipeline._streaming_decode_states


def capture(pipeline: Any, session_id: str, parts: list[TensorPart]) -> dict[str, Any]:
    """An idle session's `pipeline` and `decoder` sections of the export state; their tensors to `parts`."""
    state: dict[str, Any] = {"pipeline": _capture_pipeline(pipeline, session_id, parts), "decoder": None}
    decoder = pipeline._streaming_decode_states.get(session_id)
    if decoder is not None:
        state["decoder"] = {
            "feat_map": pack_list(decoder.feat_map, "dec/feat_map", parts),
            "conv_idx": [int(i) for i in decoder.conv_idx],
            "frames_decoded": int(decoder.frames_decoded),
            "chunks_decoded": int(decoder.chunks_decoded),
        }
    return state


def tensor_names(state: dict[str, Any]) -> set[str]:
    """The tensors the export's `pipeline` and `decoder` sections may carry (shapes of the model's internals,
    not checked); `KeyError`/`TypeError`/`AttributeError` on malformed sections."""
    named = set()
    for section, key in (("pipeline", "encoder_cache"), ("decoder", "feat_map")):
        named |= named_tensors((state[section] or {}).get(key))
    return named | {f"pipe/{name}" for name in _PIPELINE_TENSORS}


def restore(pipeline: Any, session_id: str, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Install the export's `pipeline` and `decoder` sections (their tensors read, the checksum held)."""
    if state["pipeline"] is not None:
        pipeline._ar_sessions[session_id] = _pipeline_state(pipeline, state["pipeline"], tensors)
    if state["decoder"] is not None:
        pipeline._streaming_decode_states[session_id] = _decoder_state(
            pipeline, session_id, state["decoder"], tensors
        )


def _capture_pipeline(pipeline: Any, session_id: str, parts: list[TensorPart]) -> dict[str, Any] | None:
    state = pipeline._ar_sessions.get(session_id)
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
            parts.append(part(name, tensor))
    return {
        "next_chunk_index": int(state.next_chunk_index),
        "text_cache_key": list(state.text_cache_key) if state.text_cache_key is not None else None,
        "text_cache_dirty": bool(state.text_cache_dirty),
        "camera_pitch": float(state.camera_pitch),
        "encoder_cache": pack_list(state.encoder_cache, "pipe/encoder_cache", parts),
    }


def _pipeline_state(pipeline: Any, value: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    device = pipeline.device
    poses, intrinsics = tensors.get("pipe/camera_tail/poses"), tensors.get("pipe/camera_tail/intrinsics")
    fixed_point = tensors.get("pipe/condition_fixed_point")
    return lingbot_pipeline._LingBotARSessionState(
        next_chunk_index=value["next_chunk_index"],
        text_cache_key=tuple(value["text_cache_key"]) if value["text_cache_key"] is not None else None,
        text_cache_dirty=value["text_cache_dirty"],
        generator_state=tensors.get("pipe/generator_state"),  # set_state wants a CPU ByteTensor
        encoder_cache=unpack_list(value["encoder_cache"], tensors, device),
        pending_encoder_cache=None,
        condition_fixed_point=fixed_point.to(device) if fixed_point is not None else None,
        camera_tail=(
            CameraTrajectory(poses=poses.to(device), intrinsics=intrinsics.to(device))
            if poses is not None and intrinsics is not None
            else None
        ),
        camera_pitch=value["camera_pitch"],
    )


def _decoder_state(
    pipeline: Any, session_id: str, value: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> Any:
    decoder = pipeline._streaming_decoder()
    if decoder is None:
        raise ExportCorrupt("the export has streaming-decoder state but this VAE cannot stream")
    state = decoder.new_decode_state(session_id)
    if len(state.feat_map) != len(value["feat_map"]):
        raise ExportCorrupt(
            f"decoder cache has {len(value['feat_map'])} slots, this VAE {len(state.feat_map)}"
        )
    state.feat_map = unpack_list(value["feat_map"], tensors, pipeline.device)
    state.conv_idx = list(value["conv_idx"])
    state.frames_decoded = value["frames_decoded"]
    state.chunks_decoded = value["chunks_decoded"]
    return state
