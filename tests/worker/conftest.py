"""Real worker processes (`ardiff worker serve`) on loopback, for the worker tests.

`launch_worker` starts one with the env of docs/contracts.md §3 and waits until `/readyz` answers 200; every
process it started is stopped at the end of the test session (modules stop theirs earlier). The returned
`WorkerProcess` carries a small HTTP client for ticks. `placer` places sessions on a worker's pod through the
real placement store (as the operator does) and releases them after the test. `realtime_worker` is the fake
worker the realtime video tests share (its first realtime stream imports vllm-omni's protocol pieces).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionRecord, SessionSpec, SessionState
from ardiff.worker.net import free_port
from ardiff.worker.pod_link import PodLink
from ardiff.worker.server import load_runtime
from ardiff.worker.service import WorkerService
from ardiff.worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
CAMERA = {
    "track": "camera",
    "schema": "lingbot.camera_actions.v1",
    "data": {"mode": "frames", "frames": [["w"], ["w"], ["w", "j"]]},
}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class WorkerProcess:
    env: dict[str, str]
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=120))
    endpoint: str | None = None  # None: http://127.0.0.1:<port>

    @property
    def url(self) -> str:
        return self.endpoint or f"http://127.0.0.1:{self.port}"

    def start(self) -> WorkerProcess:
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ardiff.cli", "worker", "serve"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def wait_ready(self, timeout: float) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.client.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"worker not ready within {timeout}s:\n{self.log()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, timeout: float = 60) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.client.close()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

    def metric(self, sample: str) -> float:
        """The value of one sample (name and labels, as exposed) of its `/metrics`; 0 when absent."""
        for line in self.client.get(f"{self.url}/metrics").text.splitlines():
            if line.startswith(sample + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    # -- HTTP helpers ------------------------------------------------------------------------------------

    def tick(
        self,
        session: str,
        chunk_index: int,
        *,
        token: str | None = None,
        request_id: str | None = None,
        accept: str | None = None,
        headers: dict[str, str] | None = None,
        **body: Any,
    ) -> httpx.Response:
        payload = {
            "request_id": request_id or f"{session}-{chunk_index}",
            "chunk_index": chunk_index,
            "controls": [CAMERA],
            **body,
        }
        return self.client.post(
            f"{self.url}/v1/sessions/{session}/ticks",
            json=payload,
            headers=self.headers(token, accept=accept, **(headers or {})),
        )

    @staticmethod
    def headers(token: str | None, *, accept: str | None = None, **extra: str) -> dict[str, str]:
        headers = dict(extra)
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        if accept is not None:
            headers["accept"] = accept
        return headers


LaunchWorker = Callable[..., WorkerProcess]


@pytest.fixture(scope="session")
def launch_worker() -> Iterator[LaunchWorker]:
    started: list[WorkerProcess] = []
    logs = Path(tempfile.mkdtemp(prefix="ardiff-worker-logs-"))

    def launch(*, ready_timeout: float = 60, wait: bool = True, **settings: Any) -> WorkerProcess:
        """With `tls_cert_file` (a certificate for `localhost`) it serves https at `https://localhost:<port>`,
        which its client verifies against `client_ca_file` (default `tls_ca_file`, what the worker trusts)."""
        port = free_port()
        client = httpx.Client(timeout=120)
        client_ca = settings.pop("client_ca_file", None) or settings.get("tls_ca_file")
        if "tls_cert_file" in settings:
            settings.setdefault("endpoint", f"https://localhost:{port}")
            client = httpx.Client(timeout=120, verify=ssl.create_default_context(cafile=client_ca))
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "ARDIFF_HOST": "127.0.0.1",
            "ARDIFF_POD_IP": "127.0.0.1",
            "ARDIFF_PORT": str(port),
        }
        env.pop("ARDIFF_TEST_FAULTS", None)
        env.update({f"ARDIFF_{name.upper()}": str(value) for name, value in settings.items()})
        log_path = logs / f"worker-{port}.log"
        worker = WorkerProcess(env, port, log_path, client=client, endpoint=settings.get("endpoint")).start()
        started.append(worker)
        return worker.wait_ready(ready_timeout) if wait else worker

    yield launch
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for every real worker of the run: the embedded tiny model is generated once."""
    return tmp_path_factory.mktemp("ardiff-model-cache")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint written by `ardiff worker make-tiny-model DIR --seed 0` (workers get `--model DIR`)."""
    directory = tmp_path_factory.mktemp("ardiff-tiny-model") / "tiny"
    out = subprocess.run(
        [sys.executable, "-m", "ardiff.cli", "worker", "make-tiny-model", str(directory), "--seed", "0"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return directory


@pytest.fixture(scope="session")
async def store(redis_url: str) -> PlacementStore:
    placement = PlacementStore.from_url(redis_url)
    yield placement
    await placement.close()


@dataclass
class Placer:
    """Places fresh sessions on one pod through the real `PlacementStore`, as the operator does."""

    store: PlacementStore
    session_spec: Callable[..., SessionSpec]
    pool: PoolId
    pod: str
    token: str
    close_on: WorkerProcess | None = None  # also closed on this worker after the test (frees its KV at once)
    placed: list[str] = field(default_factory=list)

    async def __call__(self, **spec: Any) -> str:
        name = f"s-{uuid.uuid4().hex[:8]}"
        result = await self.store.place(self.pool, self.session_spec(name, self.token, **spec))
        assert result.placement is not None
        assert result.placement.pod == self.pod
        self.placed.append(name)
        return name

    async def release_all(self) -> None:
        for name in self.placed:
            await self.store.release(self.pool, name, reason="test done")
            if self.close_on is not None:
                url = f"{self.close_on.url}/v1/sessions/{name}"
                self.close_on.client.delete(url, headers=self.close_on.headers(self.token))


@dataclass
class PodPlacer:
    """Places sessions on a chosen pod of a pool (`prefer_pod`) through the real `PlacementStore`, each with
    the same `defaults` (one seed and prompt: twins) and its own kept history or fork source; `release_all`
    releases them and closes them on every worker (their KV freed at once)."""

    store: PlacementStore
    session_spec: Callable[..., SessionSpec]
    pool: PoolId
    token: str
    workers: Sequence[WorkerProcess]
    defaults: dict[str, Any]
    placed: list[str] = field(default_factory=list)

    async def __call__(self, pod: str, *, keep: int = 0, fork_from: str = "") -> str:
        name = f"s-{uuid.uuid4().hex[:8]}"
        spec = self.session_spec(
            name, self.token, **self.defaults, history_keep_chunks=keep, fork_from=fork_from
        )
        result = await self.store.place(self.pool, spec, prefer_pod=pod)
        assert result.placement is not None
        assert result.placement.pod == pod
        self.placed.append(name)
        return name

    async def release_all(self) -> None:
        for name in self.placed:
            await self.store.release(self.pool, name, reason="test done")
            for worker in self.workers:
                worker.client.delete(f"{worker.url}/v1/sessions/{name}", headers=worker.headers(self.token))


@pytest.fixture
async def placer(store: PlacementStore, session_spec: Callable[..., SessionSpec]):
    """`placer(pool, pod, token, close_on=None)`: a `Placer`; its sessions are released after the test."""
    made: list[Placer] = []

    def make(pool: PoolId, pod: str, token: str, *, close_on: WorkerProcess | None = None) -> Placer:
        made.append(Placer(store, session_spec, pool, pod, token, close_on))
        return made[-1]

    yield make
    for placed in made:
        await placed.release_all()


@pytest.fixture(scope="session")
def session_spec() -> Callable[..., SessionSpec]:
    def build(name: str, token: str, **kwargs: Any) -> SessionSpec:
        return SessionSpec(
            name=name, token_sha256=token_hash(token), **{"prompt": "a walk in the forest", **kwargs}
        )

    return build


TRANSFER_TOKEN = "pool-transfer-secret"  # the pool's worker-to-worker token in the continuity tests


FAKE_POD_DEFAULTS: dict[str, Any] = {
    "fake_capacity": 2,
    "lease_seconds": 5,
    "heartbeat_seconds": 0.5,
    "transfer_token": TRANSFER_TOKEN,
}


def launch_fake_pod(launch_worker: LaunchWorker, redis_url: str, pool: PoolId, pod: str, **settings: Any):
    """A fake-runtime worker of `pool` named `pod`: `FAKE_POD_DEFAULTS` (two slots, a 5 s lease, the pool's
    transfer token) unless `settings` say otherwise, e.g. the continuity tests' tiers."""
    return launch_worker(
        runtime="fake",
        redis_url=redis_url,
        namespace=pool.namespace,
        pool=pool.name,
        pod_name=pod,
        **{**FAKE_POD_DEFAULTS, **settings},
    )


async def started_in_process(redis_url: str, pool: PoolId, pod: str, **settings: Any) -> WorkerService:
    """A fake-runtime worker of `pool` named `pod` in this process, started and ready: a real `PodLink` on the
    shared Redis, a 0.5 s heartbeat and a 5 s lease unless `settings` say otherwise."""
    worker_settings = WorkerSettings(
        runtime="fake",
        redis_url=redis_url,
        pool=pool.name,
        pod_name=pod,
        **{"heartbeat_seconds": 0.5, "lease_seconds": 5, **settings},
    )
    worker = WorkerService(
        worker_settings,
        lambda: load_runtime(worker_settings),
        placement=PodLink(PlacementStore.from_url(redis_url), worker_settings),
    )
    await worker.start()
    for _ in range(200):
        if worker.ready:
            break
        await asyncio.sleep(0.02)
    assert worker.ready
    return worker


async def suspend_and_wait(
    store: PlacementStore, pool: PoolId, session: str, *, reason: str, within: float = 20.0
) -> SessionRecord:
    """What the operator does to evict (`evicted`) or move (`migrate`) a session: `store.suspend`; then wait
    for its worker to report the export. The suspended record."""
    assert await store.suspend(pool, session, reason=reason)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        record = await store.get_session(pool, session)
        if record is not None and record.state is SessionState.SUSPENDED:
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"session {session} was not suspended within {within} s")


# The realtime video tests' worker (issue 38): the fake runtime in placement mode, shared by
# test_realtime.py and test_realtime_viewer.py. A fake runtime imports vllm-omni's request model and encoder
# for its first realtime stream (~20 s, torch and vllm with them), once for both modules.
REALTIME_POOL = PoolId("default", f"wk-realtime-{uuid.uuid4().hex[:6]}")
REALTIME_POD = "realtime-worker-0"
REALTIME_TOKEN = "realtime-token"
# The sessions' playout target there: a 12-frame chunk plays 0.25 s, so pacing shows within seconds.
REALTIME_PLAYOUT = {"playout_fps": 48.0, "playout_buffer_chunks": 2}


@pytest.fixture(scope="session")
async def realtime_worker(launch_worker: LaunchWorker, redis_url: str, store: PlacementStore, session_spec):
    process = launch_fake_pod(
        launch_worker,
        redis_url,
        REALTIME_POOL,
        REALTIME_POD,
        fake_capacity=4,
        fake_tick_seconds=0.02,
        host_tier_bytes=64 << 20,  # a suspended session waits in the worker's memory
        realtime_start_timeout_seconds=3,
        realtime_stall_timeout_seconds=3,
        test_faults=1,
    )
    from tests.worker.realtime_client import RealtimeClient

    name = f"s-warm-{uuid.uuid4().hex[:6]}"
    await store.place(REALTIME_POOL, session_spec(name, REALTIME_TOKEN, **REALTIME_PLAYOUT))
    url = f"ws://127.0.0.1:{process.port}/v1/realtime/video?session={name}"
    async with RealtimeClient.connect(url) as client:
        client.ws.close_timeout = 1
        await client.send({"type": "session.start", "prompt": "warm-up", "session_token": REALTIME_TOKEN})
        first = await asyncio.wait_for(client.ws.recv(), 300)  # the import, on a loaded machine
        assert json.loads(first)["type"] == "video.start", first
    await store.release(REALTIME_POOL, name, reason="warm-up done")
    yield process
    process.stop()
