"""Every use of kopf's private API, in one place and behind one version check.

Written against kopf 1.45.2 (pinned in pyproject.toml). `check_version` refuses any other kopf, at both doors
into this module (`apply`, `without_finalizer`), so that an upgrade makes someone re-read the upstream code
quoted here, and drop what upstream has fixed, instead of silently patching code that changed. Three uses:

1. A linear start (`apply`, run once by `ardiff operator run` before `kopf.run`): kopf's start is quadratic in
   the objects it lists; the toggle sets' patch below makes it linear.
2. Indexing without kopf's handler machinery for the indexes that need none (`apply`, issue 27; below).
3. A daemon without a finalizer (`without_finalizer`, when the handlers are imported): kopf has no public
   switch and upstream declined one (its docstring).

## 1. Toggle sets that wake their waiters only when the set's value changes

Why. kopf gates every handler and daemon on its indexes being filled. `operator_indexed` is an
`aiotoggles.ToggleSet(all)` (`kopf/_core/reactor/orchestration.py`); the watcher makes one toggle in it per
listed object (`kopf/_core/reactor/queueing.py`, `watcher`), each per-object worker drops its toggle once the
object is indexed and then waits for the set to turn on (`kopf/_core/reactor/processing.py`:
`drop_toggle`, then `operator_indexed.wait_for(True)`). Upstream, every `make_toggle`, `drop_toggle` and
`drop_toggles` calls `notify_all` on the set's one `asyncio.Condition`, which wakes every waiting worker to
re-evaluate the set: n listed objects make O(n^2) wake-ups. Measured (docs/benchmarks.md): an operator
restarted over 1,000 sessions had its first reconcile round 27-47 s after the start, over 10,000 none after
6 minutes; a restart or a standby's takeover over 100,000 would take hours.

What. A set's value (`is_on()`) is a pure function of its toggles' states, and the only waiters on its
condition wait for `is_on() == state` (`ToggleSet.wait_for`) or for one toggle's own state (`Toggle.wait_for`:
a set's toggles share its condition). Adding or removing a toggle changes no toggle's own state, so it can
wake a waiter only when it changes the set's value: the patched `make_toggle`, `drop_toggle` and
`drop_toggles` notify only then. Everything else is upstream's code: same lock, same toggles, same order.
`Toggle.turn_to` is left as it is: it must wake the waiters of that toggle itself (which share the set's
condition), kopf turns toggles only for peering and the peering CRD's presence (a few per operator, rarely),
and the index toggles are never turned, only made and dropped. With `all` over index toggles that are all
off, `is_on()` stops at the first one, so computing the value before and after costs O(1) there.

Replaced upstream code (`kopf/_cogs/aiokits/aiotoggles.py`, kopf 1.45.2), each method ending in an
unconditional `self._condition.notify_all()`::

    async def make_toggle(self, __val=False, *, name=None):
        toggle = Toggle(__val, name=name, condition=self._condition)
        async with self._condition:
            self._toggles.add(toggle)
            self._condition.notify_all()
        return toggle

    async def drop_toggle(self, toggle):
        async with self._condition:
            self._toggles.discard(toggle)
            self._condition.notify_all()

    async def drop_toggles(self, toggles):
        async with self._condition:
            self._toggles.difference_update(toggles)
            self._condition.notify_all()

How long it stays: as long as kopf needs it. Written against kopf 1.45.2 (pinned in pyproject.toml, the
newest on PyPI when written); kopf's main branch as of 2026-06-03 (nolar/kopf 60d02ae) still ends all three
methods in the unconditional `notify_all()` quoted above. No upstream issue or pull request about the
quadratic start was found (nolar/kopf's issues searched for the toggles, `notify_all`, and slow starts or
indexing over many objects), so there is none to cite. Drop it once upstream notifies only on a change of
the set's value. Tests: tests/operator/test_kopf_patch.py. `ARDIFF_KOPF_UNPATCHED=1` (operator/cli.py) skips
`apply` (this and the indexing fast path): for benchmarks/scale_operator.py's before/after only.

## 2. Indexing an event without the handler machinery

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
performance). Tests: tests/operator/test_kopf_indexing.py.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import kopf
from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet
from kopf._cogs.structs import bodies, references
from kopf._core.actions.execution import Outcome
from kopf._core.engines import indexing
from kopf._core.intents.handlers import IndexingHandler
from kopf._core.intents.registries import OperatorRegistry

KOPF_VERSION = "1.45.2"
# The environment variable that skips `apply` (benchmarks/scale_operator.py --kopf-unpatched only).
UNPATCHED_ENV = "ARDIFF_KOPF_UNPATCHED"


def installed_kopf_version() -> str:
    return importlib.metadata.version("kopf")


def check_version() -> None:
    """RuntimeError unless the installed kopf is KOPF_VERSION, the one this module was written against."""
    version = installed_kopf_version()
    if version != KOPF_VERSION:
        raise RuntimeError(
            f"operator/kopf_compat.py is written against kopf {KOPF_VERSION}, but kopf {version} is "
            "installed: re-read kopf/_cogs/aiokits/aiotoggles.py (ToggleSet.make_toggle/drop_toggle/"
            "drop_toggles), kopf/_core/engines/indexing.py (index_resource) and kopf's registry "
            "(_spawning._handlers), and update or drop what this module does"
        )


# ------------------------------------------------------------------------------------ 1. toggle sets


async def make_toggle(self: ToggleSet, val: bool = False, /, *, name: str | None = None) -> Toggle:
    toggle = Toggle(val, name=name, condition=self._condition)
    async with self._condition:
        was_on = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != was_on:
            self._condition.notify_all()
    return toggle


async def drop_toggle(self: ToggleSet, toggle: Toggle) -> None:
    async with self._condition:
        was_on = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != was_on:
            self._condition.notify_all()


async def drop_toggles(self: ToggleSet, toggles: Iterable[Toggle]) -> None:
    async with self._condition:
        was_on = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != was_on:
            self._condition.notify_all()


TOGGLES_PATCHED = {"make_toggle": make_toggle, "drop_toggle": drop_toggle, "drop_toggles": drop_toggles}
# kopf's own methods, as imported (before `apply`): the tests compare both.
TOGGLES_UPSTREAM = {name: getattr(ToggleSet, name) for name in TOGGLES_PATCHED}


# ------------------------------------------------------------------------------------ 2. indexing

# The keyword arguments a plain indexer may declare, passed as kopf passes them.
FAST_KWARGS = frozenset({"body", "namespace", "name", "labels", "memo", "logger"})
# kopf's own, as imported (before `apply`).
INDEXING_UPSTREAM = indexing.index_resource


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
    """`kopf._core.engines.indexing.index_resource` with the fast path of the module docstring's part 2."""
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
    await INDEXING_UPSTREAM(
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


def indexing_installed() -> bool:
    return indexing.index_resource is index_resource


# ------------------------------------------------------------------------------------ 1 and 2: apply


def is_applied() -> bool:
    toggles = all(getattr(ToggleSet, name) is fn for name, fn in TOGGLES_PATCHED.items())
    return toggles and indexing_installed()


def apply() -> None:
    """Patch kopf's `ToggleSet` and put the indexing fast path in kopf's place (idempotent); RuntimeError if
    the installed kopf is not KOPF_VERSION."""
    check_version()
    for name, fn in TOGGLES_PATCHED.items():
        setattr(ToggleSet, name, fn)
    indexing.index_resource = index_resource


# ------------------------------------------------------------------------- 3. a daemon without a finalizer


def without_finalizer(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Put above `@kopf.daemon`: the daemon then puts no finalizer on its objects.

    kopf gives every object with a daemon its finalizer, so that no daemon outlives its object. The pool
    daemon needs none: it notices its pool is gone in the pools index and exits by itself
    (`reconcile_pool_forever`). kopf has no public switch (kopf 1.45.2, and its main branch as of 2026-06-03):
    `kopf.daemon()` makes its handler with `requires_finalizer=True` fixed, its `registry=` argument only
    picks the registry, whose handler lists (`_spawning`) are private, and `settings.persistence.finalizer`
    only names the finalizer. Upstream declined the option: nolar/kopf#896 (for timers; the maintainer,
    2026-03-14: a daemon's promise to stop at its object's deletion needs the finalizer) and nolar/kopf#1183
    (daemons and timers, for nolar/kopf#1104) were closed unmerged. The public way left would be our own task
    per pool, started and stopped from event handlers: the lifecycle kopf's daemons exist for, re-written. So
    this flips the flag on the handler `kopf.daemon` just registered; it fails at import on another kopf
    (`check_version`), if kopf's registry changed or if the handler is not found, and
    `tests/operator/test_deletion.py` checks that no finalizer appears.
    """
    check_version()
    spawning = kopf.get_default_registry()._spawning
    for index, handler in enumerate(spawning._handlers):
        if handler.fn is fn:
            spawning._handlers[index] = dataclasses.replace(handler, requires_finalizer=False)
            return fn
    raise RuntimeError(f"{fn.__qualname__} is not a registered kopf daemon: put @without_finalizer above it")
