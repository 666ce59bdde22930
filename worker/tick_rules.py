"""vllm-omni's own tick rules, applied to an HTTP tick body before anything is queued.

`vllm_omni/experimental/ar_diffusion/tick_protocol.py` depends on the standard library only, but importing it
through its package runs `vllm_omni/__init__`, which loads ~600 vllm modules and torch. The `fake` runtime
must stay torch-free, so the file is loaded on its own from the installed package: the rules are vllm-omni's,
byte for byte, on both runtimes. The runner re-parses the same `to_extra_args()` dict with its own copy (the
engine's transport, not ours).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from ardiff.worker.errors import InvalidTick

_MODULE_NAME = "ardiff.worker._vllm_omni_tick_protocol"
_PROTOCOL_FILE = ("experimental", "ar_diffusion", "tick_protocol.py")
# The body fields of an HTTP tick: ARDiffusionTickRequest minus `session_id` (which is the URL's).
TICK_FIELDS = (
    "request_id",
    "chunk_index",
    "applied_event_ids",
    "prompt",
    "controls",
    "reset",
    "close_session",
)


def _load_protocol() -> ModuleType:
    loaded = sys.modules.get(_MODULE_NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("vllm_omni")  # locates the package without executing it
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("vllm-omni is not installed; the worker needs its tick protocol")
    path = Path(next(iter(package.submodule_search_locations))).joinpath(*_PROTOCOL_FILE)
    spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE_NAME] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


protocol = _load_protocol()
TickRequest = protocol.ARDiffusionTickRequest
ControlInput = protocol.ARDiffusionControlInput
ChunkMetadata = protocol.ARDiffusionChunkMetadata
TICK_KEY: str = protocol.AR_DIFFUSION_TICK_KEY

# vllm-omni's messages start with the field they are about ("chunk_index must be ...",
# "control.track must be ...", "Each control must be a mapping."); this maps them back to body fields.
_FIELD_PATTERN = re.compile(r"\b(" + "|".join((*TICK_FIELDS, "control", "session_id")) + r")\b")


def param_for(message: str, default: str) -> str:
    """The body field a validation message is about, or `default` when it names none."""
    match = _FIELD_PATTERN.search(message)
    if match is None:
        return default
    name = match.group(1)
    return "controls" if name == "control" else name


def parse_tick(session_id: str, body: Mapping[str, Any] | BaseModel) -> Any:
    """vllm-omni's `ARDiffusionTickRequest` of a tick, or `InvalidTick`. A body the worker's schema already
    validated (`TickBody`, `RobotTickBody`: the HTTP tick, the stream's) is read as it is and the request
    built by its constructor, where vllm-omni's checks run; a mapping (the realtime stream's chunks, OpenPI's
    observations, the warm-up) goes through vllm-omni's own `from_extra_args`. Either way the tick is
    parsed once."""
    try:
        if isinstance(body, BaseModel):
            return TickRequest(
                session_id=session_id,
                request_id=body.request_id,  # type: ignore[attr-defined]
                chunk_index=body.chunk_index,  # type: ignore[attr-defined]
                applied_event_ids=tuple(body.applied_event_ids),  # type: ignore[attr-defined]
                prompt=body.prompt,  # type: ignore[attr-defined]
                controls=tuple(
                    ControlInput(control.track, control.schema_, control.data)
                    for control in getattr(body, "controls", ())
                ),
                reset=body.reset,  # type: ignore[attr-defined]
                close_session=body.close_session,  # type: ignore[attr-defined]
            )
        payload = {"session_id": session_id, **{name: body[name] for name in TICK_FIELDS if name in body}}
        return TickRequest.from_extra_args({TICK_KEY: payload})
    except ValueError as exc:
        raise InvalidTick(str(exc), param=param_for(str(exc), "body")) from None


def fields_of(body: Mapping[str, Any] | BaseModel) -> Mapping[str, Any]:
    """A tick body's fields by name, as they are: a validated body's own (`vars`), or the mapping."""
    return vars(body) if isinstance(body, BaseModel) else body


def metadata_of(tick: Any) -> dict[str, Any]:
    """vllm-omni's `ARDiffusionChunkMetadata` echo of a tick, as JSON-ready dict."""
    return ChunkMetadata.from_tick(tick).to_dict()
