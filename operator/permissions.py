"""What the operator may do on the API, checked once at start.

kopf retries a forbidden call quietly and forever, which looks like a hang. So before it handles anything
the operator asks the API server (one SelfSubjectAccessReview per rule below and watched namespace, or
cluster-wide) whether it may do each thing it does, and refuses to start naming every one it may not, with
the Role the chart renders as the fix. `required()` is the chart's `ardiff.operatorRules`
(charts/ardiff/templates/rbac.yaml) as data: a test keeps the two identical.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ardiff.operator.kube import KubeApi


@dataclass(frozen=True)
class Permission:
    """One verb on one resource (`resource/subresource`) of an API group ("" is the core group)."""

    group: str
    resource: str
    verb: str
    name: str = ""  # one object of that resource by name ("" any)

    def __str__(self) -> str:
        group = self.group or "core"
        named = f"/{self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{named} ({group})"


def _rules(group: str, resources: Sequence[str], verbs: Sequence[str]) -> list[Permission]:
    return [Permission(group, r, v) for r in resources for v in verbs]


NODE_READ = Permission("", "nodes", "get")  # --follow-drains only: cluster-scoped, its own ClusterRole


def required(*, cluster_wide: bool) -> list[Permission]:
    """Every permission the operator's calls need in the namespaces it watches (the chart's Role grants
    exactly these; `NODE_READ` comes on top with --follow-drains)."""
    peerings = "clusterkopfpeerings" if cluster_wide else "kopfpeerings"
    rules = [
        *_rules(
            "ardiffusion.dev", ["ardiffusionworkerpools", "ardiffusionsessions"], ["list", "watch", "patch"]
        ),
        *_rules(
            "ardiffusion.dev", ["ardiffusionworkerpools/status", "ardiffusionsessions/status"], ["patch"]
        ),
        *_rules(
            "ardiffusion.dev",
            ["ardiffusionworkerpools/finalizers", "ardiffusionsessions/finalizers"],
            ["update"],
        ),
        *_rules("", ["pods"], ["create", "delete", "list", "watch", "patch"]),
        *_rules("", ["services"], ["create"]),
        *_rules("", ["secrets"], ["create", "get", "patch"]),
        *_rules("", ["configmaps"], ["get"]),
        *_rules("", ["events"], ["create"]),
        *_rules("policy", ["poddisruptionbudgets"], ["create", "get", "patch"]),
        *_rules("kopf.dev", [peerings], ["list", "watch", "patch"]),
    ]
    if cluster_wide:
        rules += _rules("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"])
    return rules


def named_secret(name: str, *, creates: bool) -> list[Permission]:
    """One Secret read and patched by name, and created (a create names no object to a Role) if `creates`."""
    return [
        Permission("", "secrets", "get", name),
        Permission("", "secrets", "patch", name),
        *([Permission("", "secrets", "create")] if creates else []),
    ]


def _review(permission: Permission, namespace: str | None) -> dict[str, object]:
    resource, _, subresource = permission.resource.partition("/")
    attributes: dict[str, str] = {"group": permission.group, "resource": resource, "verb": permission.verb}
    if subresource:
        attributes["subresource"] = subresource
    if permission.name:
        attributes["name"] = permission.name
    if namespace is not None and resource not in (
        "customresourcedefinitions",
        "clusterkopfpeerings",
        "nodes",
    ):
        attributes["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


async def missing_permissions(
    kube: KubeApi,
    namespaces: Sequence[str] | None,
    *,
    follow_drains: bool = False,
    also: Sequence[tuple[Permission, str]] = (),
) -> list[str]:
    """`<permission> in namespace <ns>` (or `cluster-wide`) for each one the API server denies; `also`: more
    permissions, each in the namespace named beside it."""
    scopes: Sequence[str | None] = list(namespaces) if namespaces else [None]
    checks: list[tuple[Permission, str | None]] = [
        (p, ns) for ns in scopes for p in required(cluster_wide=not namespaces)
    ]
    if follow_drains:
        checks.append((NODE_READ, None))
    checks += also
    replies = await asyncio.gather(
        *(kube.create_review("selfsubjectaccessreviews", _review(p, ns)) for p, ns in checks)
    )
    return [
        f"{permission} {'in namespace ' + ns if ns else 'cluster-wide'}"
        for (permission, ns), reply in zip(checks, replies, strict=True)
        if not (reply.get("status") or {}).get("allowed")
    ]
