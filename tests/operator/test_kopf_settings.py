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


class NotCopyable:
    """A value that refuses to be deep-copied: where it sits, building the essence must not copy."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise AssertionError("deep-copied")


def full_body(status: Any, managed_fields: Any) -> kopf.Body:
    annotations = {
        "team": "a",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
        f"{ANNOTATIONS_PREFIX}/admit_session": "{}",
        f"{ANNOTATIONS_PREFIX}/kopf-managed": "yes",
    }
    return body(
        status=status,
        metadata={
            "name": "s",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "42",
            "labels": {"app": "x"},
            "annotations": annotations,
            "managedFields": managed_fields,
        },
    )


def test_the_essence_is_kopfs_and_is_built_without_copying_the_status_or_the_managed_fields() -> None:
    """kopf's `DiffBaseStorage.build` deep-copies the whole body, then drops its metadata and status: for a
    session that is its status and managedFields (most of a Ready session's bytes), copied twice per event
    (`fetch` and `build`), only to be dropped. The essence is kopf's own, from the fields it keeps."""
    storage = StatusMarksHandled()
    plain = full_body({"phase": "Ready", "conditions": [{"type": "Ready"}]}, [{"manager": "kopf"}])
    assert storage.build(body=plain) == kopf.DiffBaseStorage.build(storage, body=plain)
    assert storage.build(body=plain) == {
        "spec": {"poolRef": "pool", "seed": 7},
        "metadata": {"labels": {"app": "x"}, "annotations": {"team": "a"}},
    }
    essence = storage.build(body=plain)
    plain["spec"]["seed"] = 8  # the essence is a copy: a later change of the body does not reach it
    plain["metadata"]["labels"]["app"] = "y"
    assert essence["spec"]["seed"] == 7
    assert essence["metadata"]["labels"] == {"app": "x"}
    heavy = full_body({"phase": "Ready", "big": NotCopyable()}, [NotCopyable()])
    assert storage.fetch(body=heavy) == storage.build(body=heavy) == essence


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
