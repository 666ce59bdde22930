"""Forks and rewinds with real workers (issue 26): the tiny LingBot-World on vllm-omni's paged-KV runner on
CPU, placed by the real operator through real Redis on the dev cluster, driven by the client and the CLI.

Five pods of 2 slots (the tiny runner's): a parent and its 8 forks fill 9 of them, so one fork lands on the
parent's pod (its kept chunk read in place) and the others on the other pods (pulled from the parent's pod).
The 8 forks tick together with 8 different controls and every chunk equals the one of a twin: a fresh session
of the parent's seed and prompt ticked through the parent's controls and then the fork's. A rewind through
the client (and the CLI) puts a session back at a kept chunk, and the chunks from there equal the ones first
generated.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pytest

from ardiff import client
from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.pools import build_pool
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

T = TypeVar("T")
CAPACITY, PODS = 2, 5  # the tiny runner's resident capacity; 10 slots for the parent, 8 forks (or twins)
POOL = build_pool("forks", capacity=CAPACITY, min_replicas=PODS, max_replicas=PODS, fake=False)
WORKER_START_TIMEOUT = 300  # loading vllm-omni and the tiny model on two busy cores
PROMPT, SEED = "a stone bridge over a river", 17
TRUNK = [client.hold("w"), client.camera("w", "wj", "j"), client.hold("d")]  # the parent's chunks 0..2
AT = len(TRUNK)  # the forks start at kept chunk 3: the parent's state after its chunks 0..2
BRANCH_KEYS = "wasdijkl"  # fork i holds BRANCH_KEYS[i] on each of its chunks
BRANCH_CHUNKS = 2


@pytest.fixture(scope="module")
def stack(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(dev_cluster, "e2e-fork", tmp_path_factory.mktemp("e2e-fork"), POOL) as running:
        wait_until(
            lambda: len(running.ready_pods()) == PODS, timeout=3 * WORKER_START_TIMEOUT, what="the workers"
        )
        yield running


def together(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run the jobs at once (one thread each); their results in order."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [future.result() for future in [pool.submit(job) for job in jobs]]


def play(stack: Stack, name: str, controls: Sequence[dict[str, Any]], first: int) -> list[np.ndarray]:
    """Tick `name` once per control from its chunk `first`; the frames."""
    with stack.connect(name, timeout=WORKER_START_TIMEOUT) as session:
        assert session.next_chunk_index == first, name
        chunks = [session.tick([c]) for c in controls]
    assert [c.metadata.chunk_index for c in chunks] == list(range(first, first + len(controls)))
    return [chunk.frames for chunk in chunks]


def branch(index: int) -> list[dict[str, Any]]:
    return [client.hold(BRANCH_KEYS[index])] * BRANCH_CHUNKS


def test_eight_forks_ticking_together_equal_eight_twins(stack: Stack) -> None:
    parent = stack.session("trunk", prompt=PROMPT, seed=SEED, keep_chunks=4)
    trunk = play(stack, parent, TRUNK, 0)
    parent_pod = stack.sessions.wait_ready(parent)["pod"]
    wait_until(
        lambda: AT in (stack.sessions.status(parent).get("keptChunks") or []), timeout=30, what="chunk 3 kept"
    )
    # One fork through the CLI, seven through the client.
    forks = [f"trunk-f{i}" for i in range(len(BRANCH_KEYS))]
    command = [sys.executable, "-m", "ardiff.cli", "session", "fork", parent, forks[0], "--at", str(AT)]
    command += ["-n", stack.namespace, "--kubeconfig", str(stack.kube.kubeconfig), "--timeout", "240"]
    stack.created.append(forks[0])
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert f"{forks[0]}: forked from {parent}, Ready on " in result.stdout
    for name in forks[1:]:
        stack.sessions.fork(parent, name, at=AT)
        stack.created.append(name)
    pods = [stack.sessions.wait_ready(name, timeout=WORKER_START_TIMEOUT)["pod"] for name in forks]
    # The parent's pod takes forks while it has slots; the rest pull the kept chunk from it.
    assert pods.count(parent_pod) == CAPACITY - 1, pods
    assert len(set(pods)) >= 2, pods
    for name in forks:
        spec = stack.sessions.get(name)["spec"]
        assert spec["forkFrom"] == {"session": parent, "chunk": AT}
        assert "ownerReferences" not in stack.sessions.get(name)["metadata"]

    branches = together(
        [lambda i=i, name=name: play(stack, name, branch(i), AT) for i, name in enumerate(forks)]
    )
    # The parent is untouched: it goes on at its chunk 3.
    assert len(play(stack, parent, [client.hold("s")], AT)) == 1
    for name in forks:
        stack.sessions.delete(name)
    for name in forks:
        stack.sessions.delete(name, wait=True, timeout=60)

    twins = [f"twin-{i}" for i in range(len(BRANCH_KEYS))]
    for name in twins:
        stack.session(name, prompt=PROMPT, seed=SEED)
    replays = together(
        [lambda i=i, name=name: play(stack, name, TRUNK + branch(i), 0) for i, name in enumerate(twins)]
    )
    for i, replay in enumerate(replays):
        for chunk, (frames, expected) in enumerate(zip(trunk, replay[:AT], strict=True)):
            np.testing.assert_array_equal(frames, expected, err_msg=f"twin {i} chunk {chunk} (the trunk)")
        for chunk, (frames, expected) in enumerate(zip(branches[i], replay[AT:], strict=True), start=AT):
            np.testing.assert_array_equal(frames, expected, err_msg=f"fork {i} chunk {chunk}")
    # Different controls made different worlds: the comparison could fail.
    assert not np.array_equal(branches[0][0], branches[1][0])
    assert stack.invariants() == []


def test_a_rewind_through_the_client_and_the_cli_regenerates_the_same_chunks(stack: Stack) -> None:
    walk = [
        client.hold("w"),
        client.hold("j"),
        client.camera("w", "wl", "l"),
        client.hold("a"),
        client.hold("s"),
    ]
    name = stack.session("rewound", prompt=PROMPT, seed=SEED, keep_chunks=3)
    with stack.connect(name, timeout=WORKER_START_TIMEOUT) as session:
        first = [session.tick([c]).frames for c in walk]  # chunks 0..4: kept 3, 4, 5
        rewind = session.rewind(3)
        assert rewind == client.Rewind(session=name, chunk_index=3, kept_chunks=(3,))
        assert session.next_chunk_index == 3
        again = [session.tick([c]) for c in walk[3:]]
        assert [c.metadata.chunk_index for c in again] == [3, 4]
        for chunk, expected in zip(again, first[3:], strict=True):
            np.testing.assert_array_equal(chunk.frames, expected)  # bit-identical from the kept chunk
        with pytest.raises(client.ChunkNotKept) as refused:
            session.rewind(1)
        assert refused.value.kept_chunks == (3, 4, 5)
        assert session.next_chunk_index == 5  # nothing moved
        assert session.describe()["next_chunk_index"] == 5

    command = [sys.executable, "-m", "ardiff.cli", "session", "rewind", name, "4", "-n", stack.namespace]
    command += ["--kubeconfig", str(stack.kube.kubeconfig)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{name}: rewound, its next chunk is 4 (kept chunks: 3, 4)"
    with stack.connect(name) as session:
        assert session.next_chunk_index == 4
        np.testing.assert_array_equal(session.tick([walk[4]]).frames, first[4])
    wait_until(
        lambda: stack.sessions.status(name).get("chunkIndex") == 5, timeout=30, what="chunkIndex 5 mirrored"
    )

    command[6] = "1"  # not kept: one line, no traceback
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("error: chunk_not_kept: "), result.stderr
    assert "Traceback" not in result.stderr
