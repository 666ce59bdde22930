"""The placement store's invariants, checked from one consistent snapshot of a pool (for tests and the
failover harness, never on a serving path).

For every pod `used == |sessions placed on it| <= capacity` and `demand_fps` is the sum of their playout_fps;
every placed session points to a registered pod with that pod's epoch; the indexes (open, leases, draining,
residents, LRU, suspending, compute headroom) agree with the records.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from ardiff.kv.errors import PlacementContention
from ardiff.kv.keys import PoolKeys, resident
from ardiff.kv.records import PodRecord, PoolId, SessionRecord, SessionState
from ardiff.kv.scripts import MAX_PLAN_ATTEMPTS, as_text, as_texts

LRU_PRIORITY_SCALE = 1 << 42  # as kv/lua/_lib.lua PRIORITY_SCALE
# States that hold a slot on their pod (counted in its `used`, listed in the resident index).
_HOLDS_A_SLOT = (SessionState.PLACED, SessionState.SUSPENDING)
# demand_fps is a running float sum (HINCRBYFLOAT): it may differ from the exact sum by rounding.
_FPS_TOLERANCE = 1e-6


async def read_violations(client: aioredis.Redis, pool: PoolId) -> list[str]:
    """Violations of the invariants in `pool` (empty when all hold); retried while the pool keeps changing
    between listing its names and reading them."""
    keys = PoolKeys(pool)
    for _ in range(MAX_PLAN_ATTEMPTS):
        snapshot = await _Snapshot.read(client, keys)
        if snapshot is not None:
            return snapshot.violations()
        await asyncio.sleep(0.01)
    raise PlacementContention(f"placement pool {pool} kept changing while its invariants were read")


def _pairs(reply: list[Any]) -> list[tuple[bytes, float]]:
    """`ZRANGE ... WITHSCORES` as (member, score) pairs, whether redis-py paired them already or not."""
    if reply and isinstance(reply[0], list | tuple):
        return [(member, float(score)) for member, score in reply]
    return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]


@dataclass(frozen=True)
class _Snapshot:
    """Everything of one pool, read in one MULTI/EXEC (check_invariants)."""

    pods: dict[str, PodRecord]
    sessions: dict[str, SessionRecord]
    residents: list[str]
    lru: dict[str, float]
    open: dict[str, float]
    leases: dict[str, float]
    draining: set[str]
    suspending: set[str] = field(default_factory=set)
    headroom: dict[str, float] = field(default_factory=dict)

    @classmethod
    async def read(cls, client: aioredis.Redis, keys: PoolKeys) -> _Snapshot | None:
        """None when the pool changed between listing its names and reading them (the caller retries)."""
        pod_names = sorted(as_texts(await client.smembers(keys.pods)))
        session_prefix = keys.session("")
        session_names = sorted(
            {
                as_text(key)[len(session_prefix) :]
                async for key in client.scan_iter(match=f"{session_prefix}*")
            }
        )
        # Plain commands, scores paired here: redis-py's Cluster transactions hand the `keys=` of its command
        # methods to response callbacks that do not take it.
        async with client.pipeline(transaction=True) as pipe:
            pipe.execute_command("SMEMBERS", keys.pods)
            pipe.execute_command("ZRANGE", keys.residents, 0, -1)
            for scored in (keys.lru, keys.open, keys.leases, keys.headroom):
                pipe.execute_command("ZRANGE", scored, 0, -1, "WITHSCORES")
            pipe.execute_command("SMEMBERS", keys.draining)
            pipe.execute_command("ZRANGE", keys.suspending, 0, -1)
            for name in pod_names:
                pipe.execute_command("HGETALL", keys.pod(name))
            for name in session_names:
                pipe.execute_command("HGETALL", keys.session(name))
            (
                pods_now,
                residents,
                lru_flat,
                open_flat,
                leases_flat,
                headroom_flat,
                draining,
                suspending,
                *raws,
            ) = await pipe.execute()
        lru, open_, leases = _pairs(lru_flat), _pairs(open_flat), _pairs(leases_flat)
        headroom = _pairs(headroom_flat)
        resident_members = as_texts(residents)
        if (
            sorted(as_texts(pods_now)) != pod_names
            or not {member.split("/", 1)[1] for member in resident_members} <= set(session_names)
            or not set(as_texts(suspending)) <= set(session_names)
        ):
            return None
        pod_raws, session_raws = raws[: len(pod_names)], raws[len(pod_names) :]
        return cls(
            pods={n: PodRecord.from_hash(n, raw) for n, raw in zip(pod_names, pod_raws, strict=True)},
            sessions={
                n: SessionRecord.from_hash(n, raw)
                for n, raw in zip(session_names, session_raws, strict=True)
                if raw
            },
            residents=resident_members,
            lru={as_text(m): score for m, score in lru},
            open={as_text(m): score for m, score in open_},
            leases={as_text(m): score for m, score in leases},
            draining=set(as_texts(draining)),
            suspending=set(as_texts(suspending)),
            headroom={as_text(m): score for m, score in headroom},
        )

    def violations(self) -> list[str]:
        found: list[str] = []
        on_pod: dict[str, list[str]] = {name: [] for name in self.pods}
        for member in self.residents:
            pod, session = member.split("/", 1)
            on_pod.setdefault(pod, []).append(session)
            record = self.sessions.get(session)
            if record is None or record.state not in _HOLDS_A_SLOT or record.pod != pod:
                found.append(f"resident {member} has no matching placed session record")
        for name, pod in self.pods.items():
            placed = len(on_pod[name])
            if pod.used != placed:
                found.append(f"pod {name} used={pod.used} but {placed} sessions are placed on it")
            if pod.used > pod.capacity:
                found.append(f"pod {name} used={pod.used} exceeds capacity={pod.capacity}")
            if self.leases.get(name) != pod.lease_expires_ms:
                found.append(f"pod {name} lease index disagrees with lease_expires_ms={pod.lease_expires_ms}")
            if (name in self.draining) != pod.draining:
                found.append(f"pod {name} draining index disagrees with draining={int(pod.draining)}")
            demand = sum(self.sessions[s].playout_fps for s in on_pod[name] if s in self.sessions)
            if abs(pod.demand_fps - demand) > _FPS_TOLERANCE:
                found.append(
                    f"pod {name} demand_fps={pod.demand_fps} but its sessions' playout_fps sum to {demand}"
                )
            has_slot = not pod.draining and pod.used < pod.capacity
            accepts = has_slot and (pod.compute_fps == 0 or pod.demand_fps < pod.compute_fps)
            if accepts != (name in self.open):
                found.append(
                    f"pod {name} open index disagrees (used={pod.used}, draining={int(pod.draining)}, "
                    f"demand_fps={pod.demand_fps}, compute_fps={pod.compute_fps})"
                )
            headroom = pod.compute_fps - pod.demand_fps if has_slot and pod.compute_fps > 0 else None
            indexed = self.headroom.get(name)
            if (headroom is None) != (indexed is None) or (
                headroom is not None and indexed is not None and abs(headroom - indexed) > _FPS_TOLERANCE
            ):
                found.append(
                    f"pod {name} compute headroom index {indexed} disagrees with the record ({headroom})"
                )
        for pod in on_pod.keys() - self.pods.keys():
            found.append(f"sessions {sorted(on_pod[pod])} are placed on unregistered pod {pod}")
        indexed_pods = self.open.keys() | self.leases.keys() | self.draining | self.headroom.keys()
        for extra in indexed_pods - self.pods.keys():
            found.append(f"index entry for unregistered pod {extra}")
        residents = set(self.residents)
        for name, record in self.sessions.items():
            if (record.state is SessionState.SUSPENDING) != (name in self.suspending):
                found.append(f"session {name} is {record.state} but the suspending index disagrees")
            if record.state is SessionState.SUSPENDED and record.pod:
                found.append(f"suspended session {name} still names pod {record.pod}")
            if record.state not in _HOLDS_A_SLOT:
                continue
            member = resident(record.pod, name)
            pod = self.pods.get(record.pod)
            if pod is None:
                found.append(f"session {name} is placed on unregistered pod {record.pod}")
            elif record.pod_epoch != pod.epoch:
                found.append(
                    f"session {name} has pod_epoch {record.pod_epoch}, pod {record.pod} has {pod.epoch}"
                )
            if member not in residents:
                found.append(f"placed session {name} is missing from the resident index")
            if record.state is SessionState.SUSPENDING:
                if member in self.lru:
                    found.append(f"suspending session {name} is still in the LRU index")
                continue
            expected_lru = record.priority * LRU_PRIORITY_SCALE + record.last_tick_ms
            if record.eviction_policy == "LRU" and self.lru.get(member) != expected_lru:
                found.append(f"session {name} LRU entry {self.lru.get(member)} != {expected_lru}")
            if record.eviction_policy == "Never" and member in self.lru:
                found.append(f"session {name} has evictionPolicy Never but is in the LRU index")
        placed_members = {
            resident(r.pod, n) for n, r in self.sessions.items() if r.state is SessionState.PLACED
        }
        for member in self.lru.keys() - placed_members:
            found.append(f"LRU entry {member} is not a placed session")
        for name in self.suspending - self.sessions.keys():
            found.append(f"suspending index entry {name} has no session record")
        return found
