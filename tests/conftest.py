"""Fixtures shared by every test tier: one real redis-server per test session.

Rules for sharing it (worker processes started per module register in it):
- never FLUSHALL/FLUSHDB the shared server; give every test its own pool name (`unique_pool`);
- a test that must lose Redis data starts its own `RedisServer`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from ardiff.devcluster.redis_server import RedisServer

# The tests run torch on CPU next to other processes: one thread each keeps 2-core machines usable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_pool_counter = itertools.count()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def unique_pool(request: pytest.FixtureRequest) -> str:
    """A pool name no other test uses, so tests never see each other's keys."""
    return f"pool-{next(_pool_counter)}-{request.node.name[:20].lower().replace('_', '-').strip('-')}"
