"""`KubeSessions`: the `ARDiffusionSession` resources of one namespace through the `kubernetes` package:
create, fork, wait for `Ready`, read the token Secret, and `connect()` a `SessionClient` at the session's base
URL."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict, Unpack

from ardiff.client.errors import InvalidSession, KubernetesError, SessionFailed, SessionNotFound, WaitTimeout
from ardiff.client.session import DEFAULT_RETRY_SECONDS, SessionClient
from ardiff.wire import GROUP, SESSION_PLURAL, VERSION

TERMINAL_PHASES = ("Failed", "Expired")


def is_ready(status: Mapping[str, Any]) -> bool:
    """A session's status says it can be ticked: `Ready` with an endpoint."""
    return status.get("phase") == "Ready" and bool(status.get("endpoint"))


def base_url(status: Mapping[str, Any]) -> str:
    """Where a Ready session's routes go: `status.url`, its base at the front door (the same whichever Pod
    holds it; issue 37), else `status.endpoint`, its Pod's own address (reachable inside the cluster)."""
    return str(status.get("url") or status["endpoint"])


@dataclass(frozen=True)
class SessionEvent:
    """One Kubernetes Event about a session (`KubeSessions.events`)."""

    reason: str
    type: str
    message: str
    count: int
    time: datetime | None


class SessionOptions(TypedDict, total=False):
    """The optional fields of a session's spec (`KubeSessions.create` and `fork`); unset ones are the
    defaults (a fork's: its parent's seed and image)."""

    seed: int
    priority: int
    eviction_policy: str
    idle_timeout_seconds: int
    max_chunks: int
    image: Mapping[str, Any]
    keep_chunks: int  # the chunk boundaries its worker keeps (the last ones), to rewind to or fork from


# Each option's place in the spec.
OPTION_FIELDS: dict[str, tuple[str, ...]] = {
    "seed": ("seed",),
    "priority": ("priority",),
    "eviction_policy": ("evictionPolicy",),
    "idle_timeout_seconds": ("idleTimeoutSeconds",),
    "max_chunks": ("maxChunks",),
    "image": ("image",),
    "keep_chunks": ("history", "keepChunks"),
}


class KubeSessions:
    """`ARDiffusionSession` resources of one namespace, through the `kubernetes` package.

    Credentials: an explicit `kubeconfig` file, else `KUBECONFIG`/`~/.kube/config`, else the in-cluster
    service account.
    """

    def __init__(
        self, namespace: str = "default", *, kubeconfig: str | Path | None = None, context: str | None = None
    ) -> None:
        try:
            import kubernetes
        except ImportError:
            raise KubernetesError(
                "the client's Kubernetes part needs the `kubernetes` package: pip install 'ardiff[client]'"
            ) from None
        import urllib3  # the kubernetes package's HTTP library

        self.namespace = namespace
        self._kubernetes = kubernetes
        # Connection refused, DNS, TLS, timeouts: urllib3's errors (after its retries) and the OS's.
        self._unreachable = (urllib3.exceptions.HTTPError, OSError)
        try:
            if kubeconfig is None and context is None:
                try:
                    kubernetes.config.load_kube_config()
                    api_client = kubernetes.client.ApiClient()
                except kubernetes.config.ConfigException:
                    kubernetes.config.load_incluster_config()
                    api_client = kubernetes.client.ApiClient()
            else:
                config_file = None if kubeconfig is None else str(kubeconfig)
                api_client = kubernetes.config.new_client_from_config(
                    config_file=config_file, context=context
                )
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise KubernetesError(f"no usable Kubernetes credentials: {exc}") from None
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A Kubernetes call with its ApiException turned into a typed `KubernetesError`."""
        try:
            return fn(*args, **kwargs)
        except self._kubernetes.client.ApiException as exc:
            try:
                message = json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                message = exc.reason
            cls = {404: SessionNotFound, 422: InvalidSession}.get(exc.status, KubernetesError)
            raise cls(f"{what}: {message}", status=exc.status) from None
        except self._kubernetes.client.exceptions.OpenApiException as exc:
            raise KubernetesError(f"{what}: {exc}") from None
        except self._unreachable as exc:
            raise KubernetesError(f"{what}: cannot reach the Kubernetes API: {exc}") from None

    def create(
        self, name: str, *, pool: str, prompt: str, **options: Unpack[SessionOptions]
    ) -> dict[str, Any]:
        """Create the session resource with the `SessionOptions` given (the API server validates it:
        `InvalidSession` on a bad spec)."""
        return self._create(name, {"poolRef": pool, "prompt": prompt}, options)

    def fork(
        self,
        parent: str,
        child: str,
        at: int | None = None,
        *,
        prompt: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> dict[str, Any]:
        """Create `child` at `parent`'s kept chunk `at` (its state after chunks 0..at-1; None: the parent's
        latest kept chunk when the child is placed): its next chunk with the same controls is the parent's.
        The child is in the parent's pool and family; the prompt, seed and image it is not given are the
        parent's. The parent must keep the chunk (its `keep_chunks`), else the child ends `Failed`
        (`ChunkNotKept`, `ForkSourceNotFound`, `ForkPoolMismatch`: `wait_ready` raises `SessionFailed`)."""
        source = self.get(parent).get("spec") or {}
        spec: dict[str, Any] = {
            "poolRef": source["poolRef"],
            "forkFrom": {"session": parent, **({} if at is None else {"chunk": at})},
        }
        if source.get("family") is not None:
            spec["family"] = source["family"]
        if prompt is not None:
            spec["prompt"] = prompt
        return self._create(child, spec, options)

    def _create(self, name: str, spec: Mapping[str, Any], options: SessionOptions) -> dict[str, Any]:
        """Create the resource with `spec` and the `options` given, as their spec fields."""
        unknown = set(options) - set(OPTION_FIELDS)
        if unknown:
            raise TypeError(f"unknown session options {sorted(unknown)}; known: {sorted(OPTION_FIELDS)}")
        fields: dict[str, Any] = {}
        for option, value in options.items():
            if value is not None:
                path = OPTION_FIELDS[option]
                leaf = fields
                for part in path[:-1]:
                    leaf = leaf.setdefault(part, {})
                leaf[path[-1]] = dict(value) if isinstance(value, Mapping) else value
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ARDiffusionSession",
            "metadata": {"name": name},
            "spec": {**spec, **fields},
        }
        return self._call(
            f"create session {name}",
            self._custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
            body,
        )

    def get(self, name: str) -> dict[str, Any]:
        return self._call(
            f"get session {name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
            name,
        )

    def list(self) -> list[dict[str, Any]]:
        listing = self._call(
            "list sessions",
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            SESSION_PLURAL,
        )
        return list(listing["items"])

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def delete(self, name: str, *, wait: bool = False, timeout: float = 60) -> None:
        """Delete the session (its slot and KV are freed); a missing session counts as deleted."""
        try:
            self._call(
                f"delete session {name}",
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                SESSION_PLURAL,
                name,
            )
        except SessionNotFound:
            return
        deadline = time.monotonic() + timeout
        while wait:
            try:
                self.get(name)
            except SessionNotFound:
                return
            if time.monotonic() > deadline:
                raise WaitTimeout(f"session {name} still exists {timeout}s after its deletion")
            time.sleep(0.2)

    def wait_for(
        self,
        name: str,
        predicate: Callable[[dict[str, Any]], bool],
        *,
        timeout: float = 300,
        what: str = "a status",
        on_status: Callable[[dict[str, Any]], None] | None = None,
        poll: float = 0.2,
    ) -> dict[str, Any]:
        """Poll the status until `predicate(status)` holds; `SessionFailed` on Failed/Expired."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while True:
            status = self.status(name)
            if on_status is not None:
                on_status(status)
            if predicate(status):
                return status
            if status.get("phase") in TERMINAL_PHASES:
                raise SessionFailed(
                    f"session {name} is {status['phase']}: {status.get('reason')}: {status.get('message')}"
                )
            if time.monotonic() > deadline:
                phase = status.get("phase", "without status")
                raise WaitTimeout(
                    f"session {name} did not reach {what} within {timeout}s; it is {phase} "
                    f"({status.get('reason')}: {status.get('message')})"
                )
            time.sleep(poll)

    def wait_ready(
        self, name: str, *, timeout: float = 300, on_status: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Until `status.phase` is `Ready` (with an endpoint); returns the status."""
        return self.wait_for(
            name,
            is_ready,
            timeout=timeout,
            what="Ready",
            on_status=on_status,
        )

    def events(self, name: str) -> list[SessionEvent]:
        """The session's Kubernetes Events, oldest first: the operator's news (`Lost`, `Evicted`,
        `Replaced`, `Expired`, `Failed`). A status poll can miss `Lost`: the same round places it again."""
        listing = self._call(
            f"list the events of session {name}",
            self._core.list_namespaced_event,
            self.namespace,
            field_selector=f"involvedObject.kind=ARDiffusionSession,involvedObject.name={name}",
        )
        events = [
            SessionEvent(
                reason=event.reason or "",
                type=event.type or "",
                message=event.message or "",
                count=event.count or 1,
                time=event.last_timestamp or event.event_time or event.metadata.creation_timestamp,
            )
            for event in listing.items
        ]
        return sorted(events, key=lambda event: (event.time is None, event.time))

    def token(self, name: str, status: Mapping[str, Any] | None = None) -> str:
        """The session's bearer token, from the Secret its status names."""
        ref = (status if status is not None else self.status(name)).get("tokenSecretRef") or {}
        if not ref.get("name"):
            raise KubernetesError(f"session {name} has no status.tokenSecretRef yet")
        secret = self._call(
            f"read the token of session {name}",
            self._core.read_namespaced_secret,
            ref["name"],
            self.namespace,
        )
        key = ref.get("key", "token")
        encoded = (secret.data or {}).get(key)
        if not encoded:
            raise KubernetesError(f"secret {ref['name']} has no key {key!r}")
        return base64.b64decode(encoded).decode()

    def connect(self, name: str, *, timeout: float = 300, **client_options: Any) -> SessionClient:
        """Wait for `Ready`, then a `SessionClient` at the session's `base_url` (the front door's `status.url`
        when the operator writes one, else `status.endpoint`) that continues at the session's next chunk (a
        session that needs a reset stays that way: its first tick raises `ResetRequired`). At the front door a
        refused connection is tried again for `DEFAULT_RETRY_SECONDS` (`SessionClient.reconnect_seconds`)."""
        status = self.wait_ready(name, timeout=timeout)
        if status.get("url"):
            client_options.setdefault("reconnect_seconds", DEFAULT_RETRY_SECONDS)
        client = SessionClient(name, base_url(status), self.token(name, status), **client_options)
        client.sync()
        return client
