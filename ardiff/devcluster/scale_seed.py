"""Bulk seeding and measuring helpers for simulations at scale (`benchmarks/scale_store.py`,
`benchmarks/scale_operator.py`): sessions go into Redis through the placement store's own `place` (bounded
concurrency), objects into the API server as any client makes them — a create and a status write each, with
`SEED_CONCURRENCY` requests in flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ardiff.devcluster.kubeconfig import Credentials
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PodRecord, PoolId, SessionBinding, SessionSpec
from ardiff.operator.specs import Playout
from ardiff.operator.status import SessionObservation, build_session_status, rfc3339

T = TypeVar("T")
TOKEN_SHA256 = hashlib.sha256(b"scale").hexdigest()
# A realistic record: a prompt of a sentence, a token digest, a seed, no inline image.
PROMPT = "a lighthouse on a cliff at dusk, waves, slow dolly in"
SEED = 7
SEED_CONCURRENCY = 16
# A pool's default playout target (issue 25): what the operator places a session of such a pool with, so a
# seeded record and its status hold what the operator's would.
PLAYOUT = Playout()


def session_spec(name: str) -> SessionSpec:
    return SessionSpec(
        name=name,
        token_sha256=TOKEN_SHA256,
        seed=SEED,
        prompt=PROMPT,
        playout_fps=PLAYOUT.fps,
        playout_buffer_chunks=PLAYOUT.buffer_chunks,
    )


async def bounded(calls: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[float]:
    """Run `calls` with at most `limit` in flight; each one's latency in seconds."""
    latencies: list[float] = []
    queue = list(reversed(calls))

    async def runner() -> None:
        while queue:
            call = queue.pop()
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(runner() for _ in range(limit)))
    return latencies


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1..99), inclusive method; a single value is every percentile of itself."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def used_memory(store: PlacementStore) -> int:
    return int((await store.client.info("memory"))["used_memory"])


async def place_sessions(
    store: PlacementStore, pool: PoolId, names: Sequence[str], concurrency: int
) -> dict[str, SessionBinding]:
    """Place every named session (the store picks the pods), then tick each once, as a live session would
    have been; their bindings."""
    await bounded([lambda n=n: store.place(pool, session_spec(n)) for n in names], concurrency)
    bindings = await store.get_bindings(pool, names)
    await bounded(
        [
            lambda n=n: store.touch(pool, n, pod=bindings[n].pod, epoch=bindings[n].pod_epoch, chunk_index=1)
            for n in names
        ],
        concurrency,
    )
    return await store.get_bindings(pool, names)


def seed_objects(
    credentials: Credentials,
    plural_path: str,
    items: Sequence[Mapping[str, Any]],
    concurrency: int = SEED_CONCURRENCY,
) -> None:
    """Create each of `items` under `plural_path` (e.g. `/apis/g/v/namespaces/ns/things`) and write its
    `status` through the status subresource, `concurrency` objects at a time."""

    async def seed() -> None:
        async with credentials.async_client(timeout=120) as client:

            async def one(item: Mapping[str, Any]) -> None:
                body = {k: v for k, v in item.items() if k != "status"}
                created = await client.post(plural_path, json=body)
                created.raise_for_status()
                if item.get("status"):
                    # A merge patch, not a PUT at the create's resourceVersion: the operator may have admitted
                    # the object meanwhile (a CR without status is new to it) and written its own status.
                    reply = await client.patch(
                        f"{plural_path}/{created.json()['metadata']['name']}/status",
                        content=json.dumps({"status": item["status"]}),
                        headers={"content-type": "application/merge-patch+json"},
                    )
                    reply.raise_for_status()

            await bounded([lambda item=item: one(item) for item in items], concurrency)

    asyncio.run(seed())


def seeded_session(
    template: Mapping[str, Any], name: str, binding: SessionBinding, pod: PodRecord, now_ms: int
) -> dict[str, Any]:
    """A session object to seed: `template` (a session the operator admitted, as the API returns it: kopf's
    annotations, the finalizers) renamed, with the status the operator derives from the session's Redis
    record, so that an operator listing it finds nothing to write."""
    observation = SessionObservation(record=binding, pod=pod, pod_ready=True, now_ms=now_ms)
    status = build_session_status({}, observation, session=name, generation=1, now=rfc3339(now_ms))
    meta = template["metadata"]
    return {
        "apiVersion": template["apiVersion"],
        "kind": template["kind"],
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "annotations": meta.get("annotations", {}),
            **({"finalizers": meta["finalizers"]} if meta.get("finalizers") else {}),
        },
        "spec": template["spec"],
        "status": {k: v for k, v in status.items() if v is not None},
    }
