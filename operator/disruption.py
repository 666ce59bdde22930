"""Disruption budgets that let a node drain through (issue 11 item 1; docs/contracts.md §5).

The disruption controller sizes a `maxUnavailable` (or a percentage `minAvailable`) budget from the scale of
the pods' controller, here the pool's Scale (`spec.replicas.min`), not from the pods the budget selects. A
budget over a pool's busy pods only (`maxUnavailable: 0`) therefore expects `min` pods: with more busy pods
than `min` it allows evicting the surplus, sessions and all. What protects each busy pod whatever the pool's
size is an integer `minAvailable` (counted against the selected pods, no controller involved) equal to the
number of pods the budget selects:

- a worker Pod that holds a session (its Redis record's `used` > 0) carries `ardiffusion.dev/busy: "true"`;
- one PodDisruptionBudget per pool, `<pool>-workers-busy`, owned by the pool, selects the pool's busy pods
  with `minAvailable` = how many carry the label, so `disruptionsAllowed` is 0 while they are all Ready;
- the budget is raised before a pod is labelled and lowered after a label is removed: in between it asks for
  more pods than it selects, which allows nothing (never less protection than the labels say);
- empty pods match no budget: a drain evicts them at once (the operator replaces them on another node);
- `unhealthyPodEvictionPolicy: AlwaysAllow`: a busy pod that is not Ready (its sessions already `Lost`, or a
  worker that no longer answers) does not block a drain.

A pod placed on a moment before the operator's next round labels it is not yet protected (at most one
reconcile period).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from ardiff.kv.records import PodRecord
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import PDBS, PODS
from ardiff.operator.pods import pool_labels
from ardiff.operator.pool_state import PoolState
from ardiff.operator.views import PodView, PoolView

BUSY_LABEL = "ardiffusion.dev/busy"
BUSY_VALUE = "true"


def busy_pdb_name(pool: str) -> str:
    return f"{pool}-workers-busy"


def pool_selector(pool: str) -> str:
    """The worker Pods' label selector, serialized as the Scale's `status.selector` (keys sorted, as
    metav1.FormatLabelSelector writes matchLabels)."""
    return ",".join(f"{key}={value}" for key, value in sorted(pool_labels(pool).items()))


def build_busy_pdb(namespace: str, pool: str, min_available: int) -> dict[str, Any]:
    """The pool's budget over its busy pods (not adopted yet: the caller adopts it)."""
    if isinstance(min_available, bool) or not isinstance(min_available, int) or min_available < 0:
        raise ValueError(f"busy budget minAvailable must be a non-negative integer, got {min_available!r}")
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": busy_pdb_name(pool),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "ardiff", "ardiffusion.dev/pool": pool},
        },
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": {**pool_labels(pool), BUSY_LABEL: BUSY_VALUE}},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def busy_pods(pods: Sequence[PodView], live: Mapping[str, PodRecord]) -> set[str]:
    """The pods (not being deleted) that hold at least one session."""
    return {p.name for p in pods if not p.deleting and (r := live.get(p.name)) is not None and r.used > 0}


async def _set_budget(ctx: OperatorContext, state: PoolState, pool: PoolView, count: int) -> None:
    """Set the budget's minAvailable: a patch once it is known to exist, else create it (or read the one an
    earlier operator process made)."""
    known = state.busy_budget
    if known == count:
        return
    name, patch = busy_pdb_name(pool.name), {"spec": {"minAvailable": count}}
    if known is not None and await ctx.kube.patch(PDBS, pool.namespace, name, patch):
        state.busy_budget = count
        return
    body = build_busy_pdb(pool.namespace, pool.name, count)
    kopf.adopt(body, owner=pool.reference)
    stored = await ctx.kube.create_or_get(PDBS, body)
    if stored is None:  # deleted between the two calls: the next round creates it
        state.busy_budget = None
        return
    if stored["spec"].get("minAvailable") != count:
        await ctx.kube.patch(PDBS, pool.namespace, name, patch)
    state.busy_budget = count


async def sync_busy_pods(
    ctx: OperatorContext,
    state: PoolState,
    pool: PoolView,
    pods: Sequence[PodView],
    live: Mapping[str, PodRecord],
) -> None:
    """Bring the busy labels and the pool's budget in line with the sessions in Redis (raise, label; unlabel,
    lower)."""
    labelled = {p.name for p in pods if p.busy and not p.deleting}
    busy = busy_pods(pods, live)
    to_label, to_unlabel = busy - labelled, labelled - busy
    await _set_budget(ctx, state, pool, len(labelled | to_label))
    for name in sorted(to_label):
        await ctx.kube.patch(PODS, pool.namespace, name, {"metadata": {"labels": {BUSY_LABEL: BUSY_VALUE}}})
    for name in sorted(to_unlabel):
        await ctx.kube.patch(PODS, pool.namespace, name, {"metadata": {"labels": {BUSY_LABEL: None}}})
    await _set_budget(ctx, state, pool, len(busy))
