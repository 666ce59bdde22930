"""The disruption controller's arithmetic and the eviction API's verdict, ported from Kubernetes
(`pkg/controller/disruption/disruption.go`: getExpectedPodCount, getExpectedScale, getScaleController,
countHealthyPods, updatePdbStatus; `pkg/registry/core/pod/storage/eviction.go`: canIgnorePDB, the
unhealthy-pod policy, checkAndDecrement) so that a PodDisruptionBudget over the operator's worker Pods can be
checked the way a real cluster computes it. A development harness: pure functions over plain dicts.

What a real cluster adds and this leaves out: the `disruptedPods` map (evictions not yet confirmed by a
deletion), the built-in controllers' finders (ReplicaSet, Deployment, StatefulSet, ReplicationController:
worker Pods are owned by a pool, which only the generic scale finder knows), Events and conditions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]


class ScaleError(Exception):
    """The controller's scale cannot be read (`found no controllers for pod`, `... does not implement the
    scale subresource`): the disruption controller's failSafe sets `disruptionsAllowed` to 0."""


# (owner reference, namespace) -> the owner's Scale (`autoscaling/v1`), None when the owner is gone; raise
# ScaleError when its kind serves no scale subresource.
ScaleLookup = Callable[[Obj, str], Obj | None]


@dataclass(frozen=True)
class PdbStatus:
    expected_pods: int
    desired_healthy: int
    current_healthy: int
    disruptions_allowed: int
    unmanaged_pods: tuple[str, ...] = ()
    error: str | None = None  # the sync failed (failSafe): nothing may be disrupted

    def as_status(self, generation: int) -> dict[str, Any]:
        return {
            "observedGeneration": generation,
            "expectedPods": self.expected_pods,
            "desiredHealthy": self.desired_healthy,
            "currentHealthy": self.current_healthy,
            "disruptionsAllowed": self.disruptions_allowed,
        }


def selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """LabelSelectorAsSelector(...).Matches: a nil selector matches nothing, an empty one everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def pods_for_pdb(pdb: Obj, pods: Iterable[Obj]) -> list[Obj]:
    namespace = pdb["metadata"].get("namespace")
    selector = (pdb.get("spec") or {}).get("selector")
    return [
        pod
        for pod in pods
        if pod["metadata"].get("namespace") == namespace
        and selector_matches(selector, pod["metadata"].get("labels") or {})
    ]


def is_pod_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def scaled_value(value: int | str, total: int, *, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    if not value.endswith("%"):
        raise ScaleError(f"invalid value for IntOrString: invalid type: string is not a percentage: {value}")
    fraction = int(value[:-1]) * total / 100
    return math.ceil(fraction) if round_up else math.floor(fraction)


def _controller_of(pod: Obj) -> Obj | None:
    return next((ref for ref in pod["metadata"].get("ownerReferences") or () if ref.get("controller")), None)


def expected_scale(pods: Sequence[Obj], scale_of: ScaleLookup) -> tuple[int, tuple[str, ...]]:
    """getExpectedScale: the sum of the scales (`spec.replicas`) of the distinct controllers of `pods`.
    Unmanaged pods (no controller) are reported, not counted."""
    scales: dict[str, int] = {}
    unmanaged: list[str] = []
    for pod in pods:
        ref = _controller_of(pod)
        if ref is None:
            unmanaged.append(pod["metadata"]["name"])
            continue
        if ref["uid"] in scales:
            continue
        scale = scale_of(ref, pod["metadata"]["namespace"])
        # getScaleController: an owner of another UID (deleted and re-created) is no controller of this pod.
        if scale is None or scale["metadata"].get("uid") != ref["uid"]:
            raise ScaleError(f'found no controllers for pod "{pod["metadata"]["name"]}"')
        scales[ref["uid"]] = int((scale.get("spec") or {}).get("replicas", 0))
    return sum(scales.values()), tuple(unmanaged)


def pdb_status(pdb: Obj, pods: Iterable[Obj], scale_of: ScaleLookup) -> PdbStatus:
    """trySync (getExpectedPodCount, countHealthyPods, updatePdbStatus) for one PDB over the namespace's pods;
    failSafe when the expected count cannot be computed."""
    matched = pods_for_pdb(pdb, pods)
    spec = pdb.get("spec") or {}
    current = sum(1 for p in matched if not p["metadata"].get("deletionTimestamp") and is_pod_ready(p))
    unmanaged: tuple[str, ...] = ()
    try:
        if spec.get("maxUnavailable") is not None:
            expected, unmanaged = expected_scale(matched, scale_of)
            max_unavailable = scaled_value(spec["maxUnavailable"], expected, round_up=True)
            desired = max(expected - max_unavailable, 0)
        elif isinstance(spec.get("minAvailable"), int):
            desired, expected = spec["minAvailable"], len(matched)
        elif spec.get("minAvailable") is not None:
            expected, unmanaged = expected_scale(matched, scale_of)
            desired = scaled_value(spec["minAvailable"], expected, round_up=True)
        else:
            expected, desired = 0, 0
    except ScaleError as exc:
        return PdbStatus(0, 0, current, 0, error=str(exc))
    allowed = current - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    return PdbStatus(expected, desired, current, allowed, unmanaged)


@dataclass(frozen=True)
class EvictionVerdict:
    code: int  # 201 evicted (the apiserver answers 201 Created with a Status), 429 refused, 500 ambiguous
    message: str
    pdb: str | None = None


def evict(pod: Obj, pdbs: Iterable[Obj]) -> EvictionVerdict:
    """The eviction subresource's decision for `pod` given the namespace's PDBs with their status (what the
    disruption controller last wrote)."""
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
        return EvictionVerdict(201, "evicted: the pod's state lets the budget be ignored")
    labels = pod["metadata"].get("labels") or {}
    matching = [
        pdb
        for pdb in pdbs
        if pdb["metadata"].get("namespace") == pod["metadata"].get("namespace")
        and selector_matches((pdb.get("spec") or {}).get("selector"), labels)
    ]
    if len(matching) > 1:
        message = (
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
        )
        return EvictionVerdict(500, message)
    if not matching:
        return EvictionVerdict(201, "evicted: no PodDisruptionBudget covers the pod")
    pdb = matching[0]
    name, status = pdb["metadata"]["name"], pdb.get("status") or {}
    if not is_pod_ready(pod):
        if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return EvictionVerdict(201, "evicted: unhealthy, and the budget always allows that", name)
        if status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0:
            return EvictionVerdict(201, "evicted: unhealthy, and the budget is healthy without it", name)
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        return EvictionVerdict(
            429, f"The disruption budget {name} is still being processed by the server.", name
        )
    if status.get("disruptionsAllowed", 0) <= 0:
        return EvictionVerdict(
            429,
            f"Cannot evict pod as it would violate the pod's disruption budget. The disruption budget {name} "
            f"needs {status.get('desiredHealthy', 0)} healthy pods and has {status.get('currentHealthy', 0)} "
            "currently",
            name,
        )
    return EvictionVerdict(201, "evicted", name)
