"""Label and field selectors of list and watch requests (`?labelSelector=`, `?fieldSelector=`).

Label selectors support the whole grammar (`a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`).
Field selectors support `=`, `==` and `!=` on any dotted path of the object (`metadata.name`,
`status.phase`, `spec.nodeName`); a real apiserver allows only a few fields per kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_SET_REQUIREMENT = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


class SelectorError(ValueError):
    """A selector that does not parse."""


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _requirement(text: str) -> Callable[[Mapping[str, str]], bool]:
    if match := _SET_REQUIREMENT.match(text):
        key, operator, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for operator in ("!=", "==", "="):
        if operator in text:
            key, value = (part.strip() for part in text.split(operator, 1))
            if not key:
                raise SelectorError(f"label selector requirement {text!r} has no key")
            if operator == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        key = text[1:].strip()
        return lambda labels: key not in labels
    if re.fullmatch(r"[^\s!=(),]+", text):
        return lambda labels: text in labels
    raise SelectorError(f"cannot parse label selector requirement {text!r}")


@dataclass(frozen=True)
class LabelSelector:
    """A parsed `labelSelector`; the empty selector matches everything."""

    requirements: tuple[Callable[[Mapping[str, str]], bool], ...] = ()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        return cls(tuple(_requirement(part) for part in _split_top_level(text)))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(requirement(labels) for requirement in self.requirements)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed `fieldSelector` as (path, negated, value) terms; the empty selector matches everything."""

    terms: tuple[tuple[str, bool, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> FieldSelector:
        terms = []
        for part in _split_top_level(text):
            for operator in ("!=", "==", "="):
                if operator in part:
                    path, value = (p.strip() for p in part.split(operator, 1))
                    terms.append((path, operator == "!=", value))
                    break
            else:
                raise SelectorError(f"cannot parse field selector requirement {part!r}")
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, path) == value) != negated for path, negated, value in self.terms)
