"""A minimal kopf operator over ARDiffusionSession: exercises what kopf needs from the emulated API.

Finalizers and progress in annotations under ardiffusion.dev (as the project's operator is configured), a
handler result kept in status, a field handler, a timer, an Event, a delete handler, and peering.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

RESOURCE = ("ardiffusion.dev", "v1alpha1", "ardiffusionsessions")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "ardiffusion.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ardiffusion.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="ardiffusion.dev")
    settings.background.cancellation_polling = 0.5
    settings.posting.level = logging.INFO
    settings.peering.stealth = False


@kopf.on.create(*RESOURCE)
def accept(body: kopf.Body, name: str, patch: kopf.Patch, **_: Any) -> dict[str, str]:
    patch.status["phase"] = "Pending"
    kopf.info(body, reason="Accepted", message=f"session {name} accepted")
    return {"seen": name}


@kopf.on.field(*RESOURCE, field="spec.priority")
def reprioritise(new: Any, patch: kopf.Patch, **_: Any) -> None:
    patch.status["reason"] = f"priority {new}"


@kopf.timer(*RESOURCE, interval=0.3)
def tick(status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    patch.status["chunkIndex"] = (status.get("chunkIndex") or 0) + 1


@kopf.on.delete(*RESOURCE)
def close(name: str, logger: logging.Logger, **_: Any) -> None:
    logger.info(f"CLOSED {name}")
