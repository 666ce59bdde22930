"""Spec walks (issue 40 item 4, Acto's idea): from a valid pool and session, a seeded sequence of spec changes
(valid values, invalid ones, and changes undone) applied to the real API server with the real operator (its
Pods simulated). After each valid change the system converges to what the spec says within a bound; each
invalid one is refused with a message naming what is wrong and changes nothing; the store's invariants hold
throughout, and nothing of the walk is left once its objects are deleted."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ardiff.devcluster.operator_process import OperatorProcess
from ardiff.devcluster.waiting import condition_true, wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionState
from tests.operator.conftest import SIMULATED_ENV, SIMULATED_PLACEMENT, Cluster

pytestmark = pytest.mark.slow  # a walk of the real operator (~1 min)

WALK_SEED = 4
UNDO_RATE = 0.3  # how often a valid change of the pool is undone right after it
CONVERGE_SECONDS = 60
POOL = "walk"
SESSION = "walker"
BASE_POOL = {"replicas": {"min": 1, "max": 2}, "scaleDownDelaySeconds": 0}


@dataclass(frozen=True)
class Step:
    """A merge patch of a spec, and the message fragment the API server refuses it with ('' when valid)."""

    patch: dict[str, Any]
    refused_with: str = ""


def pool_steps(rng: random.Random) -> list[Step]:
    """Every kind of change of the pool's spec once, valid and not, in a seeded order (values seeded too)."""
    valid = [
        {"replicas": {"min": (low := rng.randint(0, 2)), "max": rng.randint(max(low, 1), 3)}},
        {"replicas": {"min": 2, "max": 2}},
        {"scaleDownDelaySeconds": rng.randint(0, 1)},
        {"podLabels": {"walk": f"labelled-{rng.randint(0, 99)}"}},
        {"podAnnotations": {"walk.example.com/step": str(rng.randint(0, 99))}},
        {"env": [*SIMULATED_ENV, {"name": "ARDIFF_WALK_STEP", "value": str(rng.randint(0, 99))}]},
        {"eviction": {"minIdleSeconds": rng.randint(0, 60)}},
        {"computeUtilisation": rng.choice([0, 0.5, 1])},
    ]
    invalid = [
        Step({"replicas": {"min": 3, "max": 2}}, "max must be >= min"),
        Step({"scaleDownDelaySeconds": -1}, "should be greater than or equal to 0"),
        Step({"podLabels": {"ardiffusion.dev/walk": "x"}}, "ardiffusion.dev/"),
        Step({"imagePullPolicy": "Sometimes"}, "Unsupported value"),
        Step({"computeUtilisation": 2}, "should be less than or equal to 1"),
        Step({"replicas": {"max": 0}}, "should be greater than or equal to 1"),
    ]
    steps = [Step(patch) for patch in valid] + invalid
    rng.shuffle(steps)
    return steps


def session_steps(rng: random.Random) -> list[Step]:
    """Every kind of change of the session's spec once, valid and not, in a seeded order."""
    valid = [
        {"priority": rng.randint(1, 1000)},
        {"evictionPolicy": "Never"},
        {"evictionPolicy": "LRU", "priority": 0},
        {"idleTimeoutSeconds": rng.randint(600, 3600)},
    ]
    invalid = [
        Step({"poolRef": "another-pool"}, "poolRef is immutable"),
        Step({"family": "dreamzero"}, "is immutable"),
        Step({"priority": 1001}, "should be less than or equal to 1000"),
        Step({"evictionPolicy": "Sometimes"}, "Unsupported value"),
        Step({"maxChunks": 0}, "should be greater than or equal to 1"),
        Step({"prompt": None}, "prompt"),
        # What the session was admitted with (before: accepted, and never applied).
        Step({"prompt": "another world"}, "prompt is immutable"),
        Step({"seed": rng.randint(2, 1000)}, "seed is immutable"),
        Step({"maxChunks": rng.randint(1, 100)}, "maxChunks is immutable"),
        Step({"playout": {"fps": 8}}, "playout is immutable"),
    ]
    steps = [Step(patch) for patch in valid] + invalid
    rng.shuffle(steps)
    return steps


def merged(spec: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`spec` after a JSON merge patch (RFC 7386) of it."""
    out = dict(spec)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def undo(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that takes `spec` back to `base` (top-level keys)."""
    return {key: base.get(key) for key in {*spec, *base} if spec.get(key) != base.get(key)}


def apply(cluster: Cluster, plural: str, name: str, step: Step) -> httpx.Response:
    before = cluster.get(plural, name)
    assert before is not None
    reply = cluster.patch_spec(plural, name, step.patch)
    if step.refused_with:
        assert reply.status_code == 422, (step, reply.text)
        assert step.refused_with in reply.json()["message"], (step, reply.json()["message"])
        after = cluster.get(plural, name)
        assert after is not None
        assert (
            after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        )  # nothing changed
    else:
        assert reply.status_code == 200, (step, reply.text)
    return reply


def pool_converged(cluster: Cluster, spec: dict[str, Any]) -> Callable[[], dict[str, Any] | None]:
    """The pool as its spec says, with no session: `min` Pods, each Ready and of the current template (its
    labels, annotations and env), and a status that says so for this generation."""

    def check() -> dict[str, Any] | None:
        pool = cluster.get("ardiffusionworkerpools", POOL)
        assert pool is not None
        status = pool.get("status") or {}
        want = spec["replicas"]["min"]
        pods = [p for p in cluster.pods(POOL) if not p["metadata"].get("deletionTimestamp")]
        if status.get("observedGeneration") != pool["metadata"]["generation"] or len(pods) != want:
            return None
        if (status.get("replicas"), status.get("readyReplicas"), status.get("updatedReplicas")) != (
            want,
        ) * 3:
            return None
        for pod in pods:
            labels, annotations = pod["metadata"].get("labels", {}), pod["metadata"].get("annotations", {})
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            if not condition_true(pod, "Ready"):
                return None
            assert labels.items() >= (spec.get("podLabels") or {}).items(), labels
            assert annotations.items() >= (spec.get("podAnnotations") or {}).items(), annotations
            assert env.items() >= {e["name"]: e["value"] for e in spec.get("env") or []}.items(), env
        return status

    return check


async def _session_record(store: PlacementStore, pool: PoolId) -> tuple[SessionState, int, str]:
    record = await store.get_session(pool, SESSION, image=False)
    assert record is not None
    return record.state, record.priority, record.eviction_policy


async def test_a_seeded_walk_of_pool_and_session_specs_converges_refuses_what_it_must_and_leaves_nothing(
    cluster: Cluster, operator_process: OperatorProcess, store: PlacementStore
) -> None:
    rng = random.Random(WALK_SEED)
    pool_id = PoolId(cluster.namespace, POOL)
    base = {**BASE_POOL, **SIMULATED_PLACEMENT, "env": SIMULATED_ENV}
    created = cluster.create_pool(POOL, **base)["spec"]
    spec = created
    wait_until(pool_converged(cluster, spec), timeout=CONVERGE_SECONDS, what="the pool's first Pods")
    walked: list[str] = []

    async def walk(step: Step, spec: dict[str, Any]) -> dict[str, Any]:
        """Apply `step` to the pool whose spec is `spec`; its spec after it, once converged."""
        walked.append(f"{'refused ' if step.refused_with else ''}{step.patch}")
        apply(cluster, "ardiffusionworkerpools", POOL, step)
        spec = spec if step.refused_with else merged(spec, step.patch)
        started = time.monotonic()
        what = f"the pool after {walked[-1]}"
        wait_until(pool_converged(cluster, spec), timeout=CONVERGE_SECONDS, what=what)
        walked[-1] += f" ({time.monotonic() - started:.1f} s)"
        assert await store.check_invariants(pool_id) == []
        return spec

    for step in pool_steps(rng):
        spec = await walk(step, spec)
        if not step.refused_with and rng.random() < UNDO_RATE and (back := undo(spec, created)):
            spec = await walk(Step(back), spec)
    print("pool walk:", *walked, sep="\n  ")

    # The session's walk, on the pool taken back to a Pod that stays.
    apply(cluster, "ardiffusionworkerpools", POOL, Step(undo(spec, created)))
    cluster.create_session(SESSION, pool=POOL)
    status = cluster.wait_phase(SESSION, "Ready", timeout=CONVERGE_SECONDS)
    placed = (status["pod"], status["podEpoch"])
    session_spec = cluster.session(SESSION)["spec"]
    walked = []
    for step in session_steps(rng):
        walked.append(f"{'refused ' if step.refused_with else ''}{step.patch}")
        apply(cluster, "ardiffusionsessions", SESSION, step)
        if not step.refused_with:
            session_spec = merged(session_spec, step.patch)

        wanted = (SessionState.PLACED, session_spec["priority"], session_spec["evictionPolicy"])
        deadline = time.monotonic() + CONVERGE_SECONDS
        while (found := await _session_record(store, pool_id)) != wanted:
            assert time.monotonic() < deadline, f"the session's record {found} after {walked[-1]}"
            await asyncio.sleep(0.2)
        now = cluster.status(SESSION)
        assert (now["phase"], now["pod"], now["podEpoch"]) == ("Ready", *placed)  # never moved or cut
        assert await store.check_invariants(pool_id) == []
    print("session walk:", *walked, sep="\n  ")

    cluster.delete("ardiffusionsessions", SESSION)
    cluster.delete("ardiffusionworkerpools", POOL)
    cluster.wait_gone("ardiffusionworkerpools", POOL, timeout=CONVERGE_SECONDS)
    wait_until(lambda: not cluster.pods(POOL), timeout=CONVERGE_SECONDS, what="the walk's Pods gone")
    deadline = time.monotonic() + CONVERGE_SECONDS  # the pool's Redis state goes once its Pods have gone
    while await store.list_pods(pool_id) or await store.get_session(pool_id, SESSION, image=False):
        assert time.monotonic() < deadline, "the walk's pool left state in the store"
        await asyncio.sleep(0.2)
    assert await store.check_invariants(pool_id) == []
