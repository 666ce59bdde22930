"""The kopf settings the operator runs with (its startup handler applies them, and so does
`benchmarks/reconcile.py`'s bare kopf baseline), including where kopf keeps its per-object state.

kopf's default diff-base storage writes a `last-handled-configuration` annotation on every object whose
changes it handles: for a session, one PATCH of the object on top of the status patch its create handler
returns. That write says one thing, that the create handler ran; the session's status already says so, and the
operator reads it that way everywhere (a pool round looks after a session only once it has a status:
`needs_reconcile`). So `StatusMarksHandled` keeps no diff base: an object without a status is new (kopf runs
its create handler), one with a status has been handled as it is (no update cause: nothing here handles
updates; the pool round is level-triggered). kopf's progress annotations stay: written only when a handler is
retried (its retry count and delay), purged once it succeeds; `ProgressOnRetry` keeps kopf from writing its
marker annotation without them. A session's admission so writes its token Secret and its status, and nothing
on the object.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

from ardiff.operator.config import OperatorConfig
from ardiff.operator.pods import COMPONENT_LABEL, POOL_LABEL, WORKER_COMPONENT

# Named so that kopf removes it from objects an earlier operator version put it on; nothing adds it now.
FINALIZER = "ardiffusion.dev/finalizer"
ANNOTATIONS_PREFIX = "ardiffusion.dev"


class StatusMarksHandled(kopf.DiffBaseStorage):
    """A diff base read from the object itself: none while it has no status, else its current essence; nothing
    is ever written (the annotation an earlier operator version wrote is ignored and left as it is).

    The essence is kopf's, built from the fields it keeps: kopf's `build` deep-copies the whole body and then
    drops its metadata and status, which for a Ready session are most of its bytes (managedFields, the
    status), on every event, twice here (`fetch` and kopf's own `build`)."""

    def fetch(self, *, body: kopf.Body) -> Any:
        return self.build(body=body) if body.get("status") else None

    def build(self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None) -> Any:
        if extra_fields:  # fields of the status or the metadata that a handler follows: kopf's way
            return super().build(body=body, extra_fields=extra_fields)
        metadata = body.get("metadata") or {}
        kept = {key: value for key, value in body.items() if key not in ("metadata", "status")}
        kept["metadata"] = {key: metadata[key] for key in ("labels", "annotations") if key in metadata}
        return super().build(body=cast(kopf.Body, kept))  # a Mapping is all that `build` reads

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


class ProgressOnRetry(kopf.AnnotationsProgressStorage):
    """kopf's progress annotations, and kopf's marker annotation (`<prefix>/kopf-managed`) only with them.

    kopf's storage adds the marker whenever it stores a handler's progress, and keeps it when it purges that
    progress in the same patch (a handler that succeeded at once): a PATCH of the object that writes only the
    marker. Here a purge that leaves no annotation of the prefix in the patch takes the marker out as well; a
    retried handler's progress keeps it."""

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        super().purge(key=key, body=body, patch=patch)
        metadata = patch.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        marker = f"{self.prefix}/kopf-managed"
        if marker not in annotations or any(
            k != marker and k.startswith(f"{self.prefix}/") for k in annotations
        ):
            return
        del annotations[marker]
        if not annotations:
            del metadata["annotations"]
        if not metadata:
            del patch["metadata"]


def apply(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = ProgressOnRetry(prefix=ANNOTATIONS_PREFIX)
    settings.persistence.diffbase_storage = StatusMarksHandled()
    # Watches reconnect well before proxies cut idle streams; requests fail fast instead of hanging handlers.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.posting.enabled = True
    settings.posting.reporting_component = "ardiff-operator"
    settings.background.cancellation_polling = config.cancellation_polling_seconds
    settings.execution.max_workers = 4  # sync handlers only; everything here is async
    # Namespaced mode runs without cluster-scoped rights: no namespace or CRD scanning.
    settings.scanning.disabled = not config.all_namespaces
    settings.watching.label_selectors["pods"] = f"{POOL_LABEL},{COMPONENT_LABEL}={WORKER_COMPONENT}"
    # Peering (standalone / name / priority) comes from `kopf.run`'s arguments (operator/cli.py); the lifetime
    # decides how soon a standby takes over from a killed active (kopf reads it whole seconds, at least 1).
    settings.peering.lifetime = max(1, round(config.peering_lifetime_seconds))
