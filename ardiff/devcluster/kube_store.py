"""The object store behind the emulated Kubernetes API: what etcd and the apiserver's registry do.

Semantics kept from a real apiserver (each one something kopf, kubectl or the operator relies on):
- metadata: `uid`, `creationTimestamp`, `generation` (bumped when anything but metadata and status
  changes), a cluster-wide monotonically increasing `resourceVersion`, `generateName`, the namespace from
  the URL (which must exist);
- optimistic concurrency: a stale `resourceVersion` in an update or merge patch is a 409 Conflict; a failed
  JSON-patch `test` (how kopf guards finalizers) is a 422;
- the `status` subresource: the main endpoint ignores status, `/status` changes only status; an update
  that changes nothing is a no-op (no new resourceVersion, no watch event);
- custom resources are admitted against their CRD (prune, default, OpenAPI + CEL, see `validation.py`),
  a CRD starts and stops serving its kinds, a CRD's deletion deletes its objects;
- deletion: finalizers hold an object with `deletionTimestamp` until they are removed; a Pod bound to a
  node (`spec.nodeName`) is deleted gracefully (the kubelet, here the pod runner, finishes it with grace 0);
  owner-reference garbage collection (background, or orphan) when an owner goes, and of an object written
  with owners that are gone (or in another namespace); namespace deletion;
- watches: events carry resourceVersions, resume from a resourceVersion still in the event log, `410 Gone`
  (an ERROR event) when it is not, label/field selectors with ADDED/DELETED on selector transitions,
  `sendInitialEvents` with its closing BOOKMARK.

All methods run on the API server's event loop and never await, so each call is atomic. Stored objects
are never mutated in place; callers must not mutate what they get back.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import re
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ardiff.devcluster import core_validation
from ardiff.devcluster.api_resources import ResourceRegistry, ResourceType
from ardiff.devcluster.crd import CRD_GROUP, CustomResourceDefinition, ScaleSubresource
from ardiff.devcluster.patches import JSON_PATCH, PatchError, apply_patch
from ardiff.devcluster.selectors import FieldSelector, LabelSelector
from ardiff.devcluster.validation import FieldError, InvalidObject

Obj = dict[str, Any]
ObjKey = tuple[tuple[str, str], str, str]  # ((group, plural), namespace or "", name)

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses for generateName suffixes
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_IMMUTABLE_METADATA = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
DEFAULT_POD_GRACE_SECONDS = 30
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
CLOSED = "CLOSED"  # not a Kubernetes event type: tells the HTTP layer to end the stream


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error response of the API: HTTP status, Status `reason` and message."""

    def __init__(self, status: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.details = status, reason, message, details or {}

    @classmethod
    def invalid(cls, exc: InvalidObject) -> ApiError:
        status = exc.as_status()
        return cls(422, "Invalid", status["message"], status["details"])

    def as_status(self) -> Obj:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.status,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(rtype: ResourceType, name: str) -> dict[str, str]:
    return {"name": name, "group": rtype.group, "kind": rtype.plural}


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rtype.qualified} "{name}" not found', _details(rtype, name))


def conflict(rtype: ResourceType, name: str) -> ApiError:
    message = (
        f'Operation cannot be fulfilled on {rtype.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, "Conflict", message, _details(rtype, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _invalid(rtype: ResourceType, name: str, *errors: FieldError) -> ApiError:
    return ApiError.invalid(InvalidObject(rtype.kind, rtype.group, name, errors))


@dataclass(frozen=True)
class WatchEvent:
    resource_version: int
    type: str  # ADDED | MODIFIED | DELETED
    key: tuple[str, str]
    obj: Obj
    old: Obj | None


@dataclass(frozen=True)
class DeleteOptions:
    """The parts of `DeleteOptions` (body or query) the store honours."""

    propagation_policy: str = "Background"  # Background | Foreground (treated as Background) | Orphan
    grace_period_seconds: int | None = None
    precondition_uid: str | None = None
    precondition_resource_version: str | None = None
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.propagation_policy not in ("Background", "Foreground", "Orphan"):
            raise bad_request(
                "DeleteOptions propagationPolicy must be Background, Foreground or Orphan, "
                f"got {self.propagation_policy!r}"
            )
        if self.grace_period_seconds is not None and self.grace_period_seconds < 0:
            raise bad_request(
                f"DeleteOptions gracePeriodSeconds must be >= 0, got {self.grace_period_seconds}"
            )


@dataclass(frozen=True)
class WriteResult:
    """The stored object and the warnings the response carries (e.g. unknown fields dropped)."""

    obj: Obj
    warnings: tuple[str, ...] = ()


@dataclass(eq=False)
class Watch:
    """One open watch: its filter and the queue of (type, object) events it still has to send."""

    key: tuple[str, str]
    namespace: str | None
    name: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)

    def _selects(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        return (
            (self.namespace is None or meta.get("namespace") == self.namespace)
            and (self.name is None or meta["name"] == self.name)
            and self.labels.matches(obj)
            and self.fields.matches(obj)
        )

    def translate(self, event: WatchEvent) -> str | None:
        """The event type this watch sees: objects entering or leaving its selection are ADDED/DELETED."""
        if event.key != self.key:
            return None
        now, before = self._selects(event.obj), self._selects(event.old)
        if event.type == "MODIFIED":
            return "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
        return event.type if now else None


class ObjectStore:
    """Objects of every served resource type, with resourceVersions, admission and watches."""

    def __init__(
        self,
        registry: ResourceRegistry | None = None,
        *,
        event_log_size: int = 10_000,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.registry = registry or ResourceRegistry.with_builtins()
        self._clock = clock
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._by_uid: dict[str, ObjKey] = {}
        self._dependents: dict[str, set[ObjKey]] = {}  # owner uid -> objects that name it as an owner
        self._orphan_on_removal: set[str] = set()  # uids deleted with propagationPolicy=Orphan
        self._resource_version = 0
        self._log: deque[WatchEvent] = deque()
        self._log_size = event_log_size
        self._log_floor = 0  # events with a resourceVersion <= this one are no longer in the log
        self._watches: set[Watch] = set()

    @property
    def resource_version(self) -> str:
        return str(self._resource_version)

    # --- reading -------------------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rtype = self.registry.get(group, version, plural)
        if rtype is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return rtype

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self._objects.get(rtype.key, {}).get((self._ns(rtype, namespace), name))
        if obj is None:
            raise not_found(rtype, name)
        return self._as_version(rtype, obj)

    def list(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
    ) -> list[Obj]:
        """Matching objects in key order (namespace, name), like etcd returns them."""
        labels, fields = labels or LabelSelector(), fields or FieldSelector()
        items = []
        for (ns, _), obj in sorted(self._objects.get(rtype.key, {}).items()):
            if (namespace is None or ns == namespace) and labels.matches(obj) and fields.matches(obj):
                items.append(self._as_version(rtype, obj))
        return items

    def _as_version(self, rtype: ResourceType, obj: Obj) -> Obj:
        """Objects are stored once per group/plural; a read through another version relabels them."""
        if obj.get("apiVersion") == rtype.api_version:
            return obj
        return {**obj, "apiVersion": rtype.api_version}

    def _ns(self, rtype: ResourceType, namespace: str | None) -> str:
        if not rtype.namespaced:
            return ""
        if not namespace:
            raise bad_request(f"the namespace of {rtype.qualified} must be given in the URL")
        return namespace

    def _find(self, key: ObjKey) -> Obj | None:
        return self._objects.get(key[0], {}).get((key[1], key[2]))

    # --- writing -------------------------------------------------------------------------------------

    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        strict: bool = False,
    ) -> WriteResult:
        """POST: a new object (409 AlreadyExists if the name is taken)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {rtype.kind} must be a JSON object")
        obj = copy.deepcopy(body)
        self._check_kind(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        ns = self._ns(rtype, namespace)
        if rtype.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
            namespaces = self.registry.get("", "v1", "namespaces")
            if namespaces and ("", ns) not in self._objects.get(namespaces.key, {}):
                raise not_found(namespaces, ns)
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _invalid(
                    rtype,
                    "",
                    FieldError("metadata.name", "FieldValueRequired", "name or generateName is required"),
                )
            meta["name"] = self._generate_name(rtype, ns, meta["generateName"])
        if not _DNS_SUBDOMAIN.match(meta["name"]) or len(meta["name"]) > 253:
            detail = "a lowercase RFC 1123 subdomain must consist of lower case alphanumerics, '-' or '.'"
            raise _invalid(
                rtype, meta["name"], FieldError("metadata.name", "FieldValueInvalid", detail, meta["name"])
            )
        for key in (
            "uid",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self._clock())
        meta["generation"] = 1
        obj = self._prepare_create(rtype, obj)
        warnings: tuple[str, ...] = ()
        if rtype.crd is not None:
            obj, warnings = self._admit(rtype, obj, None, strict)
        else:
            self._validate_builtin(rtype, obj)
        if (ns, meta["name"]) in self._objects.get(rtype.key, {}):
            details = _details(rtype, meta["name"])
            raise ApiError(
                409, "AlreadyExists", f'{rtype.qualified} "{meta["name"]}" already exists', details
            )
        if dry_run:
            return WriteResult(obj, warnings)
        return WriteResult(self._commit(rtype, obj, "ADDED", None), warnings)

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        strict: bool = False,
    ) -> WriteResult:
        """PUT: the whole object; `metadata.resourceVersion` is required and must be current."""
        old = self.get(rtype, namespace, name)
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise bad_request(f"the body of a {rtype.kind} must be a JSON object with metadata")
        self._check_kind(rtype, body)
        if body["metadata"].get("name", name) != name:
            raise bad_request(
                f"the name of the object ({body['metadata'].get('name')}) does not match the URL's ({name})"
            )
        if not body["metadata"].get("resourceVersion"):
            raise _invalid(
                rtype,
                name,
                FieldError(
                    "metadata.resourceVersion", "FieldValueInvalid", "must be specified for an update", 0
                ),
            )
        return self._update(rtype, old, copy.deepcopy(body), subresource, dry_run, strict)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        strict: bool = False,
    ) -> WriteResult:
        """PATCH (JSON, merge or strategic merge); a resourceVersion the patch sets must be current."""
        old = self.get(rtype, namespace, name)
        try:
            new = apply_patch(old, patch, content_type)
        except PatchError as exc:
            if content_type.startswith(JSON_PATCH):
                raise ApiError(
                    422, "Invalid", f"the JSON patch does not apply: {exc}", _details(rtype, name)
                ) from exc
            raise bad_request(str(exc)) from exc
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            raise bad_request("the patched object has no metadata")
        return self._update(rtype, old, new, subresource, dry_run, strict)

    # --- the scale subresource (apiextensions-apiserver: scaleFromCustomResource, scaleUpdatedObjectInfo) -

    def _scale_paths(self, rtype: ResourceType, name: str) -> ScaleSubresource:
        if rtype.crd is None or rtype.crd.scale is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({rtype.qualified}/scale)"
            )
        return rtype.crd.scale

    def get_scale(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        """GET <resource>/scale: the object as an `autoscaling/v1` Scale."""
        paths = self._scale_paths(rtype, name)
        return scale_of(self.get(rtype, namespace, name), paths)

    def update_scale(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str | None = None,
        *,
        dry_run: bool = False,
    ) -> WriteResult:
        """PUT (`content_type` None) or PATCH <resource>/scale: the Scale's `spec.replicas` goes to the
        specReplicasPath of the object, which is then admitted like any update of it (its schema and CEL
        rules may refuse it, naming its own field); a resourceVersion in the Scale must be current."""
        paths = self._scale_paths(rtype, name)
        old = self.get(rtype, namespace, name)
        current = scale_of(old, paths)
        if content_type is None:
            scale = body
        else:
            try:
                scale = apply_patch(current, body, content_type)
            except PatchError as exc:
                raise bad_request(str(exc)) from exc
        if not isinstance(scale, dict) or not isinstance(scale.get("metadata", {}), dict):
            raise bad_request("the body of a Scale must be a JSON object")
        if scale.get("kind", "Scale") != "Scale":
            raise bad_request(f"the body of a scale subresource must be a Scale, not {scale.get('kind')}")
        scale_rtype = ResourceType("autoscaling", "v1", "scale", "Scale", "scale", True)
        if scale.get("metadata", {}).get("name", name) != name:
            raise bad_request("the name of the Scale does not match the URL's")
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise bad_request(f"spec.replicas of a Scale must be an integer, got {replicas!r}")
        if replicas < 0:
            detail = "must be greater than or equal to 0"
            raise _invalid(
                scale_rtype, name, FieldError("spec.replicas", "FieldValueInvalid", detail, replicas)
            )
        version = scale.get("metadata", {}).get("resourceVersion")
        if version and str(version) != old["metadata"]["resourceVersion"]:
            raise conflict(rtype, name)
        new = copy.deepcopy(old)
        target = new
        *parents, leaf = ScaleSubresource.fields(paths.spec_replicas_path)
        for key in parents:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[leaf] = replicas
        result = self._update(rtype, old, new, None, dry_run, strict=False)
        return WriteResult(scale_of(result.obj, paths), result.warnings)

    def seed(self, rtype: ResourceType, namespace: str | None, body: Obj) -> Obj:
        """Put an object in as an etcd restore would: status included, no admission (the apiserver does not
        admit what it reads from etcd again). For simulations at a size that admission one object at a time
        cannot reach (CEL rules cost ~1 ms per write here); the caller has had one like it admitted."""
        obj = copy.deepcopy(body)
        self._check_kind(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise bad_request("a seeded object needs metadata.name")
        ns = self._ns(rtype, namespace)
        if rtype.namespaced:
            meta["namespace"] = ns
            namespaces = self.registry.get("", "v1", "namespaces")
            if namespaces and ("", ns) not in self._objects.get(namespaces.key, {}):
                raise not_found(namespaces, ns)
        if (ns, meta["name"]) in self._objects.get(rtype.key, {}):
            details = _details(rtype, meta["name"])
            raise ApiError(
                409, "AlreadyExists", f'{rtype.qualified} "{meta["name"]}" already exists', details
            )
        meta["uid"] = str(uuid.uuid4())
        meta.setdefault("creationTimestamp", rfc3339(self._clock()))
        meta.setdefault("generation", 1)
        return self._commit(rtype, obj, "ADDED", None)

    def bind_pod(self, namespace: str, name: str, node: str) -> Obj:
        """POST pods/<name>/binding: the scheduler's way of setting `spec.nodeName`."""
        pods = self.resource("", "v1", "pods")
        old = self.get(pods, namespace, name)
        if old["spec"].get("nodeName"):
            raise ApiError(
                409, "Conflict", f'pod {name} is already assigned to node "{old["spec"]["nodeName"]}"'
            )
        new = copy.deepcopy(old)
        new["spec"]["nodeName"] = node
        return self._update(pods, old, new, None, dry_run=False, strict=False).obj

    def delete(
        self, rtype: ResourceType, namespace: str | None, name: str, options: DeleteOptions | None = None
    ) -> Obj:
        """DELETE: remove now, or mark with deletionTimestamp (finalizers, graceful Pods, namespaces)."""
        options = options or DeleteOptions()
        old = self.get(rtype, namespace, name)
        meta = old["metadata"]
        if options.precondition_uid not in (None, meta["uid"]):
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                f"UID in object meta: {meta['uid']}",
            )
        if options.precondition_resource_version not in (None, meta["resourceVersion"]):
            raise conflict(rtype, name)
        if options.dry_run:
            return old
        if options.propagation_policy == "Orphan":
            self._orphan_on_removal.add(meta["uid"])
        grace = self._grace_seconds(rtype, old, options)
        if meta.get("deletionTimestamp"):
            if grace == 0 and meta.get("deletionGracePeriodSeconds"):
                if not meta.get("finalizers"):
                    return self._remove(rtype, old)  # the kubelet's final delete of a terminating Pod
                new = copy.deepcopy(old)
                new["metadata"]["deletionGracePeriodSeconds"] = 0  # finalizers decide from now on
                return self._commit(rtype, new, "MODIFIED", old)
            return old
        if meta.get("finalizers") or grace > 0 or rtype.qualified == "namespaces":
            new = copy.deepcopy(old)
            now = self._clock()
            new["metadata"]["deletionTimestamp"] = rfc3339(now + datetime.timedelta(seconds=grace))
            if grace > 0:
                new["metadata"]["deletionGracePeriodSeconds"] = grace
            if rtype.qualified == "namespaces":
                new.setdefault("status", {})["phase"] = "Terminating"
            marked = self._commit(rtype, new, "MODIFIED", old)
            if rtype.qualified == "namespaces":
                self._delete_namespace_contents(name)
                return self._finish_namespace(name) or marked
            return marked
        return self._remove(rtype, old)

    # --- internals -----------------------------------------------------------------------------------

    def _check_kind(self, rtype: ResourceType, obj: Obj) -> None:
        if obj.get("kind") not in (None, "", rtype.kind):
            raise bad_request(
                f"the kind of the object ({obj['kind']}) does not match the resource ({rtype.kind})"
            )
        obj["kind"] = rtype.kind
        obj["apiVersion"] = rtype.api_version

    def _generate_name(self, rtype: ResourceType, ns: str, prefix: str) -> str:
        taken = self._objects.get(rtype.key, {})
        while True:
            name = prefix[:58] + "".join(secrets.choice(_NAME_CHARS) for _ in range(5))
            if (ns, name) not in taken:
                return name

    def _grace_seconds(self, rtype: ResourceType, obj: Obj, options: DeleteOptions) -> int:
        """Only Pods bound to a node terminate gracefully; everything else goes at once."""
        if rtype.qualified != "pods" or not obj.get("spec", {}).get("nodeName"):
            return 0
        if options.grace_period_seconds is not None:
            return options.grace_period_seconds
        return int(obj["spec"].get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_SECONDS))

    def _prepare_create(self, rtype: ResourceType, obj: Obj) -> Obj:
        """What the registry's PrepareForCreate does per kind."""
        if rtype.has_status and rtype.crd is not None:
            obj.pop("status", None)  # create cannot set the status of a custom resource
        if rtype.qualified == "pods":
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", DEFAULT_POD_GRACE_SECONDS)
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rtype.qualified == "secrets":
            _fold_string_data(obj)
            obj.setdefault("type", "Opaque")
        elif rtype.qualified == "namespaces":
            obj["status"] = {"phase": "Active"}
        elif rtype.qualified == f"customresourcedefinitions.{CRD_GROUP}":
            obj["status"] = _crd_status(self._parse_crd(obj))
        return obj

    def _parse_crd(self, obj: Obj) -> CustomResourceDefinition:
        try:
            return CustomResourceDefinition.from_manifest(obj)
        except InvalidObject as exc:
            raise ApiError.invalid(exc) from exc

    def _admit(
        self, rtype: ResourceType, obj: Obj, old: Obj | None, strict: bool
    ) -> tuple[Obj, tuple[str, ...]]:
        assert rtype.crd is not None
        try:
            admitted = rtype.crd.admit(obj, old=old)
        except InvalidObject as exc:
            raise ApiError.invalid(exc) from exc
        if admitted.pruned and strict:
            unknown = ", ".join(f'unknown field "{path}"' for path in admitted.pruned)
            name = obj["metadata"].get("name", "")
            raise bad_request(
                f"{rtype.kind} in version {rtype.version!r} cannot be handled as a {rtype.kind}: "
                f"strict decoding error: {unknown} ({name})"
            )
        return admitted.obj, tuple(f'unknown field "{path}"' for path in admitted.pruned)

    def _validate_builtin(self, rtype: ResourceType, obj: Obj) -> None:
        """What kube-apiserver's validation of a built-in kind refuses (`core_validation`)."""
        try:
            errors = core_validation.validate(rtype.qualified, obj)
        except core_validation.Undecodable as exc:
            raise bad_request(
                f"{rtype.kind} in version {rtype.version!r} cannot be handled as a {rtype.kind}: {exc}"
            ) from exc
        if errors:
            raise _invalid(rtype, obj["metadata"]["name"], *errors)

    def _update(
        self, rtype: ResourceType, old: Obj, new: Obj, subresource: str | None, dry_run: bool, strict: bool
    ) -> WriteResult:
        name = old["metadata"]["name"]
        if (
            str(new["metadata"].get("resourceVersion", old["metadata"]["resourceVersion"]))
            != old["metadata"]["resourceVersion"]
        ):
            raise conflict(rtype, name)
        if subresource == "status":
            if not rtype.has_status:
                raise not_found(rtype, name)
            status = new.get("status")
            new = copy.deepcopy(old)
            new.pop("status", None)
            if status is not None:
                new["status"] = status
        elif subresource is not None:
            raise ApiError(
                405, "MethodNotAllowed", f"the dev cluster does not serve {rtype.qualified}/{subresource}"
            )
        elif rtype.has_status:
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        for key in _IMMUTABLE_METADATA:
            new["metadata"].pop(key, None)
            if key in old["metadata"]:
                new["metadata"][key] = old["metadata"][key]
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        terminating = bool(old["metadata"].get("deletionTimestamp"))
        added = set(new["metadata"].get("finalizers") or ()) - set(old["metadata"].get("finalizers") or ())
        if terminating and added:
            detail = "no new finalizers can be added if the object is being deleted"
            raise _invalid(rtype, name, FieldError("metadata.finalizers", "FieldValueForbidden", detail))
        if rtype.qualified == "secrets":
            _fold_string_data(new)
        warnings: tuple[str, ...] = ()
        if rtype.crd is not None:
            new, warnings = self._admit(rtype, new, old, strict)
        else:
            self._validate_builtin(rtype, new)
        if rtype.qualified == f"customresourcedefinitions.{CRD_GROUP}":
            crd = self._parse_crd(new)
            if (crd.group, crd.plural) != (old["spec"]["group"], old["spec"]["names"]["plural"]):
                raise _invalid(
                    rtype,
                    name,
                    FieldError("spec", "FieldValueForbidden", "group and names.plural are immutable"),
                )
            new["status"] = _crd_status(crd)
        spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }
        new["metadata"]["generation"] = old["metadata"].get("generation", 1) + (1 if spec_changed else 0)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return WriteResult(old, warnings)  # a no-op write: no new resourceVersion, no event
        if dry_run:
            return WriteResult(new, warnings)
        if (
            terminating
            and not new["metadata"].get("finalizers")
            and not new["metadata"].get("deletionGracePeriodSeconds")
        ):
            return WriteResult(self._remove(rtype, new), warnings)
        return WriteResult(self._commit(rtype, new, "MODIFIED", old), warnings)

    def _commit(self, rtype: ResourceType, obj: Obj, event_type: str, old: Obj | None) -> Obj:
        self._resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self._resource_version)
        meta = obj["metadata"]
        key: ObjKey = (rtype.key, meta.get("namespace", ""), meta["name"])
        self._objects.setdefault(rtype.key, {})[(key[1], key[2])] = obj
        self._by_uid[meta["uid"]] = key
        self._index_owners(key, old, obj)
        if rtype.qualified == f"customresourcedefinitions.{CRD_GROUP}":
            self.registry.register_crd(self._parse_crd(obj))
        self._publish(WatchEvent(self._resource_version, event_type, rtype.key, obj, old))
        written = self._as_version(rtype, obj)
        if meta.get("ownerReferences") and not meta.get("deletionTimestamp"):
            self._collect(rtype, key)  # written with an owner that is gone (e.g. created after it went)
        return written

    def _remove(self, rtype: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
        del self._objects[rtype.key][(ns, name)]
        del self._by_uid[uid]
        self._index_owners((rtype.key, ns, name), obj, None)
        self._resource_version += 1
        gone = {**obj, "metadata": {**meta, "resourceVersion": str(self._resource_version)}}
        self._publish(WatchEvent(self._resource_version, "DELETED", rtype.key, gone, obj))
        if rtype.qualified == f"customresourcedefinitions.{CRD_GROUP}":
            self._remove_crd(obj)
        self._collect_dependents(uid, orphan=uid in self._orphan_on_removal)
        self._orphan_on_removal.discard(uid)
        if ns:
            self._finish_namespace(ns)
        return self._as_version(rtype, gone)

    def _remove_crd(self, crd: Obj) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        rtype = self.registry.find(group, plural)
        if rtype is not None:
            for obj in list(self._objects.get(rtype.key, {}).values()):
                self._remove(rtype, obj)
        self.registry.unregister_crd(group, plural)

    def _index_owners(self, key: ObjKey, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or ():
                dependents = self._dependents.setdefault(ref.get("uid", ""), set())
                if add:
                    dependents.add(key)
                else:
                    dependents.discard(key)
                    if not dependents:
                        del self._dependents[ref.get("uid", "")]

    def _collect_dependents(self, owner_uid: str, *, orphan: bool) -> None:
        """The garbage collector after an owner went: its dependents are orphaned (the reference removed) or
        collected (`_collect`)."""
        for key in sorted(self._dependents.get(owner_uid, ())):
            dependent = self._find(key)
            rtype = self.registry.find(*key[0])
            if dependent is None or rtype is None:
                continue
            if orphan:
                refs = dependent["metadata"].get("ownerReferences") or []
                new = copy.deepcopy(dependent)
                new["metadata"]["ownerReferences"] = [ref for ref in refs if ref.get("uid") != owner_uid]
                if not new["metadata"]["ownerReferences"]:
                    del new["metadata"]["ownerReferences"]
                self._commit(rtype, new, "MODIFIED", dependent)
            else:
                self._collect(rtype, key)

    def _owner_exists(self, ref: Obj, *, namespace: str) -> bool:
        owner = self._by_uid.get(ref.get("uid", ""))
        return owner is not None and owner[1] in ("", namespace)

    def _collect(self, rtype: ResourceType, key: ObjKey) -> None:
        """The garbage collector on one dependent (kube-controller-manager's `attemptToDeleteItem`): when no
        owner exists it is deleted; when some do, the references to absent ones are removed. An owner is
        absent when no object has its uid in the dependent's namespace (or cluster-scoped): a namespaced
        dependent never has an owner in another namespace."""
        dependent = self._find(key)
        if dependent is None:
            return
        refs = dependent["metadata"].get("ownerReferences") or []
        solid = [ref for ref in refs if self._owner_exists(ref, namespace=key[1])]
        if not solid:
            self.delete(rtype, key[1] or None, key[2])
        elif len(solid) < len(refs):
            new = copy.deepcopy(dependent)
            new["metadata"]["ownerReferences"] = solid
            self._commit(rtype, new, "MODIFIED", dependent)

    def _delete_namespace_contents(self, namespace: str) -> None:
        for rtype_key, objects in list(self._objects.items()):
            rtype = self.registry.find(*rtype_key)
            if rtype is None or not rtype.namespaced:
                continue
            for ns, name in [k for k in objects if k[0] == namespace]:
                if (ns, name) in objects:
                    self.delete(rtype, ns, name)

    def _finish_namespace(self, namespace: str) -> Obj | None:
        """Remove a terminating namespace once nothing is left in it."""
        namespaces = self.registry.get("", "v1", "namespaces")
        ns_obj = self._objects.get(("", "namespaces"), {}).get(("", namespace))
        if namespaces is None or ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp"):
            return None
        if any(ns == namespace for objects in self._objects.values() for ns, _ in objects):
            return None
        return self._remove(namespaces, ns_obj)

    # --- watching ------------------------------------------------------------------------------------

    def _publish(self, event: WatchEvent) -> None:
        if len(self._log) >= self._log_size:
            self._log_floor = self._log.popleft().resource_version
        self._log.append(event)
        for watch in self._watches:
            if (seen_as := watch.translate(event)) is not None:
                watch.queue.put_nowait((seen_as, event.obj))

    def watch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        *,
        name: str | None = None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        since: str | None = None,
        send_initial_events: bool = False,
    ) -> tuple[list[tuple[str, Obj]], Watch]:
        """Open a watch: the events to send first, and the registered Watch whose queue gets the rest.

        `since` empty or "0" starts with the current objects as ADDED; otherwise the events after that
        resourceVersion are replayed, or ApiError 410 if the log no longer has them. Call `unwatch`.
        """
        watch = Watch(
            rtype.key,
            namespace if rtype.namespaced else None,
            name,
            labels or LabelSelector(),
            fields or FieldSelector(),
        )
        initial: list[tuple[str, Obj]]
        if since in (None, "", "0") or send_initial_events:
            objects = [
                o
                for o in self.list(rtype, watch.namespace, watch.labels, watch.fields)
                if name in (None, o["metadata"]["name"])
            ]
            initial = [("ADDED", obj) for obj in objects]
            if send_initial_events:
                bookmark = {
                    "apiVersion": rtype.api_version,
                    "kind": rtype.kind,
                    "metadata": {
                        "resourceVersion": self.resource_version,
                        "annotations": {INITIAL_EVENTS_END: "true"},
                    },
                }
                initial.append(("BOOKMARK", bookmark))
        else:
            try:
                start = int(since)  # type: ignore[arg-type]
            except ValueError as exc:
                raise bad_request(f"invalid resourceVersion {since!r}") from exc
            if start < self._log_floor:
                raise ApiError(410, "Expired", f"too old resource version: {start} ({self._log_floor + 1})")
            initial = [(t, self._as_version(rtype, e.obj)) for e, t in self._replay(watch, start)]
        self._watches.add(watch)
        return initial, watch

    def _replay(self, watch: Watch, start: int) -> Iterator[tuple[WatchEvent, str]]:
        newer = []
        for event in reversed(self._log):
            if event.resource_version <= start:
                break
            newer.append(event)
        for event in reversed(newer):
            if (seen_as := watch.translate(event)) is not None:
                yield event, seen_as

    def unwatch(self, watch: Watch) -> None:
        self._watches.discard(watch)

    def close_watches(self) -> None:
        """End every open watch (the server is stopping): each gets a final CLOSED marker."""
        for watch in self._watches:
            watch.queue.put_nowait((CLOSED, {}))


def _nested(obj: Obj, path: str) -> Any:
    value: Any = obj
    for key in ScaleSubresource.fields(path):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def scale_of(obj: Obj, paths: ScaleSubresource) -> Obj:
    """A custom resource as an `autoscaling/v1` Scale (absent replicas read as 0, no selector as none)."""
    spec_replicas = _nested(obj, paths.spec_replicas_path)
    status_replicas = _nested(obj, paths.status_replicas_path)
    selector = _nested(obj, paths.label_selector_path) if paths.label_selector_path else None
    meta = obj["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": spec_replicas if isinstance(spec_replicas, int) else 0},
        "status": {
            "replicas": status_replicas if isinstance(status_replicas, int) else 0,
            **({"selector": selector} if isinstance(selector, str) and selector else {}),
        },
    }


def _fold_string_data(secret: Obj) -> None:
    """Secrets: `stringData` is write-only and merged into `data` (base64), as the apiserver does."""
    string_data = secret.pop("stringData", None) or {}
    if string_data:
        data = dict(secret.get("data") or {})
        data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()})
        secret["data"] = data


def _crd_status(crd: CustomResourceDefinition) -> Obj:
    version = crd.versions[0] if crd.versions else None
    names = {"kind": crd.kind, "plural": crd.plural}
    if version is not None:
        names.update(singular=version.singular, listKind=version.list_kind)
        if version.short_names:
            names["shortNames"] = list(version.short_names)
        if version.categories:
            names["categories"] = list(version.categories)
    conditions = [
        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
        {
            "type": "Established",
            "status": "True",
            "reason": "InitialNamesAccepted",
            "message": "the initial names have been accepted",
        },
    ]
    return {
        "acceptedNames": names,
        "conditions": conditions,
        "storedVersions": [v.version for v in crd.versions if v.storage],
    }
