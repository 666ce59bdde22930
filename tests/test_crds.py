"""Static checks of crds/ and examples/: schemas, defaults, CEL rules and the errors bad specs get."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ardiff.devcluster.cel import CELCompileError, ValidationRule
from ardiff.devcluster.crd import CRD_DIR, CustomResourceDefinition, load_crds, load_manifests, served_version
from ardiff.devcluster.validation import FieldError, InvalidObject, render_path
from ardiff.kv.records import PodRecord, SessionBinding, SessionState
from ardiff.operator.status import (
    PoolObservation,
    Reason,
    SessionObservation,
    build_failed_status,
    build_pool_status,
    build_session_status,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TEST_MANIFESTS = Path(__file__).resolve().parent / "manifests"  # test-only, e.g. the fake-runtime pool
POOLS = "ardiffusionworkerpools.ardiffusion.dev"
SESSIONS = "ardiffusionsessions.ardiffusion.dev"


@pytest.fixture(scope="module")
def crds() -> dict[str, CustomResourceDefinition]:
    return load_crds()


def example(file: str, name: str, directory: Path = EXAMPLES) -> dict[str, Any]:
    for doc in load_manifests(directory / file):
        if doc["metadata"]["name"] == name:
            return copy.deepcopy(doc)
    raise KeyError(name)


def rejected(
    crd: CustomResourceDefinition, obj: dict[str, Any], old: dict[str, Any] | None = None
) -> InvalidObject:
    with pytest.raises(InvalidObject) as info:
        crd.version("v1alpha1").admit(obj, old=old)
    return info.value


def test_crds_declare_names_scope_and_status_subresource(crds: dict[str, CustomResourceDefinition]) -> None:
    assert set(crds) == {POOLS, SESSIONS, "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}
    for name, short in ((POOLS, "adpool"), (SESSIONS, "adsession")):
        version = crds[name].version("v1alpha1")
        assert version.group == "ardiffusion.dev"
        assert version.namespaced
        assert version.short_names == (short,)
        assert version.categories == ("ardiff",)
        assert version.status_subresource
        assert version.storage
    assert crds["kopfpeerings.kopf.dev"].namespaced
    assert not crds["clusterkopfpeerings.kopf.dev"].namespaced


def test_printer_columns(crds: dict[str, CustomResourceDefinition]) -> None:
    def default_columns(name: str) -> list[tuple[str, str]]:
        columns = crds[name].version("v1alpha1").printer_columns
        return [(c.name, c.json_path) for c in columns if c.priority == 0]

    assert default_columns(SESSIONS) == [
        ("Phase", ".status.phase"),
        ("Pool", ".spec.poolRef"),
        ("Pod", ".status.pod"),
        ("Chunk", ".status.chunkIndex"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    wide = [(c.name, c.json_path) for c in crds[SESSIONS].version("v1alpha1").printer_columns if c.priority]
    assert wide == [("Reason", ".status.reason"), ("Endpoint", ".status.endpoint"), ("Tier", ".status.tier")]
    assert default_columns(POOLS) == [
        ("Ready", ".status.readyReplicas"),
        ("Capacity", ".status.capacity"),
        ("Sessions", ".status.sessions"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def test_every_example_validates_unpruned(crds: dict[str, CustomResourceDefinition]) -> None:
    docs = load_manifests(EXAMPLES)
    # The ConfigMap holds the trained tiny world's start image (examples/sessions.yaml).
    assert {d["kind"] for d in docs} == {"ARDiffusionWorkerPool", "ARDiffusionSession", "ConfigMap"}
    assert len([d for d in docs if d["kind"] == "ARDiffusionSession"]) == 4  # 3 LingBot, 1 robot (DreamZero)
    for doc in (d for d in docs if d["kind"] != "ConfigMap"):
        admitted = served_version(crds, doc["apiVersion"], doc["kind"]).admit(doc)
        assert admitted.pruned == (), doc["metadata"]["name"]
        # Defaulting only adds: everything the example says is kept as written.
        assert _contains(admitted.obj, doc), doc["metadata"]["name"]


def _contains(big: Any, small: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v) for k, v in small.items())
    return bool(big == small)


def test_examples_pool_shape() -> None:
    pool = example("pool.yaml", "tiny-world")
    assert pool["spec"]["replicas"] == {"min": 1, "max": 2}
    assert (pool["spec"]["model"]["height"], pool["spec"]["model"]["width"]) == (64, 64)
    fake = example("pool-fake.yaml", "fake-pool", TEST_MANIFESTS)
    assert {"name": "ARDIFF_RUNTIME", "value": "fake"} in fake["spec"]["env"]


def test_a_pool_setting_every_pod_template_knob_is_admitted_as_written(
    crds: dict[str, CustomResourceDefinition],
) -> None:
    """Embedded Kubernetes schemas (a volume's source, affinity) are kept as written, not pruned."""
    pool = example("pool-all-knobs.yaml", "knobs", TEST_MANIFESTS)
    admitted = crds[POOLS].version("v1alpha1").admit(pool)
    assert admitted.pruned == ()
    assert _contains(admitted.obj, pool)
    assert admitted.obj["spec"]["volumes"][1]["ephemeral"] == pool["spec"]["volumes"][1]["ephemeral"]


def test_defaults_are_applied(crds: dict[str, CustomResourceDefinition]) -> None:
    pool = example("pool.yaml", "tiny-world")
    pool["spec"] = {"model": {"name": "tiny-lingbot-world"}, "image": "worker:1"}
    spec = crds[POOLS].version("v1alpha1").admit(pool).obj["spec"]
    assert spec["model"] == {
        "name": "tiny-lingbot-world",
        "pipeline": "LingBotWorldCausalDMDPipeline",
        "height": 480,
        "width": 832,
    }
    assert spec["kv"] == {"gpuMemoryFraction": 0.9}
    assert spec["replicas"] == {"min": 1, "max": 1}
    assert spec["eviction"] == {"minIdleSeconds": 30}
    assert spec["scaleDownDelaySeconds"] == 300
    assert spec["startupTimeoutSeconds"] == 600

    session = example("sessions.yaml", "forest-walk")
    session["spec"] = {"poolRef": "tiny-world", "prompt": ""}
    spec = crds[SESSIONS].version("v1alpha1").admit(session).obj["spec"]
    assert spec == {
        "poolRef": "tiny-world",
        "prompt": "",
        "seed": 0,
        "priority": 0,
        "evictionPolicy": "LRU",
        "idleTimeoutSeconds": 0,
        "family": "lingbot",
    }


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    if value is _DELETE:
        del obj[last]
    else:
        obj[last] = value


_DELETE = object()

# Expected errors; `{f}` stands for the field path.
BAD_POOLS = [
    ("spec.replicas.min", -1, "{f}: Invalid value: -1: {f} in body should be greater than or equal to 0"),
    ("spec.replicas", {"min": 3, "max": 2}, "{f}.max: Invalid value: 2: max must be >= min"),
    ("spec.replicas.max", 0, "{f}: Invalid value: 0: {f} in body should be greater than or equal to 1"),
    (
        "spec.kv.gpuMemoryFraction",
        1.5,
        "{f}: Invalid value: 1.5: {f} in body should be less than or equal to 1",
    ),
    ("spec.kv.gpuMemoryFraction", 0, "{f}: Invalid value: 0: {f} in body should be greater than 0"),
    ("spec.kv.sessionCapacity", 0, "{f}: Invalid value: 0: {f} in body should be greater than or equal to 1"),
    ("spec.model.height", 65, "{f}: Invalid value: 65: {f} in body should be a multiple of 16"),
    (
        "spec.model.width",
        "wide",
        '{f}: Invalid value: "string": {f} in body must be of type integer: "string"',
    ),
    (
        "spec.model.dtype",
        "int8",
        '{f}: Unsupported value: "int8": supported values: "bfloat16", "float16", "float32"',
    ),
    (
        "spec.model.path",
        "/m",
        'spec.model: Invalid value: "object": exactly one of model.name and model.path must be set',
    ),
    (
        "spec.model.name",
        _DELETE,
        'spec.model: Invalid value: "object": exactly one of model.name and model.path',
    ),
    ("spec.image", _DELETE, "{f}: Required value"),
    (
        "spec.startupTimeoutSeconds",
        0,
        "{f}: Invalid value: 0: {f} in body should be greater than or equal to 1",
    ),
    (
        "spec.scaleDownDelaySeconds",
        -5,
        "{f}: Invalid value: -5: {f} in body should be greater than or equal to 0",
    ),
    (
        "spec.eviction.minIdleSeconds",
        "10",
        '{f}: Invalid value: "string": {f} in body must be of type integer',
    ),
    ("spec.resources.limits", {"nvidia.com/gpu": "lots"}, '{f}[nvidia.com/gpu]: Invalid value: "lots"'),
    (
        "spec.env",
        [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}],
        '{f}[1]: Duplicate value: {{"name":"A"}}',
    ),
    ("metadata.name", "a" * 56, "{f}: Too long: may not be longer than 55"),
    # Pod template knobs (issue 11 item 3): what the Pod's admission would refuse, refused up front.
    (
        "spec.volumes",
        [{"name": "tmp", "emptyDir": {}}],
        '{f}[0].name: Invalid value: "tmp": volume names tmp, home, model-cache, dshm, model and redis-ca',
    ),
    (
        "spec.volumeMounts",
        [{"name": "data", "mountPath": "/data"}],
        '{f}: Invalid value: "array": every volumeMounts entry must name one of spec.volumes',
    ),
    (
        "spec.volumeMounts",
        [{"name": "data", "mountPath": "/dev/shm"}],
        '{f}[0].mountPath: Invalid value: "/dev/shm": mount paths /tmp, /home/ardiff',
    ),
    ("spec.shmSize", "lots", '{f}: Invalid value: "lots": {f} in body should match'),
    (
        "spec.podLabels",
        {"ardiffusion.dev/busy": "true"},
        '{f}: Invalid value: "object": label keys under ardiffusion.dev/ and app.kubernetes.io/ are the',
    ),
    ("spec.podLabels", {"a b": "c"}, '{f}: Invalid value: "object": label keys must be qualified names'),
    ("spec.podLabels", {"queue": "a b"}, '{f}.queue: Invalid value: "a b": {f}.queue in body should match'),
    (
        "spec.podAnnotations",
        {"ardiffusion.dev/template-hash": "x"},
        '{f}: Invalid value: "object": annotation keys under ardiffusion.dev/ are the operator',
    ),
    ("spec.runtimeClassName", "NVIDIA", '{f}: Invalid value: "NVIDIA": {f} in body should match'),
    (
        "spec.imagePullPolicy",
        "Sometimes",
        '{f}: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never"',
    ),
    (
        "spec.topologySpreadConstraints",
        [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
        "{f}[0].maxSkew: Invalid value: 0: {f}[0].maxSkew in body should be greater than or equal to 1",
    ),
    (
        "spec.securityContext",
        {"seccompProfile": {"type": "Localhost"}},
        '{f}.seccompProfile: Invalid value: "object": localhostProfile must be set when type is Localhost',
    ),
    (
        "spec.modelDownload",
        {"url": "https://models.example/lingbot.tgz"},
        "{p}.model.path: Invalid value: a modelDownload writes into model.path",
    ),
    (
        "spec.modelDownload",
        {"persistentVolumeClaim": {"claimName": "m"}},
        '{f}: Invalid value: "object": exactly one of modelDownload.huggingFace and modelDownload.url',
    ),
    (
        "spec.modelDownload",
        {"url": "ftp://m/x"},
        '{f}.url: Invalid value: "ftp://m/x": {f}.url in body should',
    ),
    ("metadata.name", "a.b", '{f}: Invalid value: "a.b": pool name must be a DNS-1035 label'),
]


@pytest.mark.parametrize(
    ("path", "value", "expected"), BAD_POOLS, ids=[f"{p}={v!r}"[:50] for p, v, _ in BAD_POOLS]
)
def test_bad_pools_are_rejected_naming_the_field(
    crds: dict[str, CustomResourceDefinition], path: str, value: Any, expected: str
) -> None:
    pool = example("pool.yaml", "tiny-world")
    _set(pool, path, value)
    error = rejected(crds[POOLS], pool)
    expected = expected.format(f=path, p=path.rpartition(".")[0])
    assert any(str(e).startswith(expected) for e in error.errors), [str(e) for e in error.errors]
    assert expected.split(":")[0] in error.message
    assert error.as_status()["code"] == 422
    assert error.as_status()["reason"] == "Invalid"


BAD_SESSIONS = [
    ("spec.poolRef", _DELETE, "{f}: Required value"),
    (
        "spec.evictionPolicy",
        "Sometimes",
        '{f}: Unsupported value: "Sometimes": supported values: "LRU", "Never"',
    ),
    ("spec.priority", 1001, "{f}: Invalid value: 1001: {f} in body should be less than or equal to 1000"),
    ("spec.priority", True, '{f}: Invalid value: "boolean": {f} in body must be of type integer: "boolean"'),
    ("spec.seed", -1, "{f}: Invalid value: -1: {f} in body should be greater than or equal to 0"),
    (
        "spec.idleTimeoutSeconds",
        1.5,
        '{f}: Invalid value: "number": {f} in body must be of type integer: "number"',
    ),
    ("spec.maxChunks", 0, "{f}: Invalid value: 0: {f} in body should be greater than or equal to 1"),
    ("spec.prompt", 7, '{f}: Invalid value: "integer": {f} in body must be of type string: "integer"'),
    ("spec.prompt", "x" * 8193, "{f}: Too long: may not be longer than 8192"),
    ("spec.poolRef", "Tiny_World", '{f}: Invalid value: "Tiny_World": {f} in body should match'),
    (
        "spec.image",
        {},
        '{f}: Invalid value: "object": exactly one of image.configMapKeyRef and image.secretKeyRef',
    ),
    (
        "spec.image",
        {"configMapKeyRef": {"name": "a", "key": "b"}, "secretKeyRef": {"name": "a", "key": "b"}},
        "{f}: ",
    ),
    ("spec.image", {"secretKeyRef": {"name": "a"}}, "{f}.secretKeyRef.key: Required value"),
    ("status.phase", "Running", '{f}: Unsupported value: "Running": supported values: "Pending", "Ready"'),
    ("status.chunkIndex", -1, "{f}: Invalid value: -1"),
    (
        "status.lastTickTime",
        "yesterday",
        '{f}: Invalid value: "yesterday": {f} in body must be of type date-time',
    ),
    (
        "metadata.name",
        "Forest.Walk",
        '{f}: Invalid value: "Forest.Walk": session name must be a DNS-1123 label',
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "expected"), BAD_SESSIONS, ids=[f"{p}={v!r}"[:50] for p, v, _ in BAD_SESSIONS]
)
def test_bad_sessions_are_rejected_naming_the_field(
    crds: dict[str, CustomResourceDefinition], path: str, value: Any, expected: str
) -> None:
    session = example("sessions.yaml", "forest-walk")
    _set(session, path, value)
    error = rejected(crds[SESSIONS], session)
    expected = expected.format(f=path)
    assert any(str(e).startswith(expected) for e in error.errors), [str(e) for e in error.errors]


def test_all_errors_are_reported_at_once(crds: dict[str, CustomResourceDefinition]) -> None:
    session = example("sessions.yaml", "forest-walk")
    del session["spec"]["poolRef"]
    session["spec"]["seed"] = "x"
    session["spec"]["evictionPolicy"] = "?"
    error = rejected(crds[SESSIONS], session)
    assert [e.field for e in error.errors] == ["spec.poolRef", "spec.seed", "spec.evictionPolicy"]
    assert error.message.startswith(
        'ARDiffusionSession.ardiffusion.dev "forest-walk" is invalid: [spec.poolRef: Required value, '
    )
    causes = error.as_status()["details"]["causes"]
    assert causes[0] == {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.poolRef"}


def test_status_the_operator_writes_is_kept_and_validated(crds: dict[str, CustomResourceDefinition]) -> None:
    session = example("sessions.yaml", "forest-walk")
    status = {
        "phase": "Ready",
        "pod": "tiny-world-x7k2p",
        "endpoint": "http://10.0.0.7:8000",
        "chunkIndex": 12,
        "lastTickTime": "2026-01-02T03:04:05Z",
        "resetRequired": False,
        "reason": "Placed",
        "tokenSecretRef": {"name": "forest-walk-token", "key": "token"},
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Placed",
                "lastTransitionTime": "2026-01-02T03:04:05Z",
            }
        ],
        # What kopf may write: progress records and handler results (status.<handler id>).
        "kopf": {"progress": {"place": {"started": "2026-01-02T03:04:05.000000", "retries": 0}}},
        "place_session": {"pod": "tiny-world-x7k2p"},
    }
    session["status"] = copy.deepcopy(status)
    admitted = crds[SESSIONS].version("v1alpha1").admit(session)
    assert admitted.obj["status"] == status
    assert admitted.pruned == ()

    pool = example("pool.yaml", "tiny-world")
    pool_status = {
        "replicas": 2,
        "readyReplicas": 1,
        "capacity": 2,
        "sessions": 2,
        "pending": 1,
        "observedGeneration": 3,
        "conditions": [
            {"type": "Scaling", "status": "True", "reason": "SessionsPending", "message": "1 pending"}
        ],
        "kopf": {"dummy": "x"},
    }
    pool["status"] = copy.deepcopy(pool_status)
    assert crds[POOLS].version("v1alpha1").admit(pool).obj["status"] == pool_status


def _without_preserved_status(file: str) -> CustomResourceDefinition:
    """The CRD as if its status did not keep unknown fields (everything undeclared would be pruned)."""
    doc = load_manifests(CRD_DIR / file)[0]
    status = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["x-kubernetes-preserve-unknown-fields"]
    return CustomResourceDefinition.from_manifest(doc)


def _session_statuses() -> list[dict[str, Any]]:
    """Every shape of session status the operator's builders produce."""
    pod = PodRecord("tiny-world-x7k2p", 2, 1, "http://10.0.0.7:8000", 42, 1_800_000_000_000, False)
    records = [
        None,
        *(
            SessionBinding("forest-walk", state, pod.name, 42, reset, 12, 1_700_000_000_000)
            for state in SessionState
            for reset in (False, True)
        ),
        SessionBinding(
            "forest-walk",
            SessionState.SUSPENDED,
            "",
            0,
            False,
            12,
            1_700_000_000_000,
            "shared",
            "/t/f",
            4096,
            12,
        ),
    ]
    statuses = []
    previous: dict[str, Any] = {}
    for record in records:
        for ready in (False, True):
            obs = SessionObservation(record=record, pod=pod, pod_ready=ready, now_ms=1_700_000_001_000)
            previous = build_session_status(
                previous, obs, session="forest-walk", generation=1, now="2026-01-02T03:04:05.000Z"
            )
            statuses.append(previous)
    failed = build_failed_status(
        previous,
        session="forest-walk",
        reason=Reason.INVALID_SPEC,
        message="spec.x is bad",
        generation=2,
        now="2026-01-02T03:04:06.000Z",
    )
    return [*statuses, failed]


def test_every_status_field_the_operator_writes_is_declared() -> None:
    """Nothing the operator writes relies on `x-kubernetes-preserve-unknown-fields`: with it removed, no
    status field of a session or a pool is pruned."""
    sessions = _without_preserved_status("ardiffusionsessions.yaml").version("v1alpha1")
    written: set[str] = set()
    for status in _session_statuses():
        stored = {k: v for k, v in status.items() if v is not None}  # null removes a field (merge patch)
        admitted = sessions.admit({**example("sessions.yaml", "forest-walk"), "status": stored})
        assert admitted.pruned == (), status
        written |= set(stored)
    assert written == {
        "phase",
        "reason",
        "message",
        "pod",
        "podEpoch",
        "endpoint",
        "resetRequired",
        "tokenSecretRef",
        "observedGeneration",
        "chunkIndex",
        "lastTickTime",
        "conditions",
        "tier",
        "bytes",
        "suspendedChunk",
        "exportLocation",
    }
    pools = _without_preserved_status("ardiffusionworkerpools.yaml").version("v1alpha1")
    observation = PoolObservation(
        replicas=3,
        updated_replicas=2,
        ready_replicas=2,
        capacity=4,
        sessions=3,
        pending=1,
        min_replicas=1,
        max_replicas=3,
        starting=1,
        stale=1,
        startup_failure="worker pod tiny-world-abcde did not register within 600 s",
        template_refusal='Pod "tiny-world-abcde" is invalid: spec.containers[0].env[0].name: Required value',
    )
    pool_status = build_pool_status({}, observation, generation=4, now="2026-01-02T03:04:05.000Z")
    admitted = pools.admit({**example("pool.yaml", "tiny-world"), "status": pool_status})
    assert admitted.pruned == ()
    assert admitted.obj["status"] == pool_status


# In a fresh interpreter: importing the handlers registers them in kopf's default registry, which tests that
# run kopf in this process (tests/devcluster/test_kopf.py) must not inherit.
_CHANGING_HANDLER_RETURNS = """
import json
import kopf
import ardiff.operator.handlers
handlers = kopf.get_default_registry()._changing.get_all_handlers()
print(json.dumps({h.id: h.fn.__annotations__["return"] for h in handlers}))
"""


def test_no_handler_result_lands_in_status(tmp_path: Path) -> None:
    """kopf writes a changing handler's return value to status.<handler id>; none of ours returns one."""
    result = subprocess.run(
        [sys.executable, "-c", _CHANGING_HANDLER_RETURNS],
        cwd=tmp_path,  # not the repository root: its operator/ folder would shadow the standard library
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    returns = json.loads(result.stdout)
    assert set(returns) == {"admit_session"}
    assert set(returns.values()) == {"None"}


def test_unknown_spec_fields_are_pruned_and_reported(crds: dict[str, CustomResourceDefinition]) -> None:
    session = example("sessions.yaml", "forest-walk")
    session["spec"]["colour"] = "blue"
    session["spec"]["image"] = {"secretKeyRef": {"name": "img", "key": "png", "extra": 1}}
    session["metadata"]["annotations"] = {"ardiffusion.dev/x": "kept"}
    admitted = crds[SESSIONS].version("v1alpha1").admit(session)
    assert sorted(admitted.pruned) == ["spec.colour", "spec.image.secretKeyRef.extra"]
    assert "colour" not in admitted.obj["spec"]
    assert admitted.obj["spec"]["image"] == {"secretKeyRef": {"name": "img", "key": "png"}}
    assert admitted.obj["metadata"]["annotations"] == {"ardiffusion.dev/x": "kept"}


def test_pool_ref_is_immutable_but_other_fields_may_change(crds: dict[str, CustomResourceDefinition]) -> None:
    version = crds[SESSIONS].version("v1alpha1")
    old = version.admit(example("sessions.yaml", "forest-walk")).obj
    moved = copy.deepcopy(old)
    moved["spec"]["poolRef"] = "other-pool"
    error = rejected(crds[SESSIONS], moved, old=old)
    assert [str(e) for e in error.errors] == [
        'spec.poolRef: Invalid value: "other-pool": poolRef is immutable'
    ]
    reprioritised = copy.deepcopy(old)
    reprioritised["spec"]["priority"] = 7
    assert version.admit(reprioritised, old=old).obj["spec"]["priority"] == 7
    # On create there is no old value, so the transition rule does not run.
    assert version.admit(moved).obj["spec"]["poolRef"] == "other-pool"


def test_family_is_an_enum_defaulted_to_lingbot_and_immutable(
    crds: dict[str, CustomResourceDefinition],
) -> None:
    """The session names its model family (CEL sees one object: the operator compares it with the pool's)."""
    version = crds[SESSIONS].version("v1alpha1")
    robot = example("sessions.yaml", "forest-walk")
    robot["spec"]["family"] = "dreamzero"
    old = version.admit(robot).obj
    assert old["spec"]["family"] == "dreamzero"
    robot["spec"]["family"] = "sora"
    error = rejected(crds[SESSIONS], robot)
    assert [str(e) for e in error.errors] == [
        'spec.family: Unsupported value: "sora": supported values: "lingbot", "dreamzero"'
    ]
    switched = copy.deepcopy(old)
    switched["spec"]["family"] = "lingbot"
    error = rejected(crds[SESSIONS], switched, old=old)
    assert [str(e) for e in error.errors] == ['spec.family: Invalid value: "lingbot": family is immutable']


def _all_rules(schema: dict[str, Any]) -> list[dict[str, Any]]:
    rules = list(schema.get("x-kubernetes-validations") or [])
    for child in (schema.get("properties") or {}).values():
        rules += _all_rules(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            rules += _all_rules(schema[key])
    return rules


def test_every_cel_rule_compiles(crds: dict[str, CustomResourceDefinition]) -> None:
    rules = [
        rule for name in (POOLS, SESSIONS) for rule in _all_rules(dict(crds[name].version("v1alpha1").schema))
    ]
    assert len(rules) == 26  # 14 before the Pod template knobs (issue 11 item 3); + spec.family (issue 15)
    for entry in rules:
        compiled = ValidationRule.from_schema(entry)
        assert compiled.message, entry  # every rule explains itself


def test_a_crd_with_a_broken_rule_or_default_is_rejected() -> None:
    doc = load_manifests(CRD_DIR / "ardiffusionworkerpools.yaml")[0]
    spec_schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["replicas"]["x-kubernetes-validations"][0]["rule"] = "self.max >=* self.min"
    spec_schema["properties"]["kv"]["properties"]["gpuMemoryFraction"]["default"] = 2
    with pytest.raises(InvalidObject) as info:
        CustomResourceDefinition.from_manifest(doc)
    where = "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties"
    fields = [e.field for e in info.value.errors]
    assert f"{where}[kv].properties[gpuMemoryFraction].default" in fields
    assert f"{where}[replicas].x-kubernetes-validations[0].rule" in fields
    assert "compilation failed" in info.value.message


def test_a_crd_needs_one_storage_version_and_a_matching_name() -> None:
    doc = load_manifests(CRD_DIR / "ardiffusionsessions.yaml")[0]
    doc["metadata"]["name"] = "sessions.example.com"
    doc["spec"]["versions"].append({**doc["spec"]["versions"][0], "name": "v1beta1"})
    with pytest.raises(InvalidObject) as info:
        CustomResourceDefinition.from_manifest(doc)
    assert [e.field for e in info.value.errors] == ["metadata.name", "spec.versions"]


def test_cel_rule_reasons_and_messages_are_checked() -> None:
    with pytest.raises(CELCompileError, match="reason must be one of"):
        ValidationRule(rule="true", reason="Because")
    rule = ValidationRule(rule="self.a > 1", message_expression="'a is ' + string(self.a)")
    assert rule.render_message({"a": 1}, {}) == "a is 1"


def test_field_paths_render_like_kubernetes() -> None:
    assert render_path(["spec", "env", 1, "name"]) == "spec.env[1].name"
    assert (
        render_path(["spec", "resources", "limits", "nvidia.com/gpu"])
        == "spec.resources.limits[nvidia.com/gpu]"
    )
    assert str(FieldError("spec.x", "FieldValueRequired", value=3)) == "spec.x: Required value"
    assert (
        str(FieldError("spec.x", "FieldValueInvalid", "bad", {"a": 1}))
        == 'spec.x: Invalid value: {"a":1}: bad'
    )
