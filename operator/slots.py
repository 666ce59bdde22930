"""The pool's pod records in Redis, as the pool round and admission both read them.

`sync_pods` makes Redis' pod records agree with the worker Pods (expired leases reaped, deleted pods and dead
incarnations forgotten, terminating, stale and cordoned pods drained); `live_pods` reads those records. The
`PodSlots` that placement and scaling decide on come from them and the pool's clocks (operator/pool_state.py).
It writes Redis' pod records and the pool's cordoned pods, nothing in the API.
"""

from __future__ import annotations

from collections.abc import Sequence

from ardiff.kv.records import PodRecord, PoolId
from ardiff.operator.context import OperatorContext
from ardiff.operator.pool_state import PoolState
from ardiff.operator.views import PodView


async def live_pods(ctx: OperatorContext, pool: PoolId) -> dict[str, PodRecord]:
    return {p.name: p for p in await ctx.store.list_pods(pool)}


async def sync_pods(
    ctx: OperatorContext, state: PoolState, pool: PoolId, pods: Sequence[PodView], template_hash: str
) -> dict[str, PodRecord]:
    """Make Redis agree with the Pods: reap expired leases, forget deleted pods and dead incarnations, drain
    terminating pods, stale ones (made from another template than `template_hash`) and those on a cordoned
    node: their sessions stay (or move, operator/nodes.py), new ones go to current pods."""
    if ctx.cordoned_nodes is not None:
        cordoned = await ctx.cordoned_nodes.among(p.node for p in pods)
        state.cordoned_pods = {p.name for p in pods if p.node in cordoned}
    await ctx.store.reap_expired(pool)
    live = await live_pods(ctx, pool)
    known = {p.name: p for p in pods}
    changed = False
    for name, record in live.items():
        pod = known.get(name)
        gone = pod is None and name not in state.expected_pods
        # A worker that died before its lease ran out: registered (epoch = registration time) before it died.
        died = pod is not None and pod.died_at_ms is not None and record.epoch < pod.died_at_ms
        if gone or died:
            await ctx.store.remove_pod(pool, name)  # its sessions become `lost`
            changed = True
        elif (
            pod is not None
            and not record.draining
            and (pod.deleting or pod.template_hash != template_hash or name in state.cordoned_pods)
        ):
            await ctx.store.set_draining(pool, name, draining=True)
            changed = True
    return await live_pods(ctx, pool) if changed else live
