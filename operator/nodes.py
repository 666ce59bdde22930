"""Which nodes of the pools' worker Pods are cordoned: a drain's first step, followed when the operator is
told to.

`kubectl drain` cordons a node (`spec.unschedulable`), then evicts its Pods through the eviction API. A busy
worker Pod is protected by its pool's budget (operator/disruption.py), so the eviction waits — and nothing a
namespaced operator can read says that a drain is waiting: the refused eviction changes no object. With
`--follow-drains` (the chart's `operator.followDrains`, which grants `get` on Nodes: cluster-scoped, an
explicit opt-in) the pool's round reads the Node of each of its Pods; a Pod on a cordoned node goes like a
stale one (operator/pool_state.py `PoolState.slots`): it takes no new session, a replacement is made on
another node, its sessions move there (suspend with migrate), and once it holds none its busy label and
budget let the drain evict it. Reads are cached for `CACHE_SECONDS` across pools.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ardiff.operator.kube import KubeApi

CACHE_SECONDS = 2.0
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def is_cordoned(node: dict[str, object]) -> bool:
    """`spec.unschedulable`, or the taint the node lifecycle controller mirrors it with."""
    spec = node.get("spec") or {}
    assert isinstance(spec, dict)
    taints = spec.get("taints") or []
    return bool(spec.get("unschedulable")) or any(
        isinstance(t, dict) and t.get("key") == UNSCHEDULABLE_TAINT for t in taints
    )


@dataclass
class CordonedNodes:
    """The cordoned state of nodes by name, read through `kube` at most every `CACHE_SECONDS`."""

    kube: KubeApi
    _seen: dict[str, tuple[float, bool]] = field(default_factory=dict)

    async def among(self, names: Iterable[str | None]) -> set[str]:
        """Which of the named nodes are cordoned now (a node that is gone counts as cordoned)."""
        cordoned = set()
        now = time.monotonic()
        for name in {n for n in names if n}:
            seen = self._seen.get(name)
            if seen is None or now - seen[0] > CACHE_SECONDS:
                node = await self.kube.get_node(name)
                seen = (now, node is None or is_cordoned(node))
                self._seen[name] = seen
            if seen[1]:
                cordoned.add(name)
        return cordoned
