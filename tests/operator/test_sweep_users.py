"""The operator-wide sweep deletes the Redis user of a pool deleted while no operator ran (issue 23 item 1;
real Redis, the API server's listing stubbed)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from ardiff.kv.acl import PoolUsers
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId
from ardiff.operator.config import OperatorConfig
from ardiff.operator.context import OperatorContext
from ardiff.operator.kube import ApiResource
from ardiff.operator.sweep import sweep_pools

PASSWORD = "a-pool-password-of-forty-characters-ok"


class ListedPools:
    """The API server's pools: only `kept` exists."""

    def __init__(self, kept: PoolId) -> None:
        self.kept = kept

    async def list_names(self, resource: ApiResource, namespace: str | None) -> set[tuple[str, str]]:
        return {(self.kept.namespace, self.kept.name)} if namespace == self.kept.namespace else set()

    async def close(self) -> None:
        pass


@pytest.fixture
def pools(unique_pool: str) -> tuple[PoolId, PoolId]:
    return PoolId("swept", f"{unique_pool}-gone"), PoolId("swept", f"{unique_pool}-kept")


@pytest.fixture
async def ctx(redis_url: str, pools: tuple[PoolId, PoolId]) -> AsyncIterator[OperatorContext]:
    config = OperatorConfig(redis_url=redis_url, worker_redis_url=redis_url, namespaces=("swept",))
    context = OperatorContext(
        config=config,
        store=PlacementStore.from_url(redis_url),
        kube=ListedPools(pools[1]),  # type: ignore[arg-type]
        pool_users=PoolUsers.from_url(redis_url),
    )
    yield context
    assert context.pool_users is not None
    for pool in pools:
        await context.pool_users.delete(pool)
    await context.close()


async def test_the_sweep_deletes_the_user_of_a_pool_the_api_no_longer_has(
    ctx: OperatorContext, pools: tuple[PoolId, PoolId]
) -> None:
    gone, kept = pools
    assert ctx.pool_users is not None
    for pool in pools:
        await ctx.pool_users.ensure(pool, PASSWORD)  # a user only: no other Redis state of the pool
    assert await sweep_pools(ctx, logging.getLogger("sweep")) == [gone]  # type: ignore[arg-type]
    users = await ctx.pool_users.pools()
    assert gone not in users
    assert kept in users
