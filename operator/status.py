"""What the operator writes into `status`, derived purely from what it observed (Redis records + Pods).

`status.phase` is the session's state machine (DESIGN §5):
Pending → Ready; Ready → Lost | Evicted | Expired | Suspending; Suspending → Suspended (exported: no pod, no
slot) | Evicted (the export failed) | Lost; Suspended → Ready (resumed) | Expired; Lost | Evicted → Ready
(resetRequired, unless a Lost one resumes from its snapshot); Failed is final.
Writes go through `status_patch`, which returns only what changed: per-tick data (`chunkIndex`,
`lastTickTime`) rides along with any other change, or alone once its mirror interval is due.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from ardiff.kv.records import PodRecord, SessionState
from ardiff.operator.specs import Playout
from ardiff.operator.tokens import TOKEN_KEY, token_secret_name


class Phase(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    LOST = "Lost"
    EVICTED = "Evicted"
    EXPIRED = "Expired"
    FAILED = "Failed"
    SUSPENDING = "Suspending"  # its export is being written; it still holds its pod and slot
    SUSPENDED = "Suspended"  # exported to a tier: no pod, no slot; a tick resumes it


class Reason(StrEnum):
    """`status.reason`: one stable word per cause."""

    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    # Issue 25: a pod has a free slot but no compute for its playout fps (spec.computeUtilisation)
    WAITING_FOR_COMPUTE = "WaitingForCompute"
    POD_STARTING = "PodStarting"  # waiting for a slot while the pool's worker pods start (e.g. from zero)
    POD_NOT_READY = "PodNotReady"
    PLACED = "Placed"
    RESET_REQUIRED = "ResetRequired"  # placed again after its KV was lost or evicted
    POD_LOST = "PodLost"
    EVICTED = "Evicted"
    IDLE_TIMEOUT = "IdleTimeout"
    UNKNOWN_POOL = "UnknownPool"
    INVALID_SPEC = "InvalidSpec"
    IMAGE_NOT_FOUND = "ImageNotFound"
    IMAGE_NOT_ALLOWED = "ImageNotAllowed"  # its image.secretKeyRef names a Secret not labelled for sessions
    POOL_DELETED = "PoolDeleted"
    FAMILY_MISMATCH = "FamilyMismatch"  # its spec.family is not its pool's (the pool's model.pipeline says)
    # Issue 26: a fork (spec.forkFrom) whose parent is not there or not placed, does not keep the chunk, or is
    # in another pool or family.
    FORK_SOURCE_NOT_FOUND = "ForkSourceNotFound"
    CHUNK_NOT_KEPT = "ChunkNotKept"
    FORK_POOL_MISMATCH = "ForkPoolMismatch"
    SUSPENDED_FOR_CAPACITY = "SuspendedForCapacity"  # evicted for idleness, its KV kept in the tier
    MIGRATING = "Migrating"  # moved off its pod (scale-down, roll): placed again as soon as it is exported
    RESUME_REQUESTED = "ResumeRequested"  # suspended, a tick asked for it: waiting for a slot


DEFAULT_MESSAGES = {
    Reason.WAITING_FOR_CAPACITY: "waiting for a free slot in the pool",
    Reason.POD_NOT_READY: "placed on a pod that is not Ready",
    Reason.PLACED: "placed; tick at status.endpoint",
    Reason.RESET_REQUIRED: "placed again after losing its KV cache; the next tick must reset (chunk 0)",
    Reason.POD_LOST: "its pod was lost; waiting for a free slot",
    Reason.EVICTED: "evicted to make room for another session; waiting for a free slot",
    Reason.IDLE_TIMEOUT: "no tick within spec.idleTimeoutSeconds; the slot was released",
    Reason.SUSPENDED_FOR_CAPACITY: "suspended to make room for another session; its next tick resumes it",
    Reason.MIGRATING: "moving to another pod; its ticks are answered 503 resuming meanwhile",
    Reason.RESUME_REQUESTED: "suspended; a tick asked for it: waiting for a free slot to resume",
}
# A placed session's message where the operator knows the front door (issue 37): `status.url` reaches it from
# outside the cluster, `status.endpoint` only from inside.
PLACED_AT_FRONT_DOOR = "placed; tick at status.url (status.endpoint inside the cluster)"
# States whose record holds the session's pod and slot.
HOLDING_STATES = (SessionState.PLACED, SessionState.SUSPENDING)

# Per-tick data: mirrored on a throttle, never per tick (keptChunks changes with each chunk of a session
# that keeps chunks).
THROTTLED_FIELDS = ("chunkIndex", "lastTickTime", "keptChunks")


def rfc3339(ms: int) -> str:
    return (
        datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True)
class ConditionSpec:
    type: str
    status: bool
    reason: str
    message: str


def build_conditions(
    previous: Sequence[Mapping[str, Any]], desired: Sequence[ConditionSpec], *, now: str, generation: int
) -> list[dict[str, Any]]:
    """Kubernetes conditions; `lastTransitionTime` moves only when a condition's status changes."""
    before = {c.get("type"): c for c in previous or ()}
    conditions = []
    for cond in desired:
        status = "True" if cond.status else "False"
        old = before.get(cond.type)
        since = old["lastTransitionTime"] if old and old.get("status") == status else now
        conditions.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        )
    return conditions


class SessionPlacement(Protocol):
    """What status derivation needs of a session's record (a `SessionBinding` or a whole `SessionRecord`)."""

    @property
    def state(self) -> SessionState: ...
    @property
    def pod(self) -> str: ...
    @property
    def pod_epoch(self) -> int: ...
    @property
    def reset_required(self) -> bool: ...
    @property
    def chunk_index(self) -> int: ...
    @property
    def last_tick_ms(self) -> int: ...
    @property
    def tier(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def suspended_chunk(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def resume_requested_ms(self) -> int: ...
    @property
    def resume_from(self) -> str: ...
    @property
    def snapshot_location(self) -> str: ...
    @property
    def playout_fps(self) -> float: ...
    @property
    def playout_buffer_chunks(self) -> int: ...
    @property
    def kept_chunks(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class SessionObservation:
    """Everything one session's status is derived from, observed in one reconcile."""

    record: SessionPlacement | None
    pod: PodRecord | None  # the Redis record of the pod the session is placed on
    pod_ready: bool  # that pod's Kubernetes Ready condition
    now_ms: int  # Redis server time
    # Issue 14: the pool's worker pods not registered yet, and how long its last pod took to register.
    starting_pods: int = 0
    last_startup_seconds: float | None = None
    # Issue 25: the session's resolved playout target (its own, else its pool's; a record's wins: what it
    # was placed with), and, while `place` said it waits for compute, its pool's spec.computeUtilisation.
    playout: Playout | None = None
    compute_utilisation: float | None = None
    # Issue 37: the session's base URL at the front door (its pool's; None: the operator knows no front door),
    # written while it holds a pod, beside `endpoint`.
    url: str | None = None


def starting_message(starting: int, last_startup_seconds: float | None) -> str:
    """A waiting session's message while pods start: how many, and how long the pool's last one took."""
    pods = "1 worker pod is" if starting == 1 else f"{starting} worker pods are"
    last = (
        f"; pods of this pool took {last_startup_seconds:.1f} s to start last time"
        if last_startup_seconds is not None
        else "; no pod of this pool has started yet"
    )
    return f"waiting for a slot: {pods} starting{last}"


def compute_message(utilisation: float, starting: int) -> str:
    """A session waiting for compute: the pool's bound, and the pods starting for it."""
    pods = "" if not starting else f"; {starting} worker pod{'s' if starting > 1 else ''} starting"
    return (
        "waiting for compute: every pod with a free slot would exceed spec.computeUtilisation "
        f"({utilisation:g}) of its measured throughput with this session's playout fps{pods}"
    )


def derive_session_phase(obs: SessionObservation) -> tuple[Phase, Reason]:
    record = obs.record
    if record is None and obs.compute_utilisation is not None:
        return Phase.PENDING, Reason.WAITING_FOR_COMPUTE
    if record is None:
        return Phase.PENDING, Reason.POD_STARTING if obs.starting_pods else Reason.WAITING_FOR_CAPACITY
    if record.state is SessionState.LOST:
        return Phase.LOST, Reason.POD_LOST
    if record.state is SessionState.EVICTED:
        return Phase.EVICTED, Reason.EVICTED
    if record.state is SessionState.CLOSED:
        return Phase.EXPIRED, Reason.IDLE_TIMEOUT
    if record.state is SessionState.SUSPENDING:
        # A demand while suspending: set by a migration (or a tick meanwhile): it is placed again at once.
        return (
            Phase.SUSPENDING,
            Reason.MIGRATING if record.resume_requested_ms else Reason.SUSPENDED_FOR_CAPACITY,
        )
    if record.state is SessionState.SUSPENDED:
        return Phase.SUSPENDED, (
            Reason.RESUME_REQUESTED if record.resume_requested_ms else Reason.SUSPENDED_FOR_CAPACITY
        )
    pod = obs.pod
    live = pod is not None and pod.epoch == record.pod_epoch and pod.lease_expires_ms > obs.now_ms
    if not (live and obs.pod_ready):
        return Phase.PENDING, Reason.POD_NOT_READY
    return Phase.READY, Reason.RESET_REQUIRED if record.reset_required else Reason.PLACED


def build_session_status(
    previous: Mapping[str, Any],
    obs: SessionObservation,
    *,
    session: str,
    generation: int,
    now: str,
    message: str | None = None,
) -> dict[str, Any]:
    """The whole desired status of a session that is not Failed (fields set to None are removed)."""
    phase, reason = derive_session_phase(obs)
    if message is None and reason is Reason.POD_STARTING:
        message = starting_message(obs.starting_pods, obs.last_startup_seconds)
    if message is None and reason is Reason.WAITING_FOR_COMPUTE:
        message = compute_message(obs.compute_utilisation or 0.0, obs.starting_pods)
    record = obs.record
    placed = record is not None and record.state in HOLDING_STATES
    url = obs.url if placed and obs.pod is not None else None
    if message is None:
        same_reason = previous.get("reason") == reason and previous.get("message")
        default = PLACED_AT_FRONT_DOOR if reason is Reason.PLACED and url else DEFAULT_MESSAGES[reason]
        message = previous["message"] if same_reason else default
    suspended = record is not None and record.state is SessionState.SUSPENDED
    status: dict[str, Any] = {
        "phase": phase.value,
        "reason": reason.value,
        "message": message,
        "pod": record.pod if placed else None,
        "podEpoch": record.pod_epoch if placed else None,
        "endpoint": obs.pod.endpoint if placed and obs.pod is not None else None,
        "url": url,
        "resetRequired": needs_reset(record) if record is not None else False,
        "tokenSecretRef": {"name": token_secret_name(session), "key": TOKEN_KEY},
        "observedGeneration": generation,
        "chunkIndex": record.chunk_index if record is not None else previous.get("chunkIndex", 0),
        "lastTickTime": rfc3339(record.last_tick_ms) if record and record.last_tick_ms else None,
        "playout": playout_status(obs),
    }
    # Issue 26: the chunks its worker keeps (what a fork or a rewind may name); removed (null) once none.
    kept = list(record.kept_chunks) if placed and record.kept_chunks else None
    if kept is not None or "keptChunks" in previous:
        status["keptChunks"] = kept
    # Where a Suspended session's export lies; removed (null) once it is not suspended any more.
    export = {"tier": None, "bytes": None, "suspendedChunk": None, "exportLocation": None}
    if suspended:
        export = {
            "tier": record.tier or None,
            "bytes": record.bytes,
            "suspendedChunk": record.suspended_chunk,
            "exportLocation": record.location or None,
        }
    status.update({k: v for k, v in export.items() if v is not None or k in previous})
    if record is None:
        # No record (never placed, or Redis lost it): keep what the CR knew about ticks.
        status["lastTickTime"] = previous.get("lastTickTime")
    status["conditions"] = build_conditions(
        previous.get("conditions") or (),
        [ConditionSpec("Ready", phase is Phase.READY, reason.value, message)],
        now=now,
        generation=generation,
    )
    return status


def playout_status(obs: SessionObservation) -> dict[str, Any] | None:
    """`status.playout`: the target its record holds (what it was placed with), else the resolved one."""
    record = obs.record
    if record is not None and record.playout_fps > 0:
        return {"fps": record.playout_fps, "bufferChunks": record.playout_buffer_chunks}
    return obs.playout.status() if obs.playout is not None else None


def needs_reset(record: SessionPlacement) -> bool:
    """Whether the session's next tick must be a reset: its record says so, or it lost its KV with nothing to
    continue from (evicted; lost without an export it had not imported yet or a snapshot). A suspended or
    suspending session keeps its KV in the tier."""
    if record.state in (SessionState.PLACED, SessionState.SUSPENDING, SessionState.SUSPENDED):
        return bool(record.reset_required) and record.state is SessionState.PLACED
    if record.state is SessionState.LOST:
        return not (record.resume_from or record.snapshot_location)
    return True


def build_failed_status(
    previous: Mapping[str, Any], *, session: str, reason: Reason, message: str, generation: int, now: str
) -> dict[str, Any]:
    """A session the operator cannot serve; nothing of it is held in Redis."""
    return {
        "phase": Phase.FAILED.value,
        "reason": reason.value,
        "message": message,
        "pod": None,
        "podEpoch": None,
        "endpoint": None,
        "url": None,
        "tokenSecretRef": {"name": token_secret_name(session), "key": TOKEN_KEY},
        "observedGeneration": generation,
        "conditions": build_conditions(
            previous.get("conditions") or (),
            [ConditionSpec("Ready", False, reason.value, message)],
            now=now,
            generation=generation,
        ),
    }


def status_patch(
    previous: Mapping[str, Any], desired: Mapping[str, Any], *, mirror_due: bool
) -> dict[str, Any] | None:
    """The merge patch that turns `previous` into `desired`, or None when nothing worth writing changed.

    A field that is None in `desired` and absent in `previous` is not a change.
    """
    changed = {k: v for k, v in desired.items() if previous.get(k) != v}
    if not changed:
        return None
    if set(changed) <= set(THROTTLED_FIELDS) and not mirror_due:
        return None
    return changed


@dataclass(frozen=True)
class PoolObservation:
    replicas: int  # worker Pods that exist and are not being deleted
    updated_replicas: int  # of those, made from the pool's current template
    ready_replicas: int
    capacity: int  # slots on live pods (Redis pod records)
    sessions: int  # sessions placed in the pool
    pending: int  # sessions waiting for a slot
    min_replicas: int
    max_replicas: int
    starting: int  # pods not registered yet (booting, or just created)
    stale: int  # pods made from an older template, kept while they hold sessions
    startup_failure: str | None  # why a pod was last replaced for not registering, until all pods have
    template_refusal: str | None  # the API's message refusing a Pod of the current template
    # (reason, message) while the workers' Redis credentials cannot be made (issue 23 item 1): no Pod starts
    credentials_problem: tuple[str, str] | None = None
    # Issue 25: sessions at the pool's default playout fps the Ready pods' compute admits (None: the pool
    # admits by KV memory only, spec.computeUtilisation 0)
    compute_capacity: int | None = None


def progressing_condition(obs: PoolObservation) -> ConditionSpec:
    """Like a Deployment's `Progressing`: False while the API refuses Pods of the pool's template (with its
    message), while the workers' Redis credentials cannot be made, or once a pod missed its startup deadline
    (until every pod has registered since); a roll in progress, pods starting, or all pods registered."""
    if obs.credentials_problem is not None:
        return ConditionSpec("Progressing", False, *obs.credentials_problem)
    if obs.template_refusal is not None:
        return ConditionSpec("Progressing", False, "InvalidPodTemplate", obs.template_refusal)
    if obs.startup_failure is not None:
        return ConditionSpec("Progressing", False, "StartupTimeout", obs.startup_failure)
    if obs.stale:
        message = (
            f"{obs.updated_replicas} of {obs.replicas} worker pods run the current spec; {obs.stale} older "
            "ones take no new session and go once they hold none"
        )
        return ConditionSpec("Progressing", True, "RollingUpdate", message)
    if obs.starting:
        message = f"{obs.starting} of {obs.replicas} worker pods starting (not registered yet)"
        return ConditionSpec("Progressing", True, "PodsStarting", message)
    return ConditionSpec("Progressing", True, "PodsRegistered", f"all {obs.replicas} worker pods registered")


def build_pool_status(
    previous: Mapping[str, Any], obs: PoolObservation, *, generation: int, now: str
) -> dict[str, Any]:
    at_max = obs.replicas >= obs.max_replicas
    full = obs.sessions >= obs.capacity
    conditions = [
        ConditionSpec(
            "Ready",
            obs.ready_replicas >= max(1, obs.min_replicas),
            "MinimumReplicasReady"
            if obs.ready_replicas >= max(1, obs.min_replicas)
            else "WaitingForReplicas",
            f"{obs.ready_replicas} of {obs.replicas} worker pods ready (min {obs.min_replicas})",
        ),
        ConditionSpec(
            "AtCapacity",
            at_max and full,
            "FullAtMaxReplicas" if at_max and full else "CanAdmit",
            f"{obs.sessions} of {obs.capacity} slots used on {obs.replicas} of max {obs.max_replicas} pods",
        ),
        progressing_condition(obs),
    ]
    status: dict[str, Any] = {
        "replicas": obs.replicas,
        "updatedReplicas": obs.updated_replicas,
        "readyReplicas": obs.ready_replicas,
        "capacity": obs.capacity,
        "sessions": obs.sessions,
        "pending": obs.pending,
        "observedGeneration": generation,
        "conditions": build_conditions(
            previous.get("conditions") or (), conditions, now=now, generation=generation
        ),
    }
    if obs.compute_capacity is not None or "computeCapacity" in previous:  # None removes it
        status["computeCapacity"] = obs.compute_capacity
    return status
