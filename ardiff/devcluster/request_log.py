"""Which API calls a client makes, as RBAC sees them: an in-memory log of the emulated API's requests.

The dev cluster has no authentication; a kubeconfig's bearer token names its client.
`RequestLog.follow(token)` starts recording that client's resource requests (discovery and other non-resource
URLs are open to every authenticated user through `system:discovery`, so they are not recorded) as
`ApiRequest`s: the RBAC verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
`deletecollection`), API group, resource, subresource and namespace — what a Role must grant.

Admission checks that ask the authorizer on the client's behalf are recorded too, marked `implied_by`:
OwnerReferencesPermissionEnforcement (on in OpenShift and many hardened clusters) lets a client set
`blockOwnerDeletion: true` in an ownerReference only if it may `update` the owner's `finalizers` subresource.
The plugin compares the stored object's references with the new ones; here any create or update body, and any
patch body naming `metadata.ownerReferences`, that holds such a reference counts (a superset: kopf's `adopt`
sets the flag on every child).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

OWNER_REFERENCES_PERMISSION_ENFORCEMENT = "OwnerReferencesPermissionEnforcement"


@dataclass(frozen=True)
class ApiRequest:
    """One authorization check: `verb` on `group`/`resource`[/`subresource`] in `namespace` (None:
    cluster-scoped)."""

    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None = None
    implied_by: str | None = None  # an admission plugin's check, not the request's own

    @property
    def rbac_resource(self) -> str:
        """The resource as a Role rule names it: `pods`, `ardiffusionworkerpools/status`."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def rbac_verb(method: str, *, named: bool, watch: bool) -> str:
    """The verb the apiserver authorizes an HTTP request as (k8s.io/apiserver RequestInfoFactory)."""
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


# (apiVersion, kind) -> (group, plural), or None for a kind the API does not serve.
KindResolver = Callable[[str, str], "tuple[str, str] | None"]


class RequestLog:
    """Resource requests of the followed clients (by bearer token), in arrival order; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followed: dict[str, list[ApiRequest]] = {}

    def follow(self, token: str) -> None:
        """Start (or restart, empty) recording the client that sends `Authorization: Bearer <token>`."""
        with self._lock:
            self._followed[token] = []

    def requests(self, token: str) -> list[ApiRequest]:
        with self._lock:
            return list(self._followed.get(token, ()))

    def forget(self, token: str) -> list[ApiRequest]:
        """Stop recording `token`; what it recorded."""
        with self._lock:
            return self._followed.pop(token, [])

    def record(
        self,
        headers: Mapping[str, str],
        request: ApiRequest,
        body: Any = None,
        resolve_kind: KindResolver | None = None,
    ) -> None:
        token = _bearer_token(headers)
        with self._lock:
            log = self._followed.get(token) if token is not None else None
            if log is None:
                return
            log.append(request)
            if resolve_kind is not None and request.verb in ("create", "update", "patch"):
                log.extend(_owner_finalizer_checks(request, body, resolve_kind))


def _bearer_token(headers: Mapping[str, str]) -> str | None:
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _owner_finalizer_checks(request: ApiRequest, body: Any, resolve_kind: KindResolver) -> list[ApiRequest]:
    metadata = body.get("metadata") if isinstance(body, dict) else None
    references = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    checks = []
    for reference in references if isinstance(references, list) else ():
        if not isinstance(reference, dict) or reference.get("blockOwnerDeletion") is not True:
            continue
        resolved = resolve_kind(str(reference.get("apiVersion", "")), str(reference.get("kind", "")))
        if resolved is None:
            continue  # the plugin refuses a reference to an unknown kind; not a permission question
        group, plural = resolved
        checks.append(
            ApiRequest(
                "update",
                group,
                plural,
                "finalizers",
                request.namespace,
                reference.get("name"),
                implied_by=OWNER_REFERENCES_PERMISSION_ENFORCEMENT,
            )
        )
    return checks
