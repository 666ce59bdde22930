"""The readiness predicates the dev cluster polls with, on objects as the API server returns them."""

from __future__ import annotations

from typing import Any

import pytest

from ardiff.devcluster.cluster import crds_established
from ardiff.devcluster.waiting import condition_true


def crd(group: str, conditions: list[dict[str, str]] | None) -> dict[str, Any]:
    # A CRD's status.conditions has no omitempty: right after a create the API server returns null for it.
    return {"spec": {"group": group}, "status": {"conditions": conditions, "storedVersions": ["v1alpha1"]}}


ESTABLISHED = {"type": "Established", "status": "True"}


@pytest.mark.parametrize(
    "obj",
    [{}, {"status": None}, {"status": {}}, {"status": {"conditions": None}}, {"status": {"conditions": []}}],
    ids=["no status", "null status", "empty status", "null conditions", "no conditions"],
)
def test_a_condition_not_yet_written_is_not_true(obj: dict[str, Any]) -> None:
    assert condition_true(obj, "Ready") is False


def test_a_condition_is_true_only_with_its_type_and_status_true() -> None:
    conditions = [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]
    obj = {"status": {"conditions": conditions}}
    assert condition_true(obj, "Ready") is False
    assert condition_true(obj, "Initialized") is True


def test_crds_are_established_only_once_every_one_of_ours_is() -> None:
    fresh = [crd("ardiffusion.dev", None), crd("ardiffusion.dev", [ESTABLISHED])]
    assert crds_established(fresh) is False
    assert crds_established([crd("ardiffusion.dev", [ESTABLISHED])] * 2) is True
    assert crds_established([crd("other.dev", [ESTABLISHED])]) is False
    assert crds_established([crd("other.dev", None), crd("ardiffusion.dev", [ESTABLISHED])]) is True
