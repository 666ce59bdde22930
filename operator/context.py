"""The operator's process-wide state, created by the startup handler and kept in kopf's memo.

Nothing here is the truth: Redis and the API server are. These are clients, each pool's books (its lock and
clocks, operator/pool_state.py) and each session's (operator/session_cache.py), which a restarted operator
rebuilds from them (level-triggered), at the cost of one extra read or write.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

from ardiff.kv.acl import PoolUsers
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.operator.config import OperatorConfig
from ardiff.operator.kube import KubeApi
from ardiff.operator.metrics import OperatorMetrics
from ardiff.operator.nodes import CordonedNodes
from ardiff.operator.pool_state import PoolState
from ardiff.operator.session_cache import SessionCache


@dataclass
class OperatorContext:
    config: OperatorConfig
    store: PlacementStore
    kube: KubeApi
    # Each pool's books between rounds (operator/pool_state.py), owned by its round; and each session's.
    pools: defaultdict[PoolId, PoolState] = field(default_factory=lambda: defaultdict(PoolState))
    sessions: SessionCache = field(init=False)
    # The pools' Redis users on every node (kv/acl.py); None with `--worker-redis-users administrator`.
    pool_users: PoolUsers | None = None
    # With `follow_drains`: which nodes are cordoned (operator/nodes.py).
    cordoned_nodes: CordonedNodes | None = None
    # The Prometheus metrics (operator/metrics.py).
    metrics: OperatorMetrics | None = None
    # operator/sweep.py: the last SCAN of every session record, by pool, and when (monotonic seconds); one
    # per sweep period serves every pool's sweep.
    stored_sessions: dict[PoolId, set[str]] = field(default_factory=dict)
    stored_sessions_at: float = float("-inf")
    stored_sessions_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Issue 37: why the front door's Redis credentials could not be kept, as last reported (once per reason;
    # operator/gateway_credentials.py).
    gateway_problem: str | None = None

    def __post_init__(self) -> None:
        self.sessions = SessionCache(mirror_seconds=self.config.mirror_seconds)

    def forget_pool(self, pool: PoolId) -> None:
        """A pool gone: its books start over (under the same lock: a round or an admission may still hold
        it)."""
        state = self.pools.pop(pool, None)
        if state is not None:
            self.pools[pool] = PoolState(lock=state.lock)
        if self.metrics is not None:
            self.metrics.forget_pool(pool)

    async def close(self) -> None:
        await self.kube.close()
        await self.store.close()
        if self.pool_users is not None:
            await self.pool_users.close()
