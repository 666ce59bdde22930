"""A pool whose template would make a Pod the apiserver refuses is refused by the pool CRD itself (issue 10).

Each case is judged by the session's real kube-apiserver serving `crds/ardiffusionworkerpools.yaml`
(server-side dry-run): 422 `Invalid` naming the field with the CRD's message; the valid neighbour of each case
is admitted, and so is the worker Pod the operator builds from it.

The CRD is stricter than a 1.37 server's Pod admission in two places, on purpose: environment variable names
follow the rule of the oldest server the chart supports (1.28; newer servers take any printable name without
'='), and extended resources must be written in digits (`1k` is a whole number to the Pod; CEL on 1.28 has no
quantity()); hugepages limits must be written as their requests are for the same reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from ardiff.operator.pods import build_worker_pod
from ardiff.operator.specs import WorkerPoolSpec
from tests.conftest import Admission

GPU_EQUAL = "an extended resource such as nvidia.com/gpu needs a limit equal to its request"
GPU_WHOLE = "an extended resource such as nvidia.com/gpu must be a whole number, written in digits"
HUGEPAGES = "a hugepages-<size> request needs a limit written the same (hugepages are never overcommitted)"
EMPTY_KEY = 'operator must be Exists when `key` is empty, which means "match all values and all keys"'
EXISTS_VALUE = "value must be empty when `operator` is 'Exists'"
SECONDS = "effect must be 'NoExecute' when `tolerationSeconds` is set"
ENV_DOTS = "must not be '.' or start with '..'"
SELECTOR_KEY = "nodeSelector keys must be qualified names"


def pool(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": name},
        "spec": {"model": {"name": "tiny-lingbot-world"}, "image": "w:1", **spec},
    }


def resources(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    found = {"requests": requests, "limits": limits}
    return {"resources": {k: v for k, v in found.items() if v is not None}}


def toleration(**fields: Any) -> dict[str, Any]:
    return {"tolerations": [{"key": "gpu", **fields}]}


# (spec, the field named, the message); every case's spec is otherwise valid.
REFUSED = [
    (resources({"nvidia.com/gpu": 1}), "spec.resources.requests", GPU_EQUAL),
    (resources({"nvidia.com/gpu": 1}, {"cpu": "2"}), "spec.resources.requests", GPU_EQUAL),
    (resources({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}), "spec.resources.requests", GPU_EQUAL),
    (resources({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}), "spec.resources.requests", GPU_EQUAL),
    (resources(None, {"nvidia.com/gpu": "1.5"}), "spec.resources.limits", GPU_WHOLE),
    # int("1.5") fails, so the rule errors: reported at its node, "<error> evaluating rule: <message>".
    (resources({"nvidia.com/gpu": "1.5"}, {"nvidia.com/gpu": 2}), "spec.resources", GPU_EQUAL),
    (resources(None, {"nvidia.com/gpu": "500m"}), "spec.resources.limits", GPU_WHOLE),
    (resources(None, {"example.com/foo": "1k"}), "spec.resources.limits", GPU_WHOLE),
    # The Pod: "Limit must be set for non overcommitable resources", "must be equal to hugepages-2Mi limit".
    (
        resources({"memory": "2Gi", "hugepages-2Mi": "1Gi"}, {"memory": "4Gi"}),
        "spec.resources.requests",
        HUGEPAGES,
    ),
    (resources({"hugepages-1Gi": "1Gi"}, {"hugepages-1Gi": "2Gi"}), "spec.resources.requests", HUGEPAGES),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.tolerations[0].operator", EMPTY_KEY),
    ({"tolerations": [{}]}, "spec.tolerations[0].operator", EMPTY_KEY),
    (toleration(operator="Exists", value="x"), "spec.tolerations[0].operator", EXISTS_VALUE),
    (toleration(tolerationSeconds=30), "spec.tolerations[0].effect", SECONDS),
    (toleration(effect="NoSchedule", tolerationSeconds=30), "spec.tolerations[0].effect", SECONDS),
    ({"env": [{"name": "."}]}, "spec.env[0].name", ENV_DOTS),
    ({"env": [{"name": ".."}]}, "spec.env[0].name", ENV_DOTS),
    ({"env": [{"name": "..A"}]}, "spec.env[0].name", ENV_DOTS),
    ({"env": [{"name": "1A"}]}, "spec.env[0].name", "should match '^[-._a-zA-Z][-._a-zA-Z0-9]*$'"),
    ({"env": [{"name": "A B"}]}, "spec.env[0].name", "should match"),
    ({"nodeSelector": {"gpu type": "h200"}}, "spec.nodeSelector", SELECTOR_KEY),
    ({"nodeSelector": {"example.com/": "h200"}}, "spec.nodeSelector", SELECTOR_KEY),
    ({"nodeSelector": {"-gpu": "h200"}}, "spec.nodeSelector", SELECTOR_KEY),
    ({"nodeSelector": {"gpu": "h200 nvl"}}, "spec.nodeSelector.gpu", "should match"),
]

ADMITTED = [
    resources({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 1}),
    resources({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": "1"}),  # a quantity compares by value
    resources({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": 2}),
    resources(None, {"nvidia.com/gpu": 8, "cpu": "500m", "memory": "1.5Gi"}),
    resources(
        {"cpu": "500m", "memory": "2Gi", "hugepages-2Mi": "1Gi"}, {"memory": "4Gi", "hugepages-2Mi": "1Gi"}
    ),
    resources(None, {"hugepages-2Mi": "1Gi"}),  # the Pod's request defaults to the limit
    resources({"example.kubernetes.io/thing": "0.5"}, {"example.kubernetes.io/thing": "0.5"}),
    {"tolerations": [{"operator": "Exists"}]},
    toleration(operator="Exists"),
    toleration(value="x"),
    toleration(operator="Equal", value="x", effect="NoExecute", tolerationSeconds=30),
    {"env": [{"name": "MY_ENV.NAME", "value": "1"}, {"name": ".a"}, {"name": "-x"}]},
    {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200", "gpu": "", "a_b.c-d": "x"}},
]


@pytest.mark.parametrize(("spec", "field", "message"), REFUSED)
def test_a_template_the_apiserver_would_refuse_is_refused_by_the_pool_crd(
    admission: Admission, spec: dict[str, Any], field: str, message: str
) -> None:
    verdict = admission.create(pool("p", **spec))
    assert verdict.code == 422, verdict.body
    assert verdict.reason == "Invalid"
    assert [c["field"] for c in verdict.causes] == [field], verdict.causes
    assert message in verdict.causes[0]["message"], verdict.causes


@pytest.mark.parametrize("spec", ADMITTED)
def test_the_valid_neighbours_are_admitted_and_so_are_their_pods(
    admission: Admission, spec: dict[str, Any]
) -> None:
    admitted = admission.create(pool("p", **spec))
    assert admitted.admitted, admitted.body
    worker = build_worker_pod(
        admission.namespace, "p", WorkerPoolSpec.from_resource(admitted.obj["spec"]), pod_name="p-ab12c"
    )
    pod = admission.create(worker)
    assert pod.admitted, pod.body
