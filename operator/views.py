"""Small immutable views of the objects the operator indexes (kopf keeps them in memory per object).

Indexes hold these instead of whole bodies: a pool's reconcile reads all its sessions and pods every few
seconds, so what it reads must be cheap to keep and to compare.
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from ardiff.operator.pods import (
    IDENTITY_HASH_ANNOTATION,
    SECRET_HASH_ANNOTATION,
    TEMPLATE_HASH_ANNOTATION,
    session_identity_hash,
    worker_template_hash,
)
from ardiff.operator.specs import InvalidSpec, SessionResourceSpec, WorkerPoolSpec
from ardiff.wire import API_VERSION, POOL_KIND, SESSION_KIND

SpecT = TypeVar("SpecT")


def epoch_ms(timestamp: str) -> int:
    moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000)


def died_at_ms(container_statuses: list[Mapping[str, Any]]) -> int | None:
    """When a container of the Pod last terminated, if one is not running now (it died, maybe restarting)."""
    for container in container_statuses:
        state = container.get("state") or {}
        if "running" in state:
            continue
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
        if terminated and terminated.get("finishedAt"):
            return epoch_ms(terminated["finishedAt"])
    return None


@dataclass(frozen=True)
class PodView:
    """A worker Pod as the pool sees it."""

    name: str
    ready: bool  # condition Ready=True and not being deleted
    deleting: bool
    # Set while its worker container is dead (terminated, or waiting to restart): every session its previous
    # incarnation held lost its KV, whatever its Redis lease still says.
    died_at_ms: int | None = None
    template_hash: str | None = None  # of the template it was made from (None: made before hashes existed)
    identity_hash: str | None = (
        None  # of the session identity its template gives (None: made before issue 12)
    )
    busy: bool = False  # labelled ardiffusion.dev/busy=true (operator/disruption.py)
    node: str | None = None  # spec.nodeName: where the scheduler bound it (None: not yet)
    secret_hash: str | None = None  # of the workers' Secret data it was made with (issue 23 item 12)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodView:
        status = body.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        return cls(
            name=body["metadata"]["name"],
            ready=ready and not deleting,
            deleting=deleting,
            died_at_ms=died_at_ms(status.get("containerStatuses") or []),
            template_hash=(body["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION),
            identity_hash=(body["metadata"].get("annotations") or {}).get(IDENTITY_HASH_ANNOTATION),
            busy=(body["metadata"].get("labels") or {}).get("ardiffusion.dev/busy") == "true",
            node=(body.get("spec") or {}).get("nodeName"),
            secret_hash=(body["metadata"].get("annotations") or {}).get(SECRET_HASH_ANNOTATION),
        )


def _parse_spec(
    parse: Callable[[Mapping[str, Any]], SpecT], body: Mapping[str, Any]
) -> tuple[SpecT | None, str | None]:
    """The parsed spec and None, or None and why the spec is invalid."""
    try:
        return parse(body.get("spec") or {}), None
    except InvalidSpec as exc:
        return None, str(exc)


@dataclass(frozen=True)
class ResourceView:
    """What every custom resource view knows: identity, generation, whether it is being deleted, and why its
    spec is invalid (None when it is valid)."""

    KIND: ClassVar[str]
    namespace: str
    name: str
    uid: str
    generation: int
    deleting: bool
    invalid_reason: str | None

    @staticmethod
    def _identity(body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        return {
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid", ""),
            "generation": int(meta.get("generation") or 1),
            "deleting": bool(meta.get("deletionTimestamp")),
        }

    @property
    def reference(self) -> dict[str, Any]:
        """Enough of a body for kopf to adopt a child of this object or post an Event about it."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


@dataclass(frozen=True)
class SessionView(ResourceView):
    """An ARDiffusionSession: identity, parsed spec (None when invalid) and a copy of its status."""

    KIND: ClassVar[str] = SESSION_KIND
    spec: SessionResourceSpec | None
    status: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SessionView:
        spec, invalid = _parse_spec(SessionResourceSpec.from_resource, body)
        return cls(
            **cls._identity(body),
            invalid_reason=invalid,
            spec=spec,
            status=copy.deepcopy(dict(body.get("status") or {})),
            created=body["metadata"].get("creationTimestamp") or "",
        )

    @property
    def phase(self) -> str | None:
        return self.status.get("phase")


@dataclass(frozen=True)
class PoolView(ResourceView):
    """An ARDiffusionWorkerPool: identity and parsed spec (None when invalid); `secret_hash`, once the round
    has read the pool's `<pool>-workers-redis` Secret, the digest of its data (part of the Pod template)."""

    KIND: ClassVar[str] = POOL_KIND
    spec: WorkerPoolSpec | None
    secret_hash: str | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PoolView:
        spec, invalid = _parse_spec(WorkerPoolSpec.from_resource, body)
        return cls(**cls._identity(body), invalid_reason=invalid, spec=spec)

    @functools.cached_property
    def template_hash(self) -> str:
        """The hash of the worker Pod template its spec and Secret make (each Pod carries the one it was made
        from)."""
        assert self.spec is not None
        return worker_template_hash(self.namespace, self.name, self.spec, self.secret_hash)

    @functools.cached_property
    def identity_hash(self) -> str:
        """The session identity its pods give (`session_identity_hash`): migration stays within it."""
        assert self.spec is not None
        return session_identity_hash(self.namespace, self.name, self.spec)
