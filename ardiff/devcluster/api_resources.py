"""The resource types the emulated API serves, and the discovery documents that describe them.

Built-in kinds come from kmock's bundled catalogue (taken from a real K3s cluster); a custom resource
type is added when its CRD is created and removed when the CRD is deleted, as on a real apiserver.
The `build_*` functions render the discovery documents kubectl and kopf read (`/api`, `/apis`,
`/apis/<group>`, `/apis/<group>/<version>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kmock

from ardiff.devcluster.crd import CRDVersion, CustomResourceDefinition

ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})
# Discovery lists a CRD's status subresource with these verbs.
SUBRESOURCE_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ResourceType:
    """One served group/version/plural with what handling it needs (scope, status, its CRD)."""

    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool
    verbs: frozenset[str] = ALL_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    crd: CRDVersion | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Objects are stored per group and plural, whatever version they are read through."""
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """How the apiserver names the resource in messages: `pods`, `ardiffusionsessions.ardiffusion.dev`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @classmethod
    def from_crd_version(cls, version: CRDVersion) -> ResourceType:
        return cls(
            group=version.group,
            version=version.version,
            plural=version.plural,
            kind=version.kind,
            singular=version.singular,
            namespaced=version.namespaced,
            short_names=version.short_names,
            categories=version.categories,
            subresources=frozenset(
                ({"status"} if version.status_subresource else set())
                | ({"scale"} if version.scale else set())
            ),
            crd=version,
        )


class ResourceRegistry:
    """The served resource types by (group, version, plural)."""

    def __init__(self, types: Iterable[ResourceType] = ()) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in types:
            self.add(rtype)

    @classmethod
    def with_builtins(cls) -> ResourceRegistry:
        catalogue = kmock.ResourcesArray()
        catalogue.load_bundled()
        types = []
        for resource in catalogue:
            info = catalogue[resource]
            types.append(
                ResourceType(
                    group=resource.group or "",
                    version=resource.version or "v1",
                    plural=resource.plural or "",
                    kind=info.kind or "",
                    singular=info.singular or "",
                    namespaced=bool(info.namespaced),
                    verbs=frozenset(info.verbs) or ALL_VERBS,
                    short_names=tuple(sorted(info.shortnames)),
                    categories=tuple(sorted(info.categories)),
                    subresources=frozenset(info.subresources),
                )
            )
        return cls(types)

    def add(self, rtype: ResourceType) -> None:
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def find(self, group: str, plural: str) -> ResourceType | None:
        """Any served version of a group's resource (objects are stored version-independently)."""
        return next((t for t in self._types.values() if (t.group, t.plural) == (group, plural)), None)

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return next((t for t in self._types.values() if (t.api_version, t.kind) == (api_version, kind)), None)

    def register_crd(self, crd: CustomResourceDefinition) -> None:
        """Serve every served version of `crd` (replacing what an earlier revision of it served)."""
        self.unregister_crd(crd.group, crd.plural)
        for version in crd.versions:
            self.add(ResourceType.from_crd_version(version))

    def unregister_crd(self, group: str, plural: str) -> None:
        for key in [k for k, t in self._types.items() if (t.group, t.plural) == (group, plural) and t.crd]:
            del self._types[key]

    def types(self) -> list[ResourceType]:
        return sorted(self._types.values(), key=lambda t: (t.group, t.version, t.plural))

    def group_versions(self) -> dict[str, list[str]]:
        """Served versions per named group (not the core group), preferred version first."""
        versions: dict[str, list[str]] = {}
        for rtype in self.types():
            if rtype.group and rtype.version not in versions.setdefault(rtype.group, []):
                versions[rtype.group].append(rtype.version)
        return {group: sorted(vs, key=_version_priority) for group, vs in versions.items()}


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version order: GA before beta before alpha, then the higher number first."""
    for stability, marker in ((1, "beta"), (2, "alpha")):
        if marker in version:
            major, _, minor = version[1:].partition(marker)
            return (stability, -int(major or 0), -int(minor or 0))
    return (0, -int(version[1:] or 0) if version[1:].isdigit() else 0, 0)


def build_api_versions() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def build_api_group_list(registry: ResourceRegistry) -> dict[str, Any]:
    groups = [_group_entry(g, vs) for g, vs in sorted(registry.group_versions().items())]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def build_api_group(registry: ResourceRegistry, group: str) -> dict[str, Any] | None:
    versions = registry.group_versions().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def build_resource_list(registry: ResourceRegistry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry.types() if (t.group, t.version) == (group, version)]
    if not types and group:
        return None
    resources: list[dict[str, Any]] = []
    for rtype in types:
        resources.append(
            {
                "name": rtype.plural,
                "singularName": rtype.singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": sorted(rtype.verbs),
                "shortNames": list(rtype.short_names),
                "categories": list(rtype.categories),
            }
        )
        for sub in sorted(rtype.subresources):
            entry = {
                "name": f"{rtype.plural}/{sub}",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": list(SUBRESOURCE_VERBS),
            }
            if sub == "scale":  # served as autoscaling/v1 Scale (what kubectl scale and HPAs read)
                entry |= {"group": "autoscaling", "version": "v1", "kind": "Scale"}
            resources.append(entry)
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _openapi_gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def build_openapi_v3_index(registry: ResourceRegistry) -> dict[str, Any]:
    """`/openapi/v3`: where each group/version's document is (kubectl fetches them to decide validation)."""
    group_versions = sorted({(t.group, t.version) for t in registry.types()})
    paths = {}
    for group, version in group_versions:
        path = _openapi_gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}"}
    return {"paths": paths}


def build_openapi_v3_group_version(
    registry: ResourceRegistry, group: str, version: str
) -> dict[str, Any] | None:
    """`/openapi/v3/apis/<g>/<v>`: a minimal document declaring server-side field validation.

    kubectl's default `--validate=strict` asks each kind's PATCH operation whether it takes the
    `fieldValidation` query parameter; when it does, kubectl leaves validation to the server (this one
    prunes or, with `fieldValidation=Strict`, rejects unknown fields, and validates custom resources).
    Schemas: a custom resource's CRD schema (for `kubectl explain`); built-in kinds are left open.
    """
    types = [t for t in registry.types() if (t.group, t.version) == (group, version)]
    if not types:
        return None
    base = "/" + _openapi_gv_path(group, version)
    parameters = [
        {"name": name, "in": "query", "schema": {"type": "string"}} for name in ("dryRun", "fieldValidation")
    ]
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for rtype in types:
        gvk = {"group": group, "version": version, "kind": rtype.kind}
        prefix = (
            f"{base}/namespaces/{{namespace}}/{rtype.plural}"
            if rtype.namespaced
            else f"{base}/{rtype.plural}"
        )
        operation = {"parameters": parameters, "x-kubernetes-group-version-kind": gvk}
        paths[prefix] = {"post": operation}
        paths[f"{prefix}/{{name}}"] = {"patch": operation, "put": operation}
        schema = (
            dict(rtype.crd.schema)
            if rtype.crd
            else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        )
        reversed_group = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
        schemas[f"{reversed_group}.{version}.{rtype.kind}"] = {
            **schema,
            "x-kubernetes-group-version-kind": [gvk],
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "ardiff dev cluster", "version": "v1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
