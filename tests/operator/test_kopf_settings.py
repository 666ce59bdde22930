"""Where kopf keeps its per-object state (operator/kopf_settings.py): a session's status marks it handled,
and a handler that succeeds at once leaves kopf nothing to write on the object."""

from __future__ import annotations

from typing import Any

import kopf

from ardiff.operator.config import OperatorConfig
from ardiff.operator.kopf_settings import ANNOTATIONS_PREFIX, ProgressOnRetry, StatusMarksHandled, apply

MARKER = f"{ANNOTATIONS_PREFIX}/kopf-managed"
PROGRESS = f"{ANNOTATIONS_PREFIX}/admit_session"
RECORD: Any = {"started": "2026-12-02T07:00:00.000000", "retries": 1, "success": False, "delayed": None}


def body(**extra: Any) -> kopf.Body:
    raw = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": "s", "namespace": "ns", "uid": "u1", "annotations": {"team": "a"}},
        "spec": {"poolRef": "pool", "seed": 7},
        **extra,
    }
    return kopf.Body(raw)


def test_a_session_without_a_status_is_new_and_one_with_a_status_is_handled_as_it_is() -> None:
    storage = StatusMarksHandled()
    assert storage.fetch(body=body()) is None
    assert storage.fetch(body=body(status={})) is None
    admitted = body(status={"phase": "Pending"})
    assert storage.fetch(body=admitted) == storage.build(body=admitted)  # no diff: no update cause
    patch = kopf.Patch()
    storage.store(body=body(), patch=patch, essence=storage.build(body=body()))
    assert dict(patch) == {}


def test_progress_purged_in_the_same_patch_leaves_nothing_to_write() -> None:
    storage = ProgressOnRetry(prefix=ANNOTATIONS_PREFIX)
    new, patch = body(), kopf.Patch()
    storage.store(key=kopf.HandlerId("admit_session"), record=RECORD, body=new, patch=patch)
    assert set(patch["metadata"]["annotations"]) == {PROGRESS, MARKER}
    storage.purge(key=kopf.HandlerId("admit_session"), body=new, patch=patch)
    assert dict(patch) == {}  # kopf's own storage leaves {metadata: {annotations: {MARKER: "yes"}}}
    patch.status["phase"] = "Ready"  # what the handler returned stays
    assert dict(patch) == {"status": {"phase": "Ready"}}


def test_a_retried_handlers_progress_keeps_the_marker_and_its_purge_removes_the_progress() -> None:
    storage = ProgressOnRetry(prefix=ANNOTATIONS_PREFIX)
    patch = kopf.Patch()
    storage.store(key=kopf.HandlerId("admit_session"), record=RECORD, body=body(), patch=patch)
    assert set(patch["metadata"]["annotations"]) == {PROGRESS, MARKER}  # not purged: a retry follows
    retried = body()
    retried["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    patch = kopf.Patch()
    storage.purge(key=kopf.HandlerId("admit_session"), body=kopf.Body(retried), patch=patch)
    assert dict(patch) == {"metadata": {"annotations": {PROGRESS: None}}}


def test_the_settings_use_both_storages() -> None:
    settings = kopf.OperatorSettings()
    apply(
        settings, OperatorConfig(redis_url="redis://r:6379", worker_redis_url="redis://r", namespaces=("ns",))
    )
    assert isinstance(settings.persistence.diffbase_storage, StatusMarksHandled)
    assert isinstance(settings.persistence.progress_storage, ProgressOnRetry)
    assert settings.persistence.progress_storage.prefix == ANNOTATIONS_PREFIX
