"""The kopf handlers: small, registered here, doing their work through `sessions` (admission, release),
`reconcile` (the pool round) and `status_writer`.

- startup/cleanup/probe own the clients and settings;
- three indexes keep pools, their worker Pods and their sessions in memory (level-triggered reads);
- a session's create handler admits it at once (token Secret, image, `place`); its DELETED event releases it;
- one daemon per pool re-derives the pool's and its sessions' state every few seconds, or sooner when kicked,
  and retires the pool once it is gone.
Nothing here puts a finalizer on a session or a pool (operator/sweep.py says why and what replaces it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from typing import Any

import kopf
from redis.exceptions import RedisError

from ardiff.kv.acl import PoolUsers
from ardiff.kv.connection import redact_url
from ardiff.kv.errors import NotReplicated
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.operator import kopf_settings
from ardiff.operator.config import OperatorConfig
from ardiff.operator.context import OperatorContext
from ardiff.operator.forks import SessionFinder
from ardiff.operator.gateway_credentials import gateway_secret_permissions, keep_gateway_credentials
from ardiff.operator.kopf_compat import without_finalizer
from ardiff.operator.kube import KubeApi
from ardiff.operator.metrics import OperatorMetrics, PoolSample
from ardiff.operator.nodes import CordonedNodes
from ardiff.operator.permissions import missing_permissions
from ardiff.operator.pods import COMPONENT_LABEL, POOL_LABEL, WORKER_COMPONENT
from ardiff.operator.reconcile import reconcile_pool, retire_pool
from ardiff.operator.sessions import admit, release
from ardiff.operator.status import (
    ConditionSpec,
    Reason,
    build_conditions,
)
from ardiff.operator.status_writer import (
    now_rfc3339,
    previous_status,
    write_admission_status,
    write_pool_status,
)
from ardiff.operator.sweep import sweep_pools_forever, sweep_sessions
from ardiff.operator.views import PodView, PoolView, SessionView
from ardiff.operator.worker_pods import ensure_service
from ardiff.wire import GROUP, POOL_PLURAL, SESSION_PLURAL, VERSION

WORKER_LABELS = {POOL_LABEL: kopf.PRESENT, COMPONENT_LABEL: WORKER_COMPONENT}
# A kicked pool waits at least this long between rounds (kicks come in bursts: 1,000 sessions at once).
MIN_ROUND_GAP_SECONDS = 0.2


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    config: OperatorConfig = memo.config
    kopf_settings.apply(settings, config)

    def login() -> kopf.ConnectionInfo:
        """The same credentials kopf logs in with (in-cluster service account, else kubeconfig)."""
        info = kopf.login_via_client(logger=logger, settings=settings)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials (in-cluster service account or kubeconfig)")
        return info

    memo.ctx = OperatorContext(
        config=config,
        # The one store that loads the placement library (kv/scripts.py): at startup, every pool round, and
        # when a call of its own meets a node without it.
        store=PlacementStore.from_url(config.redis_url, loads_library=True),
        kube=KubeApi(login),
        # The pools' users are made through the operator's own URL, which reaches every node (ACL SETUSER).
        pool_users=PoolUsers.from_url(config.redis_url) if config.worker_redis_users == "operator" else None,
    )
    missing = await missing_permissions(
        memo.ctx.kube,
        None if config.all_namespaces else config.namespaces,
        follow_drains=config.follow_drains,
        also=gateway_secret_permissions(config),
    )
    if missing:
        raise kopf.PermanentError(
            f"the operator's service account may not: {'; '.join(missing)}. Grant them (the chart's Role "
            "`<release>-ardiff-operator` has them all: charts/ardiff/templates/rbac.yaml) and restart it."
        )
    await load_placement_library(memo.ctx, logger)
    if config.follow_drains:
        memo.ctx.cordoned_nodes = CordonedNodes(memo.ctx.kube)
    if config.metrics is not None:
        memo.ctx.metrics = OperatorMetrics()
        memo.ctx.metrics.serve(config.metrics)
        logger.info(f"serving Prometheus metrics at {config.metrics}")
    memo.pool_sweep = asyncio.create_task(sweep_pools_forever(memo.ctx, logger))
    if config.gateway_redis_secret is not None:
        memo.gateway_credentials = asyncio.create_task(keep_gateway_credentials(memo.ctx, logger))
    logger.info(
        f"operator started: namespaces={config.namespaces or 'all'}, redis={redact_url(config.redis_url)}, "
        f"workers' redis={redact_url(config.worker_redis_url)}, pools' redis users made by the "
        f"{config.worker_redis_users}"
    )


async def load_placement_library(ctx: OperatorContext, logger: kopf.Logger) -> None:
    """This version's function library on every primary that lacks it (kv/scripts.py `load_library`); Redis
    away at startup is logged, and the pool rounds load it once Redis answers."""
    try:
        loaded = await ctx.store.load_library()
    except RedisError as exc:
        logger.warning(f"placement library {ctx.store.library.name} not loaded yet: {exc}")
        return
    if loaded:
        logger.info(f"placement library {ctx.store.library.name} loaded on {', '.join(loaded) or 'Redis'}")


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    for task_name in ("pool_sweep", "gateway_credentials"):
        task: asyncio.Task[None] | None = getattr(memo, task_name, None)
        if task is not None:
            task.cancel()
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is not None:
        await ctx.close()


@kopf.on.probe(id="redis")
async def redis_reachable(memo: kopf.Memo, **_: Any) -> float:
    """Liveness: the round trip to Redis in milliseconds (raises when Redis is unreachable)."""
    started = time.perf_counter()
    await memo.ctx.store.ping()
    return round((time.perf_counter() - started) * 1000, 3)


# --- indexes: what each pool reconcile reads, kept current by kopf's watches ------------------------------
# (async, like every handler here: kopf would run a sync one on a thread, per event, for thousands of events)


@kopf.index(GROUP, VERSION, POOL_PLURAL)
async def pools(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], PoolView]:
    return {(namespace, name): PoolView.from_body(body)}


@kopf.index("pods", labels=WORKER_LABELS)
async def worker_pods(
    namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], PodView]:
    return {(namespace, labels[POOL_LABEL]): PodView.from_body(body)}


@kopf.index(GROUP, VERSION, SESSION_PLURAL)
async def sessions_by_pool(
    namespace: str, body: kopf.Body, **_: Any
) -> dict[tuple[str, str | None], SessionView]:
    view = SessionView.from_body(body)
    return {(namespace, view.spec.pool_ref if view.spec else None): view}


def _values(index: kopf.Index, key: Any) -> list[Any]:
    return list(index.get(key, ()))


def _first(index: kopf.Index, key: Any) -> Any | None:
    return next(iter(index.get(key, ())), None)


def session_names(pool: PoolView, sessions_by_pool: kopf.Index) -> set[str]:
    """The names of the pool's sessions in the index now (read by the sweep after it read the store)."""
    return {session.name for session in _values(sessions_by_pool, (pool.namespace, pool.name))}


def session_finder(sessions_by_pool: kopf.Index) -> SessionFinder:
    """Finds a session of a namespace in the index by name: in the given pool first (a fork's parent is
    there unless the fork is refused), then in the namespace's other pools."""

    def find(namespace: str, name: str, pool: str) -> SessionView | None:
        keys = [
            (namespace, pool),
            *(key for key in sessions_by_pool if key[0] == namespace and key[1] != pool),
        ]
        for key in keys:
            for view in sessions_by_pool.get(key, ()):
                if view.name == name:
                    return view
        return None

    return find


def pool_members(
    pool: PoolView, sessions_by_pool: kopf.Index, worker_pods: kopf.Index
) -> tuple[list[SessionView], list[PodView]]:
    """The pool's sessions and worker Pods, as the indexes know them now."""
    key = (pool.namespace, pool.name)
    return _values(sessions_by_pool, key), _values(worker_pods, key)


@kopf.on.event("pods", labels=WORKER_LABELS)
async def kick_pool_on_pod_change(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """A worker Pod changed (Ready, deleted, ...): its pool reconciles now rather than at the next period."""
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is not None:
        ctx.pools[PoolId(namespace, labels[POOL_LABEL])].kick()


# --- sessions ------------------------------------------------------------------------------------------


@kopf.on.create(GROUP, VERSION, SESSION_PLURAL, backoff=2)
async def admit_session(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    pools: kopf.Index,
    worker_pods: kopf.Index,
    sessions_by_pool: kopf.Index,
    **_: Any,
) -> None:
    """Token Secret, image, then a slot at once if one is free (or, at max, by evicting an idle session)."""
    ctx: OperatorContext = memo.ctx
    session = SessionView.from_body(body)
    pool_key = (session.namespace, session.spec.pool_ref if session.spec else "")
    key = (session.namespace, session.name)
    # Kept across retries: the placement histogram's start.
    ctx.sessions.admitted_at.setdefault(key, time.monotonic())
    pods = _values(worker_pods, pool_key)
    status = await admit(
        ctx, session, _first(pools, pool_key), pods, session_finder(sessions_by_pool), logger
    )
    write_admission_status(ctx, key, patch, status)
    observe_placements(ctx, PoolId(*pool_key), [session])


def deleted(type: str, body: kopf.Body, **_: Any) -> bool:
    """An object's DELETED event, or one of an object being deleted (held by someone else's finalizer)."""
    return type == "DELETED" or bool(body.metadata.get("deletionTimestamp"))


@kopf.on.event(GROUP, VERSION, SESSION_PLURAL, when=deleted)
async def release_session(type: str, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Free the slot, once per deleted session; the worker gets `close` through its pod's stream. The token
    Secret is owned. A DELETED event the operator missed is made up for by the pool's sweep."""
    ctx, uid = memo.ctx, body.metadata.uid or ""
    if uid in ctx.sessions.released_uids:
        if type == "DELETED":
            ctx.sessions.released_uids.discard(uid)
        return
    await release(ctx, SessionView.from_body(body), logger)
    if type != "DELETED":  # still held by a foreign finalizer: more events follow
        ctx.sessions.released_uids.add(uid)


# --- pools ---------------------------------------------------------------------------------------------


@without_finalizer
@kopf.daemon(GROUP, VERSION, POOL_PLURAL, cancellation_timeout=10)
async def reconcile_pool_forever(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    status: kopf.Status,
    memo: kopf.Memo,
    logger: kopf.Logger,
    pools: kopf.Index,
    worker_pods: kopf.Index,
    sessions_by_pool: kopf.Index,
    **_: Any,
) -> None:
    """The pool's level-triggered loop: every `reconcile_seconds`, or sooner when kicked; once the pool is
    gone from the pools index (deleted: no finalizer holds it) or being deleted, it retires the pool."""
    ctx: OperatorContext = memo.ctx
    pool = PoolView.from_body(body)
    pid = PoolId(pool.namespace, pool.name)
    # The Service, before the first round (each round brings the workers' Secret and Redis user up to date).
    # In the loop: a refused call (a 403 from admission, a 429 while the API server starts) is retried next
    # round, not after kopf's daemon back-off of a minute with nothing done for the pool meanwhile.
    prepared = False
    swept_at = 0.0
    try:
        while not stopped:
            started = time.monotonic()
            pool = PoolView.from_body(body)  # `body` is live in daemons: the latest spec each round
            current = _first(pools, (pool.namespace, pool.name))
            if pool.deleting or current is None or current.uid != pool.uid:
                await retire(ctx, pool, sessions_by_pool, worker_pods, stopped, logger)
                return
            try:
                if not prepared:
                    await ensure_service(ctx, pool)
                    prepared = True
                await pool_round(ctx, pool, sessions_by_pool, worker_pods, dict(status), logger)
                if started - swept_at >= ctx.config.sweep_seconds:
                    names = functools.partial(session_names, pool, sessions_by_pool)
                    await sweep_sessions(ctx, pid, names, logger)
                    swept_at = started
            except asyncio.CancelledError:
                raise
            except NotReplicated as exc:  # applied on the master only: the round stopped before reporting it
                logger.warning(f"pool {pid} reconcile: {exc}; the round is repeated")
                ctx.pools[pid].kick()  # at once (after the minimal gap), not a whole period later
                observe_failed_round(ctx, pid, exc)
            except Exception as exc:  # one failed round must not end the loop; the next one retries
                logger.exception(f"pool {pid} reconcile failed: {exc}")
                observe_failed_round(ctx, pid, exc)
            await wait_for_kick(ctx, pid, started, stopped)
    finally:
        # Stopped (pool deleted, operator paused by a peer or exiting): its series would go stale here, and a
        # `max` over the operators would read them.
        if ctx.metrics is not None:
            ctx.metrics.forget_pool(pid)


async def retire(
    ctx: OperatorContext,
    pool: PoolView,
    sessions_by_pool: kopf.Index,
    worker_pods: kopf.Index,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
) -> None:
    """Retire a deleted pool, waiting for its Pods to go; stopped meanwhile (operator exiting or paused), the
    operator-wide sweep forgets what is left in Redis."""
    while not stopped:
        try:
            if await retire_pool(ctx, pool, *pool_members(pool, sessions_by_pool, worker_pods), logger):
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception(f"retiring pool {pool.namespace}/{pool.name} failed: {exc}")
        await stopped.wait(1)


async def pool_round(
    ctx: OperatorContext,
    pool: PoolView,
    sessions_by_pool: kopf.Index,
    worker_pods: kopf.Index,
    status: dict[str, Any],
    logger: kopf.Logger,
) -> None:
    if pool.spec is None:
        condition = ConditionSpec(
            "Ready", False, Reason.INVALID_SPEC.value, pool.invalid_reason or "invalid spec"
        )
        conditions = build_conditions(
            status.get("conditions") or (), [condition], now=now_rfc3339(), generation=pool.generation
        )
        if conditions != status.get("conditions"):
            await write_pool_status(
                ctx, pool, {"conditions": conditions, "observedGeneration": pool.generation}
            )
        return
    sessions, pods = pool_members(pool, sessions_by_pool, worker_pods)
    started = time.perf_counter()
    # The pool's workers call the library the operator loads (a node restarted empty: their calls are 503s
    # meanwhile): one FUNCTION LIST per primary when it is there.
    if loaded := await ctx.store.load_library():
        where = ", ".join(loaded) or "Redis"
        logger.warning(f"placement library {ctx.store.library.name} was missing: loaded again on {where}")
    patch = await reconcile_pool(ctx, pool, sessions, pods, status, session_finder(sessions_by_pool), logger)
    if patch is not None:
        await write_pool_status(ctx, pool, patch)
    pid = PoolId(pool.namespace, pool.name)
    if ctx.metrics is not None:
        ctx.metrics.observe_round(pid, time.perf_counter() - started)
        observe_placements(ctx, pid, sessions)
        if (sample := ctx.pools[pid].sample) is not None:
            ctx.metrics.observe_pool(pid, pool_sample(ctx, sample, sessions))


def observe_failed_round(ctx: OperatorContext, pool: PoolId, exc: Exception) -> None:
    if ctx.metrics is not None:
        ctx.metrics.observe_failed_round(pool, exc)


def observe_placements(ctx: OperatorContext, pool: PoolId, sessions: list[SessionView]) -> None:
    """The placement histogram: admitted sessions seen Ready for the first time (admission → Ready); one
    that ends otherwise (Failed, deleted) is not counted."""
    for session in sessions:
        key = (session.namespace, session.name)
        if key not in ctx.sessions.admitted_at:
            continue
        phase = previous_status(ctx, session).get("phase")
        if phase == "Ready":
            admitted = ctx.sessions.admitted_at.pop(key)
            if ctx.metrics is not None:
                ctx.metrics.observe_placement(pool, time.monotonic() - admitted)
        elif phase not in (None, "Pending"):
            del ctx.sessions.admitted_at[key]


def pool_sample(ctx: OperatorContext, sample: PoolSample, sessions: list[SessionView]) -> PoolSample:
    """The round's sample with its sessions counted by phase (their status as last written or seen; one not
    admitted yet counts as Pending)."""
    phases: dict[str, int] = {}
    for session in sessions:
        if session.deleting:
            continue
        phase = previous_status(ctx, session).get("phase") or "Pending"
        phases[phase] = phases.get(phase, 0) + 1
    return dataclasses.replace(sample, phases=phases)


async def wait_for_kick(
    ctx: OperatorContext, pool: PoolId, started: float, stopped: kopf.DaemonStopped
) -> None:
    """Sleep until the period ends, the pool is kicked, or the daemon is stopped; then keep a minimal gap."""
    kick = ctx.pools[pool].wake
    waiters = {asyncio.ensure_future(kick.wait()), asyncio.ensure_future(stopped.wait())}
    _, pending = await asyncio.wait(
        waiters, timeout=ctx.config.reconcile_seconds, return_when=asyncio.FIRST_COMPLETED
    )
    for waiter in pending:
        waiter.cancel()
    kick.clear()
    gap = MIN_ROUND_GAP_SECONDS - (time.monotonic() - started)
    if gap > 0 and not stopped:
        await stopped.wait(gap)


@kopf.on.event(GROUP, VERSION, POOL_PLURAL, when=deleted)
async def kick_pool_on_deletion(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted pool's daemon retires it now rather than at the end of its period."""
    ctx: OperatorContext | None = getattr(memo, "ctx", None)
    if ctx is not None:
        ctx.pools[PoolId(namespace, name)].kick()
