"""examples/autoscaling/keda-scaledobject.yaml against KEDA's upstream ScaledObject CRD (vendored under
tests/vendor/keda/, source and version in its header) with `jsonschema`, and against our pool: the target
serves the scale subresource (the pool admitted by the session's real API server: server-side dry-run), the
queries read metrics the operator and the pool's workers export, the bounds fit."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ardiff.devcluster.cluster import load_manifests
from ardiff.operator.metrics import OperatorMetrics
from ardiff.operator.pods import pool_service_name
from ardiff.worker.metrics import WorkerMetrics
from tests.conftest import Admission

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "autoscaling" / "keda-scaledobject.yaml"
KEDA_CRD = ROOT / "tests" / "vendor" / "keda" / "keda.sh_scaledobjects.yaml"


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that lists its properties and keeps no
    unknown fields: what the apiserver would prune is an error here (a misspelt field would silently go)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def scaled_object_schema() -> dict[str, Any]:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["metadata"]["name"] == "scaledobjects.keda.sh"
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    assert version["name"] == "v1alpha1"
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # the apiserver's ObjectMeta, not KEDA's
    return strict(schema)


def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc}


def test_the_scaled_object_is_valid_against_kedas_crd(scaled_object_schema: dict[str, Any]) -> None:
    scaled = documents()["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    jsonschema.Draft7Validator(scaled_object_schema).validate(scaled)
    # The strict schema does catch what the apiserver would prune or refuse.
    misspelt = copy.deepcopy(scaled)
    misspelt["spec"]["scaleTargetRef"]["apiversion"] = misspelt["spec"]["scaleTargetRef"].pop("apiVersion")
    with pytest.raises(jsonschema.ValidationError, match="apiversion"):
        jsonschema.validate(misspelt, scaled_object_schema)
    no_target = copy.deepcopy(scaled)
    del no_target["spec"]["scaleTargetRef"]
    with pytest.raises(jsonschema.ValidationError, match="scaleTargetRef"):
        jsonschema.validate(no_target, scaled_object_schema)


def test_it_drives_the_pools_scale_subresource_on_the_pending_sessions_metric(admission: Admission) -> None:
    docs = documents()
    pool, scaled = docs["ARDiffusionWorkerPool"], docs["ScaledObject"]
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("ardiffusion.dev/v1alpha1", "ARDiffusionWorkerPool")
    assert target["name"] == pool["metadata"]["name"]
    # The pool is admitted by our CRD unpruned, and its CRD serves the Scale KEDA's HPA reads and writes.
    admitted = admission.create(pool)
    assert admitted.admitted, admitted.body
    assert admitted.pruned == []
    pool_crd = yaml.safe_load((ROOT / "crds" / "ardiffusionworkerpools.yaml").read_text())
    version = pool_crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas.min"
    # Scale to zero with a floor KEDA may raise up to the pool's max (a Scale above max is refused).
    assert pool["spec"]["replicas"]["min"] == scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] <= pool["spec"]["replicas"]["max"]
    # Two Prometheus triggers: the operator's pending-sessions gauge of exactly this pool, and the rate of
    # late chunks (deadline misses, issue 25) of exactly this pool's worker pods.
    pending, late = scaled["spec"]["triggers"]
    assert pending["type"] == late["type"] == "prometheus"
    query = pending["metadata"]["query"]
    names = set(re.findall(r"\b(ardiff_[a-z_]+)\{", query))
    exported = {m.name for m in OperatorMetrics().registry.collect()}
    assert names == {"ardiff_pool_pending_sessions"} <= exported
    labels = dict(re.findall(r'(\w+)="([^"]*)"', query))
    assert labels == {"namespace": "default", "pool": pool["metadata"]["name"]}
    # The threshold is one pod's slots: ceil(pending / threshold) pods.
    assert int(pending["metadata"]["threshold"]) == pool["spec"]["kv"]["sessionCapacity"]
    query = late["metadata"]["query"]
    samples = {s.name for m in WorkerMetrics().registry.collect() for s in m.samples}
    assert set(re.findall(r"\brate\((ardiff_[a-z_]+)\{", query)) == {"ardiff_worker_chunks_late_total"}
    assert "ardiff_worker_chunks_late_total" in samples
    labels = dict(re.findall(r'(\w+)="([^"]*)"', query))
    assert labels == {"namespace": "default", "service": pool_service_name(pool["metadata"]["name"])}
    assert float(late["metadata"]["threshold"]) > 0
    # The pool admits by compute too: new sessions wait for the pod the misses bring.
    assert 0 < pool["spec"]["computeUtilisation"] <= 1


def test_the_demo_does_not_apply_it() -> None:
    demo_documents = load_manifests(ROOT / "examples")
    assert not any(doc["kind"] == "ScaledObject" for doc in demo_documents)
    assert "tiny-world-autoscaled" not in {doc["metadata"]["name"] for doc in demo_documents}
