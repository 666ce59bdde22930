"""The front door's cost (issue 37 item 6; DESIGN §8): what real Envoy and the endpoint picker add to a
session's ticks and streams, each figure against its baseline measured in the same run.

Everything on loopback: a redis-server of its own, fake-runtime workers (`ardiff worker serve`, forward time
0) registered in it, the sessions placed with the placement store's own calls and the pools' records written
(the operator's part), and the front door as the chart runs it (`LocalFrontDoor`: Envoy with the bootstrap of
`ardiff.gateway.envoy_config` and the picker from the gateway image's venv), one per `--concurrency` value
(Envoy's worker threads). Four parts (`--parts`):

1. `ticks`: one 64x64 session ticked `--rounds` rounds, each round one tick per arm in a rotating order, on
   one keep-alive client: `direct` (the pod's own address: the baseline), `door/cN` (the front door) and
   `envoy/cN` (the same Envoy bootstrap without its ext_proc filter, the client naming the pod in the
   picker's headers: Envoy's proxying alone). An arm's added time is its tick minus the same round's direct
   tick (p50 and p99 of those); target: the front door adds p50 <= 1 ms, p99 <= 3 ms. Where it goes: Envoy's
   proxying (envoy - direct), the ext_proc round trip with the picker's answer (door - envoy, paired the
   same way), the picker's own decision (its `ardiff_gateway_decision_seconds`) and Redis' time in the route
   script (`INFO commandstats`, `fcall_ro`: only the picker runs it). One more arm, `responses/cN` (the
   first door's bootstrap sending its picker every response's headers too), prices what the bundled
   bootstrap saves by rewriting a worker's 421 in Envoy instead (`envoy_config._moved_rewrite`).
2. `bytes`: 480x832 raw-frame ticks (14.4 MB a chunk) by `--clients` sessions at once for `--seconds` per
   arm and round (`--bytes-rounds`, arms in a rotating order): bytes/s through the front door against direct,
   and Envoy's CPU (its `/proc/<pid>/stat`) per GB forwarded. Each session asks for its last chunk again (a
   retried request id, answered from the worker's cache: the fake's own frame making, ~0.1 s a chunk here,
   would bound the rate), or for new chunks with `--fresh-chunks`.
3. `picker`: the picker's gRPC service driven directly by `picker_load.py` (in the gateway venv) from
   `--callers` concurrent callers on one channel: decisions of placed sessions' ticks (`decide`: one
   ext_proc stream each, as Envoy opens them) against the same stream for a path that is no session's
   (`refuse`: answered from the headers, no store read) and the gRPC health check of the same server
   (`health`: its cheapest call), per second and per CPU-second of the picker's process; Redis' CPU per call
   beside it.
4. `streams`: `--streams` session streams (`/v1/sessions/{id}/stream`, the token in-band as a browser sends
   it) through the first front door's Envoy to `--workers` workers, each stream ticked once (its chunk and
   frames received) and then held open: Envoy's memory before and with all of them open (VmRSS, and what its
   allocator holds: the admin `/memory`) per stream, against what the workers' VmRSS grew per stream.

    .venv/bin/python benchmarks/gateway.py [--rounds 2000] [--concurrency 1 2] [--streams 500 --workers 5]
    .venv/bin/python benchmarks/gateway.py --smoke  # every part tiny: tests/gateway/test_gateway_benchmark.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from worker_process import CAMERA, WorkerProcess, pool_worker_env

from ardiff.devcluster.binaries import ensure_envoy
from ardiff.devcluster.front_door import LocalFrontDoor
from ardiff.devcluster.redis_server import RedisServer
from ardiff.gateway.envoy_config import (
    DESTINATION_HEADER,
    PODS_CLUSTER,
    UPSTREAM_CLUSTER_HEADER,
    EnvoySettings,
    bootstrap,
)
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId, SessionSpec, token_sha256
from ardiff.wire import front_door_url
from ardiff.worker.net import free_port

PARTS = ("ticks", "bytes", "picker", "streams")
TARGET_P50_MS, TARGET_P99_MS = 1.0, 3.0
TOKEN = "gateway-bench-token"
PROMPT = "a walk through a quiet village"
TICK_POOL = PoolId("bench", "gw-ticks")  # the 64x64 workers: part 1's session and part 4's streams
BYTES_POOL = PoolId("bench", "gw-bytes")  # one 480x832 worker
TICK_SIZE, BYTES_HEIGHT, BYTES_WIDTH = 64, 480, 832
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OPEN_AT_ONCE = 32  # streams being opened at the same time (part 4)
# `--smoke`: every part tiny (well under a minute, most of it the processes' start).
SMOKE = {
    "concurrency": [1],
    "rounds": 30,
    "warmup": 5,
    "clients": 1,
    "seconds": 1.0,
    "bytes_rounds": 1,
    "picker_rounds": 1,
    "callers": 4,
    "streams": 6,
    "workers": 2,
}


# ------------------------------------------------------------------------------------------- measuring


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A table after a blank line: its title, the header, a rule, the rows; each column as wide as its widest
    cell, the first left-aligned, the others right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return " ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        )

    print(f"\n{title}\n{line(columns)}\n{'-' * len(line(columns))}")
    for row in rows:
        print(line(row))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (`/proc/<pid>/stat` utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """A process's resident memory (`/proc/<pid>/status` VmRSS)."""
    found = re.search(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found is not None, f"no VmRSS for pid {pid}"
    return int(found[1]) * 1024


def envoy_stat(admin_port: int, name: str) -> float:
    """One counter or gauge of an Envoy's admin `/stats`."""
    text = httpx.get(f"http://127.0.0.1:{admin_port}/stats", params={"filter": f"^{re.escape(name)}$"}).text
    found = re.search(rf"^{re.escape(name)}: (\d+)$", text, re.MULTILINE)
    assert found is not None, f"Envoy has no stat {name}: {text[:200]!r}"
    return float(found[1])


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram's cumulative buckets (upper bound -> count), sum and count, as scraped."""

    buckets: dict[float, float]
    total: float
    count: float

    @classmethod
    def scrape(cls, url: str, name: str) -> Histogram:
        text = httpx.get(url).text
        buckets = {
            float(bound): float(value)
            for bound, value in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.MULTILINE)
        }
        totals = re.findall(rf"^{name}_(sum|count) (\S+)$", text, re.MULTILINE)
        found = {key: float(value) for key, value in totals}
        return cls(buckets, found["sum"], found["count"])

    def since(self, before: Histogram) -> Histogram:
        return Histogram(
            {bound: count - before.buckets.get(bound, 0.0) for bound, count in self.buckets.items()},
            self.total - before.total,
            self.count - before.count,
        )

    def bound(self, q: float) -> float:
        """The upper bound of the bucket holding quantile `q` (the quantile is at most that)."""
        return next(bound for bound, count in sorted(self.buckets.items()) if count >= q * self.count)


def redis_calls(redis_url: str, command: str) -> tuple[int, float]:
    """Calls and microseconds Redis spent in `command` so far (`INFO commandstats`)."""
    info = subprocess.run(
        ["redis-cli", "-u", redis_url, "INFO", "commandstats"], capture_output=True, text=True, check=True
    )
    found = re.search(rf"^cmdstat_{command}:calls=(\d+),usec=(\d+),", info.stdout, re.MULTILINE)
    return (int(found[1]), float(found[2])) if found else (0, 0.0)


# ------------------------------------------------------------------------------------------ the rig


def without_picker(filters: list[dict[str, Any]]) -> None:
    """No ext_proc filter: nothing asks the picker (the client names the pod in the picker's headers)."""
    filters[:] = [f for f in filters if f["name"] != EXT_PROC_FILTER]


def asking_about_responses(filters: list[dict[str, Any]]) -> None:
    """The picker also sent every response's headers (the bundled bootstrap skips them: a worker's 421 is
    rewritten in Envoy by Lua)."""
    (picker,) = (f["typed_config"] for f in filters if f["name"] == EXT_PROC_FILTER)
    picker["processing_mode"]["response_header_mode"] = "SEND"


@dataclass
class EnvoyVariant:
    """The front door's Envoy bootstrap with its HTTP filters changed by `edit` (`without_picker`: a tick pays
    Envoy's proxying alone, the same listener, routes, Lua, body bound and router; `asking_about_responses`),
    as a process of its own beside the front door, asking that door's picker if it asks one."""

    directory: Path
    name: str
    edit: Callable[[list[dict[str, Any]]], None]
    concurrency: int
    picker: str
    settings: EnvoySettings = field(init=False)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        ports = {name: free_port() for name in ("listen_port", "health_port", "admin_port")}
        self.settings = EnvoySettings(**ports, picker=self.picker)

    def start(self) -> EnvoyVariant:
        config = bootstrap(self.settings)
        (listener,) = (item for item in config["static_resources"]["listeners"] if item["name"] == "front")
        self.edit(listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"])
        path = self.directory / f"envoy-{self.name}-c{self.concurrency}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        log = path.with_suffix(".log")
        command = [str(ensure_envoy()), "-c", str(path), "--disable-hot-restart", "-l", "warning"]
        self.process = subprocess.Popen(
            [*command, "--concurrency", str(self.concurrency), "--log-path", str(log)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"Envoy ({self.name}) did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.settings.health_port}/ready").status_code == 200
        except httpx.TransportError:
            return False

    def url(self, pool: PoolId) -> str:
        return front_door_url(f"http://127.0.0.1:{self.settings.listen_port}", pool.namespace, pool.name)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)


@dataclass
class Rig:
    """What every part runs against (see the module docstring)."""

    redis: RedisServer
    doors: dict[int, LocalFrontDoor]  # by Envoy's --concurrency
    plain: dict[int, EnvoyVariant]  # without the picker, by --concurrency
    responses: EnvoyVariant  # the first door's, asking its picker about responses too
    tick_workers: list[WorkerProcess]
    bytes_worker: WorkerProcess
    tick_session: str
    byte_sessions: list[str]
    stream_sessions: list[str]

    @property
    def first_door(self) -> LocalFrontDoor:
        return next(iter(self.doors.values()))


def address(worker: WorkerProcess) -> str:
    return worker.url.removeprefix("http://")


async def place_sessions(
    redis_url: str, tick_worker: WorkerProcess, streams: int, clients: int
) -> tuple[str, list[str], list[str]]:
    """The pools' records and every session: part 1's on the first tick worker, part 2's, part 4's."""
    async with PlacementStore.from_url(redis_url) as store:

        async def place(pool: PoolId, name: str, prefer_pod: str = "") -> str:
            spec = SessionSpec(name, token_sha256(TOKEN), prompt=PROMPT)
            result = await store.place(pool, spec, prefer_pod=prefer_pod)
            assert result.placement is not None, f"no slot for {name} in {pool}"
            return name

        for pool in (TICK_POOL, BYTES_POOL):
            await store.write_pool(pool)
        tick = await place(TICK_POOL, "tick-0", prefer_pod=tick_worker.pod)
        byte_sessions = [await place(BYTES_POOL, f"bytes-{i}") for i in range(clients)]
        stream_sessions = [await place(TICK_POOL, f"stream-{i}") for i in range(streams)]
    return tick, byte_sessions, stream_sessions


@contextlib.contextmanager
def rig(args: argparse.Namespace) -> Iterator[Rig]:
    logs = Path(tempfile.mkdtemp(prefix="ardiff-bench-gateway-"))
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(RedisServer())
        fake = {"ARDIFF_RUNTIME": "fake", "ARDIFF_FAKE_TICK_SECONDS": "0"}
        capacity = math.ceil((args.streams + 1) / args.workers)
        tick_env = pool_worker_env(
            redis.url, TICK_POOL, size=TICK_SIZE, ARDIFF_FAKE_CAPACITY=str(capacity), **fake
        )
        bytes_env = pool_worker_env(
            redis.url,
            BYTES_POOL,
            size=BYTES_HEIGHT,
            ARDIFF_WIDTH=str(BYTES_WIDTH),
            ARDIFF_FAKE_CAPACITY=str(args.clients),
            **fake,
        )
        workers = [WorkerProcess.start(f"ticks-{i}", tick_env, logs) for i in range(args.workers)]
        workers.append(WorkerProcess.start("bytes-0", bytes_env, logs))
        for worker in workers:
            stack.callback(worker.stop)
        doors = {n: stack.enter_context(LocalFrontDoor(redis.url, concurrency=n)) for n in args.concurrency}
        plain = {
            n: EnvoyVariant(logs, "plain", without_picker, n, door.settings.picker).start()
            for n, door in doors.items()
        }
        first = args.concurrency[0]
        responses = EnvoyVariant(
            logs, "responses", asking_about_responses, first, doors[first].settings.picker
        ).start()
        for envoy in [*plain.values(), responses]:
            stack.callback(envoy.stop)
        for worker in workers:
            worker.wait_ready(120)
        tick, byte_sessions, stream_sessions = asyncio.run(
            place_sessions(redis.url, workers[0], args.streams, args.clients)
        )
        yield Rig(
            redis, doors, plain, responses, workers[:-1], workers[-1], tick, byte_sessions, stream_sessions
        )


# ------------------------------------------------------------------------------------ 1. per-tick time


@dataclass(frozen=True)
class Arm:
    name: str
    base: str
    headers: dict[str, str]


def tick_arms(rig: Rig) -> list[Arm]:
    worker = rig.tick_workers[0]
    auth = {"authorization": f"Bearer {TOKEN}"}
    pick = {**auth, DESTINATION_HEADER: address(worker), UPSTREAM_CLUSTER_HEADER: PODS_CLUSTER}
    arms = [Arm("direct", worker.url, auth)]
    for n, door in rig.doors.items():
        arms.append(Arm(f"envoy/c{n}", rig.plain[n].url(TICK_POOL), pick))
        arms.append(Arm(f"door/c{n}", door.url(TICK_POOL.namespace, TICK_POOL.name), auth))
    arms.append(Arm(f"responses/c{rig.responses.concurrency}", rig.responses.url(TICK_POOL), auth))
    return arms


def rotated(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


def measure_ticks(rig: Rig, rounds: int, warmup: int) -> dict[str, Any]:
    arms = tick_arms(rig)
    walls: dict[str, list[float]] = {arm.name: [] for arm in arms}
    chunk = 0
    decisions: dict[int, Histogram] = {}
    redis_before = (0, 0.0)
    with httpx.Client(timeout=30) as client:
        for round_ in range(warmup + rounds):
            if round_ == warmup:
                decisions = {
                    n: Histogram.scrape(door.picker_metrics_url, "ardiff_gateway_decision_seconds")
                    for n, door in rig.doors.items()
                }
                redis_before = redis_calls(rig.redis.url, "fcall_ro")
            for arm in rotated(arms, round_):
                body = {"request_id": f"t{chunk}", "chunk_index": chunk, "controls": [CAMERA]}
                started = time.perf_counter()
                response = client.post(
                    f"{arm.base}/v1/sessions/{rig.tick_session}/ticks", json=body, headers=arm.headers
                )
                wall = time.perf_counter() - started
                assert response.status_code == 200, (arm.name, response.status_code, response.text[:300])
                frames = int(response.headers["ardiff-frame-shape"].split(",")[0])
                assert len(response.content) == frames * TICK_SIZE * TICK_SIZE * 3, arm.name
                chunk += 1
                if round_ >= warmup:
                    walls[arm.name].append(wall * 1000)
    calls, usec = redis_calls(rig.redis.url, "fcall_ro")
    route_calls = calls - redis_before[0]
    return {
        "rounds": rounds,
        "warmup": warmup,
        "walls": walls,
        "chunk_bytes": len(response.content),
        "decisions": {
            n: Histogram.scrape(door.picker_metrics_url, "ardiff_gateway_decision_seconds").since(
                decisions[n]
            )
            for n, door in rig.doors.items()
        },
        "route_us": (usec - redis_before[1]) / max(route_calls, 1),
    }


def paired(walls: dict[str, list[float]], arm: str, base: str) -> list[float]:
    return [a - b for a, b in zip(walls[arm], walls[base], strict=True)]


def print_ticks(result: dict[str, Any], concurrency: list[int]) -> None:
    walls, direct = result["walls"], result["walls"]["direct"]
    rows = []
    for arm, values in walls.items():
        added = paired(walls, arm, "direct")
        figures = (
            statistics.median(values),
            percentile(values, 0.99),
            statistics.fmean(values),
            statistics.median(added),
            percentile(added, 0.99),
            percentile(values, 0.99) - percentile(direct, 0.99),
        )
        rows.append([arm, *(f"{figure:.3f}" for figure in figures)])
    print_table(
        f"ticks: {TICK_SIZE}x{TICK_SIZE} raw frames ({result['chunk_bytes']:,} B a chunk), one session, "
        f"fake forward 0 s; {result['rounds']} rounds (+{result['warmup']} warm-up), one tick per arm a "
        "round in a rotating order, one keep-alive client",
        ["arm", "p50_ms", "p99_ms", "mean_ms", "added_p50_ms", "added_p99_ms", "p99_minus_direct_ms"],
        rows,
    )
    rows, verdicts = [], []
    for n in concurrency:
        added = paired(walls, f"door/c{n}", "direct")
        decision: Histogram = result["decisions"][n]
        envoy, ext_proc = paired(walls, f"envoy/c{n}", "direct"), paired(walls, f"door/c{n}", f"envoy/c{n}")
        figures = [statistics.median(added), statistics.median(envoy), statistics.median(ext_proc)]
        rows.append(
            [f"door/c{n}", *(f"{figure:.3f}" for figure in figures)]
            + [f"{decision.total / decision.count * 1000:.3f}"]
            + [f"{decision.bound(q) * 1000:g}" for q in (0.5, 0.99)]
            + [f"{result['route_us']:.1f}"]
        )
        p50, p99 = statistics.median(added), percentile(added, 0.99)
        verdicts.append(
            f"target (door/c{n}): added p50 <= {TARGET_P50_MS:g} ms and p99 <= {TARGET_P99_MS:g} ms: "
            f"p50 {p50:+.3f} ms, p99 {p99:+.3f} ms: "
            + ("met" if p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS else "NOT met")
        )
    print_table(
        "where the front door's added time goes (p50s of paired differences; the picker and Redis by their "
        "own clocks)",
        [
            "door",
            "added_ms",
            "envoy_ms",
            "ext_proc_ms",
            "decision_mean_ms",
            "decision_p50_le_ms",
            "decision_p99_le_ms",
            "redis_route_us",
        ],
        rows,
    )
    responses = paired(walls, f"responses/c{concurrency[0]}", f"door/c{concurrency[0]}")
    print(
        f"asking the picker about every response too (responses/c{concurrency[0]} - door/c{concurrency[0]}): "
        f"p50 {statistics.median(responses):+.3f} ms, p99 {percentile(responses, 0.99):+.3f} ms"
    )
    print("\n".join(verdicts))


# --------------------------------------------------------------------------------- 2. bytes per second


def tick_for(client: httpx.Client, url: str, session: str, chunk: int) -> int:
    """One tick, its body counted as it arrives (never joined); the bytes received."""
    body = {"request_id": f"b{chunk}", "chunk_index": chunk, "controls": [CAMERA]}
    received = 0
    headers = {"authorization": f"Bearer {TOKEN}"}
    with client.stream("POST", f"{url}/v1/sessions/{session}/ticks", json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()[:300]
        for piece in response.iter_raw():
            received += len(piece)
    return received


def tick_loop(url: str, session: str, chunk: int, fresh: bool, deadline: float) -> tuple[int, int]:
    """`session` ticked until `deadline` on one keep-alive client: chunk `chunk` over and over (a retried
    request id: the worker answers from its cache), or new chunks from `chunk` on (`fresh`); the bytes
    received and the ticks."""
    received = ticks = 0
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            received += tick_for(client, url, session, chunk + ticks if fresh else chunk)
            ticks += 1
    return received, ticks


def measure_bytes(rig: Rig, rounds: int, seconds: float, fresh: bool) -> dict[str, Any]:
    worker = rig.bytes_worker
    arms = [("direct", worker.url, None)] + [
        (f"door/c{n}", door.url(BYTES_POOL.namespace, BYTES_POOL.name), door) for n, door in rig.doors.items()
    ]
    totals = {name: {"bytes": 0, "ticks": 0, "seconds": 0.0, "envoy_cpu_s": 0.0} for name, _, _ in arms}
    with httpx.Client(timeout=60) as client:  # every session's first chunk (9 frames) and a full one
        for session in rig.byte_sessions:
            for chunk in (0, 1):
                tick_for(client, worker.url, session, chunk)
    chunk = dict.fromkeys(rig.byte_sessions, 2 if fresh else 1)
    with ThreadPoolExecutor(len(rig.byte_sessions)) as pool:
        for round_ in range(rounds):
            for name, url, door in rotated(arms, round_):
                envoy_before = cpu_seconds(door.envoy.pid) if door is not None else 0.0
                started = time.monotonic()
                deadline = started + seconds
                done = list(
                    pool.map(
                        lambda s, url=url, end=deadline: tick_loop(url, s, chunk[s], fresh, end),
                        rig.byte_sessions,
                    )
                )
                totals[name]["seconds"] += time.monotonic() - started
                if door is not None:
                    totals[name]["envoy_cpu_s"] += cpu_seconds(door.envoy.pid) - envoy_before
                for session, (received, ticks) in zip(rig.byte_sessions, done, strict=True):
                    totals[name]["bytes"] += received
                    totals[name]["ticks"] += ticks
                    if fresh:
                        chunk[session] += ticks
    return {
        "rounds": rounds,
        "seconds": seconds,
        "clients": len(rig.byte_sessions),
        "fresh": fresh,
        "arms": totals,
    }


def print_bytes(result: dict[str, Any]) -> None:
    chunk = 12 * BYTES_HEIGHT * BYTES_WIDTH * 3
    what = "new chunks" if result["fresh"] else "its last chunk again (the worker's cache, no forward)"
    arms = result["arms"]
    direct = arms["direct"]["bytes"] / arms["direct"]["seconds"]
    rows = []
    for name, arm in arms.items():
        rate = arm["bytes"] / arm["seconds"]
        envoy = ["-", "-"] if name == "direct" else [f"{arm['envoy_cpu_s']:.2f}"]
        if name != "direct":
            envoy.append(f"{arm['envoy_cpu_s'] / (arm['bytes'] / 1e9):.3f}")
        rows.append(
            [name, str(arm["ticks"]), str(arm["bytes"]), f"{rate / 1e6:.1f}", f"{rate / direct:.2f}", *envoy]
        )
    print_table(
        f"bytes: {BYTES_HEIGHT}x{BYTES_WIDTH} raw frames ({chunk:,} B a 12-frame chunk), "
        f"{result['clients']} session(s) at once each ticking {what}; {result['rounds']} rounds x "
        f"{result['seconds']:g} s per arm",
        ["arm", "ticks", "bytes", "MB_per_s", "vs_direct", "envoy_cpu_s", "envoy_cpu_s_per_GB"],
        rows,
    )


# ------------------------------------------------------------------------------- 3. picker decisions


def measure_picker(rig: Rig, rounds: int, seconds: float, callers: int) -> dict[str, Any]:
    door = rig.first_door
    assert door.picker is not None
    assert rig.redis.process is not None
    picker_pid, redis_pid = door.picker.pid, rig.redis.process.pid
    python = Path(door.picker.args[0]).with_name("python")  # the picker's own venv (the gateway image's)
    script = Path(__file__).resolve().parent / "picker_load.py"
    base = f"/pools/{TICK_POOL.namespace}/{TICK_POOL.name}"
    modes = ["health", "refuse", "decide"]
    totals = {mode: {"calls": 0, "seconds": 0.0, "picker_cpu_s": 0.0, "redis_cpu_s": 0.0} for mode in modes}
    answers: dict[str, dict[str, int]] = {mode: {} for mode in modes}
    for round_ in range(rounds):
        for mode in rotated(modes, round_):
            command = [
                str(python),
                str(script),
                "--target",
                f"127.0.0.1:{door.picker_port}",
                "--mode",
                mode,
                "--seconds",
                str(seconds),
                "--concurrency",
                str(callers),
                "--base",
                base,
                "--token",
                TOKEN,
            ]
            picker_before, redis_before = cpu_seconds(picker_pid), cpu_seconds(redis_pid)
            done = (
                subprocess.run(  # not from the checkout: its `operator/` would shadow the standard library's
                    command,
                    input=json.dumps(rig.stream_sessions or [rig.tick_session]),
                    capture_output=True,
                    text=True,
                    cwd=tempfile.gettempdir(),
                    timeout=seconds + 60,
                    check=False,
                )
            )
            if done.returncode != 0:
                sys.exit(f"picker_load.py failed:\n{done.stderr[-3000:]}")
            out = json.loads(done.stdout)
            totals[mode]["calls"] += out["calls"]
            totals[mode]["seconds"] += out["seconds"]
            totals[mode]["picker_cpu_s"] += cpu_seconds(picker_pid) - picker_before
            totals[mode]["redis_cpu_s"] += cpu_seconds(redis_pid) - redis_before
            for kind, count in out["answers"].items():
                answers[mode][kind] = answers[mode].get(kind, 0) + count
    return {"rounds": rounds, "seconds": seconds, "callers": callers, "arms": totals, "answers": answers}


def print_picker(result: dict[str, Any]) -> None:
    arms = result["arms"]
    health = arms["health"]["calls"] / arms["health"]["picker_cpu_s"]
    rows = []
    for mode, arm in arms.items():
        per_cpu = arm["calls"] / arm["picker_cpu_s"]
        rows.append(
            [
                mode,
                str(arm["calls"]),
                f"{arm['calls'] / arm['seconds']:.0f}",
                f"{arm['picker_cpu_s']:.2f}",
                f"{per_cpu:.0f}",
                f"{arm['redis_cpu_s'] / arm['calls'] * 1e6:.1f}",
                f"{per_cpu / health:.2f}",
            ]
        )
    print_table(
        f"picker: its gRPC service driven directly, {result['callers']} callers on one channel, "
        f"{result['rounds']} rounds x {result['seconds']:g} s per arm",
        [
            "arm",
            "calls",
            "calls_per_s",
            "picker_cpu_s",
            "per_picker_cpu_s",
            "redis_cpu_us_per_call",
            "vs_health",
        ],
        rows,
    )
    kinds = "; ".join(
        f"{mode}: {json.dumps(kinds, sort_keys=True)}" for mode, kinds in result["answers"].items()
    )
    print(f"answers: {kinds}")


# ------------------------------------------------------------------------------------ 4. open streams


async def open_stream(url: str, opened: list[Any], gate: asyncio.Semaphore) -> None:
    """One session stream: in-band auth, one tick, its chunk and frames; then left open in `opened`."""
    from websockets.asyncio.client import connect

    async with gate:
        ws = await connect(url, max_size=None, open_timeout=120)
        opened.append(ws)
        await ws.send(json.dumps({"type": "auth", "token": TOKEN}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        await ws.send(
            json.dumps({"type": "tick", "request_id": "s0", "chunk_index": 0, "controls": [CAMERA]})
        )
        chunk = json.loads(await ws.recv())
        assert chunk["type"] == "chunk", chunk
        frames = [await ws.recv() for _ in range(chunk["frames"])]
        assert all(isinstance(frame, bytes) and frame for frame in frames)


def measure_streams(rig: Rig) -> dict[str, Any]:
    door = rig.first_door
    assert door.envoy is not None
    envoy_pid, admin = door.envoy.pid, door.settings.admin_port
    worker_pids = [worker.process.pid for worker in rig.tick_workers]
    base = door.url(TICK_POOL.namespace, TICK_POOL.name).replace("http://", "ws://")

    def memory() -> dict[str, float]:
        return {
            "envoy_rss": rss_bytes(envoy_pid),
            "envoy_allocated": float(httpx.get(f"http://127.0.0.1:{admin}/memory").json()["allocated"]),
            "workers_rss": sum(rss_bytes(pid) for pid in worker_pids),
        }

    async def run() -> dict[str, Any]:
        before = memory()
        opened: list[Any] = []
        gate = asyncio.Semaphore(OPEN_AT_ONCE)
        started = time.monotonic()
        results = await asyncio.gather(
            *(open_stream(f"{base}/v1/sessions/{s}/stream", opened, gate) for s in rig.stream_sessions),
            return_exceptions=True,
        )
        open_s = time.monotonic() - started
        await asyncio.sleep(1.0)  # every socket settled in Envoy and the workers
        held = memory()
        active = envoy_stat(admin, "http.front.downstream_cx_active")
        await asyncio.gather(*(ws.close() for ws in opened))
        failures = [repr(r) for r in results if isinstance(r, BaseException)]
        return {"before": before, "held": held, "active": active, "open_s": open_s, "failures": failures}

    result = asyncio.run(run())
    result["streams"] = len(rig.stream_sessions)
    result["workers"] = len(rig.tick_workers)
    return result


def print_streams(result: dict[str, Any], concurrency: int) -> None:
    streams, before, held = result["streams"], result["before"], result["held"]
    workers = (held["workers_rss"] - before["workers_rss"]) / streams
    rows = []
    for key in ("envoy_rss", "envoy_allocated", "workers_rss"):
        per_stream = (held[key] - before[key]) / streams
        megabytes = [f"{before[key] / 1e6:.1f}", f"{held[key] / 1e6:.1f}"]
        rows.append([key, *megabytes, f"{per_stream / 1e3:.1f}", f"{per_stream / workers:.2f}"])
    print_table(
        f"streams: {streams} session streams through one Envoy (--concurrency {concurrency}) to "
        f"{result['workers']} workers, each ticked once ({TICK_SIZE}x{TICK_SIZE}, JPEG frames), then held "
        f"open; opened and ticked in {result['open_s']:.1f} s\n"
        "envoy_rss: Envoy's VmRSS; envoy_allocated: what its allocator holds (admin /memory); workers_rss: "
        f"the {result['workers']} workers' VmRSS together",
        ["memory", "before_MB", "held_MB", "per_stream_KB", "vs_workers"],
        rows,
    )
    ok = streams - len(result["failures"])
    active = f"Envoy's active downstream connections: {result['active']:.0f}"
    print(f"streams with their chunk: {ok}/{streams}; {active}")
    for failure in result["failures"][:5]:
        print(f"  failed: {failure}")


# ----------------------------------------------------------------------------------------------- main


def raise_open_files(wanted: int) -> None:
    """Room for every stream's sockets in this process and the Envoys it starts (they inherit the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 2], help="Envoy worker threads, a front door each"
    )
    parser.add_argument("--rounds", type=int, default=2000, help="ticks: measured rounds")
    parser.add_argument("--warmup", type=int, default=50, help="ticks: rounds before measuring")
    parser.add_argument("--clients", type=int, default=2, help="bytes: sessions ticked at once")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="bytes and picker: seconds per arm and round"
    )
    parser.add_argument("--bytes-rounds", type=int, default=3)
    parser.add_argument("--fresh-chunks", action="store_true", help="bytes: new chunks, not the last again")
    parser.add_argument("--picker-rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=16, help="picker: concurrent callers")
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--workers", type=int, default=5, help="64x64 workers (the streams' pool)")
    parser.add_argument("--smoke", action="store_true", help="every part tiny (the test's run)")
    args = parser.parse_args()
    if args.smoke:  # the tiny sizes, where not given
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    raise_open_files(4 * args.streams + 1024)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    with rig(args) as setup:
        if "ticks" in args.parts:
            print_ticks(measure_ticks(setup, args.rounds, args.warmup), args.concurrency)
        if "streams" in args.parts:
            print_streams(measure_streams(setup), args.concurrency[0])
        if "picker" in args.parts:
            print_picker(measure_picker(setup, args.picker_rounds, args.seconds, args.callers))
        if "bytes" in args.parts:
            print_bytes(measure_bytes(setup, args.bytes_rounds, args.seconds, args.fresh_chunks))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    main()
