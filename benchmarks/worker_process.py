"""A real worker process for the benchmarks (`ardiff worker serve` on a free loopback port): the environment
of a pool's worker on loopback, started, waited for until `/readyz` answers, stopped. A worker that exits or
is not ready in time ends the benchmark with its log's tail. Also what the benchmarks ask of one: a camera
control to tick with, and a sample of its `/metrics`."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ardiff.kv.records import PoolId
from ardiff.worker.net import free_port

# A tick's camera control for the tiny LingBot: walk forward, then walk and turn.
CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]},
}


# A robot tick's cameras for the tiny DreamZero: DROID's size, what an openpi client sends.
ROBOT_CAMERAS = ("exterior_image_0_left", "exterior_image_1_left", "wrist_image_left")
ROBOT_CAMERA_SHAPE = (180, 320, 3)


def robot_observation(chunk: int) -> dict[str, Any]:
    """A robot tick's observation: three raw cameras and the arm's vectors, a pure function of `chunk`."""
    import numpy as np

    rng = np.random.default_rng(chunk)
    return {
        "images": {
            camera: {
                "encoding": "raw",
                "shape": list(ROBOT_CAMERA_SHAPE),
                "data": base64.b64encode(
                    rng.integers(0, 256, ROBOT_CAMERA_SHAPE, dtype=np.uint8).tobytes()
                ).decode(),
            }
            for camera in ROBOT_CAMERAS
        },
        "joint_position": rng.uniform(-1, 1, 7).tolist(),
        "cartesian_position": rng.uniform(-1, 1, 6).tolist(),
        "gripper_position": [0.5],
    }


def metric(url: str, sample: str) -> float:
    """The value of one sample (name and labels, as exposed) of a worker's `/metrics`; 0 when absent."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def pool_worker_env(
    redis_url: str, pool: PoolId, *, size: int, threads: int = 1, **settings: str
) -> dict[str, str]:
    """This process's environment plus a pool's worker settings on loopback (offline, `size`x`size` frames,
    `threads` torch threads), and `settings` (`ARDIFF_*` names) on top."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "ARDIFF_HOST": "127.0.0.1",
        "ARDIFF_POD_IP": "127.0.0.1",
        "ARDIFF_REDIS_URL": redis_url,
        "ARDIFF_NAMESPACE": pool.namespace,
        "ARDIFF_POOL": pool.name,
        "ARDIFF_HEIGHT": str(size),
        "ARDIFF_WIDTH": str(size),
        **settings,
    }


@dataclass
class WorkerProcess:
    pod: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, pod: str, env: dict[str, str], logs: Path) -> WorkerProcess:
        """`ardiff worker serve` as pod `pod` (`ARDIFF_POD_NAME`), its output in `logs/<pod>.log`."""
        port = free_port()
        log = logs / f"{pod}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "ardiff.cli", "worker", "serve"],
            env={**env, "ARDIFF_POD_NAME": pod, "ARDIFF_PORT": str(port)},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        return cls(pod, f"http://127.0.0.1:{port}", process, log)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"worker {self.pod} exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        sys.exit(f"worker {self.pod} not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
