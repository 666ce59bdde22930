"""A small async Kubernetes API client for the objects the operator owns or reads.

kopf has no public client, and the official `kubernetes` client is synchronous: each call would block the
event loop that runs every handler. This speaks plain JSON over one pooled `httpx.AsyncClient`, built from the
same credentials kopf logged in with. Create treats 409 as "already exists", delete treats 404 as done.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import kopf

from ardiff.wire import API_VERSION, POOL_PLURAL, SESSION_PLURAL


@dataclass(frozen=True)
class ApiResource:
    """A namespaced resource's REST location."""

    api_version: str  # "v1" for the core group, "<group>/<version>" otherwise
    plural: str

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        parts = [self.prefix, "namespaces", namespace, self.plural]
        parts += [name] if name else []
        parts += [subresource] if subresource else []
        return "/".join(parts)


PODS = ApiResource("v1", "pods")
SERVICES = ApiResource("v1", "services")
SECRETS = ApiResource("v1", "secrets")
CONFIGMAPS = ApiResource("v1", "configmaps")
PDBS = ApiResource("policy/v1", "poddisruptionbudgets")
POOLS = ApiResource(API_VERSION, POOL_PLURAL)
SESSIONS = ApiResource(API_VERSION, SESSION_PLURAL)


class KubeApiError(Exception):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]}")
        self.status = status
        self.message = status_message(body)


def status_message(body: str) -> str:
    """The `message` of an error reply's `Status` (e.g. `Pod "p" is invalid: ...`), else the body itself."""
    try:
        reply = json.loads(body)
    except ValueError:
        return body
    return reply["message"] if isinstance(reply, dict) and isinstance(reply.get("message"), str) else body


Login = Callable[[], kopf.ConnectionInfo]


def _authorization(info: kopf.ConnectionInfo) -> dict[str, str]:
    return {"Authorization": f"{info.scheme or 'Bearer'} {info.token}"} if info.token else {}


def _verify(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context(
        cafile=str(info.ca_path) if info.ca_path else None,
        cadata=info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data,
    )
    if info.certificate_path and info.private_key_path:
        context.load_cert_chain(str(info.certificate_path), str(info.private_key_path))
    return context


class KubeApi:
    """JSON over HTTP to the API server; one instance per operator process (kept in kopf's memo).

    `login` returns fresh credentials; it is called again once when a request gets 401 (service account
    tokens are rotated on disk).
    """

    def __init__(self, login: Login, *, timeout: float = 30.0) -> None:
        self._login = login
        info = login()
        self._client = httpx.AsyncClient(
            base_url=info.server.rstrip("/"),
            headers={"Accept": "application/json", **_authorization(info)},
            auth=(info.username, info.password)
            if info.username and info.password and not info.token
            else None,
            verify=_verify(info),
            timeout=timeout,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        absent: int,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """The reply's object; None when the API answers `absent` (the object is gone, or already there)."""
        headers = {"Content-Type": content_type} if body is not None else None
        response = await self._client.request(method, path, json=body, headers=headers)
        if response.status_code == 401:  # the token may have been rotated: log in again, once
            self._client.headers.update(_authorization(self._login()))
            response = await self._client.request(method, path, json=body, headers=headers)
        if response.status_code == absent:
            return None
        if response.status_code >= 400:
            raise KubeApiError(response.status_code, method, path, response.text)
        return response.json() if response.content else {}

    async def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        return await self._request("GET", resource.path(namespace, name), absent=404)

    async def create(self, resource: ApiResource, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the object; None when one of that name already exists (409)."""
        path = resource.path(body["metadata"]["namespace"])
        return await self._request("POST", path, absent=409, body=body)

    async def create_or_get(self, resource: ApiResource, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the object, or read the one of that name that exists; None when that one was deleted
        between the two calls."""
        created = await self.create(resource, body)
        if created is not None:
            return created
        return await self.get(resource, body["metadata"]["namespace"], body["metadata"]["name"])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """A Node (cluster-scoped), or None when it does not exist."""
        return await self._request("GET", f"/api/v1/nodes/{name}", absent=404)

    async def create_review(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a review to `authorization.k8s.io/v1` (e.g. `selfsubjectaccessreviews`); the reply."""
        path = f"/apis/authorization.k8s.io/v1/{plural}"
        return await self._request("POST", path, absent=-1, body=body) or {}

    async def list_names(self, resource: ApiResource, namespace: str | None) -> set[tuple[str, str]]:
        """(namespace, name) of every object in `namespace`, or in all namespaces (None); names only, in pages
        (the sweep of Redis state compares them with what the store holds)."""
        path = resource.path(namespace) if namespace else f"{resource.prefix}/{resource.plural}"
        names: set[tuple[str, str]] = set()
        params: dict[str, str | int] = {"limit": 500}
        while True:
            page = await self._request("GET", f"{path}?{urlencode(params)}", absent=-1) or {}
            names.update((i["metadata"]["namespace"], i["metadata"]["name"]) for i in page.get("items", []))
            if not (cont := (page.get("metadata") or {}).get("continue")):
                return names
            params["continue"] = cont

    async def delete(self, resource: ApiResource, namespace: str, name: str) -> bool:
        """Delete the object; False when it was already gone (404)."""
        return await self._request("DELETE", resource.path(namespace, name), absent=404) is not None

    async def patch(
        self,
        resource: ApiResource,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> bool:
        """Merge-patch the object (null deletes a field); False when it is gone."""
        reply = await self._request(
            "PATCH",
            resource.path(namespace, name, subresource),
            absent=404,
            body=dict(body),
            content_type="application/merge-patch+json",
        )
        return reply is not None

    async def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge-patch `status` through its subresource; False when the object is gone."""
        return await self.patch(resource, namespace, name, {"status": dict(status)}, subresource="status")
