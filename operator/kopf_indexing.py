"""kopf's indexing of an event without its handler machinery, for indexes that need none; installed with the
other patch to kopf 1.45.2 by `kopf_patch.apply` (`ardiff operator run`).

Why. kopf runs every indexing handler, on every event of its resource, through the machinery of its changing
handlers (`kopf/_core/engines/indexing.py` `index_resource`): a cause whose keyword arguments it builds twice,
the registry's filters matched again, a progress state made from scratch, context variables, an outcome, a
success line for a muted logger. The handler itself returns a small value. Measured in the operator during
`benchmarks/reconcile.py`'s burst (each coroutine's own CPU, docs/benchmarks.md "Operator reconcile"): the
sessions index took 0.7 ms of the operator's 3.9 ms a session, two events a session, its handler 0.2 of it;
it was the largest part of what the operator spends beyond a bare kopf operator.

What. The events of a resource whose indexing handlers are all *plain* (a coroutine function, no label,
annotation, field or `when` filter, no parameter but `FAST_KWARGS` and `**kwargs`) are indexed by awaiting
the handlers with those arguments, as kopf passes them, and storing their results as kopf stores a
success (`OperatorIndexers.replace`). kopf's own `index_resource` does the rest, unchanged: a `DELETED`
event, an object kopf holds a retry state for (a handler raised `TemporaryError`), a resource with a
filtered indexer (the worker Pods' index has a label filter), and any exception of a handler: kopf's path then
runs the handlers again (an indexer only returns a value) and handles the error its way (it logs it and
leaves the object out, or keeps a retry state). The gate kopf keeps until every listed object is indexed is
outside `index_resource`, untouched.

No upstream issue about the cost of indexing was found (nolar/kopf's issues searched for indexing CPU and
performance); like the other patch it is bound to kopf 1.45.2 by `kopf_patch.apply`'s version check. Tests:
tests/operator/test_kopf_indexing.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import kopf
from kopf._cogs.structs import bodies, references
from kopf._core.actions.execution import Outcome
from kopf._core.engines import indexing
from kopf._core.intents.handlers import IndexingHandler
from kopf._core.intents.registries import OperatorRegistry

# The keyword arguments a plain indexer may declare, passed as kopf passes them.
FAST_KWARGS = frozenset({"body", "namespace", "name", "labels", "memo", "logger"})
# kopf's own, as imported (before `install`).
UPSTREAM = indexing.index_resource


def plain(handler: IndexingHandler) -> bool:
    """Whether the fast path may run `handler`: a coroutine function with no filter, declaring no parameter
    but `FAST_KWARGS` (and `**kwargs`)."""
    if handler.labels or handler.annotations or handler.field is not None or handler.when is not None:
        return False
    if not inspect.iscoroutinefunction(handler.fn):
        return False
    named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return all(
        p.kind is inspect.Parameter.VAR_KEYWORD or (p.kind in named and p.name in FAST_KWARGS)
        for p in inspect.signature(handler.fn).parameters.values()
    )


# Per resource: the indexing handlers registered when it was decided (their identities), and the decision.
_decided: dict[references.Resource, tuple[tuple[int, ...], Sequence[IndexingHandler] | None]] = {}


def plain_indexers(
    registry: OperatorRegistry, resource: references.Resource
) -> Sequence[IndexingHandler] | None:
    """The resource's indexing handlers when there are some and all are plain, else None (kopf's path).
    Decided once per resource while the registered handlers stay the same (each event asks)."""
    registered = registry._indexing._handlers
    identities = tuple(id(h) for h in registered)
    decided = _decided.get(resource)
    if decided is None or decided[0] != identities:
        handlers = [h for h in registered if h.selector is not None and h.selector.check(resource)]
        decided = (identities, handlers if handlers and all(plain(h) for h in handlers) else None)
        _decided[resource] = decided
    return decided[1]


async def index_resource(
    *,
    indexers: indexing.OperatorIndexers,
    registry: OperatorRegistry,
    settings: kopf.OperatorSettings,
    resource: references.Resource,
    raw_event: Any,
    memory: indexing.IndexingMemory,
    logger: Any,
    memo: Any,
    body: bodies.Body,
) -> None:
    """`kopf._core.engines.indexing.index_resource` with the fast path of the module docstring."""
    handlers = plain_indexers(registry, resource)
    if handlers is not None and raw_event["type"] != "DELETED" and memory.indexing_state is None:
        metadata = body.metadata
        kwargs = {
            "body": body,
            "namespace": metadata.namespace,
            "name": metadata.name,
            "labels": metadata.labels,
            "memo": memo,
            "logger": logger,
        }
        try:
            outcomes = {h.id: Outcome(final=True, result=await h.fn(**kwargs)) for h in handlers}
        except Exception:  # kopf's own path runs the handlers again and handles it its way
            pass
        else:
            indexers.replace(body=body, outcomes=outcomes)
            return
    await UPSTREAM(
        indexers=indexers,
        registry=registry,
        settings=settings,
        resource=resource,
        raw_event=raw_event,
        memory=memory,
        logger=logger,
        memo=memo,
        body=body,
    )


def install() -> None:
    """Put the fast path in kopf's place (idempotent); `kopf_patch.apply` checks kopf's version first."""
    indexing.index_resource = index_resource


def is_installed() -> bool:
    return indexing.index_resource is index_resource
