"""charts/ardiff/README.md, generated from values.yaml (keys, defaults, the comments above them) and
values.schema.json (types). `python -m tests.chart.readme` rewrites it; test_readme.py keeps it current."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "ardiff"
HEADER = """# ardiff chart

Generated from `values.yaml` and `values.schema.json` by `python -m tests.chart.readme`; do not edit. Install,
upgrade, test and uninstall: the repository's README ("Install on a cluster"). `values.schema.json` refuses
unknown keys and bad values. A worked values file for H200 nodes: `examples/values-lingbot-h200.yaml`.

| value | type | default | |
|---|---|---|---|
"""
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")


def _comments(lines: list[str]) -> dict[str, str]:
    """Each key's dotted path -> the comment lines right above it (and a trailing comment on its line)."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            if not stripped:
                pending = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(key for _, key in stack), match["key"]])
        stack.append((indent, match["key"]))
        trailing = match["rest"].split(" # ", 1)[1].strip() if " # " in match["rest"] else ""
        found[path] = " ".join([*pending, trailing]).strip()
        pending = []
    return found


def _schema_type(schema: dict[str, Any], path: list[str]) -> str:
    node: dict[str, Any] | None = schema
    for key in path:
        if node is None:
            return ""
        if "$ref" in node:
            node = _resolve(schema, node["$ref"])
        node = (node.get("properties") or {}).get(key)
    if node is None:
        return ""
    if "$ref" in node:
        node = _resolve(schema, node["$ref"])
    kind = node.get("type", "")
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    return " \\| ".join(kind) if isinstance(kind, list) else kind


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    return schema["definitions"][ref.rsplit("/", 1)[1]]


def _rows(
    values: dict[str, Any], comments: dict[str, str], schema: dict[str, Any], prefix: list[str]
) -> list[str]:
    rows = []
    for key, value in values.items():
        path = [*prefix, key]
        dotted = ".".join(path)
        if isinstance(value, dict) and value and dotted != "defaultPool.spec":
            if comments.get(dotted):
                rows.append(f"| `{dotted}` | object | | {comments[dotted]} |")
            rows += _rows(value, comments, schema, path)
            continue
        default = json.dumps(value, separators=(", ", ": "))
        description = comments.get(dotted, "").replace("|", "\\|")
        rows.append(f"| `{dotted}` | {_schema_type(schema, path)} | `{default}` | {description} |")
    return rows


def render() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    return HEADER + "\n".join(_rows(values, _comments(text.splitlines()), schema, [])) + "\n"


if __name__ == "__main__":
    (CHART / "README.md").write_text(render())
    sys.stdout.write(f"wrote {CHART / 'README.md'}\n")
