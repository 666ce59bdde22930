"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for (`Accept: ...;as=Table`).

Custom resources get their CRD's `additionalPrinterColumns` (Name first, Age last when declared); the
built-in kinds the project uses (Pods, Services, Events, Secrets, ConfigMaps, PodDisruptionBudgets,
Namespaces) get kube-apiserver's columns (`kubectl get events`: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE);
every other kind gets Name and Age. Cells are computed like the
apiserver does: JSONPath per column, dates rendered as a human duration ("5m", "3h12m").
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
NONE = "<none>"
UNKNOWN = "<unknown>"
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


Cells = Callable[[Mapping[str, Any], datetime.datetime], list[Any]]


@dataclass(frozen=True)
class BuiltinTable:
    """kubectl's columns for a built-in kind (`pkg/printers/internalversion/printers.go`): the definitions,
    each `(name, priority)` (priority 1 shows with `-o wide`), and the row's cells (the apiserver always
    renders the wide row; kubectl hides what it does not show)."""

    columns: tuple[tuple[str, int], ...]
    cells: Cells

    def definitions(self) -> list[dict[str, Any]]:
        return [
            {**NAME_COLUMN, "priority": priority}
            if name == "Name"
            else {"name": name, "type": "string", "format": "", "description": name, "priority": priority}
            for name, priority in self.columns
        ]


def _since(value: str | None, now: datetime.datetime) -> str:
    """translateTimestampSince: a human duration, `<unknown>` when unset."""
    return human_duration((now - parse_rfc3339(value)).total_seconds()) if value else UNKNOWN


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _pod_cells(pod: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    phase = status.get("reason") or status.get("phase") or "Pending"
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting") or {}
        terminated = (container.get("state") or {}).get("terminated") or {}
        phase = waiting.get("reason") or terminated.get("reason") or phase
    if _meta(pod).get("deletionTimestamp"):
        phase = "Terminating"
    restarts = sum(s.get("restartCount", 0) for s in statuses)
    last_finish = max(
        (
            t
            for s in statuses
            if (t := ((s.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        ),
        default=None,
    )
    restarts_cell = (
        f"{restarts} ({_since(last_finish, now)} ago)" if restarts and last_finish else str(restarts)
    )
    gates = spec.get("readinessGates") or []
    return [
        _meta(pod)["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        phase,
        restarts_cell,
        _since(_meta(pod).get("creationTimestamp"), now),
        status.get("podIP") or NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        f"0/{len(gates)}" if gates else NONE,
    ]


def _labels(labels: Mapping[str, str] | None) -> str:
    """labels.FormatLabels: `k=v,...` sorted, `<none>` when empty."""
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or NONE


def _service_cells(service: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    spec = service.get("spec") or {}
    cluster_ips = spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    service_type = spec.get("type") or "ClusterIP"
    external = ",".join(spec.get("externalIPs") or ()) or (
        spec.get("externalName", NONE) if service_type == "ExternalName" else NONE
    )
    ports = ",".join(
        f"{p['port']}:{p['nodePort']}/{p.get('protocol', 'TCP')}"
        if p.get("nodePort")
        else f"{p['port']}/{p.get('protocol', 'TCP')}"
        for p in spec.get("ports") or ()
    )
    return [
        _meta(service)["name"],
        service_type,
        cluster_ips[0] if cluster_ips else NONE,
        external,
        ports or NONE,
        _since(_meta(service).get("creationTimestamp"), now),
        _labels(spec.get("selector")),
    ]


def _event_cells(event: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    first = _since(event.get("firstTimestamp") or event.get("eventTime"), now)
    last = _since(event["lastTimestamp"], now) if event.get("lastTimestamp") else first
    count = event.get("count") or 1  # singleton events of the events.k8s.io API have no count
    if series := event.get("series"):
        last, count = _since(series.get("lastObservedTime"), now), series.get("count", count)
    involved = event.get("involvedObject") or {}
    kind = (involved.get("kind") or "").lower()
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    instance = source.get("host") or event.get("reportingInstance") or ""
    return [
        last,
        event.get("type", ""),
        event.get("reason", ""),
        f"{kind}/{involved['name']}" if involved.get("name") else kind,
        involved.get("fieldPath", ""),
        f"{component}, {instance}" if component and instance else component or UNKNOWN,
        (event.get("message") or "").strip(),
        first,
        count,
        _meta(event)["name"],
    ]


def _age(obj: Mapping[str, Any], now: datetime.datetime) -> str:
    return _since(_meta(obj).get("creationTimestamp"), now)


def _secret_cells(secret: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    data = secret.get("data") or {}
    return [_meta(secret)["name"], secret.get("type") or "Opaque", len(data), _age(secret, now)]


def _config_map_cells(config_map: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    keys = len(config_map.get("data") or {}) + len(config_map.get("binaryData") or {})
    return [_meta(config_map)["name"], keys, _age(config_map, now)]


def _pdb_cells(pdb: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    spec = pdb.get("spec") or {}
    bounds = [
        str(spec[key]) if spec.get(key) is not None else "N/A" for key in ("minAvailable", "maxUnavailable")
    ]
    allowed = (pdb.get("status") or {}).get("disruptionsAllowed", 0)
    return [_meta(pdb)["name"], *bounds, allowed, _age(pdb, now)]


def _namespace_cells(namespace: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    phase = (namespace.get("status") or {}).get("phase") or "Active"
    return [_meta(namespace)["name"], phase, _age(namespace, now)]


BUILTIN_TABLES = {
    "Pod": BuiltinTable(
        (
            ("Name", 0),
            ("Ready", 0),
            ("Status", 0),
            ("Restarts", 0),
            ("Age", 0),
            ("IP", 1),
            ("Node", 1),
            ("Nominated Node", 1),
            ("Readiness Gates", 1),
        ),
        _pod_cells,
    ),
    "Service": BuiltinTable(
        (
            ("Name", 0),
            ("Type", 0),
            ("Cluster-IP", 0),
            ("External-IP", 0),
            ("Port(s)", 0),
            ("Age", 0),
            ("Selector", 1),
        ),
        _service_cells,
    ),
    "Event": BuiltinTable(
        (
            ("Last Seen", 0),
            ("Type", 0),
            ("Reason", 0),
            ("Object", 0),
            ("Subobject", 1),
            ("Source", 1),
            ("Message", 0),
            ("First Seen", 1),
            ("Count", 1),
            ("Name", 1),
        ),
        _event_cells,
    ),
    "Secret": BuiltinTable((("Name", 0), ("Type", 0), ("Data", 0), ("Age", 0)), _secret_cells),
    "ConfigMap": BuiltinTable((("Name", 0), ("Data", 0), ("Age", 0)), _config_map_cells),
    "PodDisruptionBudget": BuiltinTable(
        (("Name", 0), ("Min Available", 0), ("Max Unavailable", 0), ("Allowed Disruptions", 0), ("Age", 0)),
        _pdb_cells,
    ),
    "Namespace": BuiltinTable((("Name", 0), ("Status", 0), ("Age", 0)), _namespace_cells),
}


def _row(obj: Mapping[str, Any], cells: list[Any], include_object: str) -> dict[str, Any]:
    row: dict[str, Any] = {"cells": cells}
    if include_object == "Object":
        row["object"] = obj
    elif include_object == "Metadata":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": TABLE_API_VERSION,
            "metadata": obj["metadata"],
        }
    return row


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
    builtin = None if printer_columns else BUILTIN_TABLES.get(kind)
    if builtin is not None:
        definitions = builtin.definitions()
        rows = [_row(obj, builtin.cells(obj, now), include_object) for obj in objects]
    else:
        columns = tuple(printer_columns) or (AGE,)
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
        rows = [
            _row(obj, [obj["metadata"]["name"], *(_cell(obj, c, now) for c in columns)], include_object)
            for obj in objects
        ]
    return {
        "kind": "Table",
        "apiVersion": TABLE_API_VERSION,
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }
