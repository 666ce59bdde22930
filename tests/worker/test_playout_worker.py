"""Playout through real worker processes (fake runtime; issue 25, contracts §4 "Playout"): the session view's
`playout`, the playout metrics, and the tick estimate a pod with a compute bound measures before it registers
and reports to its pod record. The pure parts (lock order, buffer model, figures) are in test_playout.py."""

from __future__ import annotations

import time
import uuid

import pytest

from ardiff.kv.records import PoolId
from tests.worker.conftest import launch_fake_pod

FAKE_TICK_SECONDS = 0.05
UTILISATION = 0.5
PROMPT = "a walk in the forest"  # standalone: no record, so the tick carries it
FPS = 120.0  # a 12-frame chunk plays for 0.1 s: a client that waits 0.3 s has an empty buffer


def metric_values(worker) -> dict[str, float]:
    values = {}
    for line in worker.client.get(f"{worker.url}/metrics").text.splitlines():
        if line.startswith("ardiff_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


@pytest.fixture(scope="module")
def standalone(launch_worker):
    process = launch_worker(
        runtime="fake",
        fake_tick_seconds=FAKE_TICK_SECONDS,
        compute_utilisation=UTILISATION,
        playout_fps=FPS,
        playout_buffer_chunks=3,
    )
    yield process
    process.stop()


def test_the_tick_estimate_is_measured_before_the_first_tick(standalone):
    values = metric_values(standalone)  # nothing has ticked: the warm-up measured it
    tick_s = values["ardiff_worker_tick_seconds"]
    assert FAKE_TICK_SECONDS <= tick_s < FAKE_TICK_SECONDS + 0.05
    assert values["ardiff_worker_compute_fps"] == pytest.approx(UTILISATION * 12 / tick_s)
    assert standalone.client.get(f"{standalone.url}/v1/sessions").json()["sessions"] == []  # warm-up is gone


def test_the_session_view_and_the_metrics_carry_the_playout_figures(standalone):
    session = f"play-{uuid.uuid4().hex[:6]}"
    before = metric_values(standalone)
    assert standalone.tick(session, 0, prompt=PROMPT).status_code == 200  # no buffer_ms: no deadline
    assert standalone.tick(session, 1, prompt=PROMPT, buffer_ms=60_000).status_code == 200  # on time
    time.sleep(0.3)  # the 0.1 s delivered has played out: a claim of 0 is believed
    assert standalone.tick(session, 2, prompt=PROMPT, buffer_ms=0).status_code == 200  # late: ~a forward
    playout = standalone.client.get(f"{standalone.url}/v1/sessions/{session}").json()["playout"]
    assert (playout["fps"], playout["buffer_chunks"]) == (FPS, 3)
    assert (playout["chunks_on_time"], playout["chunks_late"]) == (1, 1)
    assert FAKE_TICK_SECONDS <= playout["stall_s"] < FAKE_TICK_SECONDS + 0.1
    assert FAKE_TICK_SECONDS <= playout["time_to_first_chunk_s"] < 1
    assert 0 < playout["cpr"] < 1
    after = metric_values(standalone)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew("ardiff_worker_chunks_on_time_total") == 1
    assert grew("ardiff_worker_chunks_late_total") == 1
    assert grew("ardiff_worker_stall_seconds_total") == pytest.approx(playout["stall_s"], abs=1e-3)
    assert grew("ardiff_worker_time_to_first_chunk_seconds_count") == 1
    assert grew("ardiff_worker_chunk_gap_seconds_count") == 2
    assert after["ardiff_worker_playback_ratio"] < 1
    closed = standalone.client.delete(f"{standalone.url}/v1/sessions/{session}").json()
    assert closed["playout"]["chunks_late"] == 1


def test_ticks_without_buffer_ms_have_no_deadline_so_nothing_is_late(standalone):
    session = f"idle-{uuid.uuid4().hex[:6]}"
    response = standalone.tick(session, 0, prompt=PROMPT)
    assert response.status_code == 200
    playout = standalone.client.get(f"{standalone.url}/v1/sessions/{session}").json()["playout"]
    assert playout["chunks_on_time"] == playout["chunks_late"] == 0
    assert playout["cpr"] == 1.0
    standalone.client.delete(f"{standalone.url}/v1/sessions/{session}")


POOL = PoolId("default", f"wk-playout-{uuid.uuid4().hex[:6]}")
POD = "playout-pod-0"
TOKEN = "playout-token"


async def test_a_pod_with_a_compute_bound_registers_its_figures_and_serves_the_records_target(
    launch_worker, redis_url, store, placer
):
    worker = launch_fake_pod(
        launch_worker,
        redis_url,
        POOL,
        POD,
        fake_tick_seconds=FAKE_TICK_SECONDS,
        compute_utilisation=0.9,
    )
    try:
        pod = await store.get_pod(POOL, POD)
        assert FAKE_TICK_SECONDS * 1000 <= pod.tick_ms < FAKE_TICK_SECONDS * 1000 + 50
        assert pod.compute_fps == pytest.approx(0.9 * 12 / (pod.tick_ms / 1000), rel=1e-3)
        session = await placer(POOL, POD, TOKEN)(playout_fps=24.0, playout_buffer_chunks=4)
        view = worker.client.get(f"{worker.url}/v1/sessions/{session}", headers=worker.headers(TOKEN)).json()
        assert view["playout"] == {
            "fps": 24.0,
            "buffer_chunks": 4,
            "time_to_first_chunk_s": None,
            "chunks_on_time": 0,
            "chunks_late": 0,
            "stall_s": 0.0,
            "cpr": None,
        }
        assert worker.tick(session, 0, token=TOKEN, buffer_ms=1000).status_code == 200
    finally:
        worker.stop()
