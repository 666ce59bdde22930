"""`ardiff demo` (what `make demo` runs) end to end, as a user runs it: from another directory, with the
repository's examples/, two chunks per session to keep it short. It must print the pool's capacity plan,
bring the three sessions to Ready on two Pods, show each pod's registered capacity next to the plan, write one
playable MP4 per session, print the table and kubectl's columns, and leave no process. The robot session
(examples/robot-*.yaml, the tiny DreamZero) is ticked twice beside them and its actions printed."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from ardiff.devcluster.demo import say
from ardiff.devcluster.kubeconfig import credentials_from_kubeconfig
from ardiff.devcluster.network import ClusterNetwork
from ardiff.devcluster.waiting import wait_until
from tests.e2e.conftest import REPO, restore_default_sigint

pytestmark = pytest.mark.slow

SESSIONS = ("forest-walk", "desert-drive", "harbor-flight")
DEMO_TIMEOUT = 480  # the demo's own target is ~3 min after setup on two cores (+ the robot session)


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (every process the demo started inherits it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker.encode() in environ and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def demo_slot_left(cwd: Path) -> list[str]:
    """The network namespaces left of the slot the demo's cluster used (its kubeconfig names the API server's
    address, 10.(100+slot).0.2)."""
    server = credentials_from_kubeconfig(cwd / ".ardiff-dev" / "demo" / "kubeconfig").server
    return ClusterNetwork(int(server.split("//")[1].split(".")[1]) - 100).owned_namespaces()


def test_demo_runs_the_examples_and_writes_a_video_per_session(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    env = {**os.environ, "ARDIFF_DEMO_TEST": token}
    command = [
        sys.executable,
        "-m",
        "ardiff.cli",
        "demo",
        "--examples",
        str(REPO / "examples"),
        "--chunks",
        "2",
    ]
    result = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT, check=False
    )
    out = result.stdout
    assert result.returncode == 0, f"{out[-4000:]}\n{result.stderr[-4000:]}"

    # The capacity plan of the pool, before anything is applied: what `ardiff kv explain` says for its pods
    # (the worker's CPU "free memory" default, the pool's kv.gpuMemoryFraction and kv.sessionCapacity).
    explain = ["tiny-lingbot-64x64", "--gpu-memory-gib", "8", "--fraction", "0.9", "--session-capacity", "2"]
    planned = subprocess.run(
        [sys.executable, "-m", "ardiff.cli", "kv", "explain", *explain],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    before, applied = out.split("$ kubectl apply", 1)
    header, *plan = before.split("KV capacity plan for one pod of pool tiny-world (", 1)[1].splitlines()
    assert header.startswith(f"ardiff kv explain {' '.join(explain)};")
    assert [line.strip() for line in plan[: len(planned.splitlines())]] == planned.splitlines()
    assert "  sessions per pod: 2 (binding limit: pipeline_session_capacity)" in plan
    # Once the pods are up: each pod's registered capacity next to the planned one, and its KV blocks.
    capacities = applied.split("capacity per pod, registered vs planned\n", 1)[1]
    capacities = capacities.split("all 4 sessions", 1)[0]
    rows = re.findall(r"^(tiny-world-\w{5})\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)$", capacities, re.MULTILINE)
    assert len(rows) == 2, capacities
    for _, registered, planned_sessions, free, total in rows:
        assert (registered, planned_sessions) == ("2", "2")
        assert 0 < int(free) <= int(total)

    assert re.search(r"^\[\s*\d+\.\d+s\] .*\bforest-walk: Pending", out, flags=re.MULTILINE)
    assert "pool tiny-world: 2/2 pods ready" in out  # the third session made the pool grow
    assert "all 4 sessions Ready; ticking 2 chunks each (2 for the robot sessions: robot-arm)" in out
    # Every session ticks through the front door (issue 37): the chart's gateway NodePort, its status.url.
    front_door = re.search(r"^the front door: (http://[\d.]+:\d+) ", out, re.MULTILINE)
    assert front_door is not None, out
    for name in SESSIONS:
        assert f"  {name}: {front_door.group(1)}/pools/default/tiny-world\n" in out
    # The robot session (examples/robot-*.yaml: the tiny DreamZero) beside them: its action chunks.
    robot = re.findall(
        r"^  robot-arm chunk (\d): actions \[24, 8\] in \d+ ms; step 0: \[([-+]\d+\.\d{3}, ){4}\.\.\.\]$",
        out,
        re.MULTILINE,
    )
    assert [chunk for chunk, _ in robot] == ["0", "1"], out
    assert re.search(
        r"^robot session robot-arm on tiny-robot-\w{5}: 2 action chunks of \[24, 8\], mean tick \d+ ms$",
        out,
        re.MULTILINE,
    )
    table = out.split("\nsession ", 1)[1].split("$ kubectl", 1)[0]  # the results table
    pods = set()
    for name in SESSIONS:
        row = re.search(
            rf"^{name}\s+(tiny-world-\w{{5}})\s+2\s+21\s+\d+\s+[\d.]+\s+(\S+\.mp4)$", table, re.MULTILINE
        )
        assert row is not None, table
        pods.add(row.group(1))
        video = Path(row.group(2))
        assert video == tmp_path / "demo-out" / f"{name}.mp4"
        with av.open(io.BytesIO(video.read_bytes())) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        assert len(frames) == 9 + 12
        assert frames[0].shape == (64, 64, 3)
        strip = np.asarray(Image.open(video.with_suffix(".png")))
        assert strip.shape == (64, 8 * 64, 3)  # 8 frames along the video, side by side
        assert str(video.with_suffix(".png")) in out.split("frame strips: ", 1)[1]
    assert len(pods) == 2

    listing = out.split("$ kubectl get ardiffusionsessions\n", 1)[1].split("$ kubectl", 1)[0].splitlines()
    assert listing[0].split() == ["NAME", "PHASE", "POOL", "POD", "CHUNK", "AGE"]
    assert sorted(line.split()[:3] + line.split()[4:5] for line in listing[1:]) == sorted(
        [[name, "Ready", "tiny-world", "2"] for name in SESSIONS]
        + [["robot-arm", "Ready", "tiny-robot", "2"]]
    )
    assert "done in" in out
    # The chart's operator ran as a Pod: its container's output is where the kubelet keeps it.
    [operator_log] = (tmp_path / ".ardiff-dev" / "demo" / "nodes").glob(
        "*/pods/default_ardiff-operator-0_*/logs/operator/0.log"
    )
    assert "operator started" in operator_log.read_text()
    assert processes_with(f"ARDIFF_DEMO_TEST={token}") == []
    assert demo_slot_left(tmp_path) == []  # every namespace the demo's cluster made is gone


def test_ctrl_c_tears_the_demo_down(tmp_path: Path) -> None:
    """Ctrl-C while the workers load: the terminal's SIGINT reaches the demo's whole process group."""
    token = uuid.uuid4().hex
    env = {**os.environ, "ARDIFF_DEMO_TEST": token}
    command = [sys.executable, "-m", "ardiff.cli", "demo", "--examples", str(REPO / "examples")]
    demo = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job
        # and SIGINT at its default, as in a terminal: a test runner started in the background of a
        # non-interactive shell ignores SIGINT, and the demo would inherit that.
        preexec_fn=restore_default_sigint,
    )
    try:
        assert demo.stdout is not None
        seen = []
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("["):  # the first progress line: the sessions exist, worker Pods are starting
                break
        # The control plane, the kubelets and the provisioner (they inherit the demo's environment; the Pods'
        # processes get only theirs), besides the demo itself.
        wait_until(
            lambda: len(set(processes_with(f"ARDIFF_DEMO_TEST={token}")) - {demo.pid}) >= 7,
            timeout=60,
            what="the demo's cluster processes",
        )
        os.killpg(demo.pid, signal.SIGINT)
        rest, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, "".join(seen) + rest
    assert "Traceback" not in rest
    assert not (tmp_path / "demo-out").exists() or not any((tmp_path / "demo-out").iterdir())
    assert processes_with(f"ARDIFF_DEMO_TEST={token}") == []
    assert demo_slot_left(tmp_path) == []  # the worker Pods' namespaces (and processes) went too


class SwitchingStream(io.StringIO):
    """An output whose every write lets the other threads run, as a pipe's write may."""

    def write(self, text: str) -> int:
        written = super().write(text)
        time.sleep(0.0005)
        return written


def test_the_ticking_threads_lines_stay_whole() -> None:
    """The sessions' ticks print from threads sharing one output (CI saw one session's URL line broken by
    another thread's between its text and its end of line, as print() writes the two separately)."""
    out = SwitchingStream()
    lines = {f"  session-{t}: line {i}" for t in range(4) for i in range(25)}

    def say_all(thread: int) -> None:
        for i in range(25):
            say(out, f"  session-{thread}: line {i}")

    threads = [threading.Thread(target=say_all, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert out.getvalue().endswith("\n")
    assert sorted(out.getvalue().splitlines()) == sorted(lines)
