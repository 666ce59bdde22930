"""The Python client on the dev cluster, over worker Pods that run the real worker app on the fake runtime
(the control plane and the HTTP contract are real; only the model is not — tests/e2e/test_real_cluster.py
has the real one): create, wait, connect, tick, replay, 421 follow-up, explicit reset, typed errors, CLI."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

from ardiff import client
from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import build_pool
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

# Two pods of one slot each: two sessions always live on different pods.
POOL = build_pool("fake", capacity=1, min_replicas=2, max_replicas=2, fake=True)


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(dev_cluster, "e2e-client", tmp_path_factory.mktemp("e2e-client"), POOL) as running:
        wait_until(lambda: len(running.ready_pods()) == 2, timeout=60, what="two ready fake worker pods")
        yield running


def test_create_wait_connect_and_tick(stack: Stack) -> None:
    name = stack.session("walk", seed=3)
    status = stack.sessions.wait_ready(name, timeout=60)
    assert status["pod"] in stack.ready_pods()
    assert status["tokenSecretRef"] == {"name": "walk-token", "key": "token"}
    assert status["resetRequired"] is False
    with stack.connect(name) as walk:
        assert (walk.endpoint, walk.next_chunk_index) == (status["endpoint"], 0)
        first = walk.tick([client.hold("w")], applied_event_ids=[1, 2], request_id="walk-first")
        assert first.frames.shape == (9, 64, 64, 3)
        assert first.frames.dtype == np.uint8
        assert first.metadata == client.ChunkMetadata("walk", "walk-first", 0, (1, 2))
        assert set(first.server_timing) == {"queue", "forward", "decode", "encode"}
        assert first.latency_s * 1000 >= first.server_ms
        second = walk.tick([client.camera("w", "wj", "j")], request_id="walk-second")
        assert second.frames.shape == (12, 64, 64, 3)
        assert second.metadata.chunk_index == 1
        assert not np.array_equal(second.frames[:9], first.frames)
        assert walk.next_chunk_index == 2
        # A retry of the last request (its answer was lost) replays the same chunk and advances nothing.
        walk.next_chunk_index = 1
        replay = walk.tick([client.camera("w", "wj", "j")], request_id="walk-second")
        assert np.array_equal(replay.frames, second.frames)
        assert walk.next_chunk_index == 2
    with stack.connect(name) as later:  # e.g. another process: it continues where the session is
        assert later.next_chunk_index == 2
        assert later.describe()["ticks"] == 2


def test_out_of_order_and_unauthorized_ticks_raise_typed_errors(stack: Stack) -> None:
    name = stack.session("strict")
    with stack.connect(name) as strict:
        strict.tick([client.hold("a")])
        strict.next_chunk_index = 5
        with pytest.raises(client.ChunkOutOfOrder) as out_of_order:
            strict.tick([client.hold("a")])
        assert (out_of_order.value.status, out_of_order.value.expected_chunk_index) == (409, 1)
        intruder = client.SessionClient(name, strict.endpoint, "not-the-token")
        with pytest.raises(client.Unauthorized) as unauthorized:
            intruder.tick([client.hold("a")])
        assert unauthorized.value.status == 401
        strict.next_chunk_index = out_of_order.value.expected_chunk_index
        assert strict.tick([client.hold("a")]).metadata.chunk_index == 1


def test_a_misdirected_tick_follows_the_endpoint_the_worker_names(stack: Stack) -> None:
    here, there = stack.session("here"), stack.session("there")
    status_here = stack.sessions.wait_ready(here, timeout=60)
    status_there = stack.sessions.wait_ready(there, timeout=60)
    assert status_here["pod"] != status_there["pod"]
    token = stack.sessions.token(here)
    with client.SessionClient(here, status_there["endpoint"], token) as lost:
        chunk = lost.tick([client.hold("d")])
        assert lost.endpoint == status_here["endpoint"]
        assert chunk.endpoint == status_here["endpoint"]
        assert chunk.metadata.session_id == here


def test_a_failed_forward_needs_an_explicit_reset(stack: Stack) -> None:
    name = stack.session("fragile")
    with stack.connect(name) as fragile:
        fragile.tick([client.hold("w")])
        fragile.http.headers["ardiff-test-fault"] = "forward"  # the worker's test-only fault injection
        with pytest.raises(client.ForwardFailed) as failed:
            fragile.tick([client.hold("w")])
        assert failed.value.status == 500
        del fragile.http.headers["ardiff-test-fault"]
        for _ in range(2):  # the client never resets on its own: every tick says so until reset() is called
            with pytest.raises(client.ResetRequired) as needs_reset:
                fragile.tick([client.hold("w")])
            assert needs_reset.value.status == 409
            assert fragile.next_chunk_index == 1
        assert fragile.reset()["next_chunk_index"] == 0
        assert fragile.next_chunk_index == 0
        restarted = fragile.tick([client.hold("w")])
        assert (restarted.metadata.chunk_index, len(restarted.frames)) == (0, 9)


def test_kubernetes_errors_are_typed(stack: Stack) -> None:
    with pytest.raises(client.InvalidSession) as invalid:
        stack.sessions.create("bad-seed", pool=stack.pool, prompt="x", seed=-1)
    assert invalid.value.status == 422
    assert "spec.seed" in invalid.value.message
    with pytest.raises(client.SessionNotFound):
        stack.sessions.get("no-such-session")
    stack.sessions.delete("no-such-session")  # deleting what is gone is done
    stack.sessions.create("orphan", pool="no-such-pool", prompt="nowhere")
    stack.created.append("orphan")
    with pytest.raises(client.SessionFailed, match="UnknownPool"):
        stack.sessions.wait_ready("orphan", timeout=30)


def test_the_tick_command_reports_errors_without_a_traceback(stack: Stack, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ardiff.cli", "session", "tick", "missing", "-n", stack.namespace]
    command += [
        "--chunks",
        "1",
        "--out",
        str(tmp_path / "x.mp4"),
        "--kubeconfig",
        str(stack.kube.kubeconfig),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "error: session_not_found: get session missing:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.mp4").exists()


def test_the_tick_command_continues_a_session_and_resets_only_when_asked(
    stack: Stack, tmp_path: Path
) -> None:
    name = stack.session("cli")
    with stack.connect(name) as session:
        session.tick([client.hold("w")])
        session.http.headers["ardiff-test-fault"] = "forward"
        with pytest.raises(client.ForwardFailed):
            session.tick([client.hold("w")])
    command = [
        sys.executable,
        "-m",
        "ardiff.cli",
        "session",
        "tick",
        name,
        "-n",
        stack.namespace,
        "--chunks",
        "2",
    ]
    command += ["--kubeconfig", str(stack.kube.kubeconfig), "--keys", "wj"]

    refused = subprocess.run(
        [*command, "--out", str(tmp_path / "a.mp4")], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 1
    assert "error: reset_required:" in refused.stderr
    assert "run again with --reset" in refused.stderr
    assert "Traceback" not in refused.stderr

    video = tmp_path / "b.mp4"
    reset = subprocess.run(
        [*command, "--out", str(video), "--reset"], capture_output=True, text=True, check=False
    )
    assert reset.returncode == 0, reset.stderr
    assert f"{name} chunk 0: 9 frames 64x64" in reset.stdout
    assert f"{name} chunk 1: 12 frames 64x64" in reset.stdout
    assert f"wrote 21 frames to {video}" in reset.stdout
    with av.open(io.BytesIO(video.read_bytes())) as container:
        assert sum(1 for _ in container.decode(video=0)) == 21

    again = subprocess.run([*command, "--out", str(video)], capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert f"{name} chunk 2: 12 frames 64x64" in again.stdout  # it continues where the session is


def test_close_on_the_worker_is_idempotent_and_deleting_the_resource_ends_the_session(stack: Stack) -> None:
    name = stack.session("closing")
    with stack.connect(name) as closing:
        closing.tick([client.hold("w")])
        view = closing.close()
        assert (view["session_id"], view["state"], view["resident"]) == (name, "closed", False)
        with pytest.raises(client.SessionClosed) as closed:
            closing.tick([client.hold("w")])
        assert closed.value.status == 410
        assert closing.close()["state"] == "closed"
    stack.sessions.delete(name, wait=True)
    with pytest.raises(client.SessionNotFound):
        stack.sessions.status(name)


def test_session_events_are_the_operators_news_about_that_session_only(stack: Stack) -> None:
    idle, busy = stack.session("idle", idle_timeout_seconds=1), stack.session("busy")
    stack.sessions.wait_ready(busy, timeout=60)
    expired = stack.sessions.wait_for(idle, lambda s: s.get("phase") == "Expired", timeout=60, what="Expired")
    events = wait_until(lambda: stack.sessions.events(idle), timeout=30, what="the Expired event")
    assert [(e.reason, e.type) for e in events] == [("Expired", "Normal")]
    assert events[0].message == expired["message"]
    assert events[0].count == 1
    assert events[0].time is not None
    assert stack.sessions.events(busy) == []  # a Ready session made no news
    assert stack.sessions.events("no-such-session") == []
