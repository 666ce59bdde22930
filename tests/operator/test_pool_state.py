"""`PoolState` (issue 41 item 3): the pool's round is the one writer of its pod clocks; admission's `slots`
reads them and writes nothing."""

from __future__ import annotations

import copy
import time

from ardiff.kv.records import PodRecord
from ardiff.operator.pool_state import EXPECTED_POD_TTL_SECONDS, PoolState
from ardiff.operator.views import PodView, PoolView

POOL = PoolView.from_body(
    {
        "metadata": {"namespace": "ns", "name": "walkers"},
        "spec": {"image": "w:1", "model": {"name": "m"}, "startupTimeoutSeconds": 30},
    }
)


def pod(name: str, *, deleting: bool = False) -> PodView:
    return PodView(name=name, ready=not deleting, deleting=deleting, template_hash=POOL.template_hash)


def record(name: str, used: int) -> PodRecord:
    return PodRecord(
        name=name,
        capacity=2,
        used=used,
        endpoint=f"http://{name}:8000",
        epoch=1,
        lease_expires_ms=0,
        draining=False,
    )


def clocks(state: PoolState) -> tuple[object, ...]:
    return copy.deepcopy(
        (state.expected_pods, state.empty_since, state.unregistered_since, state.last_startup_seconds)
    )


def test_slots_read_the_clocks_and_write_none_of_them() -> None:
    state = PoolState()
    state.expected_pods["booting"] = time.monotonic() - 40  # created 40 s ago, never registered
    state.expected_pods["undone"] = time.monotonic() - EXPECTED_POD_TTL_SECONDS - 1
    pods = [pod("empty"), pod("busy"), pod("leaving", deleting=True)]
    live = {"empty": record("empty", 0), "busy": record("busy", 1)}
    before = clocks(state)

    slots = state.slots(POOL, pods, live)

    assert clocks(state) == before
    assert sorted(slots) == ["booting", "busy", "empty"]  # not the deleting one, nor a creation undone
    assert slots["booting"].stuck  # past startupTimeoutSeconds
    assert not slots["booting"].registered
    assert slots["empty"].empty_since is not None
    assert slots["busy"].empty_since is None
    assert (slots["empty"].free, slots["busy"].free) == (2, 1)


def test_the_round_moves_the_clocks_on_and_reads_the_same_slots() -> None:
    state = PoolState(scale_down_pods={"gone", "empty"})
    created = time.monotonic() - 5
    state.expected_pods["booting"] = created  # the pod index does not show it yet
    pods = [pod("empty")]
    live = {"empty": record("empty", 0)}

    slots = state.observe(POOL, pods, live)

    assert state.unregistered_since == {"booting": created}  # its startup deadline runs from its creation
    assert set(state.empty_since) == {"empty"}
    assert state.scale_down_pods == {"empty"}  # a pod gone leaves nothing behind
    assert state.slots(POOL, pods, live) == slots  # admission reads what the round left
    assert not slots["booting"].stuck

    pods.append(pod("booting"))
    slots = state.observe(POOL, pods, {"empty": record("empty", 1), "booting": record("booting", 0)})

    assert state.expected_pods == {}  # the index shows it now
    assert state.unregistered_since == {}
    assert state.last_startup_seconds is not None
    assert 5 <= state.last_startup_seconds < 60
    assert set(state.empty_since) == {"booting"}  # it registered empty; `empty` took a session
    assert slots["booting"].registered
    assert slots["empty"].empty_since is None
