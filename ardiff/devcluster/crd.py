"""CustomResourceDefinitions as the dev cluster, the static tests and the chart tests see them.

`CustomResourceDefinition.from_manifest(doc)` checks a CRD like the apiserver's CRD validation does (names,
versions, one storage version, printer columns, and each schema as `structural.py` checks it: structural
rules, list types, CEL rules compiled against the schema within the cost budget, defaults) and raises
`InvalidObject` naming the bad field. Each served `CRDVersion` admits custom resources
(`version.admit(obj, old=...)`: prune, default, OpenAPI + CEL validation, see `validation.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ardiff.devcluster.structural import schema_errors
from ardiff.devcluster.validation import Admitted, FieldError, InvalidObject, admit

# The repository's crds/ folder (the dev cluster runs from an editable checkout).
CRD_DIR = Path(__file__).resolve().parents[2] / "crds"

CRD_GROUP = "apiextensions.k8s.io"
_COLUMN_TYPES = ("integer", "number", "string", "boolean", "date")


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry: what `kubectl get` shows."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""

    def __post_init__(self) -> None:
        if self.type not in _COLUMN_TYPES:
            raise ValueError(f"printer column type must be one of {_COLUMN_TYPES}, got {self.type!r}")
        if not self.json_path.startswith("."):
            raise ValueError(f"printer column jsonPath must start with '.', got {self.json_path!r}")


@dataclass(frozen=True)
class ScaleSubresource:
    """A version's `subresources.scale`: where the Scale's `spec.replicas`, `status.replicas` and
    `status.selector` live in the custom resource (simple JSON paths: `.spec.replicas.min`)."""

    spec_replicas_path: str
    status_replicas_path: str
    label_selector_path: str | None = None

    @staticmethod
    def fields(path: str) -> list[str]:
        return path.lstrip(".").split(".")


@dataclass(frozen=True)
class CRDVersion:
    """A served version of a CRD: its names, schema, subresources and printer columns."""

    group: str
    version: str
    kind: str
    list_kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...]
    categories: tuple[str, ...]
    schema: Mapping[str, Any]
    status_subresource: bool
    printer_columns: tuple[PrinterColumn, ...]
    storage: bool
    scale: ScaleSubresource | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def admit(self, obj: Mapping[str, Any], *, old: Mapping[str, Any] | None = None) -> Admitted:
        """Prune, default and validate `obj` as the apiserver stores it; raise InvalidObject if invalid."""
        return admit(obj, self.schema, kind=self.kind, group=self.group, old=old)


@dataclass(frozen=True)
class CustomResourceDefinition:
    name: str
    group: str
    kind: str
    plural: str
    namespaced: bool
    versions: tuple[CRDVersion, ...]

    @classmethod
    def from_manifest(cls, doc: Mapping[str, Any]) -> CustomResourceDefinition:
        """Parse and check a CRD manifest; raise InvalidObject (422 in the dev cluster) if it is bad."""
        errors = list(_crd_errors(doc))
        name = str((doc.get("metadata") or {}).get("name", ""))
        if errors:
            raise InvalidObject("CustomResourceDefinition", CRD_GROUP, name, errors)
        spec, names = doc["spec"], doc["spec"]["names"]
        versions = tuple(
            CRDVersion(
                group=spec["group"],
                version=v["name"],
                kind=names["kind"],
                list_kind=names.get("listKind", f"{names['kind']}List"),
                plural=names["plural"],
                singular=names.get("singular", names["kind"].lower()),
                namespaced=spec["scope"] == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                schema=v["schema"]["openAPIV3Schema"],
                status_subresource="status" in (v.get("subresources") or {}),
                printer_columns=tuple(
                    PrinterColumn(
                        name=c["name"],
                        type=c["type"],
                        json_path=c["jsonPath"],
                        description=c.get("description", ""),
                        priority=c.get("priority", 0),
                        format=c.get("format", ""),
                    )
                    for c in v.get("additionalPrinterColumns") or ()
                ),
                storage=bool(v.get("storage")),
                scale=_scale_subresource((v.get("subresources") or {}).get("scale")),
            )
            for v in spec["versions"]
            if v.get("served", True)
        )
        return cls(
            name, spec["group"], names["kind"], names["plural"], spec["scope"] == "Namespaced", versions
        )

    def version(self, name: str) -> CRDVersion:
        for version in self.versions:
            if version.version == name:
                return version
        raise KeyError(f"{self.name} does not serve version {name!r}")


def _scale_subresource(scale: Mapping[str, Any] | None) -> ScaleSubresource | None:
    if scale is None:
        return None
    return ScaleSubresource(
        scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath") or None
    )


# validateSimpleJSONPath: `.a.b.c`, no array indexes or other JSONPath syntax.
_SIMPLE_JSON_PATH = re.compile(r"^(\.[A-Za-z_][-A-Za-z0-9_]*)+$")


def _scale_errors(scale: Any, where: str) -> Iterator[FieldError]:
    """ValidateCustomResourceDefinitionSubresources' scale rules: specReplicasPath under .spec,
    statusReplicasPath under .status (both required), labelSelectorPath under either."""
    if not isinstance(scale, Mapping):
        yield FieldError(where, "FieldValueInvalid", "must be an object", scale)
        return
    rules = (
        ("specReplicasPath", (".spec.",), "should be a json path under .spec", True),
        ("statusReplicasPath", (".status.",), "should be a json path under .status", True),
        (
            "labelSelectorPath",
            (".spec.", ".status."),
            "should be a json path under either .spec or .status",
            False,
        ),
    )
    for key, prefixes, message, required in rules:
        path = scale.get(key)
        if not path:
            if required:
                yield FieldError(f"{where}.{key}", "FieldValueRequired")
            continue
        if not isinstance(path, str) or not _SIMPLE_JSON_PATH.match(path):
            yield FieldError(f"{where}.{key}", "FieldValueInvalid", "must be a simple json path", path)
        elif not path.startswith(prefixes):
            yield FieldError(f"{where}.{key}", "FieldValueInvalid", message, path)


def _crd_errors(doc: Mapping[str, Any]) -> Iterator[FieldError]:
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        yield FieldError("spec", "FieldValueRequired")
        return
    names = spec.get("names") if isinstance(spec.get("names"), Mapping) else {}
    for key in ("plural", "kind"):
        if not names.get(key):
            yield FieldError(f"spec.names.{key}", "FieldValueRequired")
    if not spec.get("group"):
        yield FieldError("spec.group", "FieldValueRequired")
    name = (doc.get("metadata") or {}).get("name")
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if name != expected:
        yield FieldError(
            "metadata.name",
            "FieldValueInvalid",
            f'must be spec.names.plural+"."+spec.group ({expected})',
            name,
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        yield FieldError(
            "spec.scope",
            "FieldValueNotSupported",
            'supported values: "Cluster", "Namespaced"',
            spec.get("scope"),
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        yield FieldError("spec.versions", "FieldValueRequired")
        return
    if sum(bool(v.get("storage")) for v in versions) != 1:
        yield FieldError(
            "spec.versions",
            "FieldValueInvalid",
            "must have exactly one version marked as storage version",
            len(versions),
        )
    for index, version in enumerate(versions):
        where = f"spec.versions[{index}]"
        if not version.get("name"):
            yield FieldError(f"{where}.name", "FieldValueRequired")
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, Mapping):
            yield FieldError(f"{where}.schema.openAPIV3Schema", "FieldValueRequired")
            continue
        yield from schema_errors(schema, f"{where}.schema.openAPIV3Schema")
        if "scale" in (version.get("subresources") or {}):
            yield from _scale_errors(version["subresources"]["scale"], f"{where}.subresources.scale")
        for col_index, column in enumerate(version.get("additionalPrinterColumns") or ()):
            col_where = f"{where}.additionalPrinterColumns[{col_index}]"
            try:
                PrinterColumn(column.get("name", ""), column.get("type", ""), column.get("jsonPath", ""))
            except ValueError as exc:
                yield FieldError(col_where, "FieldValueInvalid", str(exc), column)


def load_manifests(paths: Sequence[Path] | Path) -> list[dict[str, Any]]:
    """Every YAML document in the given files (or the *.yaml files of a folder), in order."""
    files = sorted(paths.glob("*.yaml")) if isinstance(paths, Path) and paths.is_dir() else paths
    if isinstance(files, Path):
        files = [files]
    docs: list[dict[str, Any]] = []
    for path in files:
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def load_crds(directory: Path = CRD_DIR) -> dict[str, CustomResourceDefinition]:
    """The CRDs in a folder (default: the repository's crds/), by name (`<plural>.<group>`)."""
    crds = [CustomResourceDefinition.from_manifest(doc) for doc in load_manifests(directory)]
    if not crds:
        raise FileNotFoundError(f"no CustomResourceDefinition found in {directory}")
    return {crd.name: crd for crd in crds}


def served_version(crds: Mapping[str, CustomResourceDefinition], api_version: str, kind: str) -> CRDVersion:
    """The CRD version that serves `apiVersion`/`kind` (e.g. of an example manifest)."""
    for crd in crds.values():
        for version in crd.versions:
            if version.api_version == api_version and version.kind == kind:
                return version
    raise KeyError(f"no CRD serves {api_version} {kind}; known: {sorted(crds)}")
