"""The whole system with real workers: vllm-omni's paged-KV runner and the tiny LingBot-World model on CPU,
placed by the real operator through real Redis on the dev cluster, driven by kubectl and the Python client.

One cluster for the module; its pool has one slot per pod (min 1, max 2), so capacity, scale-up and eviction
show with few sessions and at most two workers. The tests run in order on the same pods: the first waits for
the first worker, the second makes the pool grow to its second; after that both stay (long scale-down delay).
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import yaml

from ardiff import client
from ardiff.devcluster.cluster import DevCluster, pod_pid
from ardiff.devcluster.faults import FaultInjector
from ardiff.devcluster.history import History
from ardiff.devcluster.network import short_pod_id
from ardiff.devcluster.pools import SHARED_TIER_CLAIM, build_pool, with_shared_tier
from ardiff.devcluster.tick_recorder import TickRecorder
from ardiff.devcluster.waiting import wait_until
from ardiff.wire import ServedBy
from tests.e2e.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

POOL = build_pool("world", capacity=1, min_replicas=1, max_replicas=2, fake=False)
WORKER_START_TIMEOUT = 300  # loading vllm-omni and the tiny model on two busy cores
HEIGHT = WIDTH = 64
FIRST_CHUNK_FRAMES, CHUNK_FRAMES = 9, 12  # LingBot's causal VAE: 1 + 4 * 2 frames, then 4 * 3
WALK = [client.hold("w"), client.camera("w", "wj", "j"), client.camera("d", "d", "wl")]


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("e2e-real")
    # Every worker mounts the same shared tier (a ReadWriteMany claim): evicted sessions are suspended there,
    # not dropped; a session whose pod dies resumes from its last snapshot.
    pool = with_shared_tier(POOL, snapshot_every_chunks=2)
    with running_stack(dev_cluster, "e2e-real", workdir, pool, claims=[SHARED_TIER_CLAIM]) as running:
        wait_until(lambda: running.ready_pods(), timeout=WORKER_START_TIMEOUT, what="the first worker pod")
        yield running


def ready(stack: Stack, name: str, **fields: Any) -> dict[str, Any]:
    """Wait for Ready (and the given status fields); the status."""
    return stack.sessions.wait_for(
        name,
        lambda s: s.get("phase") == "Ready" and all(s.get(k) == v for k, v in fields.items()),
        timeout=WORKER_START_TIMEOUT,
        what=f"Ready {fields or ''}".strip(),
    )


def assert_frames(chunk: client.Chunk, chunk_index: int) -> None:
    frames = FIRST_CHUNK_FRAMES if chunk_index == 0 else CHUNK_FRAMES
    assert chunk.frames.shape == (frames, HEIGHT, WIDTH, 3)
    assert chunk.frames.dtype == np.uint8
    assert chunk.frames.std() > 0  # a picture, not a constant
    assert chunk.metadata.chunk_index == chunk_index


def assert_consistent(stack: Stack, names: list[str]) -> None:
    """No slot leaked, nothing double-placed: Redis agrees with itself and with every session's status."""
    assert stack.invariants() == []
    records = stack.placement(lambda store: store.get_sessions(stack.pool_id, names))
    pods = {p.name: p for p in stack.placement(lambda store: store.list_pods(stack.pool_id))}
    for name in names:
        status = stack.sessions.status(name)
        assert records[name].pod == status["pod"], name
        assert records[name].pod_epoch == status["podEpoch"] == pods[status["pod"]].epoch, name
    assert sum(p.used for p in pods.values()) == len(names)


def placed_again(stack: Stack, name: str, epoch: int) -> dict[str, Any]:
    """Wait for the session Ready on another incarnation than `epoch`'s; its status."""

    def moved() -> dict[str, Any] | None:
        status = stack.sessions.status(name)
        return status if status.get("phase") == "Ready" and status.get("podEpoch") != epoch else None

    return wait_until(moved, timeout=WORKER_START_TIMEOUT, what=f"{name} placed again")


def ticked_into(history: History, stack: Stack, name: str) -> client.SessionClient:
    """A client of the session (closed after) that ticked it three times, every answer recorded in `history`;
    its endpoint, token and next chunk index."""
    with stack.connect(name) as session:
        session.http.event_hooks["response"].append(history.record)
        for _ in range(3):
            session.tick([client.hold("w")])
    return session


def back_as_new_incarnation(stack: Stack, pod: str, epoch: int) -> None:
    """Wait for `pod` registered again with a later epoch than `epoch` (fenced or killed, then restarted)."""

    def incarnation() -> int | None:
        pods = {p.name: p for p in stack.placement(lambda store: store.list_pods(stack.pool_id))}
        record = pods.get(pod)
        return record.epoch if record is not None and record.epoch > epoch else None

    wait_until(incarnation, timeout=WORKER_START_TIMEOUT, what=f"{pod} back as a new incarnation")


def test_apply_ready_and_ticks_return_frames(stack: Stack, tmp_path: Path) -> None:
    session = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionSession",
        "metadata": {"name": "first", "namespace": stack.namespace},
        "spec": {"poolRef": stack.pool, "prompt": "a lighthouse on a cliff at dusk", "seed": 7},
    }
    stack.created.append("first")
    stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(session))
    status = ready(stack, "first")
    assert status["pod"] in stack.ready_pods()
    with stack.connect("first") as first:
        for index, controls in enumerate(WALK):
            chunk = first.tick([controls], applied_event_ids=[2 * index + 1, 2 * index + 2])
            assert_frames(chunk, index)
            assert chunk.metadata.session_id == "first"
            assert chunk.metadata.applied_event_ids == (2 * index + 1, 2 * index + 2)
            assert chunk.metadata.request_id.startswith(f"first-{index}-")
            assert chunk.server_timing["forward"] > 0

    def listing_at_chunk_3() -> str | None:
        out = stack.kubectl("get", "ardiffusionsessions").stdout
        return out if " 3 " in out else None

    listed = wait_until(listing_at_chunk_3, timeout=15, what="kubectl get to show chunk 3")
    assert listed.split()[:6] == ["NAME", "PHASE", "POOL", "POD", "CHUNK", "AGE"]
    assert listed.split()[6:11] == ["first", "Ready", stack.pool, status["pod"], "3"]

    video = tmp_path / "first.mp4"
    command = [
        sys.executable,
        "-m",
        "ardiff.cli",
        "session",
        "tick",
        "first",
        "-n",
        stack.namespace,
        "--chunks",
        "2",
    ]
    command += ["--out", str(video), "--kubeconfig", str(stack.kube.kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "first chunk 3: 12 frames 64x64" in result.stdout
    assert "first chunk 4: 12 frames 64x64" in result.stdout
    with av.open(io.BytesIO(video.read_bytes())) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 2 * CHUNK_FRAMES
    assert decoded[0].shape == (HEIGHT, WIDTH, 3)


def test_capacity_reached_scales_up_and_new_sessions_land_on_the_new_pod(stack: Stack) -> None:
    before = stack.pods()
    assert len(before) == 1
    stack.session("filler")
    assert ready(stack, "filler")["pod"] in before
    stack.session("overflow")
    waiting = stack.sessions.wait_for(
        "overflow",
        lambda s: s.get("reason") in ("WaitingForCapacity", "PodStarting"),  # a second pod starts for it
        timeout=30,
        what="waiting for capacity",
    )
    assert waiting["phase"] == "Pending"
    status = ready(stack, "overflow")
    assert status["pod"] not in before
    assert set(stack.pods()) == {*before, status["pod"]}
    with stack.connect("overflow") as overflow:
        assert_frames(overflow.tick([client.hold("a")]), 0)
    assert_consistent(stack, ["filler", "overflow"])


def test_full_at_max_suspends_the_least_recently_ticked_session_and_resumes_it_bit_identical(
    stack: Stack,
) -> None:
    """Eviction suspends (issue 12): the victim's state goes to the shared tier instead of being dropped;
    a later tick resumes it and its frames equal an uninterrupted twin's (same seed, prompt, controls)."""
    walk = [client.hold("w"), client.camera("w", "wj", "j"), client.hold("d")]
    twin = stack.session("twin", prompt="a walk by the sea", seed=21)
    ready(stack, twin)
    with stack.connect(twin) as twin_client:
        expected = [twin_client.tick([controls]).frames for controls in walk]
    stack.sessions.delete(twin, wait=True)

    older = stack.session("older", prompt="a walk by the sea", seed=21)
    newer = stack.session("newer")
    older_pod, newer_pod = ready(stack, older)["pod"], ready(stack, newer)["pod"]
    assert older_pod != newer_pod
    with stack.connect(older) as older_client, stack.connect(newer) as newer_client:
        np.testing.assert_array_equal(older_client.tick([walk[0]]).frames, expected[0])
        newer_client.tick([client.hold("w")])  # `older` is now the least recently ticked

        stack.session("newcomer")
        assert ready(stack, "newcomer")["pod"] == older_pod
        suspended = stack.sessions.wait_for(
            older, lambda s: s.get("phase") == "Suspended", timeout=30, what="Suspended"
        )
        assert "newcomer" in suspended["message"]
        assert (suspended["tier"], suspended["suspendedChunk"]) == ("shared", 1)
        assert suspended["bytes"] > 0
        assert not suspended.get("pod")
        assert stack.sessions.status(newer)["phase"] == "Ready"
        assert_frames(newer_client.tick([client.hold("s")]), 1)  # the other session never noticed

        stack.sessions.delete("newcomer", wait=True)  # a slot frees up; `older` waits for a tick to resume
        assert stack.sessions.status(older)["phase"] == "Suspended"
        older_client.retry_seconds = 60
        for index, controls in enumerate(walk[1:], start=1):  # resuming (503) is retried, 421 followed
            chunk = older_client.tick([controls])
            assert chunk.metadata.chunk_index == index
            np.testing.assert_array_equal(chunk.frames, expected[index])  # bit-identical, no reset
    status = ready(stack, older)
    assert status["resetRequired"] is False
    reasons = {event.reason for event in stack.sessions.events(older)}
    assert {"Suspended", "Resumed"} <= reasons
    assert "Replaced" not in reasons
    assert_consistent(stack, [older, newer])


def test_deleting_a_session_closes_it_on_its_worker_and_frees_its_kv_blocks(stack: Stack) -> None:
    name = stack.session("brief")
    pod = ready(stack, name)["pod"]
    baseline = stack.worker(pod)["kv_blocks"]
    with stack.connect(name) as brief:
        brief.tick([client.hold("w")])
        brief.tick([client.hold("j")])
    during = stack.worker(pod)
    assert [(s["session_id"], s["resident"]) for s in during["sessions"]] == [(name, True)]
    assert during["kv_blocks"]["free"] < baseline["free"]

    stack.sessions.delete(name, wait=True)

    def closed() -> dict[str, Any] | None:
        view = stack.worker(pod)
        return view if not view["sessions"] else None

    after = wait_until(closed, timeout=30, what="the worker to close the session")
    assert after["kv_blocks"] == baseline
    assert after["admitted"] == 0
    assert stack.invariants() == []


def test_killing_a_worker_mid_session_resumes_its_session_from_a_snapshot_bit_identical(stack: Stack) -> None:
    """kill -9 of a worker while its session ticks: the session is placed again (on the restarted worker,
    the only free slot) and resumes from its last snapshot (every 2 chunks here) instead of starting over;
    the client is told `rewound` to the snapshot's chunk and its frames from there equal a twin's."""
    twin = stack.session("doomed-twin", prompt="a harbour at night", seed=31)
    ready(stack, twin)
    with stack.connect(twin) as twin_client:
        expected = [twin_client.tick([client.hold("w")]).frames for _ in range(6)]
    stack.sessions.delete(twin, wait=True)

    doomed = stack.session("doomed", prompt="a harbour at night", seed=31)
    bystander = stack.session("bystander")
    before = ready(stack, doomed)
    killed_pod, other_pod = before["pod"], ready(stack, bystander)["pod"]
    assert killed_pod != other_pod
    restarts_before = stack.restart_count(killed_pod)
    failures: list[BaseException] = []

    def keep_ticking(session: client.SessionClient) -> None:
        try:
            while True:
                session.tick([client.hold("w")])
        except client.WorkerUnreachable as exc:
            failures.append(exc)

    with stack.connect(doomed) as doomed_client, stack.connect(bystander) as bystander_client:
        bystander_client.tick([client.hold("d")])
        ticking = threading.Thread(target=keep_ticking, args=(doomed_client,))
        ticking.start()
        wait_until(lambda: doomed_client.next_chunk_index >= 3, timeout=60, what="a snapshot or two")
        stack.kill(killed_pod, signal.SIGKILL)
        killed_at = time.monotonic()
        ticking.join(60)
        assert [type(f) for f in failures] == [client.WorkerUnreachable]
        reached = doomed_client.next_chunk_index

        status = placed_again(stack, doomed, before["podEpoch"])
        print(f"kill -9 -> placed again and Ready: {time.monotonic() - killed_at:.1f}s")
        assert status["pod"] == killed_pod  # the only free slot: the restarted worker's, with a new epoch
        assert status["resetRequired"] is False  # it has a snapshot
        assert "Lost" in {event.reason for event in stack.sessions.events(doomed)}

        resumed_at = None
        try:
            chunk = doomed_client.tick([client.hold("w")])
        except client.Rewound as rewound:  # chunks past the snapshot died with the pod
            resumed_at = rewound.expected_chunk_index
            assert resumed_at < reached
            assert doomed_client.next_chunk_index == resumed_at
            chunk = doomed_client.tick([client.hold("w")])
        while True:
            index = chunk.metadata.chunk_index
            np.testing.assert_array_equal(chunk.frames, expected[index])  # bit-identical to the twin
            if index == len(expected) - 1:
                break
            chunk = doomed_client.tick([client.hold("w")])
        print(f"resumed at chunk {resumed_at if resumed_at is not None else reached} (had reached {reached})")
        assert_frames(bystander_client.tick([client.hold("d")]), 1)  # the other pod's session kept its KV
    assert stack.restart_count(killed_pod) == restarts_before + 1
    assert_consistent(stack, [doomed, bystander])


def test_a_worker_cut_off_from_redis_past_its_lease_loses_its_session_to_another_pod_and_serves_it_no_more(
    stack: Stack, tmp_path: Path
) -> None:
    """A partition, not a crash (issue 40): the worker's Pod keeps running and its clients reach it, but its
    packets to Redis vanish. It answers the session's ticks only with retryable 503s (it cannot check the
    placement); its lease lapses, the operator places the session again on the other pod from its snapshot,
    and a client that reads the status again ticks on there. Healed, the cut-off pod's heartbeat is fenced
    (before: it re-created its record with the old epoch, still holding the session's stale KV), its worker
    restarts as a new incarnation holding none of the session, and sends callers to the new pod. (A client
    kept on the old address retries its 503s until its `retry_seconds`; only the front door follows the move
    by itself.)"""
    assert stack.kube.network is not None
    network = stack.kube.network
    wait_until(lambda: len(stack.ready_pods()) == 2, timeout=WORKER_START_TIMEOUT, what="both workers Ready")
    name = stack.session("cut-off", seed=41)
    before = ready(stack, name)
    cut_pod = before["pod"]
    restarts = stack.restart_count(cut_pod)
    namespace = network.pod_namespace(short_pod_id(stack.pods()[cut_pod]["metadata"]["uid"]))
    faults = FaultInjector(tmp_path / "faults.jsonl")
    history = History()  # every answer of the session's routes, checked at the end
    session = ticked_into(history, stack, name)
    old_incarnation = ServedBy(cut_pod, before["podEpoch"])
    at_old_pod = f"{session.endpoint}/v1/sessions/{name}/ticks"
    headers = {"Authorization": f"Bearer {session.token}"}
    with httpx.Client(headers=headers, timeout=30, event_hooks={"response": [history.record]}) as old:

        def tick_old_pod() -> httpx.Response:
            chunk = session.next_chunk_index
            body = {"request_id": f"old-{chunk}", "chunk_index": chunk, "controls": [client.hold("w")]}
            return old.post(at_old_pod, json=body)

        with faults.partition(namespace, network.host_ip, stack.redis.port):
            cut_at = time.monotonic()
            assert tick_old_pod().status_code == 503  # its placement cannot be checked: never a 200
            status = placed_again(stack, name, before["podEpoch"])
            assert status["pod"] != cut_pod  # its pod is cut off: the other one took it
            assert status["resetRequired"] is False  # from its snapshot
            assert tick_old_pod().status_code == 503
            with stack.connect(name) as moved:
                moved.http.event_hooks["response"].append(history.record)
                assert moved.endpoint != session.endpoint
                assert_frames(moved.tick([client.hold("w")]), moved.next_chunk_index - 1)
            assert faults.faults == []  # still cut
        (fault,) = faults.faults
        assert fault.kind == "partition"

        def answered() -> httpx.Response | None:
            try:
                response = tick_old_pod()
            except httpx.TransportError:  # fenced on healing: its worker restarts
                return None
            return response if response.status_code != 503 else None

        healed = wait_until(answered, timeout=WORKER_START_TIMEOUT, what="the healed pod answering")
        assert healed.status_code == 421, healed.text  # sent on to the session's pod

        # Its next heartbeat is fenced: the worker stops and its kubelet starts it again, as a new epoch.
        back_as_new_incarnation(stack, cut_pod, before["podEpoch"])
        wait_until(lambda: cut_pod in stack.ready_pods(), timeout=WORKER_START_TIMEOUT, what="it Ready")
        assert stack.restart_count(cut_pod) == restarts + 1
        assert name not in {s["session_id"] for s in stack.worker(cut_pod)["sessions"]}
        again = answered()
        assert again is not None
        assert again.status_code == 421
    assert_consistent(stack, [name])
    # The history (issue 40 item 3): the cut-off incarnation answered, but never with a chunk once cut, and
    # the session's chunks form one line across the two pods.
    assert history.violations(stale={old_incarnation: cut_at}) == []
    by_old = {
        (a.status, a.code) for a in history.answers if a.served_by == old_incarnation and a.sent >= cut_at
    }
    assert (503, "not_ready") in by_old
    assert {a.served_by for a in history.answers if a.status == 200} == {
        old_incarnation,
        ServedBy(status["pod"], status["podEpoch"]),
    }


def test_a_worker_paused_past_its_lease_answers_nothing_of_its_old_incarnation_when_it_wakes(
    stack: Stack, tmp_path: Path
) -> None:
    """A pause, not a partition (issue 40: a stalled node, a long GC): the worker's process stops (SIGSTOP)
    and everything it would do waits — its heartbeat, its answers. A tick sent to it meanwhile waits in its
    socket. Its lease lapses, the operator places the session again on the other pod from its snapshot and the
    session ticks on there. Resumed (SIGCONT), the worker answers the tick that waited with 421 (the store
    names the new pod) or, fenced by its first heartbeat, refuses it or hangs up — never a chunk of its old
    incarnation; its kubelet starts it again as a new epoch holding none of the session."""
    wait_until(lambda: len(stack.ready_pods()) == 2, timeout=WORKER_START_TIMEOUT, what="both workers Ready")
    name = stack.session("paused", seed=43)
    before = ready(stack, name)
    paused_pod = before["pod"]
    restarts = stack.restart_count(paused_pod)
    pid = pod_pid(stack.pods()[paused_pod])
    assert pid is not None
    faults = FaultInjector(tmp_path / "faults.jsonl")
    history = History()
    session = ticked_into(history, stack, name)
    old_incarnation = ServedBy(paused_pod, before["podEpoch"])
    at_old_pod = f"{session.endpoint}/v1/sessions/{name}/ticks"
    headers = {"Authorization": f"Bearer {session.token}"}
    answers: list[httpx.Response | httpx.TransportError] = []
    with httpx.Client(
        headers=headers, timeout=WORKER_START_TIMEOUT, event_hooks={"response": [history.record]}
    ) as old:

        def tick_old_pod() -> None:
            chunk = session.next_chunk_index
            body = {"request_id": f"old-{chunk}", "chunk_index": chunk, "controls": [client.hold("w")]}
            try:
                answers.append(old.post(at_old_pod, json=body))
            except httpx.TransportError as exc:  # woken, fenced and gone before it answered
                answers.append(exc)

        waiting = threading.Thread(target=tick_old_pod, daemon=True)
        with faults.paused(pid, f"pod {paused_pod}"):
            paused_at = time.monotonic()
            waiting.start()  # sent to the stopped process: it waits in the socket
            # Woken as soon as that happened: past ~25 s its kubelet's liveness probe would restart it.
            status = placed_again(stack, name, before["podEpoch"])
            print(f"pause -> placed again and Ready: {time.monotonic() - paused_at:.1f}s")
            assert answers == []  # the paused worker answered nothing
        assert status["pod"] != paused_pod
        assert status["resetRequired"] is False  # from its snapshot
        waiting.join(timeout=60)
        (woken,) = answers
        # Sent on to the session's new pod (421), or refused as the fenced worker stops: never a chunk.
        if isinstance(woken, httpx.Response):
            assert woken.status_code in (421, 503), woken.text
            assert woken.json()["error"]["code"] in ("misdirected", "not_ready", "placement_recovering"), (
                woken.text
            )
        with stack.connect(name) as moved:
            moved.http.event_hooks["response"].append(history.record)
            assert moved.endpoint != session.endpoint
            assert_frames(moved.tick([client.hold("w")]), moved.next_chunk_index - 1)

        back_as_new_incarnation(stack, paused_pod, before["podEpoch"])
        wait_until(lambda: paused_pod in stack.ready_pods(), timeout=WORKER_START_TIMEOUT, what="it Ready")
        assert stack.restart_count(paused_pod) == restarts + 1
        assert name not in {s["session_id"] for s in stack.worker(paused_pod)["sessions"]}
    (fault,) = faults.faults
    assert fault.kind == "pause"
    assert_consistent(stack, [name])
    assert history.violations(stale={old_incarnation: paused_at}) == []
    assert {a.served_by for a in history.answers if a.status == 200} == {
        old_incarnation,
        ServedBy(status["pod"], status["podEpoch"]),
    }


def test_operator_restart_and_redis_losing_its_data_converge(stack: Stack) -> None:
    names = [stack.session("steady-a"), stack.session("steady-b")]
    bindings = {name: (s["pod"], s["podEpoch"]) for name in names for s in [ready(stack, name)]}
    clients = {name: stack.connect(name) for name in names}
    try:
        for session in clients.values():
            session.tick([client.hold("w")])

        stack.operator.stop(signal.SIGKILL)  # a crash
        stack.operator.start().wait_ready()
        time.sleep(2)  # a few reconcile rounds
        for name, session in clients.items():
            status = stack.sessions.status(name)
            assert (status["phase"], status["pod"], status["podEpoch"]) == ("Ready", *bindings[name])
            assert_frames(session.tick([client.hold("w")]), 1)
        assert_consistent(stack, names)

        stack.operator.stop()
        stack.redis.restart()  # same port, every key lost
        assert stack.placement(lambda store: store.get_sessions(stack.pool_id, names)) == {}
        stack.operator.start().wait_ready()

        def converged() -> bool:
            records = stack.placement(lambda store: store.get_sessions(stack.pool_id, names))
            placed = all(r.state == "placed" for r in records.values())
            return len(records) == len(names) and placed and stack.invariants() == []

        wait_until(converged, timeout=60, what="the placements rebuilt from the statuses")
        for name, session in clients.items():
            status = stack.sessions.status(name)
            assert (status["phase"], status["pod"], status["podEpoch"]) == ("Ready", *bindings[name])
            assert status["resetRequired"] is False
            assert_frames(session.tick([client.hold("a")]), 2)  # the KV never left the workers
        assert_consistent(stack, names)
    finally:
        for session in clients.values():
            session.http.close()


RETRYABLE = {(503, "placement_recovering"), (503, "not_ready")}


def test_while_redis_restarts_empty_ticks_are_only_told_to_retry(stack: Stack) -> None:
    """Redis killed (-9) and back empty under ticking sessions, then again with the operator killed at the
    same moment: every answer until the bindings are rebuilt is a retryable 503, then each session goes on at
    its next chunk with its KV; the Python client rides it out without the caller doing anything."""
    names = [stack.session("ride-a"), stack.session("ride-b")]
    bindings = {name: (s["pod"], s["podEpoch"]) for name in names for s in [ready(stack, name)]}
    clients = {name: stack.connect(name) for name in names}
    try:
        for session in clients.values():
            session.tick([client.hold("w")])
        clients["ride-b"].retry_seconds = 120  # rides out the operator's restart below
        recorder = TickRecorder(clients["ride-a"])
        recorder.start()
        wait_until(lambda: recorder.first_success_since(0), timeout=60, what="ride-a ticking")

        # 1. Redis alone: the operator rebuilds the bindings within a round. The window runs from the moment
        # Redis is back, empty (as benchmarks/e2e.py measures it): a tick sent before the kill may succeed.
        stack.redis.restart(signal.SIGKILL)
        crashed = time.monotonic()
        wait_until(lambda: recorder.first_success_since(crashed), timeout=60, what="ride-a ticking again")
        alone = recorder.first_success_since(crashed).sent - crashed
        late = clients["ride-b"].tick([client.hold("d")])  # the client retries whatever is retryable
        assert late.metadata.chunk_index == 1

        # 2. Redis and the operator together: recovery waits for the new operator.
        stack.operator.stop(signal.SIGKILL)
        stack.redis.restart(signal.SIGKILL)
        crashed = time.monotonic()
        ticked: list[client.Chunk] = []
        rider = threading.Thread(target=lambda: ticked.append(clients["ride-b"].tick([client.hold("a")])))
        rider.start()
        time.sleep(3)  # the operator stays down
        stack.operator.start().wait_ready()
        wait_until(lambda: recorder.first_success_since(crashed), timeout=60, what="ride-a ticking again")
        with_operator = recorder.first_success_since(crashed).sent - crashed
        rider.join(timeout=120)
        recorder.stop()

        answers = recorder.since(0)
        refused = [(a.status, a.code) for a in answers if a.status != 200]
        assert set(refused) <= RETRYABLE, refused
        assert (
            503,
            "placement_recovering",
        ) in refused  # the window was exercised (the operator was down 3 s)
        assert with_operator >= 3
        indexes = [a.chunk_index for a in answers if a.status == 200]
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes)))  # never a reset, never a gap
        assert recorder.history.violations() == []  # one incarnation, one line, every 5xx with its code
        assert {a.served_by for a in answers if a.status == 200} == {ServedBy(*bindings["ride-a"])}
        assert [chunk.metadata.chunk_index for chunk in ticked] == [2]
        print(
            f"\nstore recovery window (restart -> first 200): Redis alone {alone:.2f} s, "
            f"Redis + operator {with_operator:.2f} s (operator down 3 s); {len(refused)} retryable answers"
        )
        for name in names:
            status = stack.sessions.status(name)
            assert (status["phase"], status["pod"], status["podEpoch"]) == ("Ready", *bindings[name])
            assert status["resetRequired"] is False
        wait_until(lambda: stack.invariants() == [], timeout=30, what="consistent placements")
    finally:
        for session in clients.values():
            session.http.close()


HOSTILE_TICKS: list[tuple[str, dict[str, Any], int, str]] = [
    (
        "malformed JSON",
        {"content": b"{not json", "headers": {"content-type": "application/json"}},
        400,
        "invalid_tick",
    ),
    ("binary garbage", {"content": bytes(range(256)) * 4}, 400, "invalid_tick"),
    ("a list body", {"json": []}, 400, "invalid_tick"),
    ("empty request id", {"json": {"request_id": "", "chunk_index": 1}}, 400, "invalid_tick"),
    ("negative chunk", {"json": {"request_id": "r", "chunk_index": -1}}, 400, "invalid_tick"),
    ("chunk as text", {"json": {"request_id": "r", "chunk_index": "1"}}, 400, "invalid_tick"),
    # A valid index, only not the next one.
    ("huge chunk", {"json": {"request_id": "r", "chunk_index": 10**30}}, 409, "chunk_out_of_order"),
    ("unknown field", {"json": {"request_id": "r", "chunk_index": 1, "rm -rf": True}}, 400, "invalid_tick"),
    (
        "unknown camera key",
        {
            "json": {
                "request_id": "r",
                "chunk_index": 1,
                "controls": [{**client.hold("w"), "data": {"mode": "frames", "frames": [["x"], [], []]}}],
            }
        },
        400,
        "invalid_tick",
    ),
    (
        "two camera frames",
        {
            "json": {
                "request_id": "r",
                "chunk_index": 1,
                "controls": [{**client.hold("w"), "data": {"mode": "frames", "frames": [["w"], []]}}],
            }
        },
        400,
        "invalid_tick",
    ),
    (
        "a 2 MiB prompt",
        {"json": {"request_id": "r", "chunk_index": 1, "prompt": "x" * (2 << 20)}},
        413,
        "body_too_large",
    ),
    ("out of order", {"json": {"request_id": "r", "chunk_index": 7}}, 409, "chunk_out_of_order"),
    ("no token", {"json": {"request_id": "r", "chunk_index": 1}, "token": None}, 401, "unauthorized"),
    ("wrong token", {"json": {"request_id": "r", "chunk_index": 1}, "token": "forged"}, 401, "unauthorized"),
    (
        "basic auth",
        {"json": {"request_id": "r", "chunk_index": 1}, "headers": {"authorization": "Basic eDp5"}},
        401,
        "unauthorized",
    ),
    (  # an unknown id is answered as a wrong token is: which names exist is never told (contracts §4)
        "unknown session",
        {"json": {"request_id": "r", "chunk_index": 0}, "session": "nobody"},
        401,
        "unauthorized",
    ),
    (
        "overlong session id",
        {"json": {"request_id": "r", "chunk_index": 0}, "session": "a" * 300},
        401,
        "unauthorized",
    ),
    (
        "path traversal",  # no route matches: the router's own 404, in the same envelope
        {"json": {"request_id": "r", "chunk_index": 0}, "session": "..%2F..%2Fhealthz"},
        404,
        "not_found",
    ),
]

HOSTILE_SESSIONS: list[tuple[str, dict[str, Any], str]] = [
    ("negative seed", {"poolRef": "world", "prompt": "x", "seed": -1}, "spec.seed"),
    ("priority out of range", {"poolRef": "world", "prompt": "x", "priority": 5000}, "spec.priority"),
    (
        "unknown eviction policy",
        {"poolRef": "world", "prompt": "x", "evictionPolicy": "Sometimes"},
        "spec.evictionPolicy",
    ),
    ("no pool", {"prompt": "x"}, "spec.poolRef"),
    ("pool as a number", {"poolRef": 42, "prompt": "x"}, "spec.poolRef"),
    ("zero max chunks", {"poolRef": "world", "prompt": "x", "maxChunks": 0}, "spec.maxChunks"),
    (
        "image from both sources",
        {
            "poolRef": "world",
            "prompt": "x",
            "image": {
                "configMapKeyRef": {"name": "a", "key": "b"},
                "secretKeyRef": {"name": "a", "key": "b"},
            },
        },
        "spec.image",
    ),
]


def test_hostile_input_gets_4xx_and_leaves_other_sessions_alone(stack: Stack) -> None:
    target, bystander = stack.session("target"), stack.session("onlooker")
    ready(stack, target)
    ready(stack, bystander)
    token = stack.sessions.token(target)
    with stack.connect(target) as target_client, stack.connect(bystander) as bystander_client:
        target_client.tick([client.hold("w")])
        bystander_client.tick([client.hold("w")])
        with httpx.Client(timeout=60) as http:
            for label, case, status, code in HOSTILE_TICKS:
                request = dict(case)
                session = request.pop("session", target)
                presented = request.pop("token", token)
                headers = {
                    **({"authorization": f"Bearer {presented}"} if presented else {}),
                    **request.pop("headers", {}),
                }
                response = http.post(
                    f"{target_client.endpoint}/v1/sessions/{session}/ticks", headers=headers, **request
                )
                assert (response.status_code, label) == (status, label), response.text
                error = response.json()["error"]
                assert error["code"] == code, label
                assert "Traceback" not in response.text
            assert http.get(f"{target_client.endpoint}/healthz").status_code == 200

        for label, spec, field in HOSTILE_SESSIONS:
            manifest = {
                "apiVersion": "ardiffusion.dev/v1alpha1",
                "kind": "ARDiffusionSession",
                "metadata": {"name": "hostile", "namespace": stack.namespace},
                "spec": spec,
            }
            refused = stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
            assert refused.returncode != 0, label
            assert "is invalid" in refused.stderr, (label, refused.stderr)
            assert field in refused.stderr, (label, refused.stderr)
        assert stack.kubectl("get", "adsession", "hostile", check=False).returncode != 0

        # Nothing of the above reached a forward, closed a session, or cost a slot.
        assert_frames(target_client.tick([client.hold("w")]), 1)
        assert_frames(bystander_client.tick([client.hold("w")]), 1)
    assert_consistent(stack, [target, bystander])
