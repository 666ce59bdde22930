"""The placement store's function library (issue 42 item 4, kv/scripts.py `Library`) on a real redis-server of
the test's own (its functions are flushed here, which the shared server's other clients must not see): who
loads it, what a worker's call answers while it is missing, and two versions side by side."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from ardiff.devcluster.redis_server import RedisServer
from ardiff.kv.errors import FunctionsNotLoaded
from ardiff.kv.keys import PoolKeys
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, token_sha256
from ardiff.kv.scripts import Library, library_source

POOL = PoolId("default", "library")
LEASE_MS = 60_000


def spec(name: str) -> SessionSpec:
    return SessionSpec(name, token_sha256("t"))


async def test_a_worker_without_the_library_gets_a_retryable_error_until_the_operator_loads_it() -> None:
    with RedisServer(functions=False) as redis:
        async with (
            PlacementStore.from_url(redis.url) as worker,
            PlacementStore.from_url(redis.url, loads_library=True) as operator,
        ):
            with pytest.raises(FunctionsNotLoaded) as missing:
                await worker.register_pod(
                    POOL, "w-0", capacity=2, endpoint="http://w-0:8000", lease_ms=LEASE_MS
                )
            assert missing.value.code == "placement_functions_not_loaded"
            assert (missing.value.library, missing.value.operation) == (worker.library.name, "register_pod")
            assert redis.cli("FUNCTION", "LIST").strip() == ""  # the worker loaded nothing

            assert await operator.load_library() == [""]  # the one server
            assert await operator.load_library() == []  # there already: one FUNCTION LIST, no load
            registration = await worker.register_pod(
                POOL, "w-0", capacity=2, endpoint="http://w-0:8000", lease_ms=LEASE_MS
            )
            assert (await operator.place(POOL, spec("s"))).placement is not None

            # Lost again under a running worker (an empty restart, a failover to a node without it): its calls
            # fail retryably and change nothing; the operator's next call of its own loads it back.
            redis.cli("FUNCTION", "FLUSH")
            with pytest.raises(FunctionsNotLoaded):
                await worker.touch(POOL, "s", pod="w-0", epoch=registration.epoch, chunk_index=1)
            assert (await operator.place(POOL, spec("s"))).already_placed
            assert await worker.touch(POOL, "s", pod="w-0", epoch=registration.epoch, chunk_index=1)
            assert (await worker.get_session(POOL, "s")).chunk_index == 1  # type: ignore[union-attr]
            # The front door's read (FCALL_RO) likewise.
            redis.cli("FUNCTION", "FLUSH")
            with pytest.raises(FunctionsNotLoaded):
                await worker.route(POOL, "s")
            await operator.load_library()
            assert (await worker.route(POOL, "s", expected_pod="w-0")).served_by_pod


async def test_two_versions_of_the_library_live_side_by_side() -> None:
    """A rolling update: another version's library (another name, other function names) loads beside this
    one and replaces nothing; each client calls its own version's functions."""
    with RedisServer() as redis:
        other = "ardiff_000000000000"
        assert redis.cli("FUNCTION", "LOAD", library_source(other)).strip() == other
        async with PlacementStore.from_url(redis.url, loads_library=True) as operator:
            assert await operator.load_library() == []  # its own was loaded at start, untouched by the other
            await operator.register_pod(
                POOL, "w-0", capacity=2, endpoint="http://w-0:8000", lease_ms=LEASE_MS
            )
            assert (await operator.place(POOL, spec("s"))).placement is not None
        async with aioredis.from_url(redis.url, decode_responses=True) as client:
            libraries = await client.execute_command("FUNCTION", "LIST")
            names = sorted(
                entry[1] if isinstance(entry, list) else entry["library_name"] for entry in libraries
            )
            assert names == sorted([other, Library.current().name])
            # The other version's read answers from the same data: the session is on w-0, whose record the
            # call did not declare (STALE_PLAN naming it).
            keys = PoolKeys(POOL)
            reply = await client.execute_command(
                "FCALL_RO", f"{other}_route", 3, keys.session("s"), keys.pool_record, keys.leases, 0, 0, 0, 0
            )
            assert reply == [1, ["w-0"], []]


async def test_the_read_is_registered_no_writes_and_the_writes_are_not() -> None:
    with RedisServer() as redis:
        name = Library.current().name
        listing = redis.cli("FUNCTION", "LIST", "LIBRARYNAME", name)
        async with aioredis.from_url(redis.url, decode_responses=True) as client:
            [library] = await client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", name)
        entry = dict(zip(library[::2], library[1::2], strict=True)) if isinstance(library, list) else library
        functions = {
            (f := dict(zip(fn[::2], fn[1::2], strict=True)) if isinstance(fn, list) else fn)["name"]: f[
                "flags"
            ]
            for fn in entry["functions"]
        }
        assert functions[f"{name}_route"] == ["no-writes"], listing
        assert functions[f"{name}_place"] == []
        assert functions[f"{name}_request_resume"] == []
        assert len(functions) == len(Library.current().functions)
