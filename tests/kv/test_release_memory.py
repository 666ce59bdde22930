"""Bounded Redis memory (issue 23 item 8): a released session's record keeps what a worker needs to answer
410 for an hour (state, token hash, pod), not its image and prompt. Against a `redis-server` of the test's
own, whose `used_memory` is the measure (the shared server's would count every other test's keys)."""

from __future__ import annotations

import hashlib
import os

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.placement_operator import DEFAULT_CLOSED_TTL_MS
from ardiff.kv.records import PoolId, SessionSpec, SessionState

POOL = PoolId("memory", "pool")
TOKEN = hashlib.sha256(b"token").hexdigest()
IMAGE_BYTES = 512 << 10
SESSIONS = 2_000
MiB = 1 << 20


def used_memory(server: RedisServer) -> int:
    return int(server.info("memory")["used_memory"])


async def test_released_sessions_leave_used_memory_near_where_it_started() -> None:
    """2,000 sessions with 512 KiB images, each placed and released. Before: every closed record kept its
    image for the hour it lingers, ~1 GiB here."""
    with RedisServer() as server:
        store = PlacementStore.from_url(server.url)
        try:
            await store.register_pod(POOL, "w-0", capacity=4, endpoint="http://w-0:8000", lease_ms=600_000)
            start = used_memory(server)
            image = os.urandom(IMAGE_BYTES)  # incompressible, as a PNG is
            for i in range(SESSIONS):
                spec = SessionSpec(name=f"s-{i}", token_sha256=TOKEN, prompt="a walk " * 64, image=image)
                assert (await store.place(POOL, spec)).placement is not None
                assert await store.release(POOL, spec.name, reason="deleted") is SessionState.PLACED
            grown = used_memory(server) - start
            assert grown < 8 * MiB, f"used_memory grew by {grown / MiB:.1f} MiB"
            record = await store.get_session(POOL, f"s-{SESSIONS - 1}")
            assert (record.state, record.token_sha256, record.image, record.prompt) == (
                SessionState.CLOSED,
                TOKEN,
                b"",
                "",
            )
            ttl = await store.client.pttl(PoolKeys(POOL).session(f"s-{SESSIONS - 1}"))
            assert 0 < ttl <= DEFAULT_CLOSED_TTL_MS  # still there for the worker's 410, for an hour
        finally:
            await store.close()


async def test_a_session_created_again_after_its_release_gets_its_new_image_and_prompt() -> None:
    with RedisServer() as server:
        store = PlacementStore.from_url(server.url)
        try:
            await store.register_pod(POOL, "w-0", capacity=4, endpoint="http://w-0:8000", lease_ms=600_000)
            first = SessionSpec(name="again", token_sha256=TOKEN, prompt="first", image=b"\x89PNG-1")
            await store.place(POOL, first)
            await store.release(POOL, "again", reason="deleted")
            second = SessionSpec(name="again", token_sha256=TOKEN, prompt="second", image=b"\x89PNG-2")
            assert (await store.place(POOL, second)).placement is not None
            record = await store.get_session(POOL, "again")
            assert (record.state, record.prompt, record.image) == (
                SessionState.PLACED,
                "second",
                b"\x89PNG-2",
            )
        finally:
            await store.close()
