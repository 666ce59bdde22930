"""Pure pieces of the emulated API: patches, selectors, printer columns, discovery order."""

from __future__ import annotations

import datetime

import pytest

from ardiff.devcluster.api_resources import ResourceRegistry, build_api_group_list
from ardiff.devcluster.crd import PrinterColumn
from ardiff.devcluster.patches import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    apply_patch,
)
from ardiff.devcluster.selectors import FieldSelector, LabelSelector, SelectorError
from ardiff.devcluster.tables import build_table, human_duration, json_path

POD = {
    "metadata": {"name": "w1", "labels": {"app": "ardiff", "tier": "gpu"}, "finalizers": ["a"]},
    "spec": {
        "containers": [
            {
                "name": "worker",
                "image": "w:1",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
            },
            {"name": "sidecar", "image": "s:1"},
        ],
    },
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_merge_patch_is_rfc_7386() -> None:
    patched = apply_patch(
        POD, {"metadata": {"labels": {"tier": None, "new": "x"}}, "spec": {"containers": []}}, MERGE_PATCH
    )
    assert patched["metadata"]["labels"] == {"app": "ardiff", "new": "x"}
    assert patched["spec"]["containers"] == []  # lists are replaced
    assert POD["metadata"]["labels"]["tier"] == "gpu"  # the target is not mutated


def test_strategic_merge_patch_merges_known_lists_by_key() -> None:
    patch = {
        "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "worker"}, {"name": "sidecar"}],
            "containers": [
                {"name": "worker", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
                {"name": "sidecar", "$patch": "delete"},
            ],
        },
    }
    patched = apply_patch(POD, patch, STRATEGIC_MERGE_PATCH)
    assert patched["metadata"]["finalizers"] == ["b"]
    assert [c["name"] for c in patched["spec"]["containers"]] == ["worker"]
    assert patched["spec"]["containers"][0]["image"] == "w:1"
    assert patched["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "3"},
        {"name": "C", "value": "4"},
    ]


def test_json_patch_and_its_failures() -> None:
    patched = apply_patch(POD, [{"op": "replace", "path": "/status/phase", "value": "Failed"}], JSON_PATCH)
    assert patched["status"]["phase"] == "Failed"
    with pytest.raises(PatchError):
        apply_patch(POD, [{"op": "test", "path": "/status/phase", "value": "Pending"}], JSON_PATCH)
    with pytest.raises(PatchError, match="must be a list"):
        apply_patch(POD, {"op": "add"}, JSON_PATCH)
    with pytest.raises(PatchError, match="unsupported patch content type"):
        apply_patch(POD, {}, "application/xml")


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=ardiff", True),
        ("app==ardiff,tier=gpu", True),
        ("app!=ardiff", False),
        ("tier in (cpu, gpu)", True),
        ("tier notin (gpu)", False),
        ("tier", True),
        ("!tier", False),
        ("missing", False),
        ("!missing", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    assert LabelSelector.parse(selector).matches(POD) is matches


def test_field_selectors_and_parse_errors() -> None:
    assert FieldSelector.parse("metadata.name=w1,status.phase=Running").matches(POD)
    assert not FieldSelector.parse("metadata.name!=w1").matches(POD)
    assert FieldSelector.parse("spec.nodeName=").matches(POD)  # absent fields compare as ""
    with pytest.raises(SelectorError):
        FieldSelector.parse("metadata.name")
    with pytest.raises(SelectorError):
        LabelSelector.parse("a b c")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (9 * 3600, "9h"),
        (3 * 86400, "3d"),
        (-5, "<invalid>"),
    ],
)
def test_human_duration_matches_kubectl(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_json_path_subset() -> None:
    assert json_path(POD, ".metadata.labels.tier") == "gpu"
    assert json_path(POD, ".metadata.labels['app']") == "ardiff"
    assert json_path(POD, ".spec.containers[1].name") == "sidecar"
    assert json_path(POD, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert json_path(POD, ".status.missing.deeper") is None
    with pytest.raises(ValueError, match="unsupported JSONPath"):
        json_path(POD, "status.phase")


def test_tables_render_printer_columns_and_pod_columns() -> None:
    now = datetime.datetime(2026, 1, 1, 0, 10, tzinfo=datetime.UTC)
    obj = {
        "metadata": {"name": "s1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Ready"},
    }
    columns = [
        PrinterColumn("Phase", "string", ".status.phase"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    ]
    table = build_table(
        "ARDiffusionSession", [obj], columns, resource_version="7", include_object="None", now=now
    )
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase", "Age"]
    assert table["rows"] == [{"cells": ["s1", "Ready", "10m"]}]
    pod = {
        **POD,
        "metadata": {**POD["metadata"], "creationTimestamp": "2026-01-01T00:09:00Z"},
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "containerStatuses": [{"ready": True, "restartCount": 2}, {"ready": False, "restartCount": 0}],
        },
    }
    pod_table = build_table("Pod", [pod], (), resource_version="7", include_object="Object", now=now)
    assert [c["name"] for c in pod_table["columnDefinitions"]][:5] == [
        "Name",
        "Ready",
        "Status",
        "Restarts",
        "Age",
    ]
    assert pod_table["rows"][0]["cells"] == [
        "w1", "1/2", "Running", "2", "60s", "127.0.0.1", "<none>", "<none>", "<none>",
    ]  # fmt: skip
    assert pod_table["rows"][0]["object"] is pod


def test_discovery_prefers_stable_versions() -> None:
    groups = {g["name"]: g for g in build_api_group_list(ResourceRegistry.with_builtins())["groups"]}
    assert groups["autoscaling"]["preferredVersion"]["version"] == "v2"
    assert groups["gateway.networking.k8s.io"]["preferredVersion"]["version"] == "v1"
