"""The defects a real kube-apiserver finds in CRDs, and the cost of our rules by its published model."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ardiff.devcluster.cel_check import CELCheckError, check_expression, root_schema, schema_type
from ardiff.devcluster.crd import CRD_DIR, CustomResourceDefinition, load_manifests
from ardiff.devcluster.structural import schema_errors
from ardiff.devcluster.validation import InvalidObject

ROOT = "spec.versions[0].schema.openAPIV3Schema"


def crd(file: str) -> dict[str, Any]:
    return copy.deepcopy(load_manifests(CRD_DIR / file)[0])


def schema_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def refused(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidObject) as info:
        CustomResourceDefinition.from_manifest(doc)
    return [str(e) for e in info.value.errors]


@pytest.mark.parametrize("file", ["ardiffusionworkerpools.yaml", "ardiffusionsessions.yaml"])
def test_a_field_path_must_resolve_in_the_schema_not_the_object(file: str) -> None:
    doc = crd(file)
    schema_of(doc)["properties"]["metadata"] = {"type": "object"}  # as on main before the fix
    assert refused(doc) == [
        f'{ROOT}.x-kubernetes-validations[0].fieldPath: Invalid value: ".metadata.name": '
        "fieldPath must be a valid path: does not refer to a valid field"
    ]


def test_a_default_is_checked_against_its_nodes_rules_as_written() -> None:
    doc = crd("ardiffusionworkerpools.yaml")
    schema_of(doc)["properties"]["spec"]["properties"]["replicas"][
        "default"
    ] = {}  # as on main before the fix
    assert refused(doc) == [
        f'{ROOT}.properties[spec].properties[replicas].default: Invalid value: "object": '
        "no such key: max evaluating rule: max must be >= min"
    ]


def test_rules_are_type_checked_against_the_schema() -> None:
    replicas = schema_of(crd("ardiffusionworkerpools.yaml"))["properties"]["spec"]["properties"]["replicas"]
    for rule, error in [
        ("self.maximum >= self.min", "undefined field 'maximum'"),
        ("self.max >= 'one'", "found no matching overload"),
        ("self.max.value > 0", "type 'int' does not support field selection"),
        ("size(self.max) > 0", "found no matching overload for 'size'"),
        ("other.max > 0", "undeclared reference to 'other'"),
    ]:
        bad = copy.deepcopy(replicas)
        bad["x-kubernetes-validations"][0]["rule"] = rule
        errors = schema_errors({"type": "object", "properties": {"r": bad}}, "s")
        assert [(e.field, e.reason) for e in errors] == [
            ("s.properties[r].x-kubernetes-validations[0].rule", "FieldValueInvalid")
        ], rule
        assert error in errors[0].detail, rule
        assert errors[0].detail.startswith("compilation failed"), rule
    bad = copy.deepcopy(replicas)
    bad["x-kubernetes-validations"][0]["rule"] = "self.max"
    assert "must evaluate to a bool" in schema_errors(bad | {"type": "object"}, "s")[0].detail


def test_a_rule_reading_an_unbounded_value_is_refused() -> None:
    """Stricter than kube-apiserver, which would estimate the string from the 3 MiB request limit."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self.name.startsWith('a')"}],
    }
    errors = schema_errors(schema, "s")
    assert [(e.field, e.reason) for e in errors] == [
        ("s.x-kubernetes-validations[0].rule", "FieldValueForbidden")
    ]
    assert "cannot be bounded: name has no maxLength" in errors[0].detail
    schema["properties"]["name"]["maxLength"] = 16
    assert schema_errors(schema, "s") == []


def test_a_rule_over_the_cost_budget_is_refused() -> None:
    names = {"type": "array", "maxItems": 1000, "items": {"type": "string", "maxLength": 1000}}
    schema = {
        "type": "object",
        "properties": {"names": names},
        "x-kubernetes-validations": [{"rule": "self.names.all(a, self.names.all(b, a.matches(b)))"}],
    }
    errors = schema_errors(schema, "s")
    assert ("s.x-kubernetes-validations[0].rule", "FieldValueForbidden") in [
        (e.field, e.reason) for e in errors
    ]
    assert "estimated rule cost exceeds budget by factor of more than 100x" in errors[0].detail


def test_quantity_needs_kubernetes_1_29() -> None:
    """A 1.28 apiserver compiles new rules in its 1.27 environment, which has no quantity library."""
    gpus = schema_type({"type": "string", "maxLength": 16})
    rule = "quantity(self).isInteger() && quantity(self).isGreaterThan(quantity('0'))"
    with pytest.raises(CELCheckError, match="undeclared reference to 'quantity'"):
        check_expression(rule, gpus, old_self=False)
    assert check_expression(rule, gpus, old_self=False, compatibility=(1, 28)).type.kind == "bool"


# Each rule of our CRDs: estimated cost (cel-go v0.16 model with the Kubernetes size estimator) times the
# cardinality of its node. Strings count maxLength * 4 bytes.
POOL = "ardiffusionworkerpools.yaml"
# spec.resources: 16 entries, each reading int-or-string amounts (3 MiB - 2: an equality costs 314573).
GPU_EQUAL = (
    "!has(self.requests) || self.requests.all(k, !k.contains('/') || k.contains('kubernetes.io/') "
    "|| has(self.limits) && k in self.limits "
    "&& (self.requests[k] == self.limits[k] || int(self.requests[k]) == int(self.limits[k])))"
)
GPU_WHOLE = (
    "!has(self.limits) || self.limits.all(k, !k.contains('/') || k.contains('kubernetes.io/') "
    "|| type(self.limits[k]) == int || !self.limits[k].matches('\\\\D'))"
)
SELECTOR_KEYS = (
    "self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))"
)
MOUNTS_NAME_VOLUMES = (
    "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) "
    "&& self.volumes.exists(v, v.name == m.name))"
)
COSTS = [
    (POOL, "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')", 1, 164),
    (POOL, "has(self.name) != has(self.path)", 1, 5),
    (POOL, GPU_EQUAL, 1, 5033670),
    (POOL, GPU_WHOLE, 1, 5033446),
    (POOL, SELECTOR_KEYS, 1, 2114),
    (POOL, "has(self.key) && self.key != '' || has(self.operator) && self.operator == 'Exists'", 64, 9 * 64),
    (
        POOL,
        "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        64,
        11 * 64,
    ),
    (POOL, "!has(self.tolerationSeconds) || has(self.effect) && self.effect == 'NoExecute'", 64, 8 * 64),
    (POOL, "!(has(self.value) && has(self.valueFrom))", 256, 5 * 256),
    (POOL, "self != '.' && !self.startsWith('..')", 256, 5 * 256),
    (POOL, "self.max >= self.min", 1, 5),
    # Pod template knobs (issue 11 item 3); podLabels/podAnnotations keys reuse SELECTOR_KEYS.
    (
        POOL,
        "!has(self.modelDownload) || has(self.model.path) && self.model.path.startsWith('/models/')",
        1,
        10,
    ),
    (POOL, MOUNTS_NAME_VOLUMES, 1, 139782),  # 64 mounts x 64 volumes, names of 63 characters
    (POOL, "!(self.name in ['tmp', 'home', 'model-cache', 'dshm', 'model', 'redis-ca'])", 64, 19 * 64),
    (
        POOL,
        "!(self.mountPath in ['/tmp', '/home/ardiff', '/var/cache/ardiff/models', '/dev/shm', '/models', "
        "'/etc/ardiff/redis-tls'])",
        64,
        19 * 64,
    ),
    (POOL, "self.all(k, !k.startsWith('ardiffusion.dev/') && !k.startsWith('app.kubernetes.io/'))", 1, 706),
    (POOL, "self.all(k, !k.startsWith('ardiffusion.dev/'))", 1, 450),
    (POOL, "self.type == 'Localhost' ? has(self.localhostProfile) : !has(self.localhostProfile)", 1, 6),
    (POOL, "has(self.huggingFace) != has(self.url)", 1, 5),
    (POOL, "!(has(self.persistentVolumeClaim) && has(self.emptyDir))", 1, 5),
    ("ardiffusionsessions.yaml", "self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')", 1, 211),
    ("ardiffusionsessions.yaml", "self == oldSelf", 1, 24),  # spec.poolRef (55 characters)
    ("ardiffusionsessions.yaml", "self == oldSelf", 1, 15),  # spec.family (32 characters; issue 15)
    ("ardiffusionsessions.yaml", "has(self.configMapKeyRef) != has(self.secretKeyRef)", 1, 5),
]


def _rule_nodes(
    schema: dict[str, Any], above: int = 1, root: bool = True
) -> list[tuple[str, dict[str, Any], int, bool]]:
    """(rule, node, cardinality, root) in schema order; one rule text may sit on several nodes."""
    found = [(r["rule"], schema, above, root) for r in schema.get("x-kubernetes-validations") or ()]
    for child in (schema.get("properties") or {}).values():
        found += _rule_nodes(child, above, False)
    if isinstance(schema.get("items"), dict):
        found += _rule_nodes(schema["items"], above * schema.get("maxItems", 0), False)
    return found


def test_cost_of_our_rules() -> None:
    """Every node's (cardinality, total) is a row of COSTS for its rule, and every row is some node's (one
    rule text may sit on several nodes: the same cost is listed once, different costs once each)."""
    seen = set()
    for file in (POOL, "ardiffusionsessions.yaml"):
        for rule, node, above, root in _rule_nodes(schema_of(crd(file))):
            checked = check_expression(rule, schema_type(root_schema(node) if root else node), old_self=True)
            assert checked.unbounded == [], rule
            row = (file, rule, above, checked.cost * above)
            assert row in COSTS, row
            seen.add(row)
    assert sorted(seen) == sorted(COSTS)


def test_int_or_string_values_and_map_keys_are_sized_like_the_apiserver() -> None:
    """An int-or-string is dyn of 3 MiB - 2 and a map key is sized 0 (the estimator's StringType has no max).

    So comparing two amounts costs 314573, and `string()` of an amount, whose result cel-go 0.16 cannot size,
    makes a comparison unbounded: a 1.28 apiserver refuses `string(a) == string(b)` over the cost budget.
    """
    amounts = {
        "type": "object",
        "maxProperties": 1,
        "additionalProperties": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        },
    }
    resources = schema_type({"type": "object", "properties": {"requests": amounts, "limits": amounts}})
    compared = check_expression("self.requests['a'] == self.limits['a']", resources, old_self=False)
    assert (compared.cost, compared.unbounded) == (314573 + 2 * 3, [])  # each read: self, select, index
    keys = check_expression("self.requests.all(k, k.contains('/'))", resources, old_self=False)
    assert keys.cost == 2 + 1 + 1 * (1 + 3)  # range, result, one entry: contains on a 0-sized key + step
    typed = check_expression("type(self.limits['a']) == int", resources, old_self=False)
    assert typed.cost == 4 + 1  # type() 1 + the read 3, int 1, == 0: the type name is sized as the node, 0
    schema = {
        "type": "object",
        "properties": {"requests": amounts, "limits": amounts},
        "x-kubernetes-validations": [{"rule": "string(self.requests['a']) == string(self.limits['a'])"}],
    }
    errors = schema_errors(schema, "s")  # the rule, and the schema's total, over budget
    assert (errors[0].field, errors[0].reason) == (
        "s.x-kubernetes-validations[0].rule",
        "FieldValueForbidden",
    )
    assert "estimated rule cost exceeds budget by factor of more than 100x" in errors[0].detail
