"""A container's environment as a kubelet composes it: the image's, then `envFrom`, then `env` in order,
with `$(VAR)` references, `fieldRef`, `secretKeyRef`, `configMapKeyRef` and `resourceFieldRef` (a limit the
container does not set is the node's allocatable, as the downward API gives it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ardiff.devcluster.pod_volumes import field_value

_ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_references(value: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion (`$$` escapes; unknown references stay as they are)."""
    return _ENV_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), value).replace("$$", "$")


class ContainerConfigError(ValueError):
    """`CreateContainerConfigError`: a reference the container's env needs cannot be resolved."""


def quantity_value(quantity: str, divisor: str = "1") -> str:
    """A resource quantity divided by `divisor`, rounded up, as the downward API gives it."""
    suffixes = {
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }

    def parse(text: str) -> float:
        match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
        if match is None:
            raise ContainerConfigError(f"cannot parse quantity {text!r}")
        return float(match.group(1)) * suffixes.get(match.group(2), 1.0)

    value = parse(quantity) / parse(divisor)
    return str(max(1, int(-(-value // 1))))


def build_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    base: Mapping[str, str],
    secrets: Mapping[str, Mapping[str, str] | None],
    config_maps: Mapping[str, Mapping[str, str] | None],
    allocatable: Mapping[str, str],
) -> dict[str, str]:
    """A container's environment: `base` (the image's, then the kubelet's), `envFrom`, then `env` in order.

    `secrets`/`config_maps` hold the decoded data of the objects the container refers to (None: not found);
    a missing reference that is not optional raises ContainerConfigError."""
    env = dict(base)

    def lookup(kind: str, ref: Mapping[str, Any], key: str | None) -> Any:
        source = secrets if kind == "secret" else config_maps
        data = source.get(ref.get("name", ""))
        value = data if key is None else (None if data is None else data.get(key))
        if value is None and not ref.get("optional"):
            missing = ref.get("name") if data is None else f"{ref.get('name')}[{key}]"
            raise ContainerConfigError(f"{kind} {missing!r} not found")
        return value

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref_key in (("secret", "secretRef"), ("configmap", "configMapRef")):
            if ref_key in source:
                data = lookup(kind, source[ref_key], None) or {}
                env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name, value_from = var["name"], var.get("valueFrom")
        if value_from is None:
            env[name] = expand_references(str(var.get("value", "")), env)
        elif "fieldRef" in value_from:
            env[name] = field_value(pod, value_from["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
            kind, ref = (
                ("secret", value_from["secretKeyRef"])
                if "secretKeyRef" in value_from
                else ("configmap", value_from["configMapKeyRef"])
            )
            value = lookup(kind, ref, ref["key"])
            if value is not None:
                env[name] = value
        elif "resourceFieldRef" in value_from:
            ref = value_from["resourceFieldRef"]
            section, _, resource = ref["resource"].partition(".")
            given = ((container.get("resources") or {}).get(section) or {}).get(resource)
            fallback = allocatable.get(resource, "0") if section == "limits" else "0"
            env[name] = quantity_value(given or fallback, str(ref.get("divisor", "1")))
    return env


def referenced_objects(container: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The Secrets and ConfigMaps a container's env names."""
    secrets: set[str] = set()
    config_maps: set[str] = set()
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            secrets.add(source["secretRef"]["name"])
        if "configMapRef" in source:
            config_maps.add(source["configMapRef"]["name"])
    for var in container.get("env") or []:
        value_from = var.get("valueFrom") or {}
        if "secretKeyRef" in value_from:
            secrets.add(value_from["secretKeyRef"]["name"])
        if "configMapKeyRef" in value_from:
            config_maps.add(value_from["configMapKeyRef"]["name"])
    return secrets, config_maps
