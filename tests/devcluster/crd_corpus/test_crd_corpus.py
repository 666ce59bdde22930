"""Conformance corpus: CRD schemas judged by the dev cluster exactly as kube-apiserver judges them.

Each case is an `openAPIV3Schema` from upstream's tests and rules (k8s.io/apiextensions-apiserver:
`pkg/apis/apiextensions/validation/validation_test.go` `TestValidateCustomResourceDefinitionValidation` and
`TestValidateFieldPath`, `pkg/apiserver/schema/validation.go` and its tests, `defaulting/validation.go`),
wrapped in a v1 CRD, with upstream's verdict: accepted, or the exact set of (field path, error type)
it reports.
Upstream's tests validate the internal type, whose path is `spec.validation.openAPIV3Schema`; for a v1 CRD the
same error is at `spec.versions[0].schema.openAPIV3Schema`, so paths below are relative to `openAPIV3Schema`.
The CRDs we ship (crds/) are part of the corpus and must be accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ardiff.devcluster.crd import CRD_DIR, CustomResourceDefinition, load_manifests
from ardiff.devcluster.validation import InvalidObject

PREFIX = "spec.versions[0].schema.openAPIV3Schema"
VT = "validation_test.go TestValidateCustomResourceDefinitionValidation"
S = {"type": "string", "maxLength": 10}
INT = {"type": "integer"}


def obj(props: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", **({"properties": props} if props is not None else {}), **extra}


def rules(*rule: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"rule": r, **extra} for r in rule]


def listmap(items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "array", "maxItems": 10, "items": items, **extra}


# (id, upstream source, schema, expected errors: (path below openAPIV3Schema, reason); empty = accepted)
CASES: list[tuple[str, str, dict[str, Any], set[tuple[str, str]]]] = [
    # --- structural (pkg/apiserver/schema/validation.go) -------------------------------------------
    ("root-type-missing", f"{VT} 'empty'", {}, {(".type", "FieldValueRequired")}),
    (
        "root-not-object",
        f"{VT} 'root type having invalid value, with status'",
        {"type": "string"},
        {(".type", "FieldValueInvalid")},
    ),
    (
        "field-type-missing",
        f"{VT} 'must be structural, but isn't'",
        obj({"a": {}}),
        {(".properties[a].type", "FieldValueRequired")},
    ),
    ("structural", f"{VT} 'must be structural'", obj({"a": S}), set()),
    (
        "invalid-type",
        f"{VT} 'require valid types, invalid'",
        obj({"a": {"type": "foo"}}),
        {(".properties[a].type", "FieldValueNotSupported")},
    ),
    (
        "array-without-items",
        "schema/validation_test.go TestValidateStructuralInvariants (items must be specified)",
        obj({"a": {"type": "array"}}),
        {(".properties[a].items", "FieldValueRequired")},
    ),
    (
        "additionalProperties-at-root",
        "schema/validation.go validateStructuralInvariants 'must not be used at the root'",
        obj(additionalProperties={"type": "string"}),
        {(".additionalProperties", "FieldValueForbidden")},
    ),
    (
        "metadata-other-field",
        "schema/validation_test.go TestValidateStructuralMetadataInvariants (labels in metadata)",
        obj({"metadata": obj({"labels": obj(additionalProperties=S)})}),
        {(".properties[metadata]", "FieldValueForbidden")},
    ),
    (
        "metadata-name-only",
        "schema/validation_test.go TestValidateStructuralMetadataInvariants (name and generateName)",
        obj({"metadata": obj({"name": S, "generateName": S})}),
        set(),
    ),
    (
        "metadata-not-object",
        "schema/validation.go validateStructuralMetadataInvariants 'must be object'",
        obj({"metadata": {"type": "string"}}),
        {(".properties[metadata].type", "FieldValueInvalid")},
    ),
    (
        "int-or-string-anyof",
        "schema/validation.go isIntOrStringAnyOfPattern",
        obj({"a": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}}),
        set(),
    ),
    (
        "type-in-anyof",
        "schema/validation.go validateNestedValueValidation 'must be empty to be structural'",
        obj({"a": {"type": "string", "anyOf": [{"type": "string", "maxLength": 3}]}}),
        {(".properties[a].anyOf[0].type", "FieldValueForbidden")},
    ),
    (
        "rule-in-oneof",
        "schema/validation.go validateNestedValueValidation (x-kubernetes-validations)",
        obj({"a": {"type": "string", "oneOf": [{"x-kubernetes-validations": rules("true")}]}}),
        {(".properties[a].oneOf[0].x-kubernetes-validations", "FieldValueForbidden")},
    ),
    (
        "bad-pattern",
        "schema/validation.go validateValueValidation 'must be a valid regular expression'",
        obj({"a": {"type": "string", "pattern": "("}}),
        {(".properties[a].pattern", "FieldValueInvalid")},
    ),
    (
        "preserve-and-int-or-string",
        "schema/validation.go validateExtensions",
        obj({"a": {"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True}}),
        {(".properties[a].x-kubernetes-preserve-unknown-fields", "FieldValueInvalid")},
    ),
    # --- ValidateCustomResourceDefinitionOpenAPISchema ----------------------------------------------
    (
        "uniqueItems",
        "validation.go 'uniqueItems cannot be set to true'",
        obj({"a": {"type": "array", "uniqueItems": True, "items": S}}),
        {(".properties[a].uniqueItems", "FieldValueForbidden")},
    ),
    (
        "properties-and-additionalProperties",
        "validation.go 'additionalProperties and properties are mutual exclusive'",
        obj({"a": obj({"b": S}, additionalProperties=S)}),
        {(".properties[a].additionalProperties", "FieldValueForbidden")},
    ),
    (
        "preserve-false",
        "validation.go 'must be true or undefined'",
        obj({"a": obj(**{"x-kubernetes-preserve-unknown-fields": False})}),
        {(".properties[a].x-kubernetes-preserve-unknown-fields", "FieldValueInvalid")},
    ),
    (
        "default-in-metadata",
        "validation.go withForbiddenDefaults 'in top-level metadata'",
        obj({"metadata": obj({"name": {"type": "string", "default": "x"}})}),
        {(".properties[metadata].properties[name].default", "FieldValueForbidden")},
    ),
    (
        "list-type-on-string",
        f"{VT} 'invalid type with list type extension set'",
        obj({"a": {"type": "object", "x-kubernetes-list-type": "set"}}),
        {(".properties[a].type", "FieldValueInvalid")},
    ),
    (
        "invalid-list-type",
        f"{VT} 'invalid list type extension'",
        obj({"a": listmap(S, **{"x-kubernetes-list-type": "no-such"})}),
        {(".properties[a].x-kubernetes-list-type", "FieldValueNotSupported")},
    ),
    (
        "map-keys-without-list-type",
        f"{VT} 'unset list type extension with list map keys extension non-empty'",
        obj({"a": listmap(obj({"k": S}, required=["k"]), **{"x-kubernetes-list-map-keys": ["k"]})}),
        {(".properties[a].x-kubernetes-list-type", "FieldValueRequired")},
    ),
    (
        "map-without-keys",
        f"{VT} 'empty list map keys extension with list type extension map'",
        obj({"a": listmap(obj({"k": S}), **{"x-kubernetes-list-type": "map"})}),
        {(".properties[a].x-kubernetes-list-map-keys", "FieldValueRequired")},
    ),
    (
        "map-of-strings",
        f"{VT} 'non object item with list type extension map'",
        obj({"a": listmap(S, **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"]})}),
        {(".properties[a].items.type", "FieldValueInvalid")},
    ),
    (
        "map-key-missing",
        f"{VT} 'items with key missing from properties with list type extension map'",
        obj(
            {
                "a": listmap(
                    obj({"k": S}, required=["k"]),
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["x"]},
                )
            }
        ),
        {(".properties[a].x-kubernetes-list-map-keys", "FieldValueInvalid")},
    ),
    (
        "map-key-not-scalar",
        f"{VT} 'items with non scalar key property type with list type extension map'",
        obj(
            {
                "a": listmap(
                    obj({"k": obj({})}, required=["k"]),
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"]},
                )
            }
        ),
        {(".properties[a].items.properties[k].type", "FieldValueInvalid")},
    ),
    (
        "map-key-duplicate",
        f"{VT} 'duplicate map keys with list type extension map'",
        obj(
            {
                "a": listmap(
                    obj({"k": S}, required=["k"]),
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k", "k"]},
                )
            }
        ),
        {(".properties[a].x-kubernetes-list-map-keys", "FieldValueInvalid")},
    ),
    (
        "map-key-not-required",
        f"{VT} 'invalid map with non-required key and no default'",
        obj(
            {
                "a": listmap(
                    obj({"k": S}), **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"]}
                )
            }
        ),
        {(".properties[a].items.properties[k].default", "FieldValueRequired")},
    ),
    (
        "map-key-defaulted",
        f"{VT} 'allowed map with non-required key and default'",
        obj(
            {
                "a": listmap(
                    obj({"k": {**S, "default": "x"}}),
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"]},
                )
            }
        ),
        set(),
    ),
    (
        "set-of-granular-maps",
        f"{VT} 'invalid list-type set with unspecified map-type for map items'",
        obj({"a": listmap(obj({"k": S}), **{"x-kubernetes-list-type": "set"})}),
        {(".properties[a].items.x-kubernetes-map-type", "FieldValueInvalid")},
    ),
    (
        "set-of-atomic-maps",
        f"{VT} 'allowed list-type set with atomic map items'",
        obj(
            {
                "a": listmap(
                    obj({"k": S}, **{"x-kubernetes-map-type": "atomic"}), **{"x-kubernetes-list-type": "set"}
                )
            }
        ),
        set(),
    ),
    (
        "invalid-map-type",
        f"{VT} 'invalid map type'",
        obj({"a": obj({}, **{"x-kubernetes-map-type": "no-such"})}),
        {(".properties[a].x-kubernetes-map-type", "FieldValueNotSupported")},
    ),
    # --- x-kubernetes-validations -------------------------------------------------------------------
    (
        "rule-scalar",
        f"{VT} 'valid x-kubernetes-validations for scalar element'",
        obj({"a": {**S, "x-kubernetes-validations": rules("self.startsWith('s')")}}),
        set(),
    ),
    (
        "rule-empty",
        f"{VT} 'invalid x-kubernetes-validations with empty rule'",
        obj({"a": {**S, "x-kubernetes-validations": [{"rule": " "}]}}),
        {(".properties[a].x-kubernetes-validations[0].rule", "FieldValueRequired")},
    ),
    (
        "rule-syntax",
        f"{VT} 'invalid rule in x-kubernetes-validations'",
        obj({"a": {**S, "x-kubernetes-validations": rules("self == true == 1")}}),
        {(".properties[a].x-kubernetes-validations[0].rule", "FieldValueInvalid")},
    ),
    (
        "rule-unknown-property",
        f"{VT} 'invalid x-kubernetes-validations for unknown property'",
        obj(**{"x-kubernetes-validations": rules("self.unknownProp > 0")}),
        {(".x-kubernetes-validations[0].rule", "FieldValueInvalid")},
    ),
    (
        "rule-multiline-no-message",
        f"{VT} 'multiline rule with message' (without its message)",
        obj({"a": {**S, "x-kubernetes-validations": rules("self.size() > 0 &&\nself.size() < 5")}}),
        {(".properties[a].x-kubernetes-validations[0].message", "FieldValueRequired")},
    ),
    (
        "rule-bad-reason",
        "validation.go supportedValidationReason (reason not supported)",
        obj({"a": {**S, "x-kubernetes-validations": rules("true", reason="Because")}}),
        {(".properties[a].x-kubernetes-validations[0].reason", "FieldValueNotSupported")},
    ),
    (
        "fieldPath-valid",
        "validation_test.go TestValidateFieldPath 'Valid fieldPath'",
        obj({"a": obj({"b": S}, **{"x-kubernetes-validations": rules("self.b == 'x'", fieldPath=".b")})}),
        set(),
    ),
    (
        "fieldPath-unknown",
        "validation_test.go TestValidateFieldPath 'Invalid fieldPath' (does not refer to a valid field)",
        obj({"a": obj({"b": S}, **{"x-kubernetes-validations": rules("self.b == 'x'", fieldPath=".c")})}),
        {(".properties[a].x-kubernetes-validations[0].fieldPath", "FieldValueInvalid")},
    ),
    (
        "fieldPath-map-key",
        "validation_test.go TestValidateFieldPath (map key in bracket notation)",
        obj(
            {
                "a": obj(
                    additionalProperties=S,
                    maxProperties=3,
                    **{"x-kubernetes-validations": rules("size(self) > 0", fieldPath="['k.x']")},
                )
            }
        ),
        set(),
    ),
    (
        "messageExpression",
        f"{VT} 'x-kubernetes-validations rule with messageExpression'",
        obj(
            {"a": {**S, "x-kubernetes-validations": rules("self == 'x'", messageExpression="'got ' + self")}}
        ),
        set(),
    ),
    (
        "messageExpression-syntax",
        f"{VT} 'x-kubernetes-validations rule invalidated by messageExpression syntax error'",
        obj({"a": {**S, "x-kubernetes-validations": rules("true", messageExpression="'a' +")}}),
        {(".properties[a].x-kubernetes-validations[0].messageExpression", "FieldValueInvalid")},
    ),
    (
        "messageExpression-not-string",
        f"{VT} 'x-kubernetes-validations rule invalidated by messageExpression not returning a string'",
        obj({"a": {**INT, "x-kubernetes-validations": rules("true", messageExpression="self + 1")}}),
        {(".properties[a].x-kubernetes-validations[0].messageExpression", "FieldValueInvalid")},
    ),
    (
        "messageExpression-blank",
        f"{VT} 'x-kubernetes-validations rule invalidated by messageExpression being only empty spaces'",
        obj({"a": {**S, "x-kubernetes-validations": rules("true", messageExpression="  ")}}),
        {(".properties[a].x-kubernetes-validations[0].messageExpression", "FieldValueRequired")},
    ),
    (
        "transition-atomic-list-item",
        f"{VT} 'forbid transition rule on element of list defaulting to type atomic'",
        obj({"a": listmap({**S, "x-kubernetes-validations": rules("self == oldSelf")})}),
        {(".properties[a].items.x-kubernetes-validations[0].rule", "FieldValueInvalid")},
    ),
    (
        "transition-set-item",
        f"{VT} 'forbid transition rule on element of list of type set'",
        obj(
            {
                "a": listmap(
                    {**S, "x-kubernetes-validations": rules("self == oldSelf")},
                    **{"x-kubernetes-list-type": "set"},
                )
            }
        ),
        {(".properties[a].items.x-kubernetes-validations[0].rule", "FieldValueInvalid")},
    ),
    (
        "transition-atomic-list",
        f"{VT} 'allow transition rule on list of type atomic'",
        obj(
            {
                "a": listmap(
                    S,
                    **{
                        "x-kubernetes-list-type": "atomic",
                        "x-kubernetes-validations": rules("self == oldSelf"),
                    },
                )
            }
        ),
        set(),
    ),
    (
        "transition-map-item",
        f"{VT} 'allow transition rule on element of list of type map'",
        obj(
            {
                "a": listmap(
                    obj(
                        {"k": S}, required=["k"], **{"x-kubernetes-validations": rules("self.k == oldSelf.k")}
                    ),
                    **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"]},
                )
            }
        ),
        set(),
    ),
    (
        "transition-granular-map-value",
        f"{VT} 'allow transition rule on element of map of type granular'",
        obj(
            {
                "a": obj(
                    additionalProperties={**S, "x-kubernetes-validations": rules("self == oldSelf")},
                    maxProperties=3,
                )
            }
        ),
        set(),
    ),
    (
        "double-nested-no-limit",
        f"{VT} 'forbid double-nested rule with no limit set'",
        obj(
            {
                "value": {
                    "type": "array",
                    "items": obj(additionalProperties=obj({"key": {"type": "string"}}, required=["key"])),
                    "x-kubernetes-validations": rules("self.all(x, x.all(y, x[y].key == x[y].key))"),
                }
            }
        ),
        {
            (".properties[value].x-kubernetes-validations[0].rule", "FieldValueForbidden"),
            ("", "FieldValueForbidden"),
        },
    ),
    (
        "double-nested-three-limits",
        f"{VT} 'allow double-nested rule with three limits set'",
        obj(
            {
                "a": {
                    "type": "array",
                    "maxItems": 10,
                    "items": {
                        "type": "array",
                        "maxItems": 10,
                        "items": {
                            "type": "string",
                            "maxLength": 10,
                            "x-kubernetes-validations": rules("self.contains('x')"),
                        },
                    },
                }
            }
        ),
        set(),
    ),
    (
        "metadata-name-rule",
        f"{VT} 'x-kubernetes-validations rule referencing metadata.name and generateName is within "
        "estimated cost limit' (with bounded strings)",
        obj(
            {
                "metadata": obj({"name": S, "generateName": S}),
                "kind": {"type": "string"},
                "apiVersion": {"type": "string"},
            },
            **{"x-kubernetes-validations": rules("self.metadata.name.startsWith('x')")},
        ),
        set(),
    ),
    # --- defaults (pkg/apiserver/schema/defaulting/validation.go) -----------------------------------
    (
        "default-violates-rule",
        f"{VT} 'invalid default with x-kubernetes-validations' (value)",
        obj(
            {"value": {**S, "default": "nope", "x-kubernetes-validations": rules("self.startsWith('kube')")}}
        ),
        {(".properties[value].default", "FieldValueInvalid")},
    ),
    (
        "default-valid-rule",
        f"{VT} 'valid default with x-kubernetes-validations' (value)",
        obj(
            {
                "value": {
                    **S,
                    "default": "kube-x",
                    "x-kubernetes-validations": rules("self.startsWith('kube')"),
                }
            }
        ),
        set(),
    ),
    (
        "default-unpruned",
        "defaulting/validation.go 'must not have unknown fields'",
        obj({"a": obj({"b": S}, default={"b": "x", "c": 1})}),
        {(".properties[a].default", "FieldValueInvalid")},
    ),
    (
        "default-nested-not-applied",
        "defaulting/validation.go (default validated as written, no nested defaulting)",
        obj(
            {
                "a": obj(
                    {"min": {**INT, "default": 1}, "max": {**INT, "default": 1}},
                    default={},
                    **{"x-kubernetes-validations": rules("self.max >= self.min")},
                )
            }
        ),
        {(".properties[a].default", "FieldValueInvalid")},
    ),
    (
        "default-wrong-type",
        "defaulting/validation.go (default validated against its schema)",
        obj({"a": {**INT, "default": "x"}}),
        {(".properties[a].default", "FieldValueInvalid")},
    ),
]


def crd_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "foos.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "foos", "kind": "Foo"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


def judged(doc: dict[str, Any]) -> set[tuple[str, str]]:
    try:
        CustomResourceDefinition.from_manifest(doc)
    except InvalidObject as error:
        return {(e.field.removeprefix(PREFIX), e.reason) for e in error.errors}
    return set()


@pytest.mark.parametrize(("schema", "expected"), [(c[2], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_upstream_case(schema: dict[str, Any], expected: set[tuple[str, str]]) -> None:
    assert judged(crd_of(schema)) == expected


@pytest.mark.parametrize("path", sorted(CRD_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_our_crds_are_accepted(path: Path) -> None:
    for doc in load_manifests(path):
        assert judged(doc) == set()


def test_corpus_size() -> None:
    assert len(CASES) + len(list(CRD_DIR.glob("*.yaml"))) >= 40
