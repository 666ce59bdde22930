"""Status derivation and write throttling: pure functions over Redis records."""

from __future__ import annotations

import pytest

from ardiff.kv.records import PodRecord, SessionRecord, SessionState
from ardiff.operator.specs import Playout
from ardiff.operator.status import (
    ConditionSpec,
    Phase,
    PoolObservation,
    Reason,
    SessionObservation,
    build_conditions,
    build_failed_status,
    build_pool_status,
    build_session_status,
    derive_session_phase,
    status_patch,
)

NOW_MS = 1_700_000_000_000
POD = PodRecord(
    name="tiny-ab12c",
    capacity=4,
    used=1,
    endpoint="http://10.0.0.7:8000",
    epoch=42,
    lease_expires_ms=NOW_MS + 5000,
    draining=False,
)


def record(state: SessionState = SessionState.PLACED, **fields: object) -> SessionRecord:
    values: dict[str, object] = {
        "name": "forest",
        "pool": "tiny",
        "pod": "tiny-ab12c",
        "pod_epoch": 42,
        "state": state,
        "token_sha256": "0" * 64,
        "seed": 0,
        "prompt": "",
        "image": b"",
        "reset_required": False,
        "max_chunks": 0,
        "priority": 0,
        "eviction_policy": "LRU",
        "chunk_index": 7,
        "last_tick_ms": NOW_MS - 1000,
    }
    values.update(fields)
    return SessionRecord(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rec", "pod", "ready", "expected"),
    [
        (None, None, False, (Phase.PENDING, Reason.WAITING_FOR_CAPACITY)),
        (record(), POD, True, (Phase.READY, Reason.PLACED)),
        (record(reset_required=True), POD, True, (Phase.READY, Reason.RESET_REQUIRED)),
        (record(), POD, False, (Phase.PENDING, Reason.POD_NOT_READY)),
        (record(pod_epoch=41), POD, True, (Phase.PENDING, Reason.POD_NOT_READY)),  # fenced incarnation
        (record(), None, True, (Phase.PENDING, Reason.POD_NOT_READY)),
        (
            record(),
            PodRecord(**{**POD.__dict__, "lease_expires_ms": NOW_MS}),
            True,
            (Phase.PENDING, Reason.POD_NOT_READY),
        ),
        (record(SessionState.LOST), POD, True, (Phase.LOST, Reason.POD_LOST)),
        (record(SessionState.EVICTED), POD, True, (Phase.EVICTED, Reason.EVICTED)),
        (record(SessionState.CLOSED), POD, True, (Phase.EXPIRED, Reason.IDLE_TIMEOUT)),
    ],
)
def test_phase_follows_the_records(
    rec: SessionRecord | None, pod: PodRecord | None, ready: bool, expected
) -> None:
    assert derive_session_phase(SessionObservation(rec, pod, ready, NOW_MS)) == expected


def test_ready_status_mirrors_the_binding() -> None:
    placed = record(playout_fps=12.5, playout_buffer_chunks=3)
    status = build_session_status(
        {}, SessionObservation(placed, POD, True, NOW_MS), session="forest", generation=3, now="T1"
    )
    assert status == {
        "phase": "Ready",
        "reason": "Placed",
        "message": "placed; tick at status.endpoint",
        "pod": "tiny-ab12c",
        "podEpoch": 42,
        "endpoint": "http://10.0.0.7:8000",
        "url": None,  # no front door known
        "resetRequired": False,
        "tokenSecretRef": {"name": "forest-token", "key": "token"},
        "observedGeneration": 3,
        "chunkIndex": 7,
        "lastTickTime": "2023-11-14T22:13:19.000Z",
        "playout": {"fps": 12.5, "bufferChunks": 3},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Placed",
                "message": "placed; tick at status.endpoint",
                "lastTransitionTime": "T1",
                "observedGeneration": 3,
            }
        ],
    }


def test_the_playout_target_is_the_records_else_the_resolved_one() -> None:
    resolved = Playout(fps=8.0, buffer_chunks=4)

    def playout(rec: SessionRecord | None) -> object:
        obs = SessionObservation(rec, POD, True, NOW_MS, playout=resolved)
        return build_session_status({}, obs, session="forest", generation=1, now="T1")["playout"]

    assert playout(None) == {"fps": 8.0, "bufferChunks": 4}  # pending: what it will be placed with
    assert playout(record()) == {"fps": 8.0, "bufferChunks": 4}  # placed before issue 25: no target kept
    assert playout(record(playout_fps=16.0, playout_buffer_chunks=2)) == {"fps": 16.0, "bufferChunks": 2}


def test_a_session_place_left_for_compute_waits_for_compute_naming_the_bound() -> None:
    waiting = SessionObservation(None, None, False, NOW_MS, starting_pods=1, compute_utilisation=0.9)
    assert derive_session_phase(waiting) == (Phase.PENDING, Reason.WAITING_FOR_COMPUTE)
    status = build_session_status({}, waiting, session="forest", generation=1, now="T1")
    assert (status["phase"], status["reason"]) == ("Pending", "WaitingForCompute")
    assert status["message"] == (
        "waiting for compute: every pod with a free slot would exceed spec.computeUtilisation (0.9) of its "
        "measured throughput with this session's playout fps; 1 worker pod starting"
    )
    # Once placed, the record decides.
    placed = SessionObservation(record(), POD, True, NOW_MS, compute_utilisation=0.9)
    assert derive_session_phase(placed) == (Phase.READY, Reason.PLACED)


def test_lost_status_drops_the_binding_and_requires_a_reset() -> None:
    ready = build_session_status(
        {}, SessionObservation(record(), POD, True, NOW_MS), session="forest", generation=1, now="T1"
    )
    lost = build_session_status(
        ready,
        SessionObservation(record(SessionState.LOST), None, False, NOW_MS),
        session="forest",
        generation=1,
        now="T2",
    )
    assert (lost["phase"], lost["reason"], lost["resetRequired"]) == ("Lost", "PodLost", True)
    assert (lost["pod"], lost["podEpoch"], lost["endpoint"]) == (None, None, None)
    assert lost["conditions"][0]["status"] == "False"
    assert lost["conditions"][0]["lastTransitionTime"] == "T2"


def test_the_front_door_url_lives_as_long_as_the_endpoint() -> None:
    """Issue 37: `url` (its pool's base URL at the front door) is written with `endpoint` while the session
    holds a pod, and cleared with it; the placed message points at it."""
    url = "https://worlds.example.com/pools/worlds/tiny"

    def status(previous: dict, rec: SessionRecord | None, pod: PodRecord | None, now: str) -> dict:
        obs = SessionObservation(rec, pod, pod is not None, NOW_MS, url=url)
        return build_session_status(previous, obs, session="forest", generation=1, now=now)

    pending = status({}, None, None, "T0")
    assert pending["url"] is None
    ready = status(pending, record(), POD, "T1")
    assert (ready["endpoint"], ready["url"]) == ("http://10.0.0.7:8000", url)
    assert ready["message"] == "placed; tick at status.url (status.endpoint inside the cluster)"
    lost = status(ready, record(SessionState.LOST), None, "T2")
    assert (lost["endpoint"], lost["url"]) == (None, None)
    assert status_patch(ready, lost, mirror_due=False)["url"] is None  # type: ignore[index]  # removed
    suspended = status(ready, record(SessionState.SUSPENDED, pod="", pod_epoch=0), None, "T3")
    assert suspended["url"] is None
    failed = build_failed_status(
        ready, session="forest", reason=Reason.POOL_DELETED, message="gone", generation=1, now="T4"
    )
    assert failed["url"] is None


def test_a_note_replaces_the_default_message_and_sticks_while_the_reason_does() -> None:
    obs = SessionObservation(record(SessionState.EVICTED), POD, True, NOW_MS)
    first = build_session_status(
        {}, obs, session="forest", generation=1, now="T1", message="evicted for desert"
    )
    again = build_session_status(first, obs, session="forest", generation=1, now="T2")
    assert first["message"] == again["message"] == "evicted for desert"
    assert status_patch(first, again, mirror_due=True) is None


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = build_conditions([], [ConditionSpec("Ready", True, "Placed", "m")], now="T1", generation=1)
    same = build_conditions(first, [ConditionSpec("Ready", True, "Placed", "other")], now="T2", generation=1)
    flipped = build_conditions(same, [ConditionSpec("Ready", False, "PodLost", "m")], now="T3", generation=1)
    assert [c["lastTransitionTime"] for c in (first[0], same[0], flipped[0])] == ["T1", "T1", "T3"]


def test_tick_data_is_written_only_when_due_or_with_another_change() -> None:
    previous = {"phase": "Ready", "chunkIndex": 3, "lastTickTime": "a"}
    ticked = {"phase": "Ready", "chunkIndex": 9, "lastTickTime": "b"}
    assert status_patch(previous, ticked, mirror_due=False) is None
    assert status_patch(previous, ticked, mirror_due=True) == {"chunkIndex": 9, "lastTickTime": "b"}
    moved = {**ticked, "phase": "Lost"}
    assert status_patch(previous, moved, mirror_due=False) == {
        "phase": "Lost",
        "chunkIndex": 9,
        "lastTickTime": "b",
    }
    assert status_patch(previous, {**previous, "pod": None}, mirror_due=True) is None


def test_kept_chunks_are_listed_while_placed_and_mirrored_on_the_throttle() -> None:
    """Issue 26: status.keptChunks is the record's kept_chunks while it holds its pod; gone once it does not;
    a change of it alone waits for the mirror like chunkIndex."""
    keeping = build_session_status(
        {},
        SessionObservation(record(kept_chunks=(5, 6, 7)), POD, True, NOW_MS),
        session="forest",
        generation=1,
        now="T",
    )
    assert keeping["keptChunks"] == [5, 6, 7]
    more = build_session_status(
        keeping,
        SessionObservation(record(kept_chunks=(6, 7, 8)), POD, True, NOW_MS),
        session="forest",
        generation=1,
        now="T",
    )
    assert status_patch(keeping, more, mirror_due=False) is None
    assert status_patch(keeping, more, mirror_due=True) == {"keptChunks": [6, 7, 8]}
    for gone in (record(kept_chunks=()), record(SessionState.SUSPENDED, pod="", kept_chunks=(6,))):
        status = build_session_status(
            keeping, SessionObservation(gone, POD, True, NOW_MS), session="forest", generation=1, now="T"
        )
        assert status["keptChunks"] is None  # removed by the merge patch


def test_fork_refusals_are_reasons() -> None:
    assert (Reason.FORK_SOURCE_NOT_FOUND, Reason.CHUNK_NOT_KEPT, Reason.FORK_POOL_MISMATCH) == (
        "ForkSourceNotFound",
        "ChunkNotKept",
        "ForkPoolMismatch",
    )


def test_failed_status() -> None:
    status = build_failed_status(
        {}, session="s", reason=Reason.UNKNOWN_POOL, message="no pool 'x'", generation=2, now="T"
    )
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "UnknownPool", "no pool 'x'")
    assert status["conditions"][0]["status"] == "False"


def pool_observation(**fields: object) -> PoolObservation:
    values: dict[str, object] = {
        "replicas": 3,
        "updated_replicas": 3,
        "ready_replicas": 3,
        "capacity": 12,
        "sessions": 12,
        "pending": 2,
        "min_replicas": 1,
        "max_replicas": 3,
        "starting": 0,
        "stale": 0,
        "startup_failure": None,
        "template_refusal": None,
    }
    values.update(fields)
    return PoolObservation(**values)  # type: ignore[arg-type]


def test_pool_status() -> None:
    obs = pool_observation()
    status = build_pool_status({}, obs, generation=5, now="T")
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "replicas": 3,
        "updatedReplicas": 3,
        "readyReplicas": 3,
        "capacity": 12,
        "sessions": 12,
        "pending": 2,
        "observedGeneration": 5,
    }
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "True", "MinimumReplicasReady"),
        ("AtCapacity", "True", "FullAtMaxReplicas"),
        ("Progressing", "True", "PodsRegistered"),
    ]


def test_pool_status_shows_compute_capacity_while_the_pool_admits_by_compute() -> None:
    status = build_pool_status({}, pool_observation(compute_capacity=5), generation=5, now="T")
    assert (status["capacity"], status["computeCapacity"]) == (12, 5)
    # computeUtilisation set back to 0: the field goes (None: the merge patch removes it).
    assert build_pool_status(status, pool_observation(), generation=6, now="T")["computeCapacity"] is None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ("True", "PodsRegistered", "all 3 worker pods registered")),
        ({"starting": 1}, ("True", "PodsStarting", "1 of 3 worker pods starting (not registered yet)")),
        (
            {"starting": 1, "stale": 2, "updated_replicas": 1},
            (
                "True",
                "RollingUpdate",
                "1 of 3 worker pods run the current spec; 2 older ones take no new session and go once they "
                "hold none",
            ),
        ),
        (
            {"starting": 1, "startup_failure": "worker pod p-abcde did not register within 60 s"},
            ("False", "StartupTimeout", "worker pod p-abcde did not register within 60 s"),
        ),
        (  # the API's refusal of the template comes first: no pod of it can even start
            {
                "startup_failure": "worker pod p-abcde did not register within 60 s",
                "template_refusal": 'Pod "p-abcde" is invalid: spec.containers[0].env[0].name: Invalid value',
            },
            (
                "False",
                "InvalidPodTemplate",
                'Pod "p-abcde" is invalid: spec.containers[0].env[0].name: Invalid value',
            ),
        ),
        (  # issue 23 item 1: without the workers' Redis user no Pod can log in, whatever the template
            {
                "template_refusal": 'Pod "p-abcde" is invalid',
                "credentials_problem": (
                    "RedisAclForbidden",
                    "the operator's redis user may not manage users",
                ),
            },
            ("False", "RedisAclForbidden", "the operator's redis user may not manage users"),
        ),
    ],
)
def test_pool_progressing_condition(fields: dict, expected: tuple[str, str, str]) -> None:
    status = build_pool_status({}, pool_observation(**fields), generation=5, now="T")
    [progressing] = [c for c in status["conditions"] if c["type"] == "Progressing"]
    assert (progressing["status"], progressing["reason"], progressing["message"]) == expected


# ---- issue 12: suspension ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rec", "expected"),
    [
        (record(SessionState.SUSPENDING), (Phase.SUSPENDING, Reason.SUSPENDED_FOR_CAPACITY)),
        (record(SessionState.SUSPENDING, resume_requested_ms=NOW_MS), (Phase.SUSPENDING, Reason.MIGRATING)),
        (record(SessionState.SUSPENDED, pod=""), (Phase.SUSPENDED, Reason.SUSPENDED_FOR_CAPACITY)),
        (
            record(SessionState.SUSPENDED, pod="", resume_requested_ms=NOW_MS),
            (Phase.SUSPENDED, Reason.RESUME_REQUESTED),
        ),
    ],
)
def test_suspension_phases(rec: SessionRecord, expected: tuple[Phase, Reason]) -> None:
    assert derive_session_phase(SessionObservation(rec, POD, True, NOW_MS)) == expected


def suspension_status(rec: SessionRecord, previous: dict | None = None) -> dict:
    obs = SessionObservation(rec, POD, True, NOW_MS)
    return build_session_status(
        previous or {}, obs, session="forest", generation=1, now="2026-01-01T00:00:00Z"
    )


def test_a_suspended_status_shows_where_the_export_lies_and_needs_no_reset() -> None:
    suspended = record(
        SessionState.SUSPENDED,
        pod="",
        pod_epoch=0,
        tier="shared",
        location="/t/f",
        bytes=4096,
        suspended_chunk=7,
    )
    status = suspension_status(suspended)
    assert (status["phase"], status["tier"], status["bytes"], status["suspendedChunk"]) == (
        "Suspended",
        "shared",
        4096,
        7,
    )
    assert (status["pod"], status["endpoint"], status["resetRequired"]) == (None, None, False)
    # Placed again: the export fields are removed (null in the merge patch); it resumes without a reset.
    resumed = suspension_status(record(resume_from="/t/f"), previous=status)
    assert (resumed["phase"], resumed["resetRequired"]) == ("Ready", False)
    assert (resumed["tier"], resumed["bytes"], resumed["suspendedChunk"]) == (None, None, None)
    # A suspending session still holds its pod: the status keeps it.
    suspending = suspension_status(record(SessionState.SUSPENDING))
    assert (suspending["pod"], suspending["resetRequired"]) == ("tiny-ab12c", False)
    assert "tier" not in suspending


def test_a_lost_session_with_a_snapshot_does_not_need_a_reset() -> None:
    assert suspension_status(record(SessionState.LOST, snapshot_location="/t/s"))["resetRequired"] is False
    assert suspension_status(record(SessionState.LOST, resume_from="/t/e"))["resetRequired"] is False
    assert suspension_status(record(SessionState.LOST))["resetRequired"] is True
    assert suspension_status(record(SessionState.EVICTED, snapshot_location="/t/s"))["resetRequired"] is True


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        (
            {"source": "direct", "bytes": 4174639, "seconds": 0.034, "from": "p-aaaaa", "to": "p-bbbbb"},
            ("Normal", "4174639 bytes pulled from pod p-aaaaa by pod p-bbbbb in 0.034 s (123 MB/s)"),
        ),
        (
            {
                "source": "suspend",
                "bytes": 148127,
                "seconds": 0.5,
                "from": "p-aaaaa",
                "to": "p-b",
                "direct_failed": True,
            },
            (
                "Warning",
                "the direct transfer from pod p-aaaaa failed; 148127 bytes read from the shared tier "
                "by pod p-b in 0.500 s",
            ),
        ),
        (
            {
                "source": "snapshot",
                "bytes": None,
                "seconds": 0.25,
                "from": "",
                "to": "p-b",
                "direct_failed": False,
            },
            ("Normal", "its export read from its snapshot in the shared tier by pod p-b in 0.250 s"),
        ),
        (
            {"source": "host", "bytes": 2048, "seconds": 0.002, "from": "p-b", "to": "p-b"},
            ("Normal", "2048 bytes read from its own host memory by pod p-b in 0.002 s"),
        ),
    ],
)
def test_a_resume_is_reported_with_its_bytes_and_time(note, expected):
    """Issue 12: the `Transferred` Event on the session, from the note its new worker left in Redis."""
    from ardiff.operator.reconcile import transfer_event

    assert transfer_event(note) == expected
