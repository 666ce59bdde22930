"""Compile-time checks of a CRD's CEL rule against its schema: types, field references and estimated cost.

cel-python parses CEL but has no type checker and no cost estimator. kube-apiserver compiles each
`x-kubernetes-validations` rule with cel-go against the CEL types of the schema node (`self`, and `oldSelf`
for transition rules) and refuses the CRD when a rule names a field the schema does not declare, applies an
operator to the wrong types, does not yield a bool, or when its estimated worst-case cost
(`checker.Cost` with the Kubernetes size estimator) times the node's cardinality exceeds 10,000,000.

`check_rule(source, schema, ...)` walks cel-python's parse tree and does the same for the subset of CEL that
CRD rules use: identifiers, field selection, `has()`, indexing, literals, the operators, `size`, the string
functions `matches`/`startsWith`/`endsWith`/`contains`, the macros `all`/`exists`/`exists_one`/`map`/
`filter`, `type()` with the type names, and the Kubernetes `quantity` library. The cost is cel-go's
(v0.16, Kubernetes 1.28) formula for each of them. Anything else is refused as unmodelled rather than guessed.

Which Kubernetes: a 1.28 apiserver compiles new rules against its 1.27 environment, so `quantity()` (in the
environment from 1.28) is refused unless `compatibility` says 1.28 or later (a 1.29+ server). Strings
bounded only by an `enum` count as unbounded, as in 1.28 (later versions bound them by the longest value).
An `x-kubernetes-int-or-string` value is `dyn` of 3 MiB - 2 whatever the schema says, as upstream (no
bound can be declared for it), and a map's keys are sized 0, as the apiserver's estimator sizes them
(their declared type, `StringType`, has no maximum).
Stricter than kube-apiserver: a rule that reads a string, list or map the schema does not bound
(`maxLength`/`maxItems`/`maxProperties`, or a date/duration format), or that sits under an unbounded list or
map, is refused; the apiserver would estimate its size from the 3 MiB request limit instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final

import celpy
import lark

# Limits of k8s.io/apiextensions-apiserver (validation.go) and k8s.io/apiserver/pkg/cel (limits.go).
PER_RULE_COST_LIMIT: Final = 10_000_000
CRD_COST_LIMIT: Final = 100_000_000
MAX_REQUEST_BYTES: Final = 3 * 1024 * 1024
_UNBOUNDED_STRING: Final = MAX_REQUEST_BYTES - 2
_FORMAT_SIZES: Final = {"duration": 32, "date": 12, "date-time": 32}
_MAX_UINT64: Final = 2**64 - 1
# Kubernetes versions as (major, minor); a 1.28 server compiles new expressions in its 1.27 environment.
OLDEST_SUPPORTED_ENV: Final = (1, 27)
_QUANTITY_SINCE: Final = (1, 28)


class CELCheckError(ValueError):
    """A rule the apiserver would not compile (`compilation failed: ...`, `... must evaluate to a bool`)."""


class CELCostError(ValueError):
    """A rule whose estimated cost exceeds the budget or cannot be bounded."""


def _factor(size: int, factor: float) -> int:
    return min(math.ceil(size * factor), _MAX_UINT64)


def _add(*costs: int) -> int:
    return min(sum(costs), _MAX_UINT64)


def _mul(a: int, b: int) -> int:
    return min(a * b, _MAX_UINT64)


@dataclass(frozen=True)
class Ty:
    """A CEL type as the checker sees it; `size` is the most bytes/items/entries a value may hold."""

    kind: str  # bool int uint double string bytes null list map object dyn timestamp duration quantity
    size: int = 1
    fields: Mapping[str, Any] | None = None  # object: declared properties (schemas)
    elem: Ty | None = None  # list: item type; map: value type
    unbounded: str | None = None  # why the size is not bounded by the schema, if it is not


DYN: Final = Ty("dyn", _MAX_UINT64)


def schema_type(schema: Mapping[str, Any], where: str = "self") -> Ty:
    """The CEL type of a value of this structural schema (apiserver `SchemaDeclType`)."""
    if schema.get("x-kubernetes-int-or-string"):
        # Upstream's fixed size for an int-or-string (`maxRequestSizeBytes - 2`): modelled, not guessed.
        return Ty("dyn", _UNBOUNDED_STRING)
    kind = schema.get("type")
    if kind == "string":
        fmt = schema.get("format", "")
        cel_kind = {"byte": "bytes", "duration": "duration", "date": "timestamp", "date-time": "timestamp"}
        if "maxLength" in schema:
            factor = 1 if fmt == "byte" else 4  # maxLength counts runes; a rune is up to 4 bytes
            return Ty(cel_kind.get(fmt, "string"), max(schema["maxLength"], 0) * factor)
        if fmt in _FORMAT_SIZES:
            return Ty(cel_kind[fmt], _FORMAT_SIZES[fmt])
        return Ty(cel_kind.get(fmt, "string"), _UNBOUNDED_STRING, unbounded=f"{where} has no maxLength")
    if kind in ("integer", "number", "boolean"):
        return Ty({"integer": "int", "number": "double", "boolean": "bool"}[kind])
    if kind == "array":
        items = schema.get("items") or {}
        elem = schema_type(items, f"{where}[*]")
        if "maxItems" in schema:
            return Ty("list", schema["maxItems"], elem=elem)
        return Ty("list", _UNBOUNDED_STRING, elem=elem, unbounded=f"{where} has no maxItems")
    if kind == "object":
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            elem = schema_type(additional, f"{where}[*]")
            if "maxProperties" in schema:
                return Ty("map", schema["maxProperties"], elem=elem)
            return Ty("map", _UNBOUNDED_STRING, elem=elem, unbounded=f"{where} has no maxProperties")
        return Ty("object", fields=schema.get("properties") or {})
    return DYN


def root_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The root of a resource as CEL sees it: apiVersion, kind, metadata.name/generateName always declared.

    Like `WithTypeAndObjectMeta`: unless the schema declares all four as strings, they are replaced by
    plain (unbounded) strings and metadata holds nothing else.
    """
    props = schema.get("properties") or {}
    meta = (props.get("metadata") or {}).get("properties") or {}
    if all((props.get(k) or {}).get("type") == "string" for k in ("kind", "apiVersion")) and all(
        (meta.get(k) or {}).get("type") == "string" for k in ("name", "generateName")
    ):
        return schema
    string = {"type": "string"}
    meta_schema = {"type": "object", "properties": {"name": string, "generateName": string}}
    return {**schema, "properties": {**props, "kind": string, "apiVersion": string, "metadata": meta_schema}}


@dataclass
class Checked:
    """What the checker learnt about a rule."""

    type: Ty
    cost: int
    uses_old_self: bool = False
    unbounded: list[str] = field(default_factory=list)


@cache
def parse(source: str) -> lark.Tree:
    try:
        return celpy.Environment().compile(source)
    except celpy.CELParseError as exc:
        raise CELCheckError(f"compilation failed: {exc}") from exc


# Type denotations usable as values (`type(x) == int`).
_TYPE_NAMES: Final = frozenset(
    ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type")
)
# The size cel-go gives a map's keys in a macro: the apiserver's estimator answers with the MaxElements of the
# map's key type, StringType, which is never set.
_MAP_KEY: Final = Ty("string", 0)


@dataclass
class _Checker:
    variables: dict[str, Ty]
    compatibility: tuple[int, int]
    # What the apiserver's size estimator answers for a path that is not below `self` (an identifier such as
    # `int`): the MaxElements of the rule's own node, 0 unless it is a string, list, map or int-or-string.
    root_size: int = 0
    uses_old_self: bool = False
    unbounded: list[str] = field(default_factory=list)

    def fail(self, detail: str) -> CELCheckError:
        return CELCheckError(f"compilation failed: ERROR: <input>: {detail}")

    def read(self, ty: Ty) -> Ty:
        if ty.unbounded and ty.unbounded not in self.unbounded:
            self.unbounded.append(ty.unbounded)
        return ty

    # Each visit returns the expression's type and its estimated worst-case cost.
    def visit(self, tree: lark.Tree | lark.Token) -> tuple[Ty, int]:
        if isinstance(tree, lark.Token):
            raise self.fail(f"unexpected token {tree!s}")
        children = [c for c in tree.children if c is not None]
        rule = tree.data
        if rule in ("expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication"):
            if len(children) == 1:
                return self.visit(children[0])
            return self._operator(rule, children)
        if rule == "unary":
            if len(children) == 1:
                return self.visit(children[0])
            ty, cost = self.visit(children[1])
            if children[0].data == "unary_not":
                self.expect(ty, ("bool",), "!_")
                return Ty("bool"), _add(cost, 1)
            self.expect(ty, ("int", "double"), "-_")
            return ty, _add(cost, 1)
        if rule in ("member", "primary"):
            return self.visit(children[0])
        if rule == "paren_expr":
            return self.visit(children[0])
        if rule == "literal":
            return self._literal(children[0])
        if rule == "ident":
            return self._ident(str(children[0]))
        if rule == "member_dot":
            operand, cost = self.visit(children[0])
            return self._select(operand, str(children[1])), _add(cost, self._select_cost(operand))
        if rule == "member_index":
            (target, t_cost), (index, i_cost) = self.visit(children[0]), self.visit(children[1])
            return self._index(target, index), _add(t_cost, i_cost, 1)
        if rule == "ident_arg":
            return self._global_call(str(children[0]), _args(children[1:]))
        if rule == "member_dot_arg":
            return self._method(children[0], str(children[1]), _args(children[2:]))
        if rule == "list_lit":
            items = [self.visit(c) for c in _args(children)]
            cost = _add(10, *(c for _, c in items))
            elem = _common([t for t, _ in items])
            return Ty("list", len(items), elem=elem), cost
        if rule == "map_lit":
            entries = [self.visit(c) for c in (children[0].children if children else [])]
            cost = _add(30, *(c for _, c in entries))
            return Ty("map", len(entries) // 2, elem=_common([t for t, _ in entries[1::2]])), cost
        raise self.fail(f"the dev cluster's CEL checker does not model {rule!r} (refused, not guessed)")

    def expect(self, ty: Ty, kinds: Sequence[str], op: str) -> None:
        if ty.kind != "dyn" and ty.kind not in kinds:
            raise self.fail(f"found no matching overload for '{op}' applied to '({ty.kind})'")

    def _literal(self, token: lark.Token) -> tuple[Ty, int]:
        kinds = {
            "INT_LIT": "int",
            "UINT_LIT": "uint",
            "FLOAT_LIT": "double",
            "BOOL_LIT": "bool",
            "NULL_LIT": "null",
            "BYTES_LIT": "bytes",
        }
        if token.type in ("STRING_LIT", "MLSTRING_LIT"):
            value = celpy.Environment().program(parse(str(token))).evaluate({})
            return Ty("string", len(str(value))), 0
        return Ty(kinds[token.type]), 0

    def _ident(self, name: str) -> tuple[Ty, int]:
        if name not in self.variables and name in _TYPE_NAMES:
            return Ty("type", self.root_size), 1
        if name not in self.variables:
            raise self.fail(f"undeclared reference to '{name}' (in container '')")
        if name == "oldSelf":
            self.uses_old_self = True
        return self.read(self.variables[name]), 1

    def _select_cost(self, operand: Ty) -> int:
        return 1 if operand.kind in ("map", "object", "dyn") else 0

    def _select(self, operand: Ty, name: str) -> Ty:
        if operand.kind == "object":
            assert operand.fields is not None
            if name not in operand.fields:
                raise self.fail(f"undefined field '{name}'")
            return self.read(schema_type(operand.fields[name], name))
        if operand.kind == "map":
            assert operand.elem is not None
            return self.read(operand.elem)
        if operand.kind == "dyn":
            return DYN
        raise self.fail(f"type '{operand.kind}' does not support field selection")

    def _index(self, target: Ty, index: Ty) -> Ty:
        if target.kind == "list":
            self.expect(index, ("int", "uint"), "_[_]")
        elif target.kind == "map":
            self.expect(index, ("string",), "_[_]")
        elif target.kind != "dyn":
            raise self.fail(
                f"found no matching overload for '_[_]' applied to '({target.kind}, {index.kind})'"
            )
        return self.read(target.elem) if target.elem is not None else DYN

    def _operator(self, rule: str, children: list[Any]) -> tuple[Ty, int]:
        if rule == "expr":  # c ? a : b
            (cond, c_cost), (left, l_cost), (right, r_cost) = (self.visit(c) for c in children)
            self.expect(cond, ("bool",), "_?_:_")
            return _common([left, right]), _add(c_cost, max(l_cost, r_cost))
        if rule in ("conditionalor", "conditionaland"):
            (left, l_cost), (right, r_cost) = self.visit(children[0]), self.visit(children[1])
            op = "_||_" if rule == "conditionalor" else "_&&_"
            self.expect(left, ("bool",), op)
            self.expect(right, ("bool",), op)
            return Ty("bool"), _add(l_cost, r_cost)
        op_tree, right_tree = children
        op = op_tree.data
        (left, l_cost), (right, r_cost) = self.visit(op_tree.children[0]), self.visit(right_tree)
        args = _add(l_cost, r_cost)
        if op == "relation_in":
            if right.kind not in ("list", "map", "dyn"):
                raise self.fail(
                    f"found no matching overload for '@in' applied to '({left.kind}, {right.kind})'"
                )
            return Ty("bool"), _add(args, right.size if right.kind == "list" else 1)
        if op in ("relation_eq", "relation_ne"):
            self._comparable(left, right, "_==_" if op == "relation_eq" else "_!=_")
            return Ty("bool"), _add(args, self._compare_cost(left, right))
        if op.startswith("relation_"):
            self._comparable(left, right, "_<_", ordered=True)
            cost = self._compare_cost(left, right) if left.kind in ("string", "bytes") else 1
            return Ty("bool"), _add(args, cost)
        if op == "addition_add" and left.kind == right.kind and left.kind in ("string", "bytes", "list"):
            size = min(left.size + right.size, _MAX_UINT64)
            cost = 1 if left.kind == "list" else _factor(size, 0.1)
            return Ty(left.kind, size, elem=left.elem), _add(args, cost)
        name = {"addition_add": "_+_", "addition_sub": "_-_", "multiplication_mul": "_*_"}.get(op, op)
        kinds = ("int", "uint", "double", "duration", "timestamp")
        if left.kind != "dyn" and right.kind != "dyn" and (left.kind != right.kind or left.kind not in kinds):
            raise self.fail(
                f"found no matching overload for '{name}' applied to '({left.kind}, {right.kind})'"
            )
        return (left if left.kind != "dyn" else right), _add(args, 1)

    def _comparable(self, left: Ty, right: Ty, op: str, ordered: bool = False) -> None:
        numbers = ("int", "uint", "double")
        if "dyn" in (left.kind, right.kind) or left.kind == right.kind:
            if ordered and left.kind in ("list", "map", "object", "bool", "null", "type"):
                raise self.fail(
                    f"found no matching overload for '{op}' applied to '({left.kind}, {right.kind})'"
                )
            return
        if left.kind in numbers and right.kind in numbers:
            return  # cross-type numeric comparisons are enabled in Kubernetes
        if not ordered and "null" in (left.kind, right.kind):
            return
        raise self.fail(f"found no matching overload for '{op}' applied to '({left.kind}, {right.kind})'")

    def _compare_cost(self, left: Ty, right: Ty) -> int:
        if "object" in (left.kind, right.kind):
            raise self.fail(
                "the dev cluster's CEL checker does not model comparing objects (refused, not guessed)"
            )
        return _factor(min(_size(left), _size(right)), 0.1)

    def _global_call(self, name: str, args: list[Any]) -> tuple[Ty, int]:
        if name == "has":
            return self._has(args)
        checked = [self.visit(a) for a in args]
        cost = _add(*(c for _, c in checked))
        types = [t for t, _ in checked]
        if name == "size" and len(types) == 1:
            self.expect(types[0], ("string", "bytes", "list", "map"), "size")
            return Ty("int"), _add(cost, 1)
        if name == "type" and len(types) == 1:
            return Ty("type", _MAX_UINT64), _add(cost, 1)  # a call's result has no path: size unknown
        if name in ("int", "uint", "double", "string", "bool") and len(types) == 1:
            return Ty(name, _MAX_UINT64 if name == "string" else 1), _add(cost, 1)
        if name == "quantity" and len(types) == 1 and self._quantity_declared():
            self.expect(types[0], ("string",), "quantity")
            return Ty("quantity"), _add(cost, 1)
        if name == "isQuantity" and len(types) == 1 and self._quantity_declared():
            self.expect(types[0], ("string",), "isQuantity")
            return Ty("bool"), _add(cost, 1)
        if name in ("quantity", "isQuantity", "size", "int", "uint", "double", "string", "bool"):
            if name in ("quantity", "isQuantity") and not self._quantity_declared():
                raise self.fail(f"undeclared reference to '{name}' (in container '')")
            raise self.fail(f"found no matching overload for '{name}' applied to {len(types)} arguments")
        raise self.fail(f"undeclared reference to '{name}' (in container '')")

    def _quantity_declared(self) -> bool:
        return self.compatibility >= _QUANTITY_SINCE

    def _has(self, args: list[Any]) -> tuple[Ty, int]:
        select = _unwrap(args[0]) if len(args) == 1 else None
        if select is None or select.data != "member_dot":
            raise self.fail("invalid argument to has() macro")
        operand, cost = self.visit(select.children[0])
        self._select(operand, str(select.children[1]))
        return Ty("bool"), _add(cost, 1)

    def _method(self, target_tree: Any, name: str, args: list[Any]) -> tuple[Ty, int]:
        if name in ("all", "exists", "exists_one", "map", "filter"):
            return self._macro(target_tree, name, args)
        target, t_cost = self.visit(target_tree)
        checked = [self.visit(a) for a in args]
        cost = _add(t_cost, *(c for _, c in checked))
        types = [t for t, _ in checked]
        if name in ("matches", "startsWith", "endsWith", "contains") and len(types) == 1:
            self.expect(target, ("string",), name)
            self.expect(types[0], ("string",), name)
            arg = _size(types[0])
            if name == "matches":
                call = _mul(_factor(_add(_size(target), 1), 0.1), _factor(arg, 0.25))
            elif name == "contains":
                call = _mul(_factor(_size(target), 0.1), _factor(arg, 0.1))
            else:
                call = _factor(arg, 0.1)
            return Ty("bool"), _add(cost, call)
        if name == "size" and not types:
            self.expect(target, ("string", "bytes", "list", "map"), "size")
            return Ty("int"), _add(cost, 1)
        if target.kind == "quantity" and self._quantity_declared():
            result = _QUANTITY_METHODS.get((name, len(types)))
            if result is not None:
                for ty in types:
                    self.expect(ty, ("quantity", "int") if name in ("add", "sub") else ("quantity",), name)
                return Ty(result), _add(cost, 1)
        raise self.fail(
            f"found no matching overload for '{name}' applied to '{target.kind}.({len(types)} args)'"
        )

    def _macro(self, target_tree: Any, name: str, args: list[Any]) -> tuple[Ty, int]:
        target, range_cost = self.visit(target_tree)
        if target.kind not in ("list", "map", "dyn") or len(args) != 2:
            raise self.fail(f"found no matching overload for '{name}' applied to '{target.kind}'")
        var = _unwrap(args[0])
        if var is None or var.data != "ident":
            raise self.fail(f"argument is not an identifier in {name}() macro")
        element = target.elem if target.kind == "list" and target.elem else _MAP_KEY
        if target.kind == "dyn":
            element = DYN
        name_of_var = str(var.children[0])
        outer = self.variables.get(name_of_var)
        self.variables[name_of_var] = element
        try:
            body, body_cost = self.visit(args[1])
        finally:
            if outer is None:
                del self.variables[name_of_var]
            else:
                self.variables[name_of_var] = outer
        if name in ("all", "exists", "exists_one", "filter"):
            self.expect(body, ("bool",), name)
        # cel-go's macro expansions (accumulator init, loop condition, step, result) and their costs.
        init, step, result = {
            "all": (0, 3, 1),
            "exists": (0, 4, 1),
            "exists_one": (0, 2, 2),
            "map": (10, 12, 1),
            "filter": (10, 13, 1),
        }[name]
        cost = _add(range_cost, init, result, _mul(_add(body_cost, step), target.size))
        if name in ("map", "filter"):
            return Ty("list", target.size, elem=body if name == "map" else element), cost
        return Ty("bool"), cost


_QUANTITY_METHODS: Final = {
    ("isInteger", 0): "bool",
    ("asInteger", 0): "int",
    ("asApproximateFloat", 0): "double",
    ("sign", 0): "int",
    ("compareTo", 1): "int",
    ("isGreaterThan", 1): "bool",
    ("isLessThan", 1): "bool",
    ("add", 1): "quantity",
    ("sub", 1): "quantity",
}


def _size(ty: Ty) -> int:
    if ty.kind in ("string", "bytes", "list", "map", "dyn", "type"):
        return ty.size
    return 1


def _common(types: list[Ty]) -> Ty:
    kinds = {t.kind for t in types}
    if len(kinds) == 1:
        return max(types, key=lambda t: t.size)
    return DYN


def _args(children: list[Any]) -> list[Any]:
    """The expressions of an optional exprlist child."""
    if not children:
        return []
    return [c for c in children[0].children if c is not None]


def _unwrap(tree: Any) -> lark.Tree | None:
    """The innermost node of a chain of single-child wrappers (expr → ... → member → primary → x)."""
    while isinstance(tree, lark.Tree) and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
        tree = tree.children[0]
    return tree if isinstance(tree, lark.Tree) else None


def check_expression(
    source: str,
    self_type: Ty,
    *,
    old_self: bool,
    compatibility: tuple[int, int] = OLDEST_SUPPORTED_ENV,
) -> Checked:
    """Type-check and cost one expression with `self` (and `oldSelf` where allowed) of `self_type`."""
    variables = {"self": self_type}
    if old_self:
        variables["oldSelf"] = self_type
    root_size = self_type.size if self_type.kind in ("string", "bytes", "list", "map", "dyn") else 0
    checker = _Checker(variables, compatibility, root_size)
    checker.read(self_type)
    ty, cost = checker.visit(parse(source))
    return Checked(ty, cost, checker.uses_old_self, checker.unbounded)


def cardinality(path: Sequence[Mapping[str, Any]]) -> tuple[int, str | None]:
    """How many times a rule may run per object: the product of maxItems/maxProperties above its node.

    `path` lists the schemas from the root down to (excluding) the node. Returns the product and, when
    some list or map above is unbounded, why.
    """
    product = 1
    for schema in path:
        if schema.get("type") == "array" or isinstance(schema.get("additionalProperties"), Mapping):
            bound = schema.get("maxItems", schema.get("maxProperties"))
            if bound is None:
                return _MAX_UINT64, "a list or map above the rule has no maxItems/maxProperties"
            product = min(product * bound, _MAX_UINT64)
    return product, None


def cost_error(name: str, cost: int, limit: int) -> str:
    """The apiserver's `getCostErrorMessage`."""
    factor = cost / limit
    if factor > 100:
        shown = "more than 100x"
    elif factor < 1.5:
        shown = f"{factor:f}x"
    else:
        shown = f"{factor:.1f}x"
    return (
        f"{name} exceeds budget by factor of {shown} (try simplifying the rule, or adding maxItems, "
        "maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
