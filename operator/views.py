"""Small immutable views of the objects the operator indexes (kopf keeps them in memory per object).

Indexes hold these instead of whole bodies: a pool's reconcile reads all its sessions and pods every few
seconds, so what it reads must be cheap to keep and to compare.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ardiff.operator.specs import (
    API_VERSION,
    POOL_KIND,
    SESSION_KIND,
    InvalidSpec,
    SessionResourceSpec,
    WorkerPoolSpec,
)


def _reference(kind: str, namespace: str, name: str, uid: str) -> dict[str, Any]:
    """Enough of a body for kopf to adopt a child of this object or post an Event about it."""
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
    }


def _epoch_ms(timestamp: str) -> int:
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
            return _epoch_ms(terminated["finishedAt"])
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
        )


@dataclass(frozen=True)
class SessionView:
    """An ARDiffusionSession: identity, parsed spec (None when invalid) and a copy of its status."""

    namespace: str
    name: str
    uid: str
    generation: int
    deleting: bool
    spec: SessionResourceSpec | None
    invalid_reason: str | None
    status: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SessionView:
        meta = body["metadata"]
        try:
            spec, invalid = SessionResourceSpec.from_resource(body.get("spec") or {}), None
        except InvalidSpec as exc:
            spec, invalid = None, str(exc)
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation") or 1),
            deleting=bool(meta.get("deletionTimestamp")),
            spec=spec,
            invalid_reason=invalid,
            status=copy.deepcopy(dict(body.get("status") or {})),
            created=meta.get("creationTimestamp") or "",
        )

    @property
    def phase(self) -> str | None:
        return self.status.get("phase")

    @property
    def reference(self) -> dict[str, Any]:
        return _reference(SESSION_KIND, self.namespace, self.name, self.uid)


@dataclass(frozen=True)
class PoolView:
    """An ARDiffusionWorkerPool: identity and parsed spec (None when invalid)."""

    namespace: str
    name: str
    uid: str
    generation: int
    deleting: bool
    spec: WorkerPoolSpec | None
    invalid_reason: str | None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PoolView:
        meta = body["metadata"]
        try:
            spec, invalid = WorkerPoolSpec.from_resource(body.get("spec") or {}), None
        except InvalidSpec as exc:
            spec, invalid = None, str(exc)
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation") or 1),
            deleting=bool(meta.get("deletionTimestamp")),
            spec=spec,
            invalid_reason=invalid,
        )

    @property
    def reference(self) -> dict[str, Any]:
        return _reference(POOL_KIND, self.namespace, self.name, self.uid)
