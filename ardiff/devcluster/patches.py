"""The three PATCH flavours of the Kubernetes API, applied to plain JSON objects.

- `application/json-patch+json` (RFC 6902, what kopf uses for finalizers with a resourceVersion `test`);
- `application/merge-patch+json` (RFC 7386, what kubectl sends for custom resources);
- `application/strategic-merge-patch+json` (what kubectl sends for built-in kinds). Real strategic merge
  takes each list's merge key from the Go types; this harness knows the keys of the lists that
  appear in Pods, Services and CRDs (`STRATEGIC_MERGE_KEYS`) and replaces any other list, as a merge
  patch would.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch
import jsonpointer

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# List field name -> the item key that identifies an element (k8s.io/api `patchMergeKey` tags).
STRATEGIC_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "imagePullSecrets": ("name",),
    "ports": ("containerPort", "port"),  # container ports vs service ports
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "versions": ("name",),  # CustomResourceDefinition.spec.versions
}
# Primitive lists whose patch strategy is "merge" (set union), e.g. ObjectMeta.finalizers.
STRATEGIC_MERGE_SETS = frozenset({"finalizers"})


class PatchError(ValueError):
    """A patch that cannot be applied (malformed, or a failed `test` operation)."""


def apply_patch(target: Mapping[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """Return a patched deep copy of `target`; raise PatchError if the patch does not apply."""
    media_type = content_type.split(";")[0].strip()
    if media_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError("a JSON patch must be a list of operations")
        try:
            return jsonpatch.apply_patch(copy.deepcopy(dict(target)), patch)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise PatchError(str(exc)) from exc
    if not isinstance(patch, dict):
        raise PatchError(f"a {media_type} body must be a JSON object")
    if media_type == MERGE_PATCH:
        return merge_patch(target, patch)
    if media_type == STRATEGIC_MERGE_PATCH:
        return strategic_merge_patch(target, patch)
    raise PatchError(f"unsupported patch content type {content_type!r}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge for the lists this harness knows (see module docstring), merge patch otherwise."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _without_directives(patch)
    result = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field, []) if item not in value]
        elif key.startswith("$"):
            continue  # $setElementOrder/..., $retainKeys: ordering and pruning hints, not data
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(field: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if field in STRATEGIC_MERGE_SETS:
        return current + [item for item in patch if item not in current]
    key = _merge_key(field, current + patch)
    if key is None:
        return [_without_directives(item) for item in patch]
    merged = copy.deepcopy(current)
    for item in patch:
        index = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(_without_directives(item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _merge_key(field: str, items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, Mapping) for item in items):
        return None
    for key in STRATEGIC_MERGE_KEYS.get(field, ()):
        if all(key in item for item in items):
            return key
    return None


def _without_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_without_directives(v) for v in value]
    return copy.deepcopy(value)
