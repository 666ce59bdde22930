"""The front door from outside the cluster (issue 37 item 5): the chart installed as a user would, its gateway
(Envoy and the endpoint picker, two replicas) behind a NodePort that the real kube-proxy serves on the nodes'
addresses, and a client in a network namespace of its own whose only route is to the nodes and the API
server (`ClusterNetwork.add_outside`: the root namespace routes the Pod CIDRs, so a client there would prove
nothing). Through the front door: the Python client ticks; a wrong token is 401 at the edge and no worker
counts it; a stream whose session is moved to another Pod continues after one reconnect with the chunks of
its twin; the real openpi-client drives a DreamZero session; the viewer streams in Chromium; a gateway Pod
killed with `kill -9` under ticking clients loses no session; Redis stopped gives retryable 503s with codes,
then recovery.

The worker Pods run the fake runtime (deterministic frames, exports small enough to move at once).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ardiff.devcluster.cluster import DevCluster
from ardiff.devcluster.network import namespace_pids, short_pod_id
from ardiff.devcluster.waiting import condition_true, wait_until
from tests.chart.test_helm_release import GROUP, Release
from tests.e2e.conftest import restore_default_sigint

pytestmark = pytest.mark.slow

NODE_PORT = 31380
POOL = "walkers"
ROBOTS = "robots"
OUTSIDE = Path(__file__).with_name("outside_client.py")
MOVED_CHUNKS = "50"  # the moved stream's length: ~15 s, while a new Pod starts and the session moves
OPENPI_CLIENT = "openpi-client==0.1.2"
FAKE_ENV = [
    {"name": "ARDIFF_RUNTIME", "value": "fake"},
    {"name": "ARDIFF_FAKE_CAPACITY", "value": "4"},
    {"name": "ARDIFF_FAKE_TICK_SECONDS", "value": "0.05"},
    # A host tier: the pods export sessions, so a roll moves them pod to pod.
    {"name": "ARDIFF_HOST_TIER_BYTES", "value": str(64 << 20)},
    {"name": "ARDIFF_LEASE_SECONDS", "value": "5"},
    {"name": "ARDIFF_HEARTBEAT_SECONDS", "value": "1"},
]
OPERATOR_ENV = [
    {"name": "ARDIFF_OPERATOR_RECONCILE_SECONDS", "value": "0.5"},
    {"name": "ARDIFF_OPERATOR_MIRROR_SECONDS", "value": "1"},
]


def pool_spec(env: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    return {
        "model": {"name": "tiny-lingbot-world", "height": 64, "width": 64},
        "env": env,
        "replicas": {"min": 1, "max": 2},
        "eviction": {"minIdleSeconds": 0},
        **extra,
    }


@dataclass
class FrontDoor:
    release: Release
    public_url: str
    outside: str  # the outside network namespace
    cluster: DevCluster

    @property
    def namespace(self) -> str:
        return self.release.namespace

    def run_outside(self, *args: str, python: str = sys.executable, timeout: float = 180) -> dict[str, Any]:
        """`outside_client.py ARGS` in the outside namespace; its JSON line."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.outside, python, str(OUTSIDE), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            cwd="/",  # not the checkout: its `operator/` would shadow the standard library's
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def start_outside(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.outside, sys.executable, str(OUTSIDE), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            cwd="/",
        )

    def session(self, name: str, pool: str = POOL, **spec: Any) -> dict[str, Any]:
        """A session of `pool`; its status once Ready."""
        path = GROUP.format(ns=self.namespace) + "/ardiffusionsessions"
        body = {
            "apiVersion": "ardiffusion.dev/v1alpha1",
            "kind": "ARDiffusionSession",
            "metadata": {"name": name},
            "spec": {"poolRef": pool, "prompt": "a walk through a forest", **spec},
        }
        created = self.release.http.post(path, json=body)
        assert created.status_code == 201, created.text
        return wait_until(
            lambda: (
                (s := (self.release.get(f"{path}/{name}") or {}).get("status") or {}).get("phase") == "Ready"
                and s
            ),
            timeout=180,
            what=f"session {name} Ready",
        )

    def token(self, name: str) -> str:
        secret = self.release.get(f"/api/v1/namespaces/{self.namespace}/secrets/{name}-token")
        assert secret is not None
        return base64.b64decode(secret["data"]["token"]).decode()

    def worker_pods(self, pool: str = POOL) -> list[dict[str, Any]]:
        return [
            p
            for p in self.release.pods()
            if p["metadata"].get("labels", {}).get("ardiffusion.dev/pool") == pool
            and not p["metadata"].get("deletionTimestamp")
        ]

    def gateway_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.release.pods()
            if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "gateway"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def worker_requests(self) -> float:
        """Ticks answered plus errors answered, over every worker Pod of the pool (their /metrics)."""
        total = 0.0
        for pod in self.worker_pods():
            text = httpx.get(f"http://{pod['status']['podIP']}:8000/metrics", timeout=10).text
            total += sum(
                float(v)
                for v in re.findall(r"^ardiff_(?:ticks_total|tick_errors_total\{[^}]*\}) (\S+)$", text, re.M)
            )
        return total


@pytest.fixture(scope="module")
def door(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    assert dev_cluster.network is not None
    release = Release(dev_cluster, tmp_path_factory.mktemp("front-door"))
    public_url = f"http://{dev_cluster.network.node_ip(1)}:{NODE_PORT}"
    values = {
        "defaultPool": {"enabled": True, "name": POOL, "spec": pool_spec(FAKE_ENV)},
        "gateway": {"service": {"type": "NodePort", "nodePort": NODE_PORT}, "publicURL": public_url},
        "operator": {"extraEnv": OPERATOR_ENV},
        "uninstall": {"timeoutSeconds": 120},
    }
    values_file = tmp_path_factory.mktemp("front-door-values") / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    installed = release.helm("install", "ardiff", str(release.chart.path), "-f", str(values_file), "--wait")
    assert installed.returncode == 0, installed.stderr + release.diagnostics()
    robots = {
        "apiVersion": "ardiffusion.dev/v1alpha1",
        "kind": "ARDiffusionWorkerPool",
        "metadata": {"name": ROBOTS},
        "spec": pool_spec(
            [*FAKE_ENV[:2], *FAKE_ENV[4:]],
            model={"name": "tiny-dreamzero", "pipeline": "DreamZeroPipeline", "height": 64, "width": 64},
            image="ghcr.io/ardiff/ardiff-worker:0.1.0",
        ),
    }
    pools = GROUP.format(ns=release.namespace) + "/ardiffusionworkerpools"
    created = release.http.post(pools, json=robots)
    assert created.status_code == 201, created.text
    try:
        yield FrontDoor(release, public_url, dev_cluster.network.add_outside(1), dev_cluster)
    finally:
        print(release.diagnostics())
        release.helm("uninstall", "ardiff", "--wait", "--timeout", "180s")
        release.delete_namespace()
        release.http.close()


def test_a_laptop_ticks_a_session_through_the_front_door_and_reaches_no_pod(door: FrontDoor) -> None:
    status = door.session("walk")
    assert status["url"] == f"{door.public_url}/pools/{door.namespace}/{POOL}"
    ticked = door.run_outside("tick", door.namespace, "walk", "3")
    assert ticked["base"] == status["url"]
    assert len(ticked["digests"]) == 3
    assert ticked["next"] == 3
    # The laptop has no route to a Pod: the session's own endpoint is out of its reach.
    unreachable = subprocess.run(
        ["ip", "netns", "exec", door.outside, "curl", "-s", "-m", "2", f"{status['endpoint']}/healthz"],
        capture_output=True,
        check=False,
    )
    assert unreachable.returncode != 0
    wide = door.cluster.kubectl("get", "adsession", "walk", "-n", door.namespace, "-o", "wide").stdout
    assert status["url"] in wide


def test_a_wrong_token_is_401_at_the_edge_and_no_worker_counts_it(door: FrontDoor) -> None:
    door.session("guarded")
    base = f"{door.public_url}/pools/{door.namespace}/{POOL}/v1/sessions"
    before = door.worker_requests()
    for url, token in (
        (f"{base}/guarded/ticks", "not-the-token"),
        (f"{base}/guarded/ticks", None),
        (f"{base}/nobody/ticks", door.token("guarded")),
    ):
        answer = door.run_outside("request", "POST", url, *([f"--token={token}"] if token else []))
        assert answer["status"] == 401, answer
        assert json.loads(answer["body"])["error"]["code"] == "unauthorized"
    for path in ("/metrics", f"/pools/{door.namespace}/{POOL}/v1/sessions"):
        answer = door.run_outside("request", "GET", f"{door.public_url}{path}")
        assert answer["status"] == 404, answer
    assert door.worker_requests() == before


def test_a_stream_moved_to_another_pod_continues_after_one_reconnect_like_its_twin(door: FrontDoor) -> None:
    door.session("twin", seed=3)
    door.session("mover", seed=3)
    base = f"{door.public_url}/pools/{door.namespace}/{POOL}".replace("http://", "ws://")
    twin = door.run_outside(
        "stream", f"{base}/v1/sessions/twin/stream", MOVED_CHUNKS, f"--token={door.token('twin')}"
    )
    assert twin["closes"] == []
    streaming = door.start_outside(
        "stream",
        f"{base}/v1/sessions/mover/stream",
        MOVED_CHUNKS,
        f"--token={door.token('mover')}",
        "--pause",
        "0.3",
    )
    try:
        time.sleep(1)  # a few chunks out
        before = door.release.get(GROUP.format(ns=door.namespace) + "/ardiffusionsessions/mover")
        assert before is not None
        old_pod = before["status"]["pod"]
        # A roll (a change that keeps the sessions' identity): the live session moves pod to pod.
        pools = GROUP.format(ns=door.namespace) + "/ardiffusionworkerpools"
        door.release.http.patch(
            f"{pools}/{POOL}",
            json={"spec": {"kv": {"gpuMemoryFraction": 0.5}}},
            headers={"content-type": "application/merge-patch+json"},
        ).raise_for_status()
        out, err = streaming.communicate(timeout=150)
    finally:
        streaming.kill()
    assert streaming.returncode == 0, out + err
    moved = json.loads(out.strip().splitlines()[-1])
    after = door.release.get(GROUP.format(ns=door.namespace) + "/ardiffusionsessions/mover")
    assert after is not None
    assert after["status"]["pod"] != old_pod
    assert moved["closes"] == [4421], moved  # one reconnect, at the same URL
    assert moved["digests"] == twin["digests"]


def test_the_real_openpi_client_drives_a_robot_session_through_the_front_door(
    door: FrontDoor, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """openpi-client builds `ws://host[:port]`: the session's openpi URL at the front door is its host."""
    robot_venv = tmp_path_factory.mktemp("robot") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(robot_venv)], check=True)
    pip = [str(robot_venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, OPENPI_CLIENT, "httpx"], check=True, timeout=300)
    door.session("arm", pool=ROBOTS, family="dreamzero")
    url = f"{door.public_url}/pools/{door.namespace}/{ROBOTS}/v1/sessions/arm/openpi".replace("http", "ws", 1)
    driven = door.run_outside(
        "openpi", url, "2", f"--token={door.token('arm')}", python=str(robot_venv / "bin" / "python")
    )
    assert "action_space" in driven["metadata"]
    assert len(driven["shapes"]) == 2
    assert all(len(shape) == 2 and shape[1] == 8 for shape in driven["shapes"])


def test_kill_9_of_a_gateway_pod_under_ticking_clients_loses_no_session(door: FrontDoor) -> None:
    names = ["runner-a", "runner-b"]
    for name in names:
        door.session(name)
    clients = [door.start_outside("tick", door.namespace, name, "20") for name in names]
    try:
        time.sleep(1.5)
        [victim, *_] = door.gateway_pods()
        killed = 0
        assert door.cluster.network is not None
        pod_namespace = door.cluster.network.pod_namespace(short_pod_id(victim["metadata"]["uid"]))
        for pid in namespace_pids(pod_namespace):
            os.kill(pid, signal.SIGKILL)
            killed += 1
        assert killed >= 2  # Envoy and the picker
        results = [client.communicate(timeout=180) for client in clients]
    finally:
        for client in clients:
            client.kill()
    for client, (out, err) in zip(clients, results, strict=True):
        assert client.returncode == 0, out + err
        assert json.loads(out.strip().splitlines()[-1])["next"] == 20
    wait_until(lambda: len([p for p in door.gateway_pods() if condition_true(p, "Ready")]) == 2, timeout=120)


def test_redis_stopped_is_a_retryable_503_with_a_code_then_the_session_ticks_again(door: FrontDoor) -> None:
    door.session("patient")
    url = f"{door.public_url}/pools/{door.namespace}/{POOL}/v1/sessions/patient"
    token = door.token("patient")
    # Answering first (the gateway Pods the test before scaled may still be settling: a 503 then is theirs).
    wait_until(
        lambda: door.run_outside("request", "GET", url, f"--token={token}")["status"] == 200,
        timeout=60,
        what="the session answering through the front door before Redis stops",
    )
    redis = f"{door.release.chart.fullname}-redis"
    door.cluster.kubectl("scale", "statefulset", redis, "--replicas=0", "-n", door.namespace)
    try:
        answer = wait_until(
            lambda: (a := door.run_outside("request", "GET", url, f"--token={token}"))["status"] == 503 and a,
            timeout=60,
            what="the front door's 503 with Redis away",
        )
        error = json.loads(answer["body"])["error"]
        assert error["code"] in ("not_ready", "placement_recovering"), error
        assert answer["headers"]["retry-after"] == "1"
    finally:
        door.cluster.kubectl("scale", "statefulset", redis, "--replicas=1", "-n", door.namespace)
    wait_until(
        lambda: door.run_outside("request", "GET", url, f"--token={token}")["status"] == 200,
        timeout=180,
        what="the session answering again through the front door",
    )


def test_the_viewer_outside_the_cluster_streams_through_the_front_door_in_chromium(door: FrontDoor) -> None:
    """`ardiff view` on the laptop (the outside namespace, listening on its address) proxies the session's
    stream from its status.url; Chromium opens the page and frames arrive in order."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tests.e2e.test_viewer import CHROMEDRIVER, CHROMIUM, page_log

    door.session("viewed")
    assert door.cluster.network is not None
    host = door.cluster.network.outside_ip(1)
    view = ["view", "viewed", "-n", door.namespace, "--kubeconfig", str(door.cluster.kubeconfig)]
    viewer = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            door.outside,
            sys.executable,
            "-m",
            "ardiff.cli",
            *view,
            "--host",
            host,
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
        preexec_fn=restore_default_sigint,  # the Ctrl-C below reaches it even when this run ignores SIGINT
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    browser = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        assert viewer.stdout is not None
        line = viewer.stdout.readline()
        assert "viewer of session" in line, line
        browser.get(line.split(" at ")[1].split()[0])
        wait_until(lambda: len(page_log(browser)["chunks"]) >= 3, timeout=60, what="chunks in the page")
        chunks = page_log(browser)["chunks"]
        assert [c["chunk_index"] for c in chunks] == list(range(len(chunks)))
    finally:
        browser.quit()
        viewer.send_signal(signal.SIGINT)
        viewer.wait(timeout=20)
