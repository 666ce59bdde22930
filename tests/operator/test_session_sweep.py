"""The sweep of a pool's session records (operator/sweep.py) trusts no index for a deletion: a record whose
session the operator's index lacks is released only if a live listing of the API lacks it too, or lists it
in another pool (issue 40, Sieve's stale state: an index that lags, as an operator's that resumed in place of
another, must not release the sessions it has not seen yet). Real Redis; the API server's listing stubbed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState
from ardiff.operator.config import OperatorConfig
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import SESSIONS, ApiResource
from ardiff.operator.sweep import sweep_sessions

NAMESPACE = "swept-sessions"
TOKEN = "0" * 64


class ListedSessions:
    """The API server's sessions of the namespace, as (name, poolRef); counts its listings."""

    def __init__(self) -> None:
        self.sessions: dict[str, str] = {}
        self.listings = 0

    async def list_names(
        self,
        resource: ApiResource,
        namespace: str | None,
        where: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> set[tuple[str, str]]:
        assert (resource, namespace) == (SESSIONS, NAMESPACE)
        self.listings += 1
        items = [{"metadata": {"name": n}, "spec": {"poolRef": p}} for n, p in self.sessions.items()]
        return {(NAMESPACE, i["metadata"]["name"]) for i in items if where is None or where(i)}

    async def close(self) -> None:
        pass


@pytest.fixture
async def ctx(redis_url: str) -> AsyncIterator[OperatorContext]:
    config = OperatorConfig(redis_url=redis_url, worker_redis_url=redis_url, namespaces=(NAMESPACE,))
    kube = ListedSessions()
    context = OperatorContext(config=config, store=PlacementStore.from_url(redis_url), kube=kube)  # type: ignore[arg-type]
    yield context
    await context.close()


async def test_a_session_the_index_lacks_is_released_only_if_the_live_listing_lacks_it_in_its_pool(
    ctx: OperatorContext, unique_pool: str
) -> None:
    pool = PoolId(NAMESPACE, unique_pool)
    kube: ListedSessions = ctx.kube  # type: ignore[assignment]
    await ctx.store.register_pod(pool, "p", capacity=8, endpoint="http://p:8000", lease_ms=60_000)
    names = ("seen", "unseen", "deleted", "elsewhere")
    for name in names:
        await ctx.store.place(pool, SessionSpec(name, TOKEN))
    # "unseen": placed by another operator, not yet in this one's index; "elsewhere": deleted unseen, and a
    # session of that name made in another pool since.
    kube.sessions = {"seen": pool.name, "unseen": pool.name, "elsewhere": "another-pool"}
    log = logging.getLogger("sweep")

    released = await sweep_sessions(ctx, pool, lambda: {"seen"}, log)  # type: ignore[arg-type]

    assert released == ["deleted", "elsewhere"]
    assert kube.listings == 1
    states = {name: (await ctx.store.get_session(pool, name, image=False)) for name in names}
    assert {name: record.state for name, record in states.items() if record is not None} == {
        "seen": SessionState.PLACED,
        "unseen": SessionState.PLACED,
        "deleted": SessionState.CLOSED,
        "elsewhere": SessionState.CLOSED,
    }
    # Next time the closed records are no candidates: no listing at all while nothing is open and unseen.
    ctx.stored_sessions_at = float("-inf")
    assert await sweep_sessions(ctx, pool, lambda: {"seen", "unseen"}, log) == []  # type: ignore[arg-type]
    assert kube.listings == 1
