"""How a pool round makes Redis agree with the worker Pods (real Redis, no cluster)."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import AsyncIterator

import pytest

from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, SessionState
from ardiff.operator.config import OperatorConfig
from ardiff.operator.context import OperatorContext
from ardiff.operator.slots import sync_pods
from ardiff.operator.views import PodView

TOKEN = hashlib.sha256(b"token").hexdigest()


class NoKube:
    """sync_pods must not call the API server."""

    async def close(self) -> None:
        pass


@pytest.fixture
async def ctx(redis_url: str) -> AsyncIterator[OperatorContext]:
    config = OperatorConfig(redis_url=redis_url, worker_redis_url=redis_url, namespaces=("ns",))
    context = OperatorContext(config=config, store=PlacementStore.from_url(redis_url), kube=NoKube())  # type: ignore[arg-type]
    yield context
    await context.close()


TEMPLATE = "0123456789abcdef"  # the pool's current template hash


def pod(
    name: str,
    *,
    statuses: list | None = None,
    deleting: bool = False,
    ready: bool = True,
    template: str = TEMPLATE,
) -> PodView:
    body = {
        "metadata": {
            "name": name,
            "annotations": {"ardiffusion.dev/template-hash": template},
            **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {}),
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": statuses or [{"name": "worker", "state": {"running": {}}}],
        },
    }
    return PodView.from_body(body)


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def terminated(finished: str, *, restarting: bool) -> dict:
    done = {"terminated": {"exitCode": 137, "finishedAt": finished}}
    if restarting:
        return {"name": "worker", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": done}
    return {"name": "worker", "state": done}


def test_pod_view_knows_when_its_worker_died() -> None:
    assert pod("a").died_at_ms is None
    booting = [{"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    assert pod("a", statuses=booting).died_at_ms is None  # never ran: nothing to lose
    finished = int(datetime.datetime(2026, 11, 30, 1, 0, tzinfo=datetime.UTC).timestamp() * 1000)
    assert pod("a", statuses=[terminated(iso(finished), restarting=False)]).died_at_ms == finished
    assert pod("a", statuses=[terminated(iso(finished), restarting=True)]).died_at_ms == finished
    assert pod("a", deleting=True).ready is False


async def test_sync_pods_forgets_gone_and_dead_pods_and_drains_terminating_ones(
    ctx: OperatorContext, unique_pool: str
) -> None:
    pool = PoolId("ns", unique_pool)
    store = ctx.store
    epochs = {}
    for name in ("alive", "gone", "dead", "restarted", "leaving", "stale"):
        registration = await store.register_pod(
            pool, name, capacity=1, endpoint=f"http://{name}:8000", lease_ms=60_000
        )
        epochs[name] = registration.epoch
        await store.place(pool, SessionSpec(f"on-{name}", TOKEN))
    before_death = epochs["dead"] + 1000  # the worker registered, then died a second later
    pods = [
        pod("alive"),
        pod("dead", statuses=[terminated(iso(before_death), restarting=True)], ready=False),
        # Restarted (running again, after an earlier death): its current incarnation holds the session.
        pod(
            "restarted",
            statuses=[
                {**terminated(iso(epochs["restarted"] - 5000), restarting=True), "state": {"running": {}}}
            ],
        ),
        pod("leaving", deleting=True),
        pod("stale", template="an older one"),  # the pool's spec changed since it was made
    ]

    live = await sync_pods(ctx, ctx.pools[pool], pool, pods, TEMPLATE)

    assert sorted(live) == ["alive", "leaving", "restarted", "stale"]
    assert live["leaving"].draining
    assert live["stale"].draining  # no new session; its own stays
    assert not live["alive"].draining
    assert not live["restarted"].draining
    records = await store.get_sessions(pool, [f"on-{n}" for n in epochs])
    states = {name: record.state for name, record in records.items()}
    assert states == {
        "on-alive": SessionState.PLACED,
        "on-gone": SessionState.LOST,  # its Pod no longer exists
        "on-dead": SessionState.LOST,  # its worker died before its lease ran out
        "on-restarted": SessionState.PLACED,
        "on-leaving": SessionState.PLACED,  # a terminating pod keeps its sessions until it is gone
        "on-stale": SessionState.PLACED,
    }
    assert await store.check_invariants(pool) == []
