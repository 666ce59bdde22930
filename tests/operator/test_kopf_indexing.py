"""operator/kopf_compat.py, part 2: kopf's indexing of an event without its handler machinery. A plain index
ends up holding exactly what kopf's own `index_resource` makes it hold, without going through it; a DELETED
event, a filtered, sync or wider-signature indexer, and a failing one go through kopf's own path (which keeps
its retry state). Each test has a registry of its own: the operator's handlers are not imported here."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import bodies, references
from kopf._core.engines import indexing

from ardiff.operator import kopf_compat
from ardiff.operator.views import SessionView

GROUP, VERSION, PLURAL = "ardiffusion.dev", "v1alpha1", "ardiffusionsessions"
SESSIONS = references.Resource(GROUP, VERSION, PLURAL, kind="ARDiffusionSession", namespaced=True)


def session(name: str, pool: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ARDiffusionSession",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": labels},
        "spec": {"poolRef": pool, "prompt": "a quiet street"},
        "status": {"phase": "Ready"},
    }


class Operator:
    """A registry, its indexers and per-object indexing memories, indexed through one `index_resource`."""

    def __init__(self, registry: kopf.OperatorRegistry) -> None:
        self.registry = registry
        self.indexers = indexing.OperatorIndexers()
        self.indexers.ensure(registry._indexing.get_all_handlers())
        self.memories: dict[str, indexing.IndexingMemory] = {}

    async def index(self, fn: Any, kind: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        await fn(
            indexers=self.indexers,
            registry=self.registry,
            settings=kopf.OperatorSettings(),
            resource=SESSIONS,
            raw_event={"type": kind, "object": obj},
            memory=self.memories.setdefault(obj["metadata"]["uid"], indexing.IndexingMemory()),
            logger=logging.getLogger("test.kopf_indexing"),
            memo=kopf.Memo(),
            body=bodies.Body(obj),
        )

    def contents(self) -> dict[str, dict[Any, list[Any]]]:
        return {
            str(handler_id): {key: list(store) for key, store in indexer.index.items()}
            for handler_id, indexer in self.indexers.items()
        }


@pytest.fixture
def upstream_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The events the fast path hands to kopf's own `index_resource`, by type."""
    calls: list[str] = []
    upstream = kopf_compat.INDEXING_UPSTREAM

    async def counted(**kwargs: Any) -> None:
        calls.append(kwargs["raw_event"]["type"])
        await upstream(**kwargs)

    monkeypatch.setattr(kopf_compat, "INDEXING_UPSTREAM", counted)
    return calls


EVENTS = [
    ("ADDED", session("a", "pool-1")),
    ("ADDED", session("b", "pool-1")),
    ("MODIFIED", session("a", "pool-2")),
    ("DELETED", session("b", "pool-1")),
    ("ADDED", session("c", "pool-2")),
]


async def test_a_plain_index_holds_what_kopfs_own_indexing_holds(upstream_calls: list[str]) -> None:
    registry = kopf.OperatorRegistry()

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="by_pool")
    async def by_pool(namespace: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], SessionView]:
        view = SessionView.from_body(body)
        return {(namespace, view.spec.pool_ref if view.spec else ""): view}

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="names")
    async def names(name: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> str:
        return f"{name}:{sorted(labels.items())}"

    fast, kopfs = Operator(registry), Operator(registry)
    for kind, obj in EVENTS:
        await fast.index(kopf_compat.index_resource, kind, obj)
        await kopfs.index(indexing.index_resource, kind, obj)
        assert fast.contents() == kopfs.contents(), (kind, obj["metadata"]["name"])
    assert upstream_calls == ["DELETED"]  # every other event indexed without kopf's machinery
    by_pool_index = fast.indexers.indices["by_pool"]
    assert sorted(v.name for v in by_pool_index[("ns", "pool-2")]) == ["a", "c"]
    assert ("ns", "pool-1") not in by_pool_index


async def test_filtered_sync_and_wider_indexers_go_through_kopf(upstream_calls: list[str]) -> None:
    def registry_with(kind: str) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        if kind == "labels":

            @kopf.index(GROUP, VERSION, PLURAL, registry=registry, labels={"tier": "gold"})
            async def gold(name: str, **_: Any) -> str:
                return name

        elif kind == "sync":

            @kopf.index(GROUP, VERSION, PLURAL, registry=registry)
            def sync(name: str, **_: Any) -> str:
                return name

        else:

            @kopf.index(GROUP, VERSION, PLURAL, registry=registry)
            async def wide(name: str, spec: kopf.Spec, **_: Any) -> str:  # `spec`: not a fast argument
                return f"{name}:{spec['poolRef']}"

        return registry

    for kind in ("labels", "sync", "wider"):
        upstream_calls.clear()
        operator = Operator(registry_with(kind))
        for event, obj in [("ADDED", session("a", "p", tier="gold")), ("ADDED", session("b", "p"))]:
            await operator.index(kopf_compat.index_resource, event, obj)
        assert upstream_calls == ["ADDED", "ADDED"], kind
        assert operator.contents() != {}, kind


async def test_a_failing_indexer_is_left_to_kopf_and_a_retried_one_stays_with_it(
    upstream_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="fragile")
    async def fragile(name: str, body: kopf.Body, **_: Any) -> str:
        seen.append(name)
        if body["spec"]["poolRef"] == "broken":
            raise ValueError("cannot index this one")
        if body["spec"]["poolRef"] == "later":
            raise kopf.TemporaryError("not yet", delay=60)
        return name

    operator = Operator(registry)
    await operator.index(kopf_compat.index_resource, "ADDED", session("a", "broken"))
    # Tried on the fast path, then run again by kopf, which logs the error and leaves the object out.
    assert seen == ["a", "a"]
    assert upstream_calls == ["ADDED"]
    assert (
        "Indexer 'fragile' failed with an exception and will ignore it: cannot index this one" in caplog.text
    )
    assert operator.contents() == {"fragile": {}}
    await operator.index(kopf_compat.index_resource, "MODIFIED", session("a", "p"))
    assert operator.contents() == {"fragile": {None: ["a"]}}
    assert upstream_calls == ["ADDED"]  # kopf keeps nothing of an ignored error: back on the fast path
    # A handler that asks to be retried leaves kopf a retry state: the object's events stay with kopf.
    await operator.index(kopf_compat.index_resource, "MODIFIED", session("b", "later"))
    assert operator.memories["uid-b"].indexing_state is not None
    await operator.index(kopf_compat.index_resource, "MODIFIED", session("b", "p"))
    assert upstream_calls == ["ADDED", "MODIFIED", "MODIFIED"]


def test_apply_installs_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexing, "index_resource", kopf_compat.INDEXING_UPSTREAM)  # restored on teardown
    for name in kopf_compat.TOGGLES_PATCHED:
        monkeypatch.setattr(kopf_compat.ToggleSet, name, getattr(kopf_compat.ToggleSet, name))
    assert not kopf_compat.indexing_installed()
    kopf_compat.apply()
    assert kopf_compat.indexing_installed()
    assert kopf_compat.is_applied()


# In a fresh interpreter: importing the handlers registers them in kopf's default registry.
_PLAIN_INDEXERS = """
import json
import kopf
import ardiff.operator.handlers
from ardiff.operator.kopf_compat import plain
print(json.dumps({h.id: plain(h) for h in kopf.get_default_registry()._indexing.get_all_handlers()}))
"""


def test_the_operators_session_and_pool_indexes_take_the_fast_path(tmp_path: Path) -> None:
    """The sessions index (two events a session) and the pools index are plain; the worker Pods' index has a
    label filter and stays with kopf."""
    result = subprocess.run(
        [sys.executable, "-c", _PLAIN_INDEXERS],
        cwd=tmp_path,  # not the repository root: its operator/ folder would shadow the standard library
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"pools": True, "worker_pods": False, "sessions_by_pool": True}
