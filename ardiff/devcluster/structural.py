"""A CRD version's `openAPIV3Schema` checked as kube-apiserver checks it when the CRD is created.

`schema_errors(schema, where)` ports the rules of k8s.io/apiextensions-apiserver (Kubernetes 1.28+):
- structural schemas (`pkg/apiserver/schema/validation.go`): a `type` everywhere except under
  `x-kubernetes-int-or-string`/`x-kubernetes-preserve-unknown-fields`, `items` for arrays, nothing but
  `name`/`generateName` in the root `metadata`, no `additionalProperties` at the root, value validations
  (`anyOf`/`allOf`/`oneOf`/`not`) that only restrict (no `type`, `default`, `description`, `nullable`,
  `x-kubernetes-*`, nested `metadata`), patterns that compile;
- `ValidateCustomResourceDefinitionOpenAPISchema` (`pkg/apis/apiextensions/validation/validation.go`):
  `uniqueItems`, `additionalProperties` with `properties`, `default` in the top-level metadata,
  `x-kubernetes-preserve-unknown-fields: false`, `x-kubernetes-map-type`, `x-kubernetes-list-type` and
  `x-kubernetes-list-map-keys` (keys are scalar properties, required or defaulted, not nullable; set items
  are atomic), and each `x-kubernetes-validations` entry: rule/message/messageExpression/reason/fieldPath
  (a fieldPath must resolve in the schema), a rule that compiles against the schema (`cel_check`),
  `oldSelf` only where old and new values correlate, and the cost budget (per rule, times the node's
  cardinality, and for the whole schema);
- defaults (`pkg/apiserver/schema/defaulting/validation.go`): each `default` must be pruned (no unknown
  fields) and valid against its node's schema and then its node's CEL rules, as written (nested defaults are
  not applied first).
Not ported: the structural "completeness" check (every field a value validation names is also declared
outside it) and `x-kubernetes-embedded-resource` metadata checks; the rest of the CRD is `crd.py`'s.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from ardiff.devcluster.cel import RULE_REASONS, CELCompileError
from ardiff.devcluster.cel_check import (
    CRD_COST_LIMIT,
    OLDEST_SUPPORTED_ENV,
    PER_RULE_COST_LIMIT,
    CELCheckError,
    cardinality,
    check_expression,
    cost_error,
    root_schema,
    schema_type,
)
from ardiff.devcluster.validation import FieldError, prune, validate_rules, validate_schema

_TYPES: Final = ("array", "boolean", "integer", "number", "object", "string")
_INT_OR_STRING_ANY_OF: Final = [{"type": "integer"}, {"type": "string"}]
_FORBIDDEN_IN_VALUE_VALIDATION: Final = (
    ("type", "must be empty to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)
_FIELD_PATH_TOKEN: Final = re.compile(r"\.([^.\[\]]*)|\[\s*'((?:[^'\\]|\\.)*)'\s*\]")


@dataclass(frozen=True)
class _Context:
    """What a node inherits from the nodes above it."""

    root: bool = True
    level: str = "at the root"  # how upstream names a missing type's place
    forbid_defaults: str | None = None
    uncorrelatable: str | None = None  # where oldSelf stops being usable
    above: tuple[Mapping[str, Any], ...] = ()  # schemas from the root down to the parent
    compatibility: tuple[int, int] = OLDEST_SUPPORTED_ENV


@dataclass
class _Walk:
    errors: list[FieldError]  # OpenAPI and structural errors
    cel_errors: list[FieldError]
    structural: int = 0  # how many of `errors` are structural ones (they stop the defaults' check)
    total_cost: int = 0
    expensive: list[tuple[int, str]] = field(default_factory=list)  # rules costing >= 1% of the CRD limit


def schema_errors(
    schema: Mapping[str, Any], where: str, *, compatibility: tuple[int, int] = OLDEST_SUPPORTED_ENV
) -> list[FieldError]:
    """Every reason a real apiserver refuses this `openAPIV3Schema` (at `where`), schema errors first."""
    walk = _Walk([], [])
    _node(schema, where, _Context(compatibility=compatibility), walk)
    errors = walk.errors + walk.cel_errors
    if walk.total_cost > CRD_COST_LIMIT:
        for _, rule_at in sorted(walk.expensive, reverse=True)[:4]:
            detail = (
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema"
            )
            errors.append(FieldError(rule_at, "FieldValueForbidden", detail))
        detail = cost_error(
            "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
            walk.total_cost,
            CRD_COST_LIMIT,
        )
        errors.append(FieldError(where, "FieldValueForbidden", detail))
    if not walk.structural:
        # Rules that do not compile are not run on defaults (upstream only runs compiled programs).
        errors.extend(_default_errors(schema, where, root=True, run_rules=not walk.cel_errors))
    return errors


def _node(schema: Mapping[str, Any], where: str, ctx: _Context, walk: _Walk) -> None:
    errors_before = len(walk.errors)
    structural = list(_structural(schema, where, ctx))
    walk.structural += len(structural)
    walk.errors.extend(structural)
    walk.errors.extend(_openapi(schema, where, ctx))
    child_above = (*ctx.above, schema)
    props = schema.get("properties") or {}
    map_correlates = schema.get("x-kubernetes-map-type", "granular") == "granular"
    for key, child in props.items():
        child_where = f"{where}.properties[{key}]"
        child_ctx = replace(ctx, root=False, level="for specified object fields", above=child_above)
        if not map_correlates and ctx.uncorrelatable is None:
            child_ctx = replace(child_ctx, uncorrelatable=where)
        if ctx.root and key in ("metadata", "kind", "apiVersion"):
            child_ctx = replace(child_ctx, forbid_defaults=f"in top-level {key}")
        _node(child, child_where, child_ctx, walk)
    additional = schema.get("additionalProperties")
    if isinstance(additional, Mapping):
        child_ctx = replace(ctx, root=False, level="for specified object fields", above=child_above)
        _node(additional, f"{where}.additionalProperties", child_ctx, walk)
    items = schema.get("items")
    if isinstance(items, Mapping):
        child_ctx = replace(ctx, root=False, level="for specified array items", above=child_above)
        if schema.get("x-kubernetes-list-type") != "map" and ctx.uncorrelatable is None:
            child_ctx = replace(child_ctx, uncorrelatable=where)
        _node(items, f"{where}.items", child_ctx, walk)
    walk.errors.extend(_rule_entry_errors(schema, where))
    # Like upstream, rules compile only where no schema error was found at this node or below it.
    if len(walk.errors) == errors_before and schema.get("x-kubernetes-validations"):
        _compile_rules(schema, where, ctx, walk)


def _structural(schema: Mapping[str, Any], where: str, ctx: _Context) -> Iterator[FieldError]:
    kind = schema.get("type")
    if kind == "array" and "items" not in schema:
        yield FieldError(f"{where}.items", "FieldValueRequired", "must be specified")
    if ctx.root and "additionalProperties" in schema:
        yield FieldError(
            f"{where}.additionalProperties", "FieldValueForbidden", "must not be used at the root"
        )
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    if schema.get("x-kubernetes-embedded-resource") is True and kind != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        yield _required_or_invalid(f"{where}.type", kind, detail)
    elif not kind and not int_or_string and not preserve:
        yield FieldError(f"{where}.type", "FieldValueRequired", f"must not be empty {ctx.level}")
    if kind and kind not in _TYPES:
        supported = ", ".join(f'"{t}"' for t in _TYPES)
        yield FieldError(f"{where}.type", "FieldValueNotSupported", f"supported values: {supported}", kind)
    if int_or_string and preserve:
        detail = "must be false if x-kubernetes-int-or-string is true"
        yield FieldError(f"{where}.x-kubernetes-preserve-unknown-fields", "FieldValueInvalid", detail, True)
    if ctx.root and kind and kind != "object":
        yield FieldError(f"{where}.type", "FieldValueInvalid", "must be object at the root", kind)
    props = schema.get("properties") or {}
    if ctx.root:
        for key in ("kind", "apiVersion"):
            if key in props and props[key].get("type") != "string":
                yield FieldError(
                    f"{where}.properties[{key}].type",
                    "FieldValueInvalid",
                    "must be string",
                    props[key].get("type"),
                )
        if "metadata" in props:
            yield from _root_metadata(props["metadata"], f"{where}.properties[metadata]")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except re.error as exc:
            detail = f"must be a valid regular expression, but isn't: {exc}"
            yield FieldError(f"{where}.pattern", "FieldValueInvalid", detail, schema["pattern"])
    skip_any_of = schema.get("anyOf") == _INT_OR_STRING_ANY_OF
    for junctor in ("anyOf", "allOf", "oneOf"):
        for index, sub in enumerate(schema.get(junctor) or ()):
            skip = junctor == "anyOf" and skip_any_of
            yield from _value_validation(sub, f"{where}.{junctor}[{index}]", skip)
    if isinstance(schema.get("not"), Mapping):
        yield from _value_validation(schema["not"], f"{where}.not", False)


def _root_metadata(meta: Mapping[str, Any], where: str) -> Iterator[FieldError]:
    if meta.get("type") != "object":
        yield FieldError(f"{where}.type", "FieldValueInvalid", "must be object", meta.get("type", ""))
    allowed = {"type", "properties", "default"}
    if set(meta) - allowed or set(meta.get("properties") or {}) - {"name", "generateName"}:
        detail = (
            "must not specify anything other than name and generateName, but metadata is implicitly specified"
        )
        yield FieldError(where, "FieldValueForbidden", detail)


def _value_validation(sub: Mapping[str, Any], where: str, skip_any_of: bool) -> Iterator[FieldError]:
    """A schema under anyOf/allOf/oneOf/not: it may only restrict what the structural part declares."""
    if skip_any_of:
        return  # the x-kubernetes-int-or-string pattern `anyOf: [{type: integer}, {type: string}]`
    for key, detail in _FORBIDDEN_IN_VALUE_VALIDATION:
        if sub.get(key) not in (None, False, "", []):
            yield FieldError(f"{where}.{key}", "FieldValueForbidden", detail)
    if "additionalProperties" in sub:
        yield FieldError(
            f"{where}.additionalProperties", "FieldValueForbidden", "must be undefined to be structural"
        )
    if "metadata" in (sub.get("properties") or {}):
        yield FieldError(
            f"{where}.properties[metadata]",
            "FieldValueForbidden",
            "must not be specified in a nested context",
        )
    for key, child in (sub.get("properties") or {}).items():
        yield from _value_validation(child, f"{where}.properties[{key}]", False)
    if isinstance(sub.get("items"), Mapping):
        yield from _value_validation(sub["items"], f"{where}.items", False)


def _required_or_invalid(where: str, value: Any, detail: str) -> FieldError:
    if value in (None, ""):
        return FieldError(where, "FieldValueRequired", detail)
    return FieldError(where, "FieldValueInvalid", detail, value)


def _openapi(schema: Mapping[str, Any], where: str, ctx: _Context) -> Iterator[FieldError]:
    if "default" in schema and ctx.forbid_defaults:
        yield FieldError(f"{where}.default", "FieldValueForbidden", f"must not be set {ctx.forbid_defaults}")
    for key in (
        "id",
        "additionalItems",
        "patternProperties",
        "definitions",
        "dependencies",
        "$ref",
        "$schema",
    ):
        if key in schema:
            yield FieldError(f"{where}.{key}", "FieldValueForbidden", f"{key} is not supported")
    if schema.get("uniqueItems") is True:
        detail = "uniqueItems cannot be set to true since the runtime complexity becomes quadratic"
        yield FieldError(f"{where}.uniqueItems", "FieldValueForbidden", detail)
    additional = schema.get("additionalProperties")
    if schema.get("properties") and additional is not None and additional is not True:
        detail = "additionalProperties and properties are mutual exclusive"
        yield FieldError(f"{where}.additionalProperties", "FieldValueForbidden", detail)
    if schema.get("x-kubernetes-preserve-unknown-fields") is False:
        yield FieldError(
            f"{where}.x-kubernetes-preserve-unknown-fields",
            "FieldValueInvalid",
            "must be true or undefined",
            False,
        )
    kind = schema.get("type")
    map_type = schema.get("x-kubernetes-map-type")
    if map_type is not None:
        if kind != "object":
            yield _required_or_invalid(
                f"{where}.type", kind, "must be object if x-kubernetes-map-type is specified"
            )
        if map_type not in ("atomic", "granular"):
            detail = 'supported values: "atomic", "granular"'
            yield FieldError(f"{where}.x-kubernetes-map-type", "FieldValueNotSupported", detail, map_type)
    yield from _list_type(schema, where)


def _list_type(schema: Mapping[str, Any], where: str) -> Iterator[FieldError]:
    list_type = schema.get("x-kubernetes-list-type")
    keys = schema.get("x-kubernetes-list-map-keys") or []
    items = schema.get("items") if isinstance(schema.get("items"), Mapping) else None
    if list_type is not None and schema.get("type") != "array":
        detail = "must be array if x-kubernetes-list-type is specified"
        yield _required_or_invalid(f"{where}.type", schema.get("type"), detail)
    elif list_type == "set" and items is not None:
        if items.get("type") == "array" and items.get("x-kubernetes-list-type", "atomic") != "atomic":
            detail = "must be atomic as item of a list with x-kubernetes-list-type=set"
            yield FieldError(f"{where}.items.x-kubernetes-list-type", "FieldValueInvalid", detail)
        if items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
            detail = "must be atomic as item of a list with x-kubernetes-list-type=set"
            yield FieldError(f"{where}.items.x-kubernetes-map-type", "FieldValueInvalid", detail)
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        detail = 'supported values: "atomic", "map", "set"'
        yield FieldError(f"{where}.x-kubernetes-list-type", "FieldValueNotSupported", detail, list_type)
    if keys and list_type != "map":
        detail = "must be map if x-kubernetes-list-map-keys is non-empty"
        yield _required_or_invalid(f"{where}.x-kubernetes-list-type", list_type, detail)
    if list_type == "map":
        if not keys:
            detail = "must not be empty if x-kubernetes-list-type is map"
            yield FieldError(f"{where}.x-kubernetes-list-map-keys", "FieldValueRequired", detail)
        if items is None:
            detail = "must have a schema if x-kubernetes-list-type is map"
            yield FieldError(f"{where}.items", "FieldValueRequired", detail)
        elif items.get("type") != "object":
            detail = "must be object if parent array's x-kubernetes-list-type is map"
            yield FieldError(f"{where}.items.type", "FieldValueInvalid", detail, items.get("type", ""))
        else:
            props = items.get("properties") or {}
            for index, key in enumerate(keys):
                if key not in props:
                    detail = "entries must all be names of item properties"
                    yield FieldError(f"{where}.x-kubernetes-list-map-keys", "FieldValueInvalid", detail, keys)
                elif props[key].get("type") in ("array", "object"):
                    detail = "must be a scalar type if parent array's x-kubernetes-list-type is map"
                    yield FieldError(
                        f"{where}.items.properties[{key}].type", "FieldValueInvalid", detail, "object"
                    )
                if key in keys[:index]:
                    detail = "must not contain duplicate entries"
                    yield FieldError(f"{where}.x-kubernetes-list-map-keys", "FieldValueInvalid", detail, keys)
    if list_type in ("set", "map") and items is not None:
        if items.get("nullable"):
            detail = f"cannot be nullable when x-kubernetes-list-type is {list_type}"
            yield FieldError(f"{where}.items.nullable", "FieldValueForbidden", detail)
        props = items.get("properties") or {}
        for key in keys if list_type == "map" else ():
            if key not in props:
                continue
            if key not in (items.get("required") or ()) and "default" not in props[key]:
                detail = (
                    "this property is in x-kubernetes-list-map-keys, so it must have a default or be a "
                    "required property"
                )
                yield FieldError(f"{where}.items.properties[{key}].default", "FieldValueRequired", detail)
            if props[key].get("nullable"):
                detail = "this property is in x-kubernetes-list-map-keys, so it cannot be nullable"
                yield FieldError(f"{where}.items.properties[{key}].nullable", "FieldValueForbidden", detail)


def _rule_entry_errors(schema: Mapping[str, Any], where: str) -> Iterator[FieldError]:
    """The checks of each x-kubernetes-validations entry that need no compiler."""
    for index, entry in enumerate(schema.get("x-kubernetes-validations") or ()):
        at = f"{where}.x-kubernetes-validations[{index}]"
        rule = str(entry.get("rule") or "").strip()
        message = entry.get("message")
        if not rule:
            yield FieldError(f"{at}.rule", "FieldValueRequired", "rule is not specified")
        elif message is not None and message != "" and not message.strip():
            yield FieldError(f"{at}.message", "FieldValueInvalid", "must be non-empty if specified", message)
        elif message and re.search(r"[\n\r]", message.strip()):
            yield FieldError(f"{at}.message", "FieldValueInvalid", "must not contain line breaks", message)
        elif re.search(r"[\n\r]", rule) and not (message or "").strip():
            detail = "message must be specified if rule contains line breaks"
            yield FieldError(f"{at}.message", "FieldValueRequired", detail)
        expression = entry.get("messageExpression")
        if expression is not None and expression != "" and not expression.strip():
            detail = "messageExpression must be non-empty if specified"
            yield FieldError(f"{at}.messageExpression", "FieldValueRequired", detail)
        if "reason" in entry and entry["reason"] not in RULE_REASONS:
            supported = ", ".join(f'"{r}"' for r in sorted(RULE_REASONS))
            yield FieldError(
                f"{at}.reason", "FieldValueNotSupported", f"supported values: {supported}", entry["reason"]
            )
        field_path = entry.get("fieldPath")
        if field_path:
            if not field_path.strip():
                yield FieldError(
                    f"{at}.fieldPath", "FieldValueInvalid", "must be non-empty if specified", field_path
                )
            elif re.search(r"[\n\r]", field_path):
                yield FieldError(
                    f"{at}.fieldPath", "FieldValueInvalid", "must not contain line breaks", field_path
                )
            elif (problem := field_path_problem(field_path, schema)) is not None:
                # Kubernetes 1.28-1.30 say "fieldPath must be a valid path", later "must be a valid path".
                yield FieldError(
                    f"{at}.fieldPath",
                    "FieldValueInvalid",
                    f"fieldPath must be a valid path: {problem}",
                    field_path,
                )


def field_path_problem(field_path: str, schema: Mapping[str, Any]) -> str | None:
    """Why `fieldPath` does not resolve in the structural schema (cel.ValidFieldPath), or None if it does."""
    position = 0
    node = schema
    for match in _FIELD_PATH_TOKEN.finditer(field_path):
        if match.start() != position:
            return f"expected [ or . but got: {field_path[position : match.start()]}"
        position = match.end()
        name = match.group(1) if match.group(1) is not None else match.group(2)
        if name == "":
            return "unexpected end of JSON path"
        if node.get("properties") is not None:
            if name not in node["properties"]:
                return "does not refer to a valid field"
            node = node["properties"][name]
        elif isinstance(node.get("additionalProperties"), Mapping):
            node = node["additionalProperties"]
        else:
            return "does not refer to a valid field"
    if position != len(field_path):
        return f"expected [ or . but got: {field_path[position:]}"
    return None


def _compile_rules(schema: Mapping[str, Any], where: str, ctx: _Context, walk: _Walk) -> None:
    self_schema = root_schema(schema) if ctx.root else schema
    self_type = schema_type(self_schema)
    count, unbounded_above = cardinality(ctx.above)
    for index, entry in enumerate(schema["x-kubernetes-validations"]):
        at = f"{where}.x-kubernetes-validations[{index}]"
        shown = dict(entry)
        try:
            checked = check_expression(
                entry["rule"], self_type, old_self=True, compatibility=ctx.compatibility
            )
        except CELCheckError as exc:
            walk.cel_errors.append(FieldError(f"{at}.rule", "FieldValueInvalid", str(exc), shown))
            continue
        cost = min(checked.cost * count, 2**64 - 1)
        walk.total_cost += cost
        if cost >= CRD_COST_LIMIT // 100:
            walk.expensive.append((cost, f"{at}.rule"))
        if checked.type.kind not in ("bool", "dyn"):
            walk.cel_errors.append(
                FieldError(f"{at}.rule", "FieldValueInvalid", "cel expression must evaluate to a bool", shown)
            )
        if cost > PER_RULE_COST_LIMIT:
            walk.cel_errors.append(
                FieldError(
                    f"{at}.rule",
                    "FieldValueForbidden",
                    cost_error("estimated rule cost", cost, PER_RULE_COST_LIMIT),
                )
            )
        elif checked.unbounded or unbounded_above:
            reasons = "; ".join([*checked.unbounded, *([unbounded_above] if unbounded_above else [])])
            detail = (
                f"estimated rule cost cannot be bounded: {reasons} (the dev cluster refuses what "
                "kube-apiserver would estimate from the 3 MiB request limit; declare maxLength, maxItems or "
                "maxProperties)"
            )
            walk.cel_errors.append(FieldError(f"{at}.rule", "FieldValueForbidden", detail))
        if "messageExpression" in entry:
            try:
                message = check_expression(
                    entry["messageExpression"], self_type, old_self=True, compatibility=ctx.compatibility
                )
            except CELCheckError as exc:
                detail = f"messageExpression {exc}"
                walk.cel_errors.append(
                    FieldError(f"{at}.messageExpression", "FieldValueInvalid", detail, shown)
                )
            else:
                if message.type.kind not in ("string", "dyn"):
                    detail = "messageExpression must evaluate to a string"
                    walk.cel_errors.append(
                        FieldError(f"{at}.messageExpression", "FieldValueInvalid", detail, shown)
                    )
                walk.total_cost += message.cost
        if checked.uses_old_self and ctx.uncorrelatable is not None:
            within = ctx.uncorrelatable
            detail = f"oldSelf cannot be used on the uncorrelatable portion of the schema within {within}"
            walk.cel_errors.append(FieldError(f"{at}.rule", "FieldValueInvalid", detail, entry["rule"]))
        elif "optionalOldSelf" in entry:
            # optionalOldSelf arrived in Kubernetes 1.29 (a 1.28 server drops the field).
            detail = "optionalOldSelf is not supported by Kubernetes 1.28"
            walk.cel_errors.append(FieldError(f"{at}.optionalOldSelf", "FieldValueForbidden", detail))


def _default_errors(
    schema: Mapping[str, Any], where: str, *, root: bool = False, run_rules: bool = True
) -> Iterator[FieldError]:
    """Each default must be pruned and valid against its node's schema and rules, as written."""
    if "default" in schema:
        default = schema["default"]
        at = f"{where}.default"
        pruned: list[str] = []
        if prune(copy.deepcopy(default), schema, [], pruned) != default or pruned:
            yield FieldError(at, "FieldValueInvalid", "must not have unknown fields", default)
        elif errors := validate_schema(default, schema):
            yield from (replace(e, field=_under(at, e.field)) for e in errors)
        elif run_rules:
            try:
                failures = validate_rules(default, schema, old=default)
            except CELCompileError:
                return  # the rule's compile error is reported already
            yield from (replace(e, field=_under(at, e.field)) for e in failures)
    for key, child in (schema.get("properties") or {}).items():
        if root and key in ("metadata", "kind", "apiVersion"):
            continue  # defaults there are forbidden, see _openapi
        yield from _default_errors(child, f"{where}.properties[{key}]", run_rules=run_rules)
    if isinstance(schema.get("items"), Mapping):
        yield from _default_errors(schema["items"], f"{where}.items", run_rules=run_rules)


def _under(prefix: str, path: str) -> str:
    if path == "<root>":
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"
