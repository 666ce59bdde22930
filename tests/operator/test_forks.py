"""Forks through the real operator (issue 26): `spec.forkFrom` resolved at admission against the parent's CR
and Redis record, the child placed from the parent's kept chunk on the parent's pod, the refusals, and
`status.keptChunks`. The pool's Pods are simulated (registered, Ready, no process): the kept chunks a worker
would report come from the store's own `note_history`, called as the parent's pod incarnation."""

from __future__ import annotations

import asyncio

import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionRecord, SessionState, kept_location
from tests.operator.conftest import SIMULATED_PLACEMENT, Cluster

pytestmark = pytest.mark.slow


def simulated_pool(cluster: Cluster, name: str = "pool", replicas: int = 2, capacity: int = 3) -> set[str]:
    cluster.create_pool(
        name,
        replicas={"min": replicas, "max": replicas},
        **SIMULATED_PLACEMENT,
        env=[
            {"name": "ARDIFF_RUNTIME", "value": "fake"},
            {"name": "ARDIFF_FAKE_CAPACITY", "value": str(capacity)},
        ],
    )
    return cluster.wait_pods(replicas, pool=name)


async def keeping(store: PlacementStore, pool: PoolId, session: str, kept: list[int]) -> SessionRecord:
    """What the parent's worker reports after its chunks: the chunks it keeps."""
    record = await store.get_session(pool, session)
    assert record is not None
    assert record.state is SessionState.PLACED
    await store.note_history(pool, session, pod=record.pod, epoch=record.pod_epoch, kept=kept)
    return record


async def record_of(store: PlacementStore, pool: PoolId, session: str) -> SessionRecord:
    record = await store.get_session(pool, session)
    assert record is not None
    return record


async def test_a_fork_starts_from_its_parents_kept_chunk_on_its_parents_pod(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    pods = simulated_pool(cluster)
    cluster.create_session("walk", seed=7, history={"keepChunks": 4})
    parent_status = cluster.wait_phase("walk", "Ready")
    parent = await keeping(store, pool, "walk", [3, 4, 5])
    assert parent.history_keep_chunks == 4
    # The status lists the kept chunks (mirrored on a throttle).
    wait_until(lambda: cluster.status("walk").get("keptChunks") == [3, 4, 5], what="keptChunks mirrored")

    # No chunk named: the parent's latest kept one. seed, prompt and image left out: the parent's.
    cluster.http.post(
        cluster._path("ardiffusionsessions"),
        json={
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionSession",
            "metadata": {"name": "walk-b"},
            "spec": {"poolRef": "pool", "forkFrom": {"session": "walk"}},
        },
    ).raise_for_status()
    # A chunk named, and a seed and prompt of its own.
    cluster.create_session("walk-c", seed=9, prompt="another path", forkFrom={"session": "walk", "chunk": 4})
    statuses = {name: cluster.wait_phase(name, "Ready") for name in ("walk-b", "walk-c")}

    # On the parent's pod, though least-loaded would take the other, emptier one for at least one of them.
    assert {status["pod"] for status in statuses.values()} == {parent_status["pod"]}
    assert parent_status["pod"] in pods
    b, c = await record_of(store, pool, "walk-b"), await record_of(store, pool, "walk-c")
    assert (b.fork_from, b.resume_from, b.chunk_index, b.reset_required) == (
        kept_location(parent.pod, "walk", 5),
        kept_location(parent.pod, "walk", 5),
        5,
        False,
    )
    assert (b.seed, b.prompt) == (7, parent.prompt)
    assert (c.fork_from, c.chunk_index, c.seed, c.prompt) == (
        kept_location(parent.pod, "walk", 4),
        4,
        9,
        "another path",
    )
    assert (statuses["walk-b"]["resetRequired"], statuses["walk-b"]["reason"]) == (False, "Placed")
    # A child keeps its own history only if it asks for one; and carries no ownerReference to its parent.
    assert b.history_keep_chunks == 0
    assert cluster.session("walk-b")["metadata"].get("ownerReferences") is None
    # The parent is untouched.
    assert (await record_of(store, pool, "walk")).kept_chunks == (3, 4, 5)

    # Deleting the parent frees only its own slot: the children stay placed.
    cluster.delete("ardiffusionsessions", "walk")
    cluster.wait_gone("ardiffusionsessions", "walk")
    for _ in range(50):
        if (await record_of(store, pool, "walk")).state is SessionState.CLOSED:
            break
        await asyncio.sleep(0.1)
    assert (await record_of(store, pool, "walk")).state is SessionState.CLOSED
    assert {(await record_of(store, pool, n)).state for n in ("walk-b", "walk-c")} == {SessionState.PLACED}
    assert sum(p.used for p in await store.list_pods(pool)) == 2
    assert await store.check_invariants(pool) == []


async def test_forks_that_cannot_start_fail_with_the_reason_and_a_warning(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    pool = PoolId(cluster.namespace, "pool")
    simulated_pool(cluster, replicas=1)
    cluster.create_session("walk", history={"keepChunks": 2})
    cluster.create_session("still")  # keeps nothing
    cluster.create_session("robot", family="dreamzero")  # another family (Failed: FamilyMismatch)
    cluster.create_session("elsewhere", pool="other-pool")  # another pool (Failed: UnknownPool)
    cluster.wait_phase("walk", "Ready")
    cluster.wait_phase("still", "Ready")
    await keeping(store, pool, "walk", [6, 7])

    refusals = {
        "no-parent": ({"session": "nobody"}, "ForkSourceNotFound", "no ARDiffusionSession 'nobody'"),
        "self": ({"session": "self"}, "ForkSourceNotFound", "a session cannot fork from itself"),
        "late": ({"session": "walk", "chunk": 9}, "ChunkNotKept", "does not keep chunk 9: it keeps 6, 7"),
        "early": ({"session": "walk", "chunk": 5}, "ChunkNotKept", "does not keep chunk 5: it keeps 6, 7"),
        "none": (
            {"session": "still"},
            "ChunkNotKept",
            "does not keep its latest kept chunk: it keeps none (its spec.history.keepChunks is 0)",
        ),
        "family": ({"session": "robot"}, "ForkPoolMismatch", "is a dreamzero session of pool pool"),
        "pool": ({"session": "elsewhere"}, "ForkPoolMismatch", "is a lingbot session of pool other-pool"),
    }
    for name, (fork, _, _) in refusals.items():
        cluster.create_session(name, forkFrom=fork)
    for name, (_, reason, words) in refusals.items():
        status = cluster.wait_phase(name, "Failed", reason=reason)
        assert words in status["message"], (name, status["message"])
        assert status.get("pod") is None
        assert await store.get_session(pool, name) is None  # nothing held in Redis
    warnings = wait_until(
        lambda: (
            (
                found := {
                    e["involvedObject"]["name"]: e
                    for e in cluster.events("Failed")
                    if e["involvedObject"]["name"] in refusals
                }
            )
            and len(found) == len(refusals)
            and found
        ),
        what="a Failed Warning Event per refused fork",
    )
    for name, (_, reason, words) in refusals.items():
        assert warnings[name]["type"] == "Warning"
        assert warnings[name]["message"].startswith(f"{reason}: "), warnings[name]["message"]
        assert words in warnings[name]["message"]


async def test_a_fork_that_waited_for_a_slot_is_resolved_when_the_round_places_it(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    """Admission found no slot (nothing evictable): the pool round that places the fork later resolves it
    then, against the parent's kept chunks at that moment."""
    pool = PoolId(cluster.namespace, "pool")
    simulated_pool(cluster, replicas=1, capacity=2)
    cluster.create_session("walk", evictionPolicy="Never", history={"keepChunks": 2})
    cluster.create_session("filler", evictionPolicy="Never")
    cluster.wait_phase("walk", "Ready")
    cluster.wait_phase("filler", "Ready")
    await keeping(store, pool, "walk", [2, 3])
    cluster.create_session("walk-b", forkFrom={"session": "walk"})
    cluster.wait_phase("walk-b", "Pending", reason="WaitingForCapacity")
    assert await store.get_session(pool, "walk-b") is None
    parent = await keeping(store, pool, "walk", [3, 4])  # the parent ticked on meanwhile
    cluster.delete("ardiffusionsessions", "filler")
    status = cluster.wait_phase("walk-b", "Ready")
    child = await record_of(store, pool, "walk-b")
    assert (status["pod"], child.fork_from, child.chunk_index, child.reset_required) == (
        parent.pod,
        kept_location(parent.pod, "walk", 4),
        4,
        False,
    )
