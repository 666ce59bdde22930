"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for (`Accept: ...;as=Table`).

Custom resources get their CRD's `additionalPrinterColumns` (Name first, Age last when declared); Pods
get kubectl's familiar columns; every other kind gets Name and Age. Cells are computed like the
apiserver does: JSONPath per column, dates rendered as a human duration ("5m", "3h12m").
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ardiff.devcluster.crd import PrinterColumn

TABLE_API_VERSION = "meta.k8s.io/v1"
NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name of the object",
    "priority": 0,
}
AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since the object was created")
POD_COLUMNS = (
    PrinterColumn("Ready", "string", ".status.containerStatuses", "Ready containers of all containers"),
    PrinterColumn("Status", "string", ".status.phase", "The Pod's phase, or why it is not running"),
    PrinterColumn("Restarts", "integer", ".status.containerStatuses", "Container restarts"),
    AGE,
    PrinterColumn("IP", "string", ".status.podIP", "The Pod's IP", priority=1),
    PrinterColumn("Node", "string", ".spec.nodeName", "The node the Pod runs on", priority=1),
)

_PATH_TOKEN = re.compile(
    r"\.([A-Za-z0-9_-]+)|\['([^']+)'\]|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)==['\"]([^'\"]*)['\"]\)\]"
)


def parse_rfc3339(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    seconds = max(int(seconds), 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def json_path(obj: Any, path: str) -> Any:
    """The first value at a printer-column JSONPath (`.a.b`, `['k']`, `[0]`, `[?(@.type=="Ready")]`)."""
    value = obj
    position = 0
    for match in _PATH_TOKEN.finditer(path):
        if match.start() != position:
            raise ValueError(f"unsupported JSONPath {path!r}")
        position = match.end()
        name, quoted, index, filter_key, filter_value = match.groups()
        if name is not None or quoted is not None:
            value = value.get(name or quoted) if isinstance(value, Mapping) else None
        elif index is not None:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        else:
            value = next(
                (item for item in value or [] if json_path(item, f".{filter_key}") == filter_value), None
            )
        if value is None:
            return None
    if position != len(path):
        raise ValueError(f"unsupported JSONPath {path!r}")
    return value


def _cell(obj: Mapping[str, Any], column: PrinterColumn, now: datetime.datetime) -> Any:
    value = json_path(obj, column.json_path)
    if value is None:
        return None
    if column.type == "date":
        return human_duration((now - parse_rfc3339(value)).total_seconds())
    if isinstance(value, Mapping | list):
        return json.dumps(value, separators=(",", ":"))
    return value


def _pod_cells(pod: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    containers = (pod.get("spec") or {}).get("containers") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    for status in statuses:
        waiting = (status.get("state") or {}).get("waiting") or {}
        terminated = (status.get("state") or {}).get("terminated") or {}
        phase = waiting.get("reason") or terminated.get("reason") or phase
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    restarts = sum(s.get("restartCount", 0) for s in statuses)
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    age = human_duration((now - parse_rfc3339(created)).total_seconds()) if created else None
    ip = (pod.get("status") or {}).get("podIP")
    return [f"{ready}/{len(containers)}", phase, restarts, age, ip, (pod.get("spec") or {}).get("nodeName")]


def columns_for(kind: str, printer_columns: Sequence[PrinterColumn]) -> tuple[PrinterColumn, ...]:
    if printer_columns:
        return tuple(printer_columns)
    if kind == "Pod":
        return POD_COLUMNS
    return (AGE,)


def build_table(
    kind: str,
    objects: Sequence[Mapping[str, Any]],
    printer_columns: Sequence[PrinterColumn],
    *,
    resource_version: str,
    include_object: str = "Metadata",
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The Table for `objects`; `include_object` is the request's `includeObject` (None/Metadata/Object)."""
    now = now or datetime.datetime.now(datetime.UTC)
    columns = columns_for(kind, printer_columns)
    definitions = [NAME_COLUMN] + [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in columns
    ]
    rows = []
    for obj in objects:
        cells = (
            _pod_cells(obj, now)
            if kind == "Pod" and not printer_columns
            else [_cell(obj, c, now) for c in columns]
        )
        row: dict[str, Any] = {"cells": [obj["metadata"]["name"], *cells]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": TABLE_API_VERSION,
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": TABLE_API_VERSION,
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
