"""The worker's import of the pipeline -> family map (`worker/families/`, `worker/server.py` read it here).

The map itself is shared with the operator and lives in the base, `ardiff/model_families.py`: the operator
must not import the worker.
"""

from __future__ import annotations

from ardiff.model_families import DEFAULT_FAMILY, FAMILY_NAMES, PIPELINE_FAMILIES, family_of, pipelines_of

__all__ = ["DEFAULT_FAMILY", "FAMILY_NAMES", "PIPELINE_FAMILIES", "family_of", "pipelines_of"]
