"""The patches to kopf 1.45.2, applied once by `ardiff operator run` before `kopf.run`: kopf's start is
quadratic in the objects it lists, and this makes it linear (below); and kopf's indexing of an event runs
without its handler machinery for the indexes that need none (operator/kopf_indexing.py, issue 27).

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
indexing over many objects), so there is none to cite. The patch is version-guarded: `apply()` refuses any
other kopf version, so that an upgrade makes someone re-read the upstream code (and drop this patch once
upstream notifies only on a change of the set's value) instead of silently patching code that changed.
Tests: tests/operator/test_kopf_patch.py. `ARDIFF_KOPF_UNPATCHED=1` (operator/cli.py) skips it: for
benchmarks/scale_operator.py's before/after only.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

from kopf._cogs.aiokits.aiotoggles import Toggle, ToggleSet

from ardiff.operator import kopf_indexing

KOPF_VERSION = "1.45.2"
# The environment variable that skips the patches (benchmarks/scale_operator.py --kopf-unpatched only).
UNPATCHED_ENV = "ARDIFF_KOPF_UNPATCHED"


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


PATCHED = {"make_toggle": make_toggle, "drop_toggle": drop_toggle, "drop_toggles": drop_toggles}
# kopf's own methods, as imported (before `apply`): the tests compare both.
UPSTREAM = {name: getattr(ToggleSet, name) for name in PATCHED}


def installed_kopf_version() -> str:
    return importlib.metadata.version("kopf")


def is_applied() -> bool:
    toggles = all(getattr(ToggleSet, name) is fn for name, fn in PATCHED.items())
    return toggles and kopf_indexing.is_installed()


def apply() -> None:
    """Patch kopf's `ToggleSet` and install the indexing fast path (idempotent); RuntimeError if the installed
    kopf is not KOPF_VERSION."""
    version = installed_kopf_version()
    if version != KOPF_VERSION:
        raise RuntimeError(
            f"operator/kopf_patch.py is written against kopf {KOPF_VERSION}, but kopf {version} is "
            "installed: "
            "re-read kopf/_cogs/aiokits/aiotoggles.py (ToggleSet.make_toggle/drop_toggle/drop_toggles) and "
            "kopf/_core/engines/indexing.py (index_resource), and update or drop the patches"
        )
    for name, fn in PATCHED.items():
        setattr(ToggleSet, name, fn)
    kopf_indexing.install()
