"""The worker Pods' lifecycle, and the pool's Service in front of them: create one from the pool's template
(or back off from a template the pod policy or the API refuses), replace one that did not register in time,
retire an empty one (drained in Redis first, so that nothing is placed on it meanwhile). The Pod bodies come
from `operator/pods.py` (pure builders); this module makes the API calls, keeps the pool state's expected-pods
and template-refusal books, and reports with Events. What to create or retire, the round decides.
"""

from __future__ import annotations

import time

import kopf

from ardiff.kv.errors import UnknownPod
from ardiff.kv.records import PoolId
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import PODS, SERVICES, KubeApiError
from ardiff.operator.pods import build_pool_service, build_worker_pod, worker_pod_name
from ardiff.operator.pool_state import PoolState, TemplateRefusal
from ardiff.operator.views import PoolView

# After the API refuses a Pod of the pool's template, the next try waits this long, doubling up to the max
# (a template only the API server can judge may become valid without a spec change: a newer server, a fixed
# admission webhook).
TEMPLATE_RETRY_FIRST_SECONDS = 10.0
TEMPLATE_RETRY_MAX_SECONDS = 300.0


async def ensure_service(ctx: OperatorContext, pool: PoolView) -> None:
    service = build_pool_service(pool.namespace, pool.name)
    kopf.adopt(service, owner=pool.reference)
    await ctx.kube.create(SERVICES, service)


async def create_worker_pod(
    ctx: OperatorContext, state: PoolState, pool: PoolView, logger: kopf.Logger
) -> str | None:
    """Create one worker Pod with a fresh name (a name collision just draws another); None when the pool's
    template is outside the operator's pod policy (operator/pod_policy.py) or the API refuses it as invalid
    (`refuse_template` records and reports either)."""
    assert pool.spec is not None
    refused = ctx.config.pod_policy.violations(pool.spec.pod)
    if refused:  # the chart's admission policy refuses such a pool too: this one predates it, or has none
        refuse_template(state, pool, f"the operator does not make this Pod: {'; '.join(refused)}", logger)
        return None
    while True:
        name = worker_pod_name(pool.name)
        body = build_worker_pod(
            pool.namespace, pool.name, pool.spec, pod_name=name, secret_hash=pool.secret_hash
        )
        kopf.adopt(body, owner=pool.reference)
        state.expected_pods[name] = time.monotonic()
        try:
            created = await ctx.kube.create(PODS, body)
        except KubeApiError as exc:
            del state.expected_pods[name]  # it does not exist: nothing is starting
            if exc.status != 422:
                raise
            refuse_template(state, pool, exc.message, logger)
            return None
        if created is not None:
            logger.info(f"created worker pod {name}")
            state.template_refusal = None
            return name
        del state.expected_pods[name]


def refuse_template(state: PoolState, pool: PoolView, message: str, logger: kopf.Logger) -> None:
    """Back off from a template the API refuses; the first refusal of a template is news (a Warning Event)."""
    previous = state.template_refusal
    again = previous is not None and previous.template_hash == pool.template_hash
    delay = (
        min(previous.delay * 2, TEMPLATE_RETRY_MAX_SECONDS)
        if previous and again
        else TEMPLATE_RETRY_FIRST_SECONDS
    )
    state.template_refusal = TemplateRefusal(pool.template_hash, message, time.monotonic() + delay, delay)
    logger.warning(f"the API refused a worker pod of pool {pool.name} (next try in {delay:.0f} s): {message}")
    if not again:
        kopf.event(pool.reference, type="Warning", reason="InvalidPodTemplate", message=message)


def template_refusal(state: PoolState, pool: PoolView) -> TemplateRefusal | None:
    """The refusal of the pool's current template, if any (one of an older template is forgotten)."""
    if state.template_refusal is not None and state.template_refusal.template_hash != pool.template_hash:
        state.template_refusal = None
    return state.template_refusal


async def replace_stuck_pod(
    ctx: OperatorContext, state: PoolState, pool: PoolView, name: str, logger: kopf.Logger
) -> bool:
    """Delete a pod that did not register within the startup timeout (it holds nothing; the plan creates its
    successor) and report it: a Warning Event, and the pool's `Progressing` condition until a round sees every
    pod registered. False when it registered at the last moment (then it is kept)."""
    assert pool.spec is not None
    pid = PoolId(pool.namespace, pool.name)
    if await ctx.store.get_pod(pid, name) is not None:
        return False
    message = (
        f"worker pod {name} did not register within {pool.spec.startup_timeout_seconds} s "
        "(spec.startupTimeoutSeconds): replaced it"
    )
    logger.warning(message)
    kopf.event(pool.reference, type="Warning", reason="StartupTimeout", message=message)
    state.startup_failure = message
    state.expected_pods.pop(name, None)
    await ctx.kube.delete(PODS, pool.namespace, name)
    return True


async def retire_worker_pod(
    ctx: OperatorContext, state: PoolState, pool: PoolId, name: str, logger: kopf.Logger
) -> bool:
    """Drain the pod (only if it holds no session), then delete it.

    Its Redis record stays, draining, until the Pod is gone (`sync_pods` removes it then): a dying worker's
    heartbeat would re-create a record removed now, and sessions could be placed on it.
    """
    try:
        drained = await ctx.store.drain_pod(pool, name, only_if_empty=True)
    except UnknownPod:
        drained = True  # its record is already gone (lease expired): nothing can be placed on it
    if not drained:
        logger.info(f"kept worker pod {name}: it received a session before it could be drained")
        return False
    await ctx.kube.delete(PODS, pool.namespace, name)
    state.empty_since.pop(name, None)
    logger.info(f"deleted empty worker pod {name}")
    return True
