"""Admission of the built-in kinds the project creates at run time, as kube-apiserver validates them.

Ported from kubernetes' `pkg/apis/core/validation/validation.go` (`ValidatePod`, `ValidateService`,
`ValidateSecret`, `ValidateConfigMap`, `ValidateEvent`), `pkg/apis/policy/validation`
(`ValidatePodDisruptionBudget`), `apimachinery/pkg/api/validation` (`ValidateObjectMeta`: labels,
annotations and their 256 KiB total) and `apimachinery/pkg/util/validation` (qualified names, label values,
DNS labels, config keys, env var names, port names): the same field paths and messages, so a test against the
dev cluster fails where a real server would.

Which Kubernetes: what every version the chart supports (>= 1.28) admits. Where a rule was relaxed later the
stricter one is kept: environment variable names follow the 1.28 rule `[-._a-zA-Z][-._a-zA-Z0-9]*` (1.34
admits any printable ASCII but '=').

Not ported: update-only rules (a Pod's immutable spec, a Secret's immutable type), volume sources and mounts,
probes, security contexts, and the per-type Secret keys (`kubernetes.io/tls`, ...).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from ardiff.devcluster.validation import FieldError

Obj = Mapping[str, Any]

TOTAL_ANNOTATION_SIZE_LIMIT = 256 << 10  # TotalAnnotationSizeLimitB
MAX_SECRET_SIZE = 1 << 20  # api.MaxSecretSize: the data of a Secret or a ConfigMap
LAST_APPLIED_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"


class Undecodable(ValueError):
    """A value the apiserver cannot even decode (a 400 BadRequest, not a 422)."""


# --- apimachinery/pkg/util/validation ---------------------------------------------------------------------

_QUALIFIED_NAME_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = f"({_QUALIFIED_NAME_FMT})?"
_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = rf"{_DNS1123_LABEL_FMT}(\.{_DNS1123_LABEL_FMT})*"
_DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_CONFIG_KEY_FMT = "[-._a-zA-Z0-9]+"
_ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def _max_len(length: int) -> str:
    return f"must be no more than {length} characters"


def _matches(fmt: str, value: str) -> bool:
    return re.fullmatch(fmt, value) is not None


def is_dns1123_label(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_DNS1123_LABEL_FMT, value):
        message = (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
            "start and end with an alphanumeric character"
        )
        errors.append(_regex_error(message, _DNS1123_LABEL_FMT, "my-name", "123-abc"))
    return errors


def is_dns1123_subdomain(value: str) -> list[str]:
    errors = [_max_len(253)] if len(value) > 253 else []
    if not _matches(_DNS1123_SUBDOMAIN_FMT, value):
        message = (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
        errors.append(_regex_error(message, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def is_dns1035_label(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_DNS1035_LABEL_FMT, value):
        message = (
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character"
        )
        errors.append(_regex_error(message, _DNS1035_LABEL_FMT, "my-name", "abc-123"))
    return errors


def is_qualified_name(value: str) -> list[str]:
    """`[prefix/]name`: a DNS-1123 subdomain prefix and a name of at most 63 characters."""
    message = (
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
        "alphanumeric character"
    )
    parts = value.split("/")
    errors: list[str] = []
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(message, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {msg}" for msg in is_dns1123_subdomain(prefix)]
    name = parts[-1]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append(f"name part {_max_len(63)}")
    if not _matches(_QUALIFIED_NAME_FMT, name):
        errors.append(
            "name part " + _regex_error(message, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def is_valid_label_value(value: str) -> list[str]:
    errors = [_max_len(63)] if len(value) > 63 else []
    if not _matches(_LABEL_VALUE_FMT, value):
        message = (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
        errors.append(_regex_error(message, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return errors


def _chdir_prefix(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"must not be '{value}'"]
    return ["must not start with '..'"] if value.startswith("..") else []


def is_config_map_key(value: str) -> list[str]:
    errors = [_max_len(253)] if len(value) > 253 else []
    if not _matches(_CONFIG_KEY_FMT, value):
        message = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
        errors.append(_regex_error(message, _CONFIG_KEY_FMT, "key.name", "KEY_NAME", "key-name"))
    return errors + _chdir_prefix(value)


def is_env_var_name(value: str) -> list[str]:
    """The Kubernetes 1.28 rule (relaxed in 1.34; the stricter one is what every supported version admits)."""
    errors = []
    if not _matches(_ENV_VAR_NAME_FMT, value):
        message = (
            "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or "
            "'.', and must not start with a digit"
        )
        errors.append(_regex_error(message, _ENV_VAR_NAME_FMT, "my.env-name", "MY_ENV.NAME", "MyEnvName1"))
    return errors + _chdir_prefix(value)


def is_valid_port_num(port: Any) -> list[str]:
    ok = isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535
    return [] if ok else ["must be between 1 and 65535, inclusive"]


def is_valid_port_name(port: str) -> list[str]:
    errors = [_max_len(15)] if len(port) > 15 else []
    if not re.fullmatch("[-a-z0-9]+", port):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", port):
        errors.append("must contain at least one letter (a-z)")
    if "--" in port:
        errors.append("must not contain consecutive hyphens")
    if port.startswith("-") or port.endswith("-"):
        errors.append("must not begin or end with a hyphen")
    return errors


# --- quantities (k8s.io/apimachinery/pkg/api/resource) ----------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


def parse_quantity(value: Any) -> tuple[Decimal, str]:
    """A quantity's exact value and its canonical string (`0.5` -> `500m`, `2048Mi` -> `2Gi`)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise Undecodable(f"quantities must be strings or numbers, got {value!r}")
    match = _QUANTITY.match(str(value).strip()) if not isinstance(value, float) else None
    if isinstance(value, float):
        number, suffix = Decimal(repr(value)), ""
    elif match is None:
        raise Undecodable(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    else:
        number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY_SUFFIXES:
        exact = number * (2 ** _BINARY_SUFFIXES[suffix])
        if exact == exact.to_integral_value() and exact >= 1024:
            power = max(p for p in _BINARY_SUFFIXES.values() if exact % (2**p) == 0 and exact >= 2**p)
            name = next(s for s, p in _BINARY_SUFFIXES.items() if p == power)
            return exact, f"{int(exact / 2**power)}{name}"
        return exact, _decimal_si(exact)
    exponent = _DECIMAL_SUFFIXES.get(suffix)
    exact = number.scaleb(exponent if exponent is not None else int(suffix[1:]))
    return exact, _decimal_si(exact)


def _decimal_si(value: Decimal) -> str:
    if value == 0:
        return "0"
    for name, power in sorted(_DECIMAL_SUFFIXES.items(), key=lambda item: -item[1]):
        scaled = value.scaleb(-power)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{name}"
    return f"{int((value.scaleb(9)).to_integral_value(rounding='ROUND_CEILING'))}n"


# --- helpers ------------------------------------------------------------------------------------------------


def _map(obj: Obj, key: str) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Undecodable(f"{key} must be an object, got {type(value).__name__}")
    return value


def _items(obj: Obj, key: str) -> list[dict[str, Any]]:
    """A list of objects (containers, ports, env, ...)."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise Undecodable(f"{key} must be a list of objects")
    return value


def _invalid(path: str, value: Any, messages: Iterable[str]) -> list[FieldError]:
    return [FieldError(path, "FieldValueInvalid", msg, value) for msg in messages]


def _not_supported(path: str, value: Any, supported: Iterable[str]) -> FieldError:
    listed = ", ".join(json.dumps(v) for v in supported)
    return FieldError(path, "FieldValueNotSupported", f"supported values: {listed}", value)


def _required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "FieldValueRequired", detail)


# --- ObjectMeta ---------------------------------------------------------------------------------------------


def validate_labels(labels: Mapping[str, Any], path: str) -> list[FieldError]:
    errors = []
    for key, value in labels.items():
        errors += _invalid(path, key, is_qualified_name(key))
        errors += _invalid(path, value, is_valid_label_value(str(value)))
    return errors


def validate_annotations(annotations: Mapping[str, Any], path: str) -> list[FieldError]:
    """Keys are qualified names (case-insensitive); keys and values together hold at most 256 KiB (the
    last-applied configuration of a client-side `kubectl apply` counts too)."""
    errors = []
    for key in annotations:
        errors += _invalid(path, key, is_qualified_name(key.lower()))
    total = sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items())
    if total > TOTAL_ANNOTATION_SIZE_LIMIT:
        errors.append(
            FieldError(path, "FieldValueTooLong", f"must have at most {TOTAL_ANNOTATION_SIZE_LIMIT} bytes")
        )
    return errors


def validate_object_meta(obj: Obj) -> list[FieldError]:
    meta = _map(obj, "metadata")
    return validate_labels(_map(meta, "labels"), "metadata.labels") + validate_annotations(
        _map(meta, "annotations"), "metadata.annotations"
    )


# --- Pods ---------------------------------------------------------------------------------------------------

_STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _is_native(resource: str) -> bool:
    return "/" not in resource or "kubernetes.io/" in resource


def _is_huge_pages(resource: str) -> bool:
    return resource.startswith("hugepages-")


def _is_extended(resource: str) -> bool:
    return (
        not _is_native(resource)
        and not resource.startswith("requests.")
        and not is_qualified_name(f"requests.{resource}")
    )


def _overcommit_allowed(resource: str) -> bool:
    return _is_native(resource) and not _is_huge_pages(resource)


def _validate_resource_name(resource: str, path: str) -> list[FieldError]:
    errors = _invalid(path, resource, is_qualified_name(resource))
    if "/" not in resource:
        if resource not in _STANDARD_CONTAINER_RESOURCES and not _is_huge_pages(resource):
            errors += _invalid(path, resource, ["must be a standard resource for containers"])
    elif not _is_native(resource) and not _is_extended(resource):
        errors += _invalid(path, resource, ["doesn't follow extended resource name standard"])
    return errors


def _validate_quantity(resource: str, value: Any, path: str) -> tuple[list[FieldError], Decimal, str]:
    amount, text = parse_quantity(value)
    errors = _invalid(path, text, ["must be greater than or equal to 0"] if amount < 0 else [])
    if _is_extended(resource) and (amount * 1000) % 1000 != 0:
        errors += _invalid(path, text, ["must be an integer"])
    return errors, amount, text


def validate_resource_requirements(resources: Obj, path: str) -> list[FieldError]:
    """`ValidateResourceRequirements`: extended resources (`nvidia.com/gpu`) are integers, cannot be
    overcommitted (request == limit) and need a limit; no request exceeds its limit."""
    errors: list[FieldError] = []
    limits: dict[str, tuple[Decimal, str]] = {}
    for resource, value in _map(resources, "limits").items():
        key_path = f"{path}.limits[{resource}]"
        errors += _validate_resource_name(resource, key_path)
        found, amount, text = _validate_quantity(resource, value, key_path)
        errors += found
        limits[resource] = (amount, text)
    for resource, value in _map(resources, "requests").items():
        key_path = f"{path}.requests[{resource}]"
        errors += _validate_resource_name(resource, key_path)
        found, amount, text = _validate_quantity(resource, value, key_path)
        errors += found
        if resource in limits:
            limit, limit_text = limits[resource]
            if amount != limit and not _overcommit_allowed(resource):
                detail = f"must be equal to {resource} limit of {limit_text}"
                errors += _invalid(f"{path}.requests", text, [detail])
            elif amount > limit:
                detail = f"must be less than or equal to {resource} limit of {limit_text}"
                errors += _invalid(f"{path}.requests", text, [detail])
        elif not _overcommit_allowed(resource):
            errors.append(_required(f"{path}.limits", "Limit must be set for non overcommitable resources"))
    return errors


_FIELD_REF_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_FIELD_REF_MAPS = re.compile(r"^metadata\.(labels|annotations)\['[^']+'\]$")
_ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")


def validate_env(env: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, var in enumerate(env):
        at = f"{path}[{i}]"
        name = var.get("name") or ""
        if not name:
            errors.append(_required(f"{at}.name"))
        else:
            errors += _invalid(f"{at}.name", name, is_env_var_name(name))
        source = var.get("valueFrom")
        if source is None:
            continue
        given = [key for key in _ENV_SOURCES if source.get(key) is not None]
        if var.get("value"):
            errors += _invalid(f"{at}.valueFrom", "", ["may not be specified when `value` is not empty"])
        if not given:
            errors.append(_required(f"{at}.valueFrom", "must specify one of: `fieldRef`, `resourceFieldRef`, "
                                    "`configMapKeyRef` or `secretKeyRef`"))  # fmt: skip
        elif len(given) > 1:
            errors += _invalid(
                f"{at}.valueFrom", "", ["may not have more than one field specified at a time"]
            )
        field_ref = source.get("fieldRef")
        if field_ref is not None:
            field_path = field_ref.get("fieldPath") or ""
            if not field_path:
                errors.append(_required(f"{at}.valueFrom.fieldRef.fieldPath"))
            elif field_path not in _FIELD_REF_PATHS and not _FIELD_REF_MAPS.match(field_path):
                errors.append(
                    _not_supported(f"{at}.valueFrom.fieldRef.fieldPath", field_path, _FIELD_REF_PATHS)
                )
        for ref in ("configMapKeyRef", "secretKeyRef"):
            key_ref = source.get(ref)
            if key_ref is None:
                continue
            if not key_ref.get("key"):
                errors.append(_required(f"{at}.valueFrom.{ref}.key"))
            else:
                errors += _invalid(
                    f"{at}.valueFrom.{ref}.key", key_ref["key"], is_config_map_key(key_ref["key"])
                )
    return errors


_PROTOCOLS = ("SCTP", "TCP", "UDP")


def validate_container_ports(ports: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    names: set[str] = set()
    for i, port in enumerate(ports):
        at = f"{path}[{i}]"
        name = port.get("name") or ""
        if name:
            if found := is_valid_port_name(name):
                errors += _invalid(f"{at}.name", name, found)
            elif name in names:
                errors.append(FieldError(f"{at}.name", "FieldValueDuplicate", value=name))
            names.add(name)
        number = port.get("containerPort")
        if not number:
            errors.append(_required(f"{at}.containerPort"))
        else:
            errors += _invalid(f"{at}.containerPort", number, is_valid_port_num(number))
        if port.get("hostPort"):
            errors += _invalid(f"{at}.hostPort", port["hostPort"], is_valid_port_num(port["hostPort"]))
        protocol = port.get("protocol", "TCP")  # defaulted before validation
        if protocol not in _PROTOCOLS:
            errors.append(_not_supported(f"{at}.protocol", protocol, _PROTOCOLS))
    return errors


def validate_containers(containers: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    names: set[str] = set()
    for i, container in enumerate(containers):
        at = f"{path}[{i}]"
        name = container.get("name") or ""
        if not name:
            errors.append(_required(f"{at}.name"))
        else:
            errors += _invalid(f"{at}.name", name, is_dns1123_label(name))
            if name in names:
                errors.append(FieldError(f"{at}.name", "FieldValueDuplicate", value=name))
            names.add(name)
        if not container.get("image"):
            errors.append(_required(f"{at}.image"))
        errors += validate_container_ports(_items(container, "ports"), f"{at}.ports")
        errors += validate_env(_items(container, "env"), f"{at}.env")
        errors += validate_resource_requirements(_map(container, "resources"), f"{at}.resources")
    return errors


_TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")


def validate_tolerations(tolerations: list[dict[str, Any]], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, toleration in enumerate(tolerations):
        at = f"{path}[{i}]"
        key, operator = toleration.get("key") or "", toleration.get("operator") or ""
        value, effect = toleration.get("value") or "", toleration.get("effect") or ""
        if key:
            errors += _invalid(f"{at}.key", key, is_qualified_name(key))
        if not key and operator != "Exists":
            detail = (
                'operator must be Exists when `key` is empty, which means "match all values and all keys"'
            )
            errors += _invalid(f"{at}.operator", operator, [detail])
        if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
            errors += _invalid(
                f"{at}.effect", effect, ["effect must be 'NoExecute' when `tolerationSeconds` is set"]
            )
        if operator in ("Equal", ""):
            if found := is_valid_label_value(value):
                errors += _invalid(f"{at}.operator", value, [";".join(found)])
        elif operator == "Exists":
            if value:
                errors += _invalid(
                    f"{at}.operator", toleration, ["value must be empty when `operator` is 'Exists'"]
                )
        else:
            errors.append(_not_supported(f"{at}.operator", operator, ("Equal", "Exists")))
        if effect and effect not in _TAINT_EFFECTS:
            errors.append(_not_supported(f"{at}.effect", effect, _TAINT_EFFECTS))
    return errors


_RESTART_POLICIES = ("Always", "Never", "OnFailure")


def validate_pod(pod: Obj) -> list[FieldError]:
    spec = _map(pod, "spec")
    errors = validate_object_meta(pod)
    containers = _items(spec, "containers")
    errors += (
        validate_containers(containers, "spec.containers") if containers else [_required("spec.containers")]
    )
    errors += validate_containers(_items(spec, "initContainers"), "spec.initContainers")
    restart = spec.get("restartPolicy", "Always")
    if restart not in _RESTART_POLICIES:
        errors.append(_not_supported("spec.restartPolicy", restart, _RESTART_POLICIES))
    errors += validate_labels(_map(spec, "nodeSelector"), "spec.nodeSelector")
    errors += validate_tolerations(_items(spec, "tolerations"), "spec.tolerations")
    for key in ("hostname", "subdomain"):
        if spec.get(key):
            errors += _invalid(f"spec.{key}", spec[key], is_dns1123_label(spec[key]))
    volumes: set[str] = set()
    for i, volume in enumerate(_items(spec, "volumes")):
        name = volume.get("name") or ""
        if not name:
            errors.append(_required(f"spec.volumes[{i}].name"))
            continue
        errors += _invalid(f"spec.volumes[{i}].name", name, is_dns1123_label(name))
        if name in volumes:
            errors.append(FieldError(f"spec.volumes[{i}].name", "FieldValueDuplicate", value=name))
        volumes.add(name)
    return errors


# --- Services -----------------------------------------------------------------------------------------------

_SERVICE_TYPES = ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort")


def validate_service(service: Obj) -> list[FieldError]:
    meta, spec = _map(service, "metadata"), _map(service, "spec")
    errors = _invalid("metadata.name", meta.get("name", ""), is_dns1035_label(meta.get("name", "")))
    errors += validate_object_meta(service)
    service_type = spec.get("type", "ClusterIP")
    if service_type not in _SERVICE_TYPES:
        errors.append(_not_supported("spec.type", service_type, _SERVICE_TYPES))
    ports = _items(spec, "ports")
    headless = spec.get("clusterIP") == "None"
    if not ports and service_type != "ExternalName" and not headless:
        errors.append(_required("spec.ports"))
    names: set[str] = set()
    for i, port in enumerate(ports):
        at = f"spec.ports[{i}]"
        name = port.get("name") or ""
        if len(ports) > 1 and not name:
            errors.append(_required(f"{at}.name"))
        elif name:
            errors += _invalid(f"{at}.name", name, is_dns1123_label(name))
            if name in names:
                errors.append(FieldError(f"{at}.name", "FieldValueDuplicate", value=name))
            names.add(name)
        errors += _invalid(f"{at}.port", port.get("port"), is_valid_port_num(port.get("port")))
        protocol = port.get("protocol", "TCP")
        if protocol not in _PROTOCOLS:
            errors.append(_not_supported(f"{at}.protocol", protocol, _PROTOCOLS))
        target = port.get("targetPort")
        if isinstance(target, str):
            errors += _invalid(f"{at}.targetPort", target, is_valid_port_name(target))
        elif target is not None:
            errors += _invalid(f"{at}.targetPort", target, is_valid_port_num(target))
    selector = _map(spec, "selector")
    return errors + validate_labels(selector, "spec.selector")


# --- Secrets and ConfigMaps ---------------------------------------------------------------------------------


def _decoded_size(value: Any, path: str) -> int:
    try:
        return len(base64.b64decode(value or "", validate=True))
    except (binascii.Error, ValueError, TypeError):
        raise Undecodable(f"{path}: illegal base64 data") from None


def validate_secret(secret: Obj) -> list[FieldError]:
    errors = validate_object_meta(secret)
    total = 0
    for key, value in _map(secret, "data").items():
        errors += _invalid(f"data[{key}]", key, is_config_map_key(key))
        total += _decoded_size(value, f"data[{key}]")
    if total > MAX_SECRET_SIZE:
        errors.append(FieldError("data", "FieldValueTooLong", f"must have at most {MAX_SECRET_SIZE} bytes"))
    return errors


def validate_config_map(config_map: Obj) -> list[FieldError]:
    errors = validate_object_meta(config_map)
    data, binary = _map(config_map, "data"), _map(config_map, "binaryData")
    total = 0
    for key, value in data.items():
        errors += _invalid(f"data[{key}]", key, is_config_map_key(key))
        if key in binary:
            errors += _invalid(f"data[{key}]", key, ["duplicate of key present in binaryData"])
        total += len(str(value).encode())
    for key, value in binary.items():
        errors += _invalid(f"binaryData[{key}]", key, is_config_map_key(key))
        total += _decoded_size(value, f"binaryData[{key}]")
    if total > MAX_SECRET_SIZE:
        # The apiserver reports the whole object (an empty field path).
        errors.append(FieldError("", "FieldValueTooLong", f"must have at most {MAX_SECRET_SIZE} bytes"))
    return errors


# --- Events -------------------------------------------------------------------------------------------------


def validate_event(event: Obj) -> list[FieldError]:
    """`legacyValidateEvent` for core/v1 Events: an Event with `eventTime` (the new style, as kopf writes)
    names its reporter, instance, action and reason, with a message of at most 1 KiB."""
    errors = validate_object_meta(event)
    namespace = _map(event, "metadata").get("namespace", "")
    involved = _map(event, "involvedObject").get("namespace", "")
    if not event.get("eventTime"):
        if (involved and involved != namespace) or (not involved and namespace not in ("", "default")):
            errors += _invalid("involvedObject.namespace", involved, ["does not match event.namespace"])
        return errors
    if not involved and namespace not in ("default", "kube-system"):
        errors += _invalid("involvedObject.namespace", involved, ["does not match event.namespace"])
    controller = event.get("reportingComponent") or ""
    if not controller:
        errors.append(_required("source"))
    errors += _invalid("source", controller, is_qualified_name(controller) if controller else [])
    limits = (
        ("reportingInstance", 128, True),
        ("action", 128, True),
        ("reason", 128, True),
        ("message", 1024, False),
    )
    for key, limit, required in limits:
        value = event.get(key) or ""
        if required and not value:
            errors.append(_required(key))
        if len(value) > limit:
            errors += _invalid(key, "", [f"can have at most {limit} characters"])
    return errors


# --- PodDisruptionBudgets -----------------------------------------------------------------------------------


def _int_or_percent(value: Any, path: str) -> list[FieldError]:
    if isinstance(value, int) and not isinstance(value, bool):
        return _invalid(path, value, ["must be greater than or equal to 0"] if value < 0 else [])
    if isinstance(value, str) and re.fullmatch(r"[0-9]+%", value):
        return _invalid(path, value, ["must not be greater than 100%"] if int(value[:-1]) > 100 else [])
    return _invalid(path, value, ["must be an integer or percentage (e.g '5%')"])


_UNHEALTHY_POD_EVICTION_POLICIES = ("AlwaysAllow", "IfHealthyBudget")


def validate_pod_disruption_budget(pdb: Obj) -> list[FieldError]:
    spec = _map(pdb, "spec")
    errors = validate_object_meta(pdb)
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        errors += _invalid("spec", spec, ["minAvailable and maxUnavailable cannot be both set"])
    for key in ("minAvailable", "maxUnavailable"):
        if spec.get(key) is not None:
            errors += _int_or_percent(spec[key], f"spec.{key}")
    errors += validate_labels(_map(_map(spec, "selector"), "matchLabels"), "spec.selector.matchLabels")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in _UNHEALTHY_POD_EVICTION_POLICIES:
        errors.append(
            _not_supported("spec.unhealthyPodEvictionPolicy", policy, _UNHEALTHY_POD_EVICTION_POLICIES)
        )
    return errors


VALIDATORS: dict[str, Callable[[Obj], list[FieldError]]] = {
    "pods": validate_pod,
    "services": validate_service,
    "secrets": validate_secret,
    "configmaps": validate_config_map,
    "events": validate_event,
    "poddisruptionbudgets.policy": validate_pod_disruption_budget,
}


def validate(qualified: str, obj: Obj) -> list[FieldError]:
    """The field errors of a built-in object (by its resource, e.g. `pods`); [] when it is valid or its kind
    is not checked here. Raises Undecodable for what the apiserver cannot decode."""
    validator = VALIDATORS.get(qualified)
    return validator(obj) if validator is not None else []
