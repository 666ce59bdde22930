"""The pod runner (the dev cluster's kubelet) with a trivial HTTP process and with the fake-runtime worker."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ardiff.devcluster.kube_api import KubeAPIThread
from ardiff.devcluster.pod_runner import (
    PodContext,
    PodRunner,
    build_env,
    container_command,
    resolve_executable,
)
from ardiff.devcluster.waiting import wait_until
from ardiff.kv.placement import PlacementStore
from ardiff.kv.records import PoolId

HTTP_POD = Path(__file__).with_name("http_pod.py")
RUNNER_LABEL = "ardiff.test/runner"


def http_pod_command(context: PodContext) -> list[str]:
    """The pluggable command: the trivial HTTP process, with the container's args."""
    return [sys.executable, str(HTTP_POD), *(context.container.get("args") or [])]


@pytest.fixture(scope="module")
def runner(kube_api: KubeAPIThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    """A runner of its own (own label) so that the session's `pod_runner` never takes these Pods."""
    logs = tmp_path_factory.mktemp("runner-logs")
    with PodRunner(
        kube_api.url, command=http_pod_command, label_selector=f"{RUNNER_LABEL}=http", logs_dir=logs
    ) as r:
        yield r


@pytest.fixture
def client(kube_api: KubeAPIThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kube_api.url, timeout=10) as http:
        yield http


def pod_body(
    name: str, *, args: list[str] | None = None, selector: str = "http", **spec: Any
) -> dict[str, Any]:
    container = {
        "name": "worker",
        "image": "ghcr.io/ardiff/ardiff-worker:test",
        "command": ["ardiff", "worker", "serve"],
        "args": args or [],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "POOL",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ardiffusion.dev/pool']"}},
            },
            {
                "name": "TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token", "optional": True}},
            },
            {"name": "GREETING", "value": "hello $(POD_NAME)"},
            {"name": "ARDIFF_PORT", "value": "8000"},  # the runner's free port wins
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "failureThreshold": 1},
    }
    return {
        "metadata": {"name": name, "labels": {RUNNER_LABEL: selector, "ardiffusion.dev/pool": "tiny-world"}},
        "spec": {"containers": [container], **spec},
    }


def get_pod(client: httpx.Client, ns: str, name: str) -> dict[str, Any]:
    return client.get(f"/api/v1/namespaces/{ns}/pods/{name}").json()


def wait_for_pod(
    client: httpx.Client, ns: str, name: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The Pod as the API shows it, once `predicate` holds."""
    return wait_until(lambda: pod if predicate(pod := get_pod(client, ns, name)) else None)


def ready_condition(pod: dict[str, Any]) -> str | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def test_pod_runs_with_resolved_env_and_reports_ready(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    secret = {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).raise_for_status()
    client.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1")).raise_for_status()
    info = runner.wait_for(lambda i: i.ready, "w1", ns)
    pod = wait_for_pod(client, ns, "w1", lambda p: ready_condition(p) == "True")
    assert pod["spec"]["nodeName"] == runner.node_name  # claimed through the binding subresource
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"] == "127.0.0.1"
    status = pod["status"]["containerStatuses"][0]
    assert (status["name"], status["ready"], status["restartCount"]) == ("worker", True, 0)
    assert "running" in status["state"]

    env = httpx.get(f"http://127.0.0.1:{info.port}/env").json()
    assert env["POD_NAME"] == env["HOSTNAME"] == env["ARDIFF_POD_NAME"] == "w1"
    assert env["POD_NAMESPACE"] == ns
    assert env["POD_IP"] == env["ARDIFF_POD_IP"] == env["ARDIFF_HOST"] == "127.0.0.1"
    assert env["POOL"] == "tiny-world"
    assert env["TOKEN"] == "s3cret"
    assert env["GREETING"] == "hello w1"
    assert env["ARDIFF_PORT"] == str(info.port) != "8000"
    assert env["OMP_NUM_THREADS"] == "1"
    assert f"serving on {info.port} as w1" in info.log_path.read_text()


def test_a_killed_process_is_reported_and_restarted(
    runner: PodRunner, client: httpx.Client, kube_namespace: str, watch: Callable[..., Any]
) -> None:
    ns = kube_namespace
    client.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1")).raise_for_status()
    first = runner.wait_for(lambda i: i.ready, "w1", ns)
    wait_until(lambda: ready_condition(get_pod(client, ns, "w1")) == "True")
    watcher = watch(f"/api/v1/namespaces/{ns}/pods", fieldSelector="metadata.name=w1")
    assert runner.kill("w1", signal.SIGKILL, ns) == first.pid
    second = runner.wait_for(lambda i: i.restart_count == 1 and i.ready, "w1", ns)
    assert second.pid != first.pid
    assert second.port == first.port  # same Pod, same address
    pod = wait_for_pod(client, ns, "w1", lambda p: ready_condition(p) == "True")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["signal"] == signal.SIGKILL
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    # On the way the API showed the container terminated and the Pod not Ready.
    statuses = [e["object"]["status"] for e in watcher.events if e["type"] == "MODIFIED"]
    dead = [s for s in statuses if "terminated" in s["containerStatuses"][0]["state"]]
    assert dead
    assert all(ready_condition({"status": s}) == "False" for s in dead)


def test_deleting_the_pod_stops_the_process_gracefully(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    client.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1")).raise_for_status()
    info = runner.wait_for(lambda i: i.ready, "w1", ns)
    client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404)
    assert runner.info("w1", ns) is None
    with pytest.raises(ProcessLookupError):
        os.kill(info.pid, 0)  # type: ignore[arg-type]
    assert "got SIGTERM" in info.log_path.read_text()


def test_empty_dir_volumes_are_local_directories_that_live_as_long_as_the_pod(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    body = pod_body("w1", volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}])
    container = body["spec"]["containers"][0]
    container["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/var/scratch"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    container["env"] += [
        {"name": "SCRATCH", "value": "/var/scratch/models"},
        {"name": "ELSEWHERE", "value": "/var/scratchpad"},  # not under the mount path
    ]
    client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
    info = runner.wait_for(lambda i: i.ready, "w1", ns)
    env = httpx.get(f"http://127.0.0.1:{info.port}/env").json()
    [volumes] = [d for d in runner.volumes_dir.iterdir() if d.name.startswith(f"{ns}_w1_")]
    assert env["SCRATCH"] == str(volumes / "scratch" / "models")
    assert env["TMPDIR"] == str(volumes / "tmp")
    assert env["ELSEWHERE"] == "/var/scratchpad"
    assert sorted(d.name for d in volumes.iterdir()) == ["scratch", "tmp"]
    (volumes / "scratch" / "kept").write_text("across restarts")
    runner.kill("w1", signal.SIGKILL, ns)
    runner.wait_for(lambda i: i.ready and i.restart_count == 1, "w1", ns)
    assert (volumes / "scratch" / "kept").read_text() == "across restarts"

    client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404)
    assert not volumes.exists()


def test_build_env_rewrites_paths_under_mounts() -> None:
    pod = {"metadata": {"name": "w1", "namespace": "ns"}}
    container = {
        "env": [
            {"name": "HOME", "value": "/home/ardiff"},
            {"name": "CACHE", "value": "$(HOME)/.cache"},
            {"name": "OTHER", "value": "/home/ardiffx"},
        ]
    }
    mounts = {"/home/ardiff": "/local/home", "/tmp": "/local/tmp"}
    env = build_env(pod, container, base={}, secret_data={}, config_map_data={}, overrides={}, mounts=mounts)
    assert (env["HOME"], env["CACHE"], env["OTHER"]) == ("/local/home", "/local/home/.cache", "/home/ardiffx")
    assert env["TMPDIR"] == "/local/tmp"


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    body = pod_body("w1", args=["--ignore-sigterm"], terminationGracePeriodSeconds=1)
    client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
    info = runner.wait_for(lambda i: i.ready, "w1", ns)
    started = time.monotonic()
    client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
    assert (
        client.get(f"/api/v1/namespaces/{ns}/pods/w1").json()["metadata"]["deletionGracePeriodSeconds"] == 1
    )
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404)
    assert 0.9 <= time.monotonic() - started < 10
    with pytest.raises(ProcessLookupError):
        os.kill(info.pid, 0)  # type: ignore[arg-type]


def test_readiness_follows_the_probe(runner: PodRunner, client: httpx.Client, kube_namespace: str) -> None:
    ns = kube_namespace
    client.post(f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1")).raise_for_status()
    info = runner.wait_for(lambda i: i.ready, "w1", ns)
    httpx.post(f"http://127.0.0.1:{info.port}/unready")
    wait_until(lambda: ready_condition(get_pod(client, ns, "w1")) == "False")
    assert runner.info("w1", ns).ready is False  # type: ignore[union-attr]
    httpx.post(f"http://127.0.0.1:{info.port}/ready")
    wait_until(lambda: ready_condition(get_pod(client, ns, "w1")) == "True")


def test_restart_policy_never_lets_the_pod_fail(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    body = pod_body("w1", args=["--exit", "3"], restartPolicy="Never")
    client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
    pod = wait_for_pod(client, ns, "w1", lambda p: p["status"]["phase"] == "Failed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert runner.info("w1", ns).restart_count == 0  # type: ignore[union-attr]
    client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404)


def test_a_pod_runs_on_exactly_one_runner(
    kube_api: KubeAPIThread, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    selector = f"{RUNNER_LABEL}=pair"
    with (
        PodRunner(kube_api.url, command=http_pod_command, label_selector=selector) as one,
        PodRunner(kube_api.url, command=http_pod_command, label_selector=selector) as two,
    ):
        for index in range(4):
            client.post(
                f"/api/v1/namespaces/{ns}/pods", json=pod_body(f"w{index}", selector="pair")
            ).raise_for_status()
        for index in range(4):
            wait_until(lambda i=index: one.info(f"w{i}", ns) or two.info(f"w{i}", ns))
        owners = [(one.info(f"w{i}", ns) is not None, two.info(f"w{i}", ns) is not None) for i in range(4)]
        assert all(a != b for a, b in owners), owners
        nodes = {get_pod(client, ns, f"w{i}")["spec"]["nodeName"] for i in range(4)}
        assert nodes <= {one.node_name, two.node_name}
    # A stopped runner reports its Pods as failed, like a node that shut down.
    pod = get_pod(client, ns, "w0")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "Shutdown"


def test_a_pod_without_a_command_cannot_start(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    body = pod_body("w1")
    body["spec"]["containers"][0]["env"].append(
        {"name": "MISSING", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}
    )
    client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
    pod = wait_for_pod(client, ns, "w1", lambda p: bool(p["status"].get("containerStatuses")))
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerConfigError"
    assert "configmap 'nope' not found" in waiting["message"]


def test_a_missing_executable_is_a_run_container_error(
    kube_api: KubeAPIThread, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    missing = "/nonexistent/ardiff-worker"
    with PodRunner(kube_api.url, command=lambda _: [missing], label_selector=f"{RUNNER_LABEL}=broken"):
        client.post(
            f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1", selector="broken")
        ).raise_for_status()
        pod = wait_for_pod(client, ns, "w1", lambda p: bool(p["status"].get("containerStatuses")))
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["reason"] == "RunContainerError"
    assert missing in waiting["message"]


def test_default_command_is_the_containers_own() -> None:
    container = {"name": "w", "command": ["ardiff", "worker", "serve"], "args": ["--port", "$(ARDIFF_PORT)"]}
    argv = container_command(PodContext({}, container, {"ARDIFF_PORT": "4321"}, 4321))
    assert argv[-4:] == ["worker", "serve", "--port", "4321"]
    assert argv[0] in (str(Path(sys.executable).with_name("ardiff")), sys.executable)
    assert resolve_executable("python") == [sys.executable]
    assert resolve_executable("sleep") == ["sleep"]
    with pytest.raises(ValueError, match="has no command"):
        container_command(PodContext({}, {"name": "w"}, {}, 1))


def test_build_env_sources_and_precedence() -> None:
    pod = {
        "metadata": {"name": "w1", "namespace": "ns", "annotations": {"a": "b"}},
        "status": {"podIP": "10.0.0.1"},
    }
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "A", "value": "$(CFG_MODE)-1"},
            {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}},
            {"name": "OMP_NUM_THREADS", "value": "8"},
        ],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
    }
    env = build_env(
        pod,
        container,
        base={"PATH": "/bin", "A": "base"},
        secret_data={},
        config_map_data={"settings": {"MODE": "fast"}},
        overrides={"OMP_NUM_THREADS": "1"},
    )
    assert env["CFG_MODE"] == "fast"
    assert env["A"] == "fast-1"
    assert env["NOTE"] == "b"
    assert env["IP"] == "10.0.0.1"
    assert env["GPU"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"  # overrides win
    assert env["PATH"] == "/bin"
    with pytest.raises(ValueError, match="secret 'gone' not found"):
        build_env(
            pod,
            {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k"}}}]},
            base={},
            secret_data={},
            config_map_data={},
            overrides={},
        )


async def _pod_epochs(redis_url: str, pool: PoolId) -> dict[str, int]:
    async with PlacementStore.from_url(redis_url) as store:
        return {pod.name: pod.epoch for pod in await store.list_pods(pool)}


@pytest.mark.slow
def test_fake_runtime_worker_registers_a_new_epoch_after_kill_9(
    kube_api: KubeAPIThread,
    client: httpx.Client,
    kube_namespace: str,
    redis_url: str,
    unique_pool: str,
    tmp_path: Path,
) -> None:
    """The real worker (`ardiff worker serve`, fake runtime) under the runner's default command."""
    ns = kube_namespace
    env = {
        "ARDIFF_RUNTIME": "fake",
        "ARDIFF_REDIS_URL": redis_url,
        "ARDIFF_NAMESPACE": ns,
        "ARDIFF_POOL": unique_pool,
        "ARDIFF_HEARTBEAT_SECONDS": "0.5",
    }
    body = pod_body("w1", selector="fake")
    container = body["spec"]["containers"][0]
    container["args"] = []
    container["env"] = [{"name": k, "value": v} for k, v in env.items()] + [
        {"name": "ARDIFF_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    pool = PoolId(ns, unique_pool)
    with PodRunner(kube_api.url, label_selector=f"{RUNNER_LABEL}=fake", logs_dir=tmp_path) as runner:
        client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
        first = runner.wait_for(lambda i: i.ready, "w1", ns, timeout=60)
        epochs = asyncio.run(_pod_epochs(redis_url, pool))
        assert list(epochs) == ["w1"]
        health = httpx.get(f"http://127.0.0.1:{first.port}/readyz")
        assert health.status_code == 200
        runner.kill("w1", signal.SIGKILL, ns)
        runner.wait_for(lambda i: i.restart_count == 1 and i.ready, "w1", ns, timeout=60)
        assert asyncio.run(_pod_epochs(redis_url, pool))["w1"] > epochs["w1"]
        client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
        wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404, timeout=40)
    log = (tmp_path / f"{ns}_w1.log").read_text()
    assert log.count("start #") == 2


def test_init_containers_run_first_and_a_claim_is_a_directory_shared_by_pods(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    """The pool's model download step (issue 11 item 3): the real `ardiff worker download-model` as an init
    container fetches from a local file server (token from a Secret) into a PersistentVolumeClaim; the main
    container sees the model under its mount path; a second Pod on the claim finds it complete."""
    from tests.file_server import serve_files, tar_gz

    ns = kube_namespace
    secret = {"metadata": {"name": "hf-token"}, "stringData": {"token": "s3cret"}}
    client.post(f"/api/v1/namespaces/{ns}/secrets", json=secret).raise_for_status()
    with serve_files({"/m.tgz": tar_gz({"config.json": b"{}"})}, token="s3cret") as server:
        download = {
            "name": "model-download",
            "image": "ghcr.io/ardiff/ardiff-worker:test",
            "command": [
                "ardiff",
                "worker",
                "download-model",
                "--dest",
                "$(ARDIFF_MODEL)",  # as the operator builds it: an env value is mapped to the claim
                "--url",
                f"{server.url}/m.tgz",
            ],
            "env": [
                {"name": "ARDIFF_MODEL", "value": "/models/m"},
                {
                    "name": "ARDIFF_DOWNLOAD_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
                },
            ],
            "volumeMounts": [{"name": "model", "mountPath": "/models"}],
        }
        for name in ("w1", "w2"):
            body = pod_body(
                name,
                initContainers=[download],
                volumes=[{"name": "model", "persistentVolumeClaim": {"claimName": "models"}}],
            )
            container = body["spec"]["containers"][0]
            container["volumeMounts"] = [{"name": "model", "mountPath": "/models", "readOnly": True}]
            container["env"].append({"name": "MODEL", "value": "/models/m"})
            client.post(f"/api/v1/namespaces/{ns}/pods", json=body).raise_for_status()
            info = runner.wait_for(lambda i: i.ready, name, ns)
            claim = runner.volumes_dir / "pvc" / ns / "models"
            env = httpx.get(f"http://127.0.0.1:{info.port}/env").json()
            assert env["MODEL"] == str(claim / "m")
            assert (claim / "m" / "config.json").read_bytes() == b"{}"
            status = wait_for_pod(client, ns, name, lambda p: ready_condition(p) == "True")["status"]
            [init] = status["initContainerStatuses"]
            assert (init["name"], init["state"]["terminated"]["exitCode"], init["ready"]) == (
                "model-download",
                0,
                True,
            )
            assert {c["type"]: c["status"] for c in status["conditions"]}["Initialized"] == "True"
        assert server.authorizations == ["Bearer s3cret"]  # the second Pod found it complete
        assert "already holds" in info.log_path.read_text()
    for name in ("w1", "w2"):
        client.delete(f"/api/v1/namespaces/{ns}/pods/{name}")
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w2").status_code == 404)
    assert (claim / "m" / "config.json").exists()  # a claim outlives its Pods


def test_a_failing_init_container_keeps_the_pod_initializing(
    runner: PodRunner, client: httpx.Client, kube_namespace: str
) -> None:
    ns = kube_namespace
    failing = {"name": "fail", "image": "x", "command": ["python", "-c", "raise SystemExit(3)"]}
    client.post(
        f"/api/v1/namespaces/{ns}/pods", json=pod_body("w1", initContainers=[failing])
    ).raise_for_status()
    pod = wait_for_pod(
        client,
        ns,
        "w1",
        lambda p: (
            ((p.get("status") or {}).get("initContainerStatuses") or [{}])[0].get("restartCount", 0) >= 1
        ),
    )
    assert runner.info("w1", ns).pid is None  # the main container never started
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Initialized"] == "False"
    client.delete(f"/api/v1/namespaces/{ns}/pods/w1")
    wait_until(lambda: client.get(f"/api/v1/namespaces/{ns}/pods/w1").status_code == 404)
