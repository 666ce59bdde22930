"""The records the placement store keeps in Redis, as typed values (docs/contracts.md §2).

Frozen dataclasses that validate themselves; `from_hash` decodes a Redis hash (bytes keys and values).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, Literal, get_args
from urllib.parse import urlsplit

from ardiff.kv.errors import InvalidPlacementArgument

# A DNS-1123 label: what Kubernetes allows for names of namespaces, pools, pods and sessions.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

# The most a ConfigMap or Secret holds (the apiserver's MaxSecretSize): the operator reads the image there.
MAX_IMAGE_BYTES = 1 << 20
MAX_PRIORITY = 1000
# A session's playout target (docs/contracts.md §2): frames per second, the chunks its player keeps buffered.
MAX_PLAYOUT_FPS = 120.0
MAX_PLAYOUT_BUFFER_CHUNKS = 16
# Issue 26: the most chunk boundaries a session keeps (`history_keep_chunks`), and how a fork names the kept
# chunk it starts from (`SessionSpec.fork_from`): `kept:<pod>/<session>/<chunk>`, the state at the boundary
# before chunk <chunk> that pod <pod> keeps for session <session>.
MAX_KEEP_CHUNKS = 64
KEPT_PREFIX = "kept:"

PlacementPolicy = Literal["least-loaded", "pack"]
# Why `place` left a session pending (issue 25): no slot, or a slot but no compute for its playout_fps.
PendingReason = Literal["", "capacity", "compute"]
EvictionPolicy = Literal["LRU", "Never"]


def token_sha256(token: str) -> str:
    """What the session record keeps of a session's bearer token (the token itself stays in its Secret)."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(kind: str, value: object) -> str:
    """Reject anything that is not a DNS-1123 label: it becomes part of Redis keys and URLs."""
    if not isinstance(value, str) or not _DNS_LABEL.match(value):
        raise InvalidPlacementArgument(
            f"placement {kind} must be a DNS-1123 label (a-z, 0-9, '-', ≤ 63), got {value!r}"
        )
    return value


def check_non_negative_int(kind: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidPlacementArgument(f"placement {kind} must be a non-negative integer, got {value!r}")
    return value


def check_priority(kind: str, value: object) -> int:
    priority = check_non_negative_int(kind, value)
    if priority > MAX_PRIORITY:
        raise InvalidPlacementArgument(f"placement {kind} must be <= {MAX_PRIORITY}, got {priority}")
    return priority


def check_eviction_policy(value: object) -> EvictionPolicy:
    if value not in get_args(EvictionPolicy):
        raise InvalidPlacementArgument(f"placement eviction_policy must be 'LRU' or 'Never', got {value!r}")
    return value  # type: ignore[return-value]


def check_non_negative_float(kind: str, value: object) -> float:
    """A finite float >= 0 (an int is taken as its float)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidPlacementArgument(f"placement {kind} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_playout(fps: object, buffer_chunks: object) -> None:
    """A playout target: 0 <= fps <= MAX_PLAYOUT_FPS and 0 <= buffer_chunks <= MAX_PLAYOUT_BUFFER_CHUNKS
    (0: no target)."""
    if check_non_negative_float("playout_fps", fps) > MAX_PLAYOUT_FPS:
        raise InvalidPlacementArgument(f"placement playout_fps must be <= {MAX_PLAYOUT_FPS:g}, got {fps!r}")
    if check_non_negative_int("playout_buffer_chunks", buffer_chunks) > MAX_PLAYOUT_BUFFER_CHUNKS:
        raise InvalidPlacementArgument(
            f"placement playout_buffer_chunks must be <= {MAX_PLAYOUT_BUFFER_CHUNKS}, got {buffer_chunks!r}"
        )


def check_keep_chunks(value: object) -> int:
    """A session's `history_keep_chunks`: 0 (keeps none) to MAX_KEEP_CHUNKS."""
    if check_non_negative_int("history_keep_chunks", value) > MAX_KEEP_CHUNKS:
        raise InvalidPlacementArgument(
            f"placement history_keep_chunks must be <= {MAX_KEEP_CHUNKS}, got {value!r}"
        )
    return value  # type: ignore[return-value]


def kept_location(pod: str, session: str, chunk: int) -> str:
    """The location of kept chunk `chunk` (>= 1) of `session` on `pod`: what a fork's `fork_from` names."""
    check_name("pod", pod)
    check_name("session", session)
    check_positive_int("chunk", chunk)
    return f"{KEPT_PREFIX}{pod}/{session}/{chunk}"


def parse_kept_location(location: str) -> tuple[str, str, int] | None:
    """(pod, session, chunk) of a kept location; None when `location` is not one (an export's path, '')."""
    if not isinstance(location, str) or not location.startswith(KEPT_PREFIX):
        return None
    parts = location.removeprefix(KEPT_PREFIX).split("/")
    if len(parts) != 3 or not all(_DNS_LABEL.match(part) for part in parts[:2]):
        return None
    pod, session, chunk = parts
    if not chunk.isascii() or not chunk.isdigit() or chunk.startswith("0"):
        return None
    return pod, session, int(chunk)


def check_fork_from(value: object) -> str:
    """A session's `fork_from`: '' (not a fork) or a kept location (`kept_location`)."""
    if value != "" and (not isinstance(value, str) or parse_kept_location(value) is None):
        raise InvalidPlacementArgument(
            f"placement fork_from must be '' or {KEPT_PREFIX}<pod>/<session>/<chunk >= 1>, got {value!r}"
        )
    return value  # type: ignore[return-value]


def kept_chunks_text(kept: Sequence[int]) -> str:
    """The record's `kept_chunks`: ascending, distinct chunk indices >= 1, comma-separated ('' = none); at
    most MAX_KEEP_CHUNKS of them."""
    if isinstance(kept, str | bytes) or not isinstance(kept, Sequence):
        raise InvalidPlacementArgument(f"placement kept must be a sequence of chunk indices, got {kept!r}")
    if len(kept) > MAX_KEEP_CHUNKS:
        raise InvalidPlacementArgument(
            f"placement kept lists {len(kept)} chunks, more than a session keeps ({MAX_KEEP_CHUNKS})"
        )
    chunks = [check_positive_int("kept chunk", chunk) for chunk in kept]
    if any(a >= b for a, b in itertools.pairwise(chunks)):
        raise InvalidPlacementArgument(f"placement kept must be ascending and distinct, got {list(kept)!r}")
    return ",".join(str(chunk) for chunk in chunks)


def decimal_text(value: float) -> str:
    """A float as the shortest decimal text that reads back exactly ('16', '12.5'): how the scripts get it."""
    text = repr(float(value))
    return text.removesuffix(".0")


def check_tier(value: object) -> str:
    if value not in TIERS:
        raise InvalidPlacementArgument(f"placement tier must be one of {TIERS}, got {value!r}")
    return value  # type: ignore[return-value]


def check_positive_int(kind: str, value: object) -> int:
    if check_non_negative_int(kind, value) == 0:
        raise InvalidPlacementArgument(f"placement {kind} must be a positive integer, got {value!r}")
    return value  # type: ignore[return-value]


def check_pool(pool: object) -> PoolId:
    if not isinstance(pool, PoolId):
        raise InvalidPlacementArgument(f"placement pool must be a PoolId, got {pool!r}")
    return pool


def check_spec(spec: object) -> SessionSpec:
    if not isinstance(spec, SessionSpec):
        raise InvalidPlacementArgument(f"placement spec must be a SessionSpec, got {spec!r}")
    return spec


def check_endpoint(endpoint: object) -> str:
    parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidPlacementArgument(f"placement endpoint must be an http(s) URL, got {endpoint!r}")
    return endpoint  # type: ignore[return-value]


def check_address(address: object) -> str:
    """A pod's `address`: '' or `<IPv4>:<port>` / `[<IPv6>]:<port>` (what an original-destination cluster
    connects to: an IP, never a name)."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        literal = f"[{ip}]" if ip.version == 6 else str(ip)
        valid = literal == host and port.isdigit() and 0 < int(port) < 65536
    except ValueError:
        valid = False
    if address != "" and not valid:
        raise InvalidPlacementArgument(f"placement address must be <ip>:<port> or '', got {address!r}")
    return address  # type: ignore[return-value]


def check_text(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidPlacementArgument(f"placement {kind} must be a non-empty string, got {value!r}")
    return value


class SessionState(StrEnum):
    PLACED = "placed"
    EVICTED = "evicted"
    LOST = "lost"
    CLOSED = "closed"
    # Issue 12: eviction and migration of a session whose pod can export (docs/contracts.md §2).
    SUSPENDING = "suspending"  # keeps its pod and slot while its worker writes the export
    SUSPENDED = "suspended"  # exported to a tier: no pod, no slot


Tier = Literal["shared", ""]
TIERS = ("shared", "host")  # a volume every pod of the pool mounts; a pod's own host memory


@dataclass(frozen=True)
class PoolId:
    """A worker pool: all its keys share one Redis Cluster hash slot."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        check_name("pool", self.name)

    @property
    def tag(self) -> str:
        return f"{{ardiff:{self.namespace}/{self.name}}}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SessionSpec:
    """What the operator knows about a session when it asks for a slot."""

    name: str
    token_sha256: str
    seed: int = 0
    prompt: str = ""
    image: bytes = b""
    max_chunks: int = 0  # 0: unlimited
    priority: int = 0
    eviction_policy: EvictionPolicy = "LRU"
    # Issue 25: the playout target (frames/s, chunks buffered); 0 = none. Its fps is the session's demand on
    # its pod's compute (`PodRecord.demand_fps`).
    playout_fps: float = 0.0
    playout_buffer_chunks: int = 0
    # Issue 26: how many chunk boundaries its worker keeps (rewind, fork), and the kept chunk a fork starts
    # from ('' = not a fork; only a first admission reads it).
    history_keep_chunks: int = 0
    fork_from: str = ""

    def __post_init__(self) -> None:
        check_name("session", self.name)
        check_playout(self.playout_fps, self.playout_buffer_chunks)
        check_keep_chunks(self.history_keep_chunks)
        check_fork_from(self.fork_from)
        if not isinstance(self.token_sha256, str) or not _SHA256_HEX.match(self.token_sha256):
            raise InvalidPlacementArgument(
                f"placement token_sha256 must be 64 lowercase hex digits, got {self.token_sha256!r}"
            )
        check_non_negative_int("seed", self.seed)
        check_non_negative_int("max_chunks", self.max_chunks)
        check_priority("priority", self.priority)
        if not isinstance(self.prompt, str):
            raise InvalidPlacementArgument(
                f"placement prompt must be a string, got {type(self.prompt).__name__}"
            )
        if not isinstance(self.image, bytes) or len(self.image) > MAX_IMAGE_BYTES:
            raise InvalidPlacementArgument(f"placement image must be at most {MAX_IMAGE_BYTES} bytes")
        check_eviction_policy(self.eviction_policy)


def _as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _flag(value: bytes | str) -> bool:
    return int(value) == 1


# A record's fields in the order scripts answer them: (name, how it reads from a non-empty value, its value
# where the record has none) each.
FieldTable = tuple[tuple[str, Callable[[Any], Any], Any], ...]


def _read_values(table: FieldTable, values: Iterable[Any]) -> list[Any]:
    """A record's fields from their values in `table`'s order. By position: every placement and every
    operator round reads records."""
    return [
        reader(value) if value else default for (_, reader, default), value in zip(table, values, strict=True)
    ]


# The fields of a pod's record (`PodRecord.FIELDS`, its dataclass fields after `name`) in the order place.lua
# answers them (int() and float() take bytes and str).
_POD_FIELDS: FieldTable = (
    ("capacity", int, 0),
    ("used", int, 0),
    ("endpoint", _as_str, ""),
    ("epoch", int, 0),
    ("lease_expires_ms", int, 0),
    ("draining", _flag, False),
    ("exports", _flag, False),
    ("compute_fps", float, 0.0),
    ("demand_fps", float, 0.0),
    ("tick_ms", float, 0.0),
    ("address", _as_str, ""),
)
_POD_KEYS = tuple(name.encode() for name, _, _ in _POD_FIELDS)


def _text(raw: dict[bytes, bytes], field: str, default: str = "") -> str:
    value = raw.get(field.encode())
    return default if value is None else value.decode()


def _int(raw: dict[bytes, bytes], field: str, default: int = 0) -> int:
    value = raw.get(field.encode())
    return default if value in (None, b"") else int(value)


@dataclass(frozen=True)
class PodRecord:
    name: str
    capacity: int
    used: int
    endpoint: str
    epoch: int
    lease_expires_ms: int
    draining: bool
    exports: bool = False  # the worker can export sessions (its runtime supports it, a tier is configured)
    # Issue 25: the frames/s this pod may be asked for (its pool's utilisation bound x its measured
    # throughput; 0 = not limited), the playout_fps of the sessions holding its slots, its forward time per
    # full chunk (for display).
    compute_fps: float = 0.0
    demand_fps: float = 0.0
    tick_ms: float = 0.0
    # Issue 37: `<ip>:<port>` the front door connects to (its original-destination cluster needs an IP; a TLS
    # pool's `endpoint` names a DNS name). "" for a worker from before it.
    address: str = ""

    FIELDS: ClassVar[tuple[str, ...]] = tuple(name for name, _, _ in _POD_FIELDS)

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.used)

    @classmethod
    def from_values(cls, name: str, values: Sequence[bytes | None]) -> PodRecord:
        """From the values of `FIELDS` in order (a script's HMGET)."""
        return cls(name, *_read_values(_POD_FIELDS, values))

    @classmethod
    def from_hash(cls, name: str, raw: dict[bytes, bytes]) -> PodRecord:
        return cls.from_values(name, [raw.get(key) for key in _POD_KEYS])


@dataclass(frozen=True)
class SessionRecord:
    name: str
    pool: str
    pod: str
    pod_epoch: int
    state: SessionState
    token_sha256: str
    seed: int
    prompt: str
    image: bytes
    reset_required: bool
    max_chunks: int
    priority: int
    eviction_policy: EvictionPolicy
    chunk_index: int
    last_tick_ms: int
    # Issue 12 (docs/contracts.md §2): the export a suspended session continues from, the demand to resume
    # it, the export the holding worker must import first, and the latest periodic snapshot.
    tier: str = ""
    location: str = ""
    bytes: int = 0
    suspended_chunk: int = 0
    resume_requested_ms: int = 0
    resume_from: str = ""
    snapshot_location: str = ""
    snapshot_chunk: int = 0
    resumed_note: str = ""  # how its last resume went (JSON), until the operator reported it
    playout_fps: float = 0.0  # issue 25: the playout target it was placed with (as SessionSpec)
    playout_buffer_chunks: int = 0
    # Issue 26 (as SessionSpec), and the chunks its worker keeps now (ascending).
    history_keep_chunks: int = 0
    fork_from: str = ""
    kept_chunks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.state, SessionState):
            raise InvalidPlacementArgument(f"placement record of {self.name} has no state")
        check_playout(self.playout_fps, self.playout_buffer_chunks)

    def spec(self) -> SessionSpec:
        """The placement request the record holds (a lost or evicted session is placed again with it)."""
        return SessionSpec(**{f.name: getattr(self, f.name) for f in fields(SessionSpec)})

    @classmethod
    def from_hash(cls, name: str, raw: dict[bytes, bytes]) -> SessionRecord:
        """From the record's hash; `image` empty when the hash lacks it (`SESSION_FIELDS_BUT_IMAGE` read)."""
        return cls(
            name=name,
            pool=_text(raw, "pool"),
            token_sha256=_text(raw, "token_sha256"),
            seed=_int(raw, "seed"),
            prompt=_text(raw, "prompt"),
            image=raw.get(b"image", b""),
            max_chunks=_int(raw, "max_chunks"),
            fork_from=_text(raw, "fork_from"),
            **dict(
                zip(
                    _BINDING_NAMES,
                    _read_values(_BINDING_FIELDS, [raw.get(key) for key in _BINDING_KEYS]),
                    strict=True,
                )
            ),
        )


def _eviction_policy(value: bytes | str) -> EvictionPolicy:
    return "Never" if _as_str(value) == "Never" else "LRU"


def _kept_chunks(value: bytes | str) -> tuple[int, ...]:
    return tuple(int(chunk) for chunk in _as_str(value).split(","))


def _session_state(value: bytes | str) -> SessionState:
    state = _STATE_OF.get(value)
    return state if state is not None else SessionState(_as_str(value))  # unknown: ValueError


_STATE_OF: dict[bytes | str, SessionState] = {
    **{state.value: state for state in SessionState},
    **{state.value.encode(): state for state in SessionState},
}
# The fields of a session's binding (`SessionBinding.FIELDS`, and the order of its dataclass fields after
# `name`) in the order the scripts answer them (`state`, then `pod`, first: kv/lua/place.lua reads them by
# position), how each reads from a non-empty value and its value where the record has none.
_BINDING_FIELDS: FieldTable = (
    ("state", _session_state, None),
    ("pod", _as_str, ""),
    ("pod_epoch", int, 0),
    ("reset_required", _flag, False),
    ("chunk_index", int, 0),
    ("last_tick_ms", int, 0),
    ("tier", _as_str, ""),
    ("location", _as_str, ""),
    ("bytes", int, 0),
    ("suspended_chunk", int, 0),
    ("resume_requested_ms", int, 0),
    ("resume_from", _as_str, ""),
    ("snapshot_location", _as_str, ""),
    ("snapshot_chunk", int, 0),
    ("resumed_note", _as_str, ""),
    ("playout_fps", float, 0.0),
    ("playout_buffer_chunks", int, 0),
    ("history_keep_chunks", int, 0),
    ("kept_chunks", _kept_chunks, ()),
    # Issue 40 item 4: what eviction reads, which the operator keeps as the session's spec says.
    ("priority", int, 0),
    ("eviction_policy", _eviction_policy, "LRU"),
)
_BINDING_NAMES = tuple(name for name, _, _ in _BINDING_FIELDS)
_BINDING_KEYS = tuple(name.encode() for name in _BINDING_NAMES)
# The hash fields `SessionRecord.from_hash` reads but the image: what a worker reads of a session's record on
# each tick (the image, up to 1 MiB, once per session: `PlacementStore.get_session_image`).
SESSION_FIELDS_BUT_IMAGE = (
    *("pool", "token_sha256", "seed", "prompt", "max_chunks", "fork_from"),
    *_BINDING_NAMES,
)


@dataclass(frozen=True)
class SessionBinding:
    """Where a session is and how far it ticked: its record without the prompt, the image or the token hash
    (what a status mirror reads for many sessions every few seconds)."""

    name: str
    state: SessionState
    pod: str
    pod_epoch: int
    reset_required: bool
    chunk_index: int
    last_tick_ms: int
    tier: str = ""
    location: str = ""
    bytes: int = 0
    suspended_chunk: int = 0
    resume_requested_ms: int = 0
    resume_from: str = ""
    snapshot_location: str = ""
    snapshot_chunk: int = 0
    resumed_note: str = ""
    playout_fps: float = 0.0  # issue 25: the playout target it was placed with
    playout_buffer_chunks: int = 0
    history_keep_chunks: int = 0  # issue 26: how many chunk boundaries it keeps, and those kept now
    kept_chunks: tuple[int, ...] = ()
    priority: int = 0  # issue 40 item 4: as the operator last applied the session's spec
    eviction_policy: EvictionPolicy = "LRU"

    FIELDS: ClassVar[tuple[str, ...]] = _BINDING_NAMES

    @classmethod
    def from_values(cls, name: str, values: Sequence[bytes | str | bool | None]) -> SessionBinding | None:
        """From the values of `FIELDS` in order: bytes (a script's reply) or str (read_bindings' JSON), None
        or false where the record lacks one; None when it has no record (no `state`). Read straight from the
        values (every operator round reads a binding for each session of the pool)."""
        if not values or not values[0]:
            return None
        return cls(name, *_read_values(_BINDING_FIELDS, values))


@dataclass(frozen=True)
class Placement:
    """Where a session lives now."""

    session: str
    pod: str
    endpoint: str
    pod_epoch: int
    reset_required: bool
    resume_from: str = ""  # the export the pod must import before serving the session ("" = none)


@dataclass(frozen=True)
class PlaceObservation:
    """What `place` read in the same script, after its change: the session's binding (None: no record), the
    record of the pod it holds a slot on (None unless placed or suspending) and the Redis server time. A
    session's status needs nothing more, so admission reads nothing after placing."""

    binding: SessionBinding | None
    pod: PodRecord | None
    now_ms: int

    @classmethod
    def from_reply(cls, session: str, reply: Sequence[Any]) -> PlaceObservation:
        """From the script's last three reply elements: the binding's values, the pod record's values (none
        where it holds no slot), the time."""
        values, pod_values, now_ms = reply
        binding = SessionBinding.from_values(session, values)
        pod = (
            PodRecord.from_values(binding.pod, pod_values)
            if binding is not None and any(pod_values)
            else None
        )
        return cls(binding=binding, pod=pod, now_ms=int(now_ms))


@dataclass(frozen=True)
class PlaceResult:
    """`placement` is None while no slot exists (the session stays Pending).

    `victim` names the session evicted to make room, so the caller can report it.
    `already_placed` is True when the session was placed before this call (idempotent place).
    `suspending` is True when the victim's pod can export: the victim became `suspending` (it keeps its slot
    until its worker has written the export) and this session was NOT placed; place it again once the victim
    is `suspended` (its slot is then free).
    `pending_reason` (issue 25) says why a session is pending: 'compute' when some live, non-draining pod
    had a free slot but no compute headroom for its playout_fps, else 'capacity' ('' when placed or
    suspending).
    `observed`: the session's binding, its pod's record and the time, read by the same script after it.
    """

    placement: Placement | None
    observed: PlaceObservation
    victim: str | None = None
    already_placed: bool = False
    suspending: bool = False
    pending_reason: PendingReason = ""


@dataclass(frozen=True)
class PodRegistration:
    """A (re)started worker's fencing epoch and the sessions its previous incarnation held (now `lost`).

    `recreated` is True when a heartbeat found the pod record missing (Redis lost its data) or held by an
    older incarnation, and wrote it again.
    """

    epoch: int
    lost_sessions: tuple[str, ...] = ()
    recreated: bool = False


@dataclass(frozen=True)
class PodEvent:
    """One entry of a pod's notification stream."""

    id: str
    kind: Literal["close", "evict", "suspend"]
    session: str
    reason: str
    epoch: int
