"""Which model family serves a pipeline class: the model knowledge the operator and the worker share, in plain
Python with no imports.

The worker's family modules (`ardiff.worker.families`) take their `pipelines`
from here, and the operator reads it (`operator/specs.py`) to know a pool's family from its `model.pipeline`
(a session names its `family`; the operator fails one whose family differs from its pool's). It is part of
the shared base so that the operator depends on no module of the worker; the operator image has no torch,
pydantic or Pillow, which the family modules need.
"""

from __future__ import annotations

DEFAULT_FAMILY = "lingbot"
# pipeline class (vllm-omni) -> the model family serving it (`ARDiffusionSession.spec.family`)
PIPELINE_FAMILIES: dict[str, str] = {
    "LingBotWorldCausalDMDPipeline": "lingbot",
    "DreamZeroPipeline": "dreamzero",
}
FAMILY_NAMES: tuple[str, ...] = tuple(dict.fromkeys(PIPELINE_FAMILIES.values()))


def family_of(pipeline: str) -> str | None:
    """The family serving `pipeline`, None when no family does (such a worker refuses to load it)."""
    return PIPELINE_FAMILIES.get(pipeline)


def pipelines_of(family: str) -> tuple[str, ...]:
    """The pipeline classes `family` serves."""
    return tuple(pipeline for pipeline, name in PIPELINE_FAMILIES.items() if name == family)
