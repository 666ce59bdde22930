"""The one key builder of the placement store: every Redis key of a pool, under the pool's hash tag.

All keys of a pool share `{ardiff:<namespace>/<pool>}`, so they live in one Redis Cluster slot and a script
may touch any of them. Scripts never build keys: callers pass these names through KEYS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ardiff.kv.records import PoolId


@dataclass(frozen=True)
class PoolKeys:
    pool: PoolId

    prefix: str = field(init=False, repr=False, compare=False)  # the pool's tag: every key starts with it

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", self.pool.tag)  # built once, not for each key of a call

    # Records (docs/contracts.md §2).
    def pod(self, pod: str) -> str:
        return f"{self.prefix}:pod:{pod}"

    def session(self, session: str) -> str:
        return f"{self.prefix}:session:{session}"

    @property
    def pool_record(self) -> str:
        """The pool's own record (issue 37): the operator writes it every round, after the round's
        restores; the front door reads what it needs of the pool there (its pods' CA) and takes its absence
        for a store that lost its data."""
        return f"{self.prefix}:pool"

    def events(self, pod: str) -> str:
        """The pod's notification stream (consumer group `worker`)."""
        return f"{self.prefix}:events:{pod}"

    # Indexes the scripts maintain next to the records.
    @property
    def pods(self) -> str:
        """Set: registered pod names."""
        return f"{self.prefix}:pods"

    @property
    def open(self) -> str:
        """Sorted set: pods that accept placements (not draining, a free slot), scored by used / capacity."""
        return f"{self.prefix}:open"

    @property
    def leases(self) -> str:
        """Sorted set: pod → lease_expires_ms."""
        return f"{self.prefix}:leases"

    @property
    def draining(self) -> str:
        """Set: draining pods."""
        return f"{self.prefix}:draining"

    @property
    def residents(self) -> str:
        """Sorted set (lexicographic): `<pod>/<session>` for every placed session."""
        return f"{self.prefix}:residents"

    @property
    def lru(self) -> str:
        """Sorted set: `<pod>/<session>` of evictable sessions, scored priority * 2^42 + last_tick_ms."""
        return f"{self.prefix}:lru"

    @property
    def suspending(self) -> str:
        """Sorted set: sessions that are `suspending` (their worker writes the export), scored by when it
        began; while it is not empty, `place` evicts nobody (a slot is about to free up)."""
        return f"{self.prefix}:suspending"

    @property
    def headroom(self) -> str:
        """Sorted set (issue 25): the compute-limited pods (compute_fps > 0) that are not draining and have a
        free slot, scored compute_fps - demand_fps: whether a session's playout_fps fits a pod of the open
        index, and whether a pending session waits for compute."""
        return f"{self.prefix}:headroom"

    @property
    def reaped(self) -> str:
        """Sorted set: pods whose lease lapsed and whose record the operator reaped, scored by when (kept
        `REAPED_KEEP_MS`): a heartbeat of such a pod's incarnation is fenced, not re-created (only its
        restart registers it again), so a partitioned pod cannot come back holding sessions that moved on."""
        return f"{self.prefix}:reaped"

    @property
    def indexes(self) -> tuple[str, ...]:
        """Every pool-wide index a placement change may touch (open, leases, draining, residents, lru,
        suspending, headroom), in the order the scripts that touch them all declare them: register_pod, place
        and remove_pods (kv/lua/<name>.lua KEYS)."""
        return (
            self.open,
            self.leases,
            self.draining,
            self.residents,
            self.lru,
            self.suspending,
            self.headroom,
        )

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of the pool (names are DNS labels: no glob characters)."""
        return f"{self.prefix}:*"


# SCAN patterns matching every key of every pool, and every session record (the operator's sweeps).
ANY_POOL_PATTERN = "{ardiff:*}:*"


def namespace_pattern(namespace: str) -> str:
    """The pattern of every key of every pool in `namespace` (the front door's user reaches these)."""
    return f"{{ardiff:{namespace}/*}}:*"


ANY_SESSION_PATTERN = "{ardiff:*}:session:*"


def pool_of_key(key: str) -> PoolId | None:
    """The pool a key belongs to (None for a key that only looks like one of ours)."""
    tag, closed, _ = key.partition("}:")
    namespace, slash, name = tag.removeprefix("{ardiff:").partition("/")
    if not (closed and slash and tag.startswith("{ardiff:")):
        return None
    try:
        return PoolId(namespace, name)
    except ValueError:
        return None


def resident(pod: str, session: str) -> str:
    """Index member naming `session` on `pod` (as kv/lua/_lib.lua `resident`)."""
    return f"{pod}/{session}"
