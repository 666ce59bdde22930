"""CEL rules of a CRD (`x-kubernetes-validations`), compiled and evaluated with cel-python.

Kubernetes evaluates each rule with `self` bound to the value at the schema node that declares it and,
for transition rules (those that mention `oldSelf`), `oldSelf` bound to the previous value on update.
Values are converted by their schema, as the apiserver does: a `type: number` field is a CEL double
even when the JSON holds an integer. Type checking against the schema and the cost estimate happen when
the CRD is created (`cel_check.py`); the Kubernetes CEL extension libraries are not evaluated here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

# The reasons a rule may declare (apiextensions `x-kubernetes-validations[].reason`).
RULE_REASONS = ("FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate")

_OLD_SELF = re.compile(r"\boldSelf\b")
_MISSING_KEY = re.compile(r"no such member in mapping: '([^']*)'")


class CELCompileError(ValueError):
    """A rule or message expression that does not parse."""


class CELEvaluationError(ValueError):
    """A rule that failed to evaluate (e.g. it read a field that is absent) or did not yield a bool."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message  # in cel-go's words where known, e.g. "no such key: max"


@cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


@cache
def compile_expression(source: str) -> celpy.Runner:
    """Compile once per distinct source; the programs are reused for every object."""
    env = _environment()
    try:
        return env.program(env.compile(source))
    except celpy.CELParseError as exc:
        raise CELCompileError(f"compilation failed: {exc}") from exc


@dataclass(frozen=True)
class ValidationRule:
    """One `x-kubernetes-validations` entry, compiled."""

    rule: str
    message: str | None = None
    message_expression: str | None = None
    reason: str = "FieldValueInvalid"
    field_path: str | None = None
    optional_old_self: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.rule, str) or not self.rule.strip():
            raise CELCompileError(f"CEL rule must be a non-empty string, got {self.rule!r}")
        if self.reason not in RULE_REASONS:
            raise CELCompileError(f"CEL rule reason must be one of {RULE_REASONS}, got {self.reason!r}")
        compile_expression(self.rule)
        if self.message_expression is not None:
            compile_expression(self.message_expression)

    @classmethod
    def from_schema(cls, entry: Mapping[str, Any]) -> ValidationRule:
        return cls(
            rule=entry.get("rule"),  # type: ignore[arg-type]  # checked in __post_init__
            message=entry.get("message"),
            message_expression=entry.get("messageExpression"),
            reason=entry.get("reason", "FieldValueInvalid"),
            field_path=entry.get("fieldPath"),
            optional_old_self=bool(entry.get("optionalOldSelf", False)),
        )

    @property
    def is_transition_rule(self) -> bool:
        return bool(_OLD_SELF.search(self.rule))

    def applies(self, has_old: bool) -> bool:
        """Transition rules only run on update, where an old value exists (unless optionalOldSelf)."""
        return not self.is_transition_rule or has_old or self.optional_old_self

    def evaluate(self, value: Any, schema: Mapping[str, Any], old: Any = None, has_old: bool = False) -> bool:
        """True when the rule holds. Raises CELEvaluationError when it cannot be evaluated."""
        activation: dict[str, Any] = {"self": to_cel(value, schema)}
        if self.is_transition_rule:
            activation["oldSelf"] = to_cel(old, schema) if has_old else None
        result = _run(self.rule, activation)
        if not isinstance(result, celtypes.BoolType):
            raise CELEvaluationError(f"rule {self.rule!r} must evaluate to a bool, got {result!r}")
        return bool(result)

    def render_message(self, value: Any, schema: Mapping[str, Any]) -> str:
        """The message an apiserver reports when the rule fails."""
        if self.message_expression is not None:
            try:
                rendered = _run(self.message_expression, {"self": to_cel(value, schema)})
            except CELEvaluationError:
                rendered = None
            if isinstance(rendered, str) and rendered.strip():
                return str(rendered)
        return self.message or f"failed rule: {self.rule}"


def _run(source: str, activation: dict[str, Any]) -> Any:
    try:
        return compile_expression(source).evaluate(activation)
    except celpy.CELEvalError as exc:
        detail = str(exc.args[0] if exc.args else exc)
        missing = _MISSING_KEY.search(detail)
        reason = f"no such key: {missing.group(1)}" if missing else detail
        raise CELEvaluationError(f"{source!r} evaluation error: {detail}", reason) from exc


def to_cel(value: Any, schema: Mapping[str, Any]) -> Any:
    """Convert a JSON value to CEL types as its structural schema says (numbers are doubles)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        converted = {}
        for key, item in value.items():
            item_schema = properties.get(key) or (additional if isinstance(additional, Mapping) else {})
            converted[celtypes.StringType(key)] = to_cel(item, item_schema)
        return celtypes.MapType(converted)
    if isinstance(value, list):
        items = schema.get("items") or {}
        return celtypes.ListType([to_cel(item, items) for item in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int | float) and schema.get("type") == "number":
        return celtypes.DoubleType(float(value))
    return celpy.json_to_cel(value)
