"""Level-triggered garbage collection of Redis state whose custom resource is gone.

Sessions and pools carry no finalizer of ours (docs/contracts.md §5 "Deletion"): a finalizer that only a
running operator can remove hangs `kubectl delete namespace` of the operator's own namespace, where the
operator may go first. What the API owns goes by ownerReference garbage collection; what Redis holds goes
here instead:
- a session's slot is released when its DELETED event arrives (`operator/handlers.py`), and any record whose
  session is not in the API is released by its pool's next sweep (a deletion the operator did not see);
- a deleted pool's daemon retires it (`retire_pool`), and any pool the store holds that is not in the API is
  forgotten by the operator-wide sweep (a pool deleted while no operator ran).
Both read Redis first and the API second: the operator creates Redis state only for objects it has already
seen, so a record found before the listing whose object the listing lacks was deleted. The listing is a live
one (a consistent read, which a lagging API server answers only once its cache has caught up with etcd), as
Kubernetes' garbage collector looks an owner up live before deleting a dependent: a pool's session index
comes from watches and may lag, for instance that of an operator that resumed in place of another (issue 40:
a stale view), which placed sessions this one has not seen yet. The index only narrows down the candidates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import kopf

from ardiff.kv.acl import AclForbidden
from ardiff.kv.records import PoolId, SessionState
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import POOLS, SESSIONS


async def sweep_sessions(
    ctx: OperatorContext, pool: PoolId, present: Callable[[], Collection[str]], logger: kopf.Logger
) -> list[str]:
    """Release the pool's session records whose session neither `present()` (the index, read after the
    store) nor a live listing of the namespace's sessions has."""
    stored = (await stored_session_names(ctx)).get(pool, set())
    candidates = stored - set(present())
    if not candidates:
        return []
    bindings = await ctx.store.get_bindings(pool, sorted(candidates))
    # Released already: its record expires by itself.
    open_names = {name for name, binding in bindings.items() if binding.state != SessionState.CLOSED}
    if not open_names:
        return []
    listed = {name for _, name in await ctx.kube.list_names(SESSIONS, pool.namespace, where=pool_of(pool))}
    released = []
    state = ctx.pools[pool]
    async with state.lock:
        for name in sorted(open_names - listed):
            await ctx.store.release(pool, name, reason="deleted")
            ctx.sessions.forget((pool.namespace, name))
            released.append(name)
    if released:
        state.kick()
        logger.info(f"released {len(released)} sessions of pool {pool} that are gone: {released[:10]}")
    return released


def pool_of(pool: PoolId) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a listed session is one of `pool`'s."""
    return lambda item: (item.get("spec") or {}).get("poolRef") == pool.name


async def stored_session_names(ctx: OperatorContext) -> dict[PoolId, set[str]]:
    """Every session record's name by pool, read at most once per sweep period for all pools (a SCAN visits
    the whole keyspace: one per pool would cost pools x keys)."""
    async with ctx.stored_sessions_lock:
        if time.monotonic() - ctx.stored_sessions_at >= ctx.config.sweep_seconds:
            ctx.stored_sessions = await ctx.store.list_session_names()
            ctx.stored_sessions_at = time.monotonic()
    return ctx.stored_sessions


async def pools_with_users(ctx: OperatorContext, logger: kopf.Logger) -> set[PoolId]:
    """The pools that have a Redis user the operator made (none where it may not list users)."""
    if ctx.pool_users is None:
        return set()
    try:
        return await ctx.pool_users.pools()
    except AclForbidden as exc:  # the pools' rounds report it; the store's state is swept all the same
        logger.debug(f"sweep: {exc}")
        return set()


async def sweep_pools(ctx: OperatorContext, logger: kopf.Logger) -> list[PoolId]:
    """Forget the pools the store holds, in the namespaces this operator serves, that the API lacks, and
    delete their Redis users (a pool deleted while no operator ran)."""
    served = ctx.config.namespaces
    users = await pools_with_users(ctx, logger)
    stored = {
        p
        for p in {*await ctx.store.list_pools(), *users}
        if ctx.config.all_namespaces or p.namespace in served
    }
    if not stored:
        return []
    listed: set[tuple[str, str]] = set()
    for namespace in sorted({p.namespace for p in stored}):
        listed |= await ctx.kube.list_names(POOLS, namespace)
    gone = sorted((p for p in stored if (p.namespace, p.name) not in listed), key=str)
    for pool in gone:
        async with ctx.pools[pool].lock:
            await ctx.store.delete_pool(pool)
            if pool in users:
                assert ctx.pool_users is not None
                await ctx.pool_users.delete(pool)
        ctx.forget_pool(pool)
    if gone:
        logger.info(f"forgot the Redis state of {len(gone)} pools that are gone: {[str(p) for p in gone]}")
    return gone


async def sweep_pools_forever(ctx: OperatorContext, logger: kopf.Logger) -> None:
    """The operator-wide sweep, at startup and every `sweep_seconds`; a failed sweep is retried next time."""
    while True:
        try:
            await sweep_pools(ctx, logger)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis or the API away: the state stays until the next sweep
            logger.warning(f"sweep of gone pools failed: {exc}")
        await asyncio.sleep(ctx.config.sweep_seconds)
