"""The store at size: `get_bindings` makes one script call and one JSON document per batch of sessions, not
one reply each; many concurrent placers filling a pool of many pods to its last slot never run out of
attempts."""

from __future__ import annotations

import asyncio
import hashlib

from ardiff.kv.placement import PlacementStore
from ardiff.kv.placement_shared import BINDINGS_BATCH
from ardiff.kv.records import PoolId, SessionSpec, SessionState

TOKEN = hashlib.sha256(b"token").hexdigest()


async def evalsha_calls(store: PlacementStore) -> int:
    return int((await store.client.info("commandstats"))["cmdstat_fcall"]["calls"])


async def test_bindings_of_many_sessions_in_batches(redis_url: str, unique_pool: str) -> None:
    pool = PoolId("bindings", unique_pool)
    async with PlacementStore.from_url(redis_url) as store:
        epoch = (
            await store.register_pod(pool, "w-0", capacity=3_000, endpoint="http://w-0:8000", lease_ms=60_000)
        ).epoch
        names = [f"s-{i:04d}" for i in range(2 * BINDINGS_BATCH + 10)]
        for name in names[:-5]:  # the last five have no record
            await store.place(pool, SessionSpec(name=name, token_sha256=TOKEN, prompt="p"))
        await store.touch(pool, "s-0007", pod="w-0", epoch=epoch, chunk_index=9)
        await store.release(pool, "s-0008", reason="closed")

        await store.get_bindings(pool, ["s-0000"])  # a warm connection
        before = await evalsha_calls(store)
        bindings = await store.get_bindings(pool, names)
        assert await evalsha_calls(store) - before == 3  # ceil(2010 / 1000) script calls, nothing else

        assert sorted(bindings) == names[:-5]
        seven = bindings["s-0007"]
        assert (seven.state, seven.pod, seven.pod_epoch, seven.chunk_index) == (
            SessionState.PLACED,
            "w-0",
            epoch,
            9,
        )
        assert seven.last_tick_ms > 0
        assert (seven.reset_required, seven.tier, seven.resume_from, seven.snapshot_chunk) == (
            False,
            "",
            "",
            0,
        )
        assert bindings["s-0008"].state is SessionState.CLOSED
        assert await store.get_bindings(pool, []) == {}
        await store.delete_pool(pool)


async def test_concurrent_placers_fill_a_pool_of_many_pods_to_the_last_slot(
    redis_url: str, unique_pool: str
) -> None:
    """32 placers herd to the same least-loaded pods; near the end every pod they declared is full by the time
    their call runs. A repeated call then declares several open pods at once (POD_CANDIDATES), so none of them
    runs out of its 16 attempts (before: PlacementContention for ~1 in 5 placements here)."""
    pool = PoolId("herd", unique_pool)
    pods, capacity, placers = 300, 2, 32
    async with PlacementStore.from_url(redis_url) as store:
        for i in range(pods):
            await store.register_pod(
                pool, f"w-{i:03d}", capacity=capacity, endpoint="http://w:8000", lease_ms=60_000
            )
        waiting = [f"s-{i:04d}" for i in range(pods * capacity)]
        placed: list[str] = []

        async def placer() -> None:
            while waiting:
                name = waiting.pop()
                result = await store.place(pool, SessionSpec(name=name, token_sha256=TOKEN, prompt="p"))
                if result.placement is not None:
                    placed.append(name)

        await asyncio.gather(*(placer() for _ in range(placers)))
        assert len(placed) == pods * capacity
        assert [p.used for p in await store.list_pods(pool)] == [capacity] * pods
        assert (
            await store.place(pool, SessionSpec(name="late", token_sha256=TOKEN, prompt="p"))
        ).placement is None
        assert await store.check_invariants(pool) == []
        await store.delete_pool(pool)
