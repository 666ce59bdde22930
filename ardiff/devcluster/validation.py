"""Validate a custom resource against its CRD's structural schema, like kube-apiserver does.

`admit(obj, schema, old=...)` runs the apiserver's steps in its order:
1. prune unknown fields (kept under `x-kubernetes-preserve-unknown-fields: true`; `apiVersion`, `kind` and
   `metadata` are never pruned);
2. apply `default`s (a `null` in a non-nullable field with a default is defaulted);
3. validate the OpenAPI v3 schema (types and formats, bounds, enums, lengths, patterns, required,
   list types, `nullable`, `x-kubernetes-int-or-string`, anyOf/allOf/oneOf/not);
4. if that passed, evaluate the CEL rules (`x-kubernetes-validations`), with `oldSelf` on update.

Errors are `FieldError`s rendered like the apiserver's (`spec.replicas.max: Invalid value: 1: max must be
>= min`); `InvalidObject` carries them and renders the 422 `Invalid` Status. Not emulated: ratcheting of
unchanged invalid values, the runtime CEL cost budget, `x-kubernetes-embedded-resource` metadata checks.
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ardiff.devcluster.cel import CELEvaluationError, ValidationRule
from ardiff.errors import ArdiffError


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final = _Absent()

# field.ErrorType strings of k8s.io/apimachinery, by the reason a Status cause carries.
_ERROR_TYPES = {
    "FieldValueRequired": "Required value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "FieldValueForbidden": "Forbidden",
}
# These error types never print the bad value.
_VALUELESS = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong"}

_INT_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_FIELD_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[\s*'([^']*)'\s*\]")


def render_value(value: Any) -> str:
    """A bad value as the apiserver prints it: strings quoted, numbers bare, objects as JSON."""
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def render_path(path: Sequence[str | int]) -> str:
    """`spec.env[1].name`, `spec.resources.limits[nvidia.com/gpu]`: k8s field.Path notation."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = part
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}"
        else:
            out += f"[{part}]"
    return out or "<root>"


@dataclass(frozen=True)
class FieldError:
    """One invalid field, as in a Status cause (`reason`, `message`, `field`)."""

    field: str
    reason: str
    detail: str = ""
    value: Any = ABSENT

    def __post_init__(self) -> None:
        if self.reason not in _ERROR_TYPES:
            raise ValueError(f"field error reason must be one of {sorted(_ERROR_TYPES)}, got {self.reason!r}")

    @property
    def body(self) -> str:
        """The message without the field, e.g. `Invalid value: 1: max must be >= min`."""
        text = _ERROR_TYPES[self.reason]
        if self.reason not in _VALUELESS and self.value is not ABSENT:
            text += f": {render_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body}"

    def as_cause(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.body, "field": self.field}


class InvalidObject(ArdiffError):
    """An object the API server refuses with 422 `Invalid`; `errors` name every bad field."""

    code = "invalid_object"

    def __init__(self, kind: str, group: str, name: str, errors: Sequence[FieldError]) -> None:
        if not errors:
            raise ValueError("InvalidObject needs at least one field error")
        self.kind, self.group, self.name, self.errors = kind, group, name, tuple(errors)
        qualified = f"{kind}.{group}" if group else kind
        listed = str(self.errors[0]) if len(self.errors) == 1 else f"[{', '.join(map(str, self.errors))}]"
        super().__init__(f'{qualified} "{name}" is invalid: {listed}')

    def as_status(self) -> dict[str, Any]:
        """The body of the apiserver's 422 response."""
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": "Invalid",
            "details": {
                "name": self.name,
                "group": self.group,
                "kind": self.kind,
                "causes": [error.as_cause() for error in self.errors],
            },
            "code": 422,
        }


@dataclass(frozen=True)
class Admitted:
    """The object as it is stored: pruned and defaulted. `pruned` names the unknown fields dropped."""

    obj: dict[str, Any]
    pruned: tuple[str, ...] = field(default=())


def admit(
    obj: Mapping[str, Any],
    schema: Mapping[str, Any],
    *,
    kind: str,
    group: str,
    old: Mapping[str, Any] | None = None,
) -> Admitted:
    """Prune, default and validate a custom resource; raise InvalidObject naming the bad fields."""
    pruned: list[str] = []
    value = prune(copy.deepcopy(dict(obj)), schema, [], pruned, root=True)
    apply_defaults(value, schema)
    errors = validate_schema(value, schema)
    if not errors:
        errors = validate_rules(value, schema, old=old if old is not None else ABSENT)
    if errors:
        name = value.get("metadata", {}).get("name") or value.get("metadata", {}).get("generateName", "")
        raise InvalidObject(kind, group, name, errors)
    return Admitted(value, tuple(pruned))


# --- pruning -----------------------------------------------------------------------------------------


def prune(
    value: Any, schema: Mapping[str, Any], path: list[str | int], pruned: list[str], *, root: bool = False
) -> Any:
    """Drop fields the schema does not declare, recording their paths (mutates and returns `value`)."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        keep_meta = root or schema.get("x-kubernetes-embedded-resource") is True
        for key in list(value):
            if keep_meta and key in ("apiVersion", "kind", "metadata"):
                continue  # ObjectMeta is the apiserver's, never the schema's
            if properties is not None and key in properties:
                value[key] = prune(value[key], properties[key], [*path, key], pruned)
            elif isinstance(additional, Mapping):
                value[key] = prune(value[key], additional, [*path, key], pruned)
            elif not preserve:
                pruned.append(render_path([*path, key]))
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            value[index] = prune(item, schema["items"], [*path, index], pruned)
    return value


# --- defaulting --------------------------------------------------------------------------------------


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """Fill absent (or null, where not nullable) properties from `default`, then recurse (mutates)."""
    if isinstance(value, dict):
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop and (key not in value or (value[key] is None and not prop.get("nullable"))):
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                apply_defaults(value[key], prop)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key in value:
                apply_defaults(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply_defaults(item, schema["items"])


# --- OpenAPI schema ----------------------------------------------------------------------------------


def validate_schema(
    value: Any, schema: Mapping[str, Any], path: Sequence[str | int] = ()
) -> list[FieldError]:
    """Every OpenAPI v3 (structural) violation in `value`, in document order."""
    errors: list[FieldError] = []
    _validate(value, schema, list(path), errors)
    return errors


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_matches(value: Any, expected: str) -> bool:
    actual = _json_type(value)
    if expected == "number":
        return actual in ("integer", "number")
    if expected == "integer":
        # The apiserver's JSON decoder reads 3.0 as an integer.
        return actual == "integer" or (actual == "number" and math.isfinite(value) and value == int(value))
    return actual == expected


def _type_error(path: list[str | int], value: Any, expected: str) -> FieldError:
    where = render_path(path)
    got = _json_type(value)
    return FieldError(
        where, "FieldValueInvalid", f"{where} in body must be of type {expected}: {json.dumps(got)}", got
    )


def _validate(value: Any, schema: Mapping[str, Any], path: list[str | int], errors: list[FieldError]) -> None:
    where = render_path(path)
    if value is None:
        if not schema.get("nullable") and (schema.get("type") or schema.get("x-kubernetes-int-or-string")):
            errors.append(_type_error(path, value, schema.get("type") or "integer or string"))
        return
    if schema.get("x-kubernetes-int-or-string"):
        if _json_type(value) not in ("integer", "string"):
            errors.append(_type_error(path, value, "integer or string"))
            return
    elif (expected := schema.get("type")) and not _type_matches(value, expected):
        errors.append(_type_error(path, value, expected))
        return

    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(render_value(v) for v in schema["enum"])
        errors.append(FieldError(where, "FieldValueNotSupported", f"supported values: {supported}", value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        _validate_number(value, schema, where, errors)
    elif isinstance(value, str):
        _validate_string(value, schema, where, errors)
    elif isinstance(value, list):
        _validate_array(value, schema, path, errors)
    elif isinstance(value, dict):
        _validate_object(value, schema, path, errors)
    _validate_combinators(value, schema, path, errors)


def _validate_number(value: float, schema: Mapping[str, Any], where: str, errors: list[FieldError]) -> None:
    def invalid(detail: str) -> None:
        errors.append(FieldError(where, "FieldValueInvalid", f"{where} in body {detail}", value))

    if "minimum" in schema:
        if schema.get("exclusiveMinimum") and value <= schema["minimum"]:
            invalid(f"should be greater than {schema['minimum']}")
        elif value < schema["minimum"]:
            invalid(f"should be greater than or equal to {schema['minimum']}")
    if "maximum" in schema:
        if schema.get("exclusiveMaximum") and value >= schema["maximum"]:
            invalid(f"should be less than {schema['maximum']}")
        elif value > schema["maximum"]:
            invalid(f"should be less than or equal to {schema['maximum']}")
    if "multipleOf" in schema and value % schema["multipleOf"] != 0:
        invalid(f"should be a multiple of {schema['multipleOf']}")
    bounds = _INT_BOUNDS.get(schema.get("format", ""))
    if bounds and not bounds[0] <= value <= bounds[1]:
        invalid(f"must be of type {schema['format']}: {render_value(value)}")


def _validate_string(value: str, schema: Mapping[str, Any], where: str, errors: list[FieldError]) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(
            FieldError(where, "FieldValueTooLong", f"may not be longer than {schema['maxLength']}", value)
        )
    if "minLength" in schema and len(value) < schema["minLength"]:
        detail = f"{where} in body should be at least {schema['minLength']} chars long"
        errors.append(FieldError(where, "FieldValueInvalid", detail, value))
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(
            FieldError(
                where, "FieldValueInvalid", f"{where} in body should match '{schema['pattern']}'", value
            )
        )
    fmt = schema.get("format")
    if fmt and not _format_ok(fmt, value):
        errors.append(
            FieldError(
                where,
                "FieldValueInvalid",
                f"{where} in body must be of type {fmt}: {render_value(value)}",
                value,
            )
        )


def _format_ok(fmt: str, value: str) -> bool:
    if fmt == "date-time":
        return bool(_RFC3339.match(value))
    if fmt == "date":
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            return False
        return True
    if fmt == "byte":
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            return False
        return True
    return True  # formats the apiserver does not check, or that this harness does not need


def _validate_array(
    value: list[Any], schema: Mapping[str, Any], path: list[str | int], errors: list[FieldError]
) -> None:
    where = render_path(path)
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(
            FieldError(
                where, "FieldValueTooMany", f"must have at most {schema['maxItems']} items", len(value)
            )
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        detail = f"{where} in body should have at least {schema['minItems']} items"
        errors.append(FieldError(where, "FieldValueInvalid", detail, len(value)))
    items = schema.get("items")
    if isinstance(items, Mapping):
        for index, item in enumerate(value):
            _validate(item, items, [*path, index], errors)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type in ("set", "map"):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for index, item in enumerate(value):
            identity = (
                item
                if list_type == "set"
                else {k: item.get(k) for k in keys}
                if isinstance(item, dict)
                else item
            )
            marker = json.dumps(identity, sort_keys=True)
            if marker in seen:
                errors.append(FieldError(render_path([*path, index]), "FieldValueDuplicate", "", identity))
            seen.add(marker)


def _validate_object(
    value: dict[str, Any], schema: Mapping[str, Any], path: list[str | int], errors: list[FieldError]
) -> None:
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(FieldError(render_path([*path, key]), "FieldValueRequired"))
    properties = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    is_root_meta = not path or schema.get("x-kubernetes-embedded-resource") is True
    for key, item in value.items():
        if is_root_meta and key == "metadata":
            # ObjectMeta is the apiserver's; only a declared name/generateName schema applies to it.
            declared = (properties.get("metadata") or {}).get("properties") or {}
            for meta_key in ("name", "generateName"):
                if meta_key in declared and isinstance(item, dict) and meta_key in item:
                    _validate(item[meta_key], declared[meta_key], [*path, "metadata", meta_key], errors)
            continue
        if key in properties:
            _validate(item, properties[key], [*path, key], errors)
        elif isinstance(additional, Mapping):
            _validate(item, additional, [*path, key], errors)
    where = render_path(path)
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(
            FieldError(
                where, "FieldValueTooMany", f"must have at most {schema['maxProperties']} items", len(value)
            )
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        detail = f"{where} in body should have at least {schema['minProperties']} properties"
        errors.append(FieldError(where, "FieldValueInvalid", detail, len(value)))


def _validate_combinators(
    value: Any, schema: Mapping[str, Any], path: list[str | int], errors: list[FieldError]
) -> None:
    where = render_path(path)
    if "allOf" in schema:
        for sub in schema["allOf"]:
            _validate(value, sub, path, errors)
    if "anyOf" in schema and not any(not validate_schema(value, sub, path) for sub in schema["anyOf"]):
        errors.append(
            FieldError(
                where, "FieldValueInvalid", f"{where} in body must match at least one schema in anyOf", value
            )
        )
    if "oneOf" in schema and sum(not validate_schema(value, sub, path) for sub in schema["oneOf"]) != 1:
        errors.append(
            FieldError(
                where, "FieldValueInvalid", f"{where} in body must match exactly one schema in oneOf", value
            )
        )
    if "not" in schema and not validate_schema(value, schema["not"], path):
        errors.append(
            FieldError(where, "FieldValueInvalid", f"{where} in body must not match the schema in not", value)
        )


# --- CEL rules ---------------------------------------------------------------------------------------


def rules_of(schema: Mapping[str, Any]) -> list[ValidationRule]:
    return [ValidationRule.from_schema(entry) for entry in schema.get("x-kubernetes-validations") or []]


def validate_rules(value: Any, schema: Mapping[str, Any], *, old: Any = ABSENT) -> list[FieldError]:
    """Every failing `x-kubernetes-validations` rule; transition rules see `old` (ABSENT on create)."""
    errors: list[FieldError] = []
    _check_rules(value, old, schema, [], errors)
    return errors


def _check_rules(
    value: Any, old: Any, schema: Mapping[str, Any], path: list[str | int], errors: list[FieldError]
) -> None:
    if value is None:
        return
    has_old = old is not ABSENT
    for rule in rules_of(schema):
        if not rule.applies(has_old):
            continue
        field_path, field_value = _resolve_field_path(path, value, rule.field_path)
        try:
            if rule.evaluate(value, schema, old if has_old else None, has_old):
                continue
            detail = rule.render_message(value, schema)
        except CELEvaluationError as exc:
            # Like cel.Validator: reported at the rule's own node, never its fieldPath.
            errors.append(
                FieldError(
                    render_path(path),
                    "FieldValueInvalid",
                    f"{exc.reason} evaluating rule: {(rule.message or rule.rule).strip()}",
                    schema.get("type") or "object",
                )
            )
            continue
        # Like the apiserver, name the type instead of dumping a whole object or list.
        shown = {dict: "object", list: "array"}.get(type(field_value), field_value)
        errors.append(FieldError(render_path(field_path), rule.reason, detail, shown))

    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            child = properties.get(key) or (additional if isinstance(additional, Mapping) else None)
            if child is not None:
                old_item = old.get(key, ABSENT) if isinstance(old, dict) else ABSENT
                _check_rules(item, old_item, child, [*path, key], errors)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        old_by_key = _correlate_list(old, schema)
        for index, item in enumerate(value):
            old_item = old_by_key.get(_list_key(item, schema), ABSENT) if old_by_key else ABSENT
            _check_rules(item, old_item, schema["items"], [*path, index], errors)


def _list_key(item: Any, schema: Mapping[str, Any]) -> str:
    keys = schema.get("x-kubernetes-list-map-keys") or []
    identity = {k: item.get(k) for k in keys} if isinstance(item, dict) else item
    return json.dumps(identity, sort_keys=True)


def _correlate_list(old: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """Old items by identity: only map and set lists correlate across updates (as in Kubernetes)."""
    if not isinstance(old, list) or schema.get("x-kubernetes-list-type") not in ("map", "set"):
        return {}
    return {_list_key(item, schema): item for item in old}


def _resolve_field_path(
    path: list[str | int], value: Any, field_path: str | None
) -> tuple[list[str | int], Any]:
    """Where a rule's `fieldPath` (`.max`, `['a.b']`) points, and the value found there."""
    if not field_path:
        return path, value
    parts: list[str | int] = [m.group(1) or m.group(2) for m in _FIELD_PATH_PART.finditer(field_path)]
    found: Any = value
    for part in parts:
        found = found.get(part, ABSENT) if isinstance(found, dict) else ABSENT
    return [*path, *parts], found
