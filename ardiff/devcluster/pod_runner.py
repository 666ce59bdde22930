"""The dev cluster's kubelet: runs a local process for each worker Pod the API holds.

`PodRunner` watches Pods (by default those labelled `app.kubernetes.io/component=worker`) through the
emulated API and, like a kubelet, for each Pod it claims (binding it to its node name; another runner's
Pods are left alone):
- starts a process with a pluggable command (`PodCommand`; default `container_command`: the first
  container's `command` + `args`, `ardiff`/`python` resolved to this virtualenv) and the container's env
  (`valueFrom` fieldRef/secretKeyRef/configMapKeyRef resolved) plus the local overrides
  `ARDIFF_HOST=127.0.0.1`, `ARDIFF_POD_IP=127.0.0.1`, `ARDIFF_PORT=<a free port>`, `OMP_NUM_THREADS=1`;
- runs the Pod's `initContainers` first, in order, each to completion (their `command` + `args` and env, as
  for the main container; a failed one is retried with backoff unless restartPolicy is Never), once per Pod;
- gives each `emptyDir` volume the container mounts a local directory of its own (`<volumes_dir>/<namespace>_
  <pod>_<uid prefix>/<volume>`; default `volumes_dir`: `<logs_dir>/volumes`), kept across restarts and
  removed with the Pod; a `persistentVolumeClaim` volume is the claim's directory (`<volumes_dir>/pvc/
  <namespace>/<claim>`), shared by the Pods that mount it and kept after them. A local process cannot see the
  container's
  mount paths, so env values under a mount path (e.g. `HOME=/home/ardiff`) are rewritten to that directory,
  and a volume mounted at `/tmp` becomes `TMPDIR`;
- writes the Pod's status: phase Running, `podIP` 127.0.0.1, `containerStatuses` (state, restartCount),
  and the Ready condition from the container's HTTP readinessProbe path (default `/readyz`);
- when the process dies (e.g. `kill -9`) marks the container terminated and the Pod not Ready, then
  restarts it on the same port after a short backoff (restartPolicy Always; OnFailure and Never too);
- when the Pod is deleted: SIGTERM, SIGKILL after the grace period, then the final delete (grace 0).
Each Pod's output goes to `<logs_dir>/<namespace>_<pod>.log` (appended across restarts).
A Pod whose `nodeSelector` names another node (`kubernetes.io/hostname`) is left to that node's runner.

`simulated=True` runs no process at all: each worker Pod registers in Redis and heartbeats through the
worker's own link (`simulated_pods`) and is reported Running and Ready, so that the control plane can be
driven at a scale (1,000 pods) that processes could not reach on one machine.

Run it on a loop (`await runner.run()`) or on a thread (`with PodRunner(url).start(): ...`); `kill`,
`info` and `wait_for` are safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Self

import httpx

from ardiff.devcluster.redis_server import free_port
from ardiff.devcluster.simulated_pods import run_simulated, simulated_link

log = logging.getLogger(__name__)

WORKER_SELECTOR = "app.kubernetes.io/component=worker"
# The node label a runner has (its node name): a Pod whose nodeSelector names another node is not its.
HOSTNAME_LABEL = "kubernetes.io/hostname"
LOCAL_IP = "127.0.0.1"
_ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodContext:
    """What a PodCommand gets: the Pod, its (first) container, the resolved env and the local port."""

    pod: Mapping[str, Any]
    container: Mapping[str, Any]
    env: Mapping[str, str]
    port: int


class PodCommand(Protocol):
    """Builds the argv of a Pod's process. Raise ValueError when the Pod cannot run locally."""

    def __call__(self, context: PodContext) -> list[str]: ...


def resolve_executable(name: str) -> list[str]:
    """`ardiff` and `python` mean this virtualenv's, whatever PATH says."""
    if name == "ardiff":
        script = Path(sys.executable).with_name("ardiff")
        return [str(script)] if script.exists() else [sys.executable, "-m", "ardiff.cli"]
    if name in ("python", "python3"):
        return [sys.executable]
    return [name]


def expand_references(value: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion (unknown references stay as they are)."""
    return _ENV_REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def container_command(context: PodContext) -> list[str]:
    """The default PodCommand: the container's `command` + `args`, as a container runtime would run them."""
    command = list(context.container.get("command") or [])
    if not command:
        raise ValueError(
            f"container {context.container.get('name')!r} has no command: the dev cluster cannot run an "
            "image's entrypoint, so worker Pods must spell out their command"
        )
    args = [expand_references(a, context.env) for a in [*command[1:], *(context.container.get("args") or [])]]
    return [*resolve_executable(command[0]), *args]


def _field_ref(pod: Mapping[str, Any], path: str) -> str:
    meta = pod.get("metadata") or {}
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def empty_dir_mounts(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """{mount path: volume name} of the container's `emptyDir` volume mounts."""
    empty_dirs = {v["name"] for v in (pod.get("spec") or {}).get("volumes") or [] if "emptyDir" in v}
    return {
        m["mountPath"].rstrip("/") or "/": m["name"]
        for m in container.get("volumeMounts") or []
        if m["name"] in empty_dirs
    }


def claim_mounts(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """{mount path: claim name} of the container's `persistentVolumeClaim` volume mounts."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in (pod.get("spec") or {}).get("volumes") or []
        if "persistentVolumeClaim" in v
    }
    return {
        m["mountPath"].rstrip("/") or "/": claims[m["name"]]
        for m in container.get("volumeMounts") or []
        if m["name"] in claims
    }


def local_path(value: str, mounts: Mapping[str, str]) -> str:
    """`value` with a leading container mount path replaced by its local directory (`mounts`: container path
    -> local path); other values are returned as they are."""
    for mount_path, local in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return local + value[len(mount_path) :]
    return value


def build_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    base: Mapping[str, str],
    secret_data: Mapping[str, Mapping[str, str]],
    config_map_data: Mapping[str, Mapping[str, str]],
    overrides: Mapping[str, str],
    mounts: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A container's environment: `base`, then `envFrom`, then `env`, then `overrides` (which always win).

    `secret_data`/`config_map_data` hold the (decoded) data of the objects the container refers to, by name; a
    missing non-optional reference raises ValueError (the kubelet's CreateContainerConfigError). `mounts`
    (container path -> local directory) rewrites the container's own values under a mount path; one at `/tmp`
    becomes `TMPDIR`.
    """
    mounts = mounts or {}
    env = dict(base)
    env.setdefault("HOSTNAME", pod["metadata"]["name"])

    def lookup(kind: str, ref: Mapping[str, Any], key: str | None) -> str | None:
        source = secret_data if kind == "secret" else config_map_data
        data = source.get(ref.get("name", ""))
        value = None if data is None else (data if key is None else data.get(key))
        if value is None and not ref.get("optional"):
            missing = ref.get("name") if data is None else f"{ref.get('name')}[{key}]"
            raise ValueError(f"{kind} {missing!r} not found")
        return value  # type: ignore[return-value]

    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, ref_key in (("secret", "secretRef"), ("configmap", "configMapRef")):
            if ref_key in source:
                data = lookup(kind, source[ref_key], None) or {}
                env.update({prefix + k: v for k, v in data.items()})  # type: ignore[attr-defined]
    for var in container.get("env") or []:
        name, value_from = var["name"], var.get("valueFrom")
        if value_from is None:
            env[name] = local_path(expand_references(str(var.get("value", "")), env), mounts)
        elif "fieldRef" in value_from:
            env[name] = _field_ref(pod, value_from["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in value_from or "configMapKeyRef" in value_from:
            kind, ref = (
                ("secret", value_from["secretKeyRef"])
                if "secretKeyRef" in value_from
                else ("configmap", value_from["configMapKeyRef"])
            )
            value = lookup(kind, ref, ref["key"])
            if value is not None:
                env[name] = value
        elif "resourceFieldRef" in value_from:
            resource = value_from["resourceFieldRef"]["resource"]
            section, _, key = resource.partition(".")
            env[name] = str(((container.get("resources") or {}).get(section) or {}).get(key, "0"))
    if "/tmp" in mounts:
        env["TMPDIR"] = mounts["/tmp"]
    env.update(overrides)
    return env


def build_pod_status(
    *,
    container: str,
    image: str,
    state: Mapping[str, Any],
    ready: bool,
    restart_count: int,
    started: str,
    last_state: Mapping[str, Any] | None = None,
    phase: str = "Running",
    container_id: str = "",
    reason: str | None = None,
    message: str | None = None,
    initialized: bool = True,
    init_container_statuses: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Pod `status` the kubelet reports for a single-container Pod (and its init containers)."""

    def condition(kind: str, value: bool) -> dict[str, str]:
        return {"type": kind, "status": "True" if value else "False", "lastTransitionTime": _now()}

    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": LOCAL_IP,
        "podIP": LOCAL_IP,
        "podIPs": [{"ip": LOCAL_IP}],
        "startTime": started,
        "conditions": [
            condition("PodScheduled", True),
            condition("Initialized", initialized),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ],
        "containerStatuses": [
            {
                "name": container,
                "image": image,
                "imageID": "",
                "containerID": container_id,
                "ready": ready,
                "started": "running" in state,
                "restartCount": restart_count,
                "state": dict(state),
                "lastState": dict(last_state or {}),
            }
        ],
    }
    if init_container_statuses:
        status["initContainerStatuses"] = [dict(s) for s in init_container_statuses]
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    return status


@dataclass(frozen=True)
class PodInfo:
    """A snapshot of one Pod's local process, for tests and the demo."""

    namespace: str
    name: str
    uid: str
    port: int
    pid: int | None
    restart_count: int
    ready: bool
    log_path: Path


@dataclass
class _Supervisor:
    """One Pod's process and the container state the runner reports for it."""

    info: PodInfo
    pod: dict[str, Any]
    started: str = field(default_factory=_now)
    process: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    terminating: asyncio.Event = field(default_factory=asyncio.Event)
    grace_seconds: float = 30.0
    phase: str = "Pending"
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str = ""
    volumes_dir: Path | None = None  # the Pod's emptyDir volumes, one directory each
    claims_dir: Path | None = None  # <volumes_dir>/pvc/<namespace>: a directory per PersistentVolumeClaim
    initialized: bool = False
    init_statuses: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mounts(self) -> dict[str, str]:
        """Container mount path -> the local directory of its emptyDir volume."""
        return self.mounts_of(self.container)

    def mounts_of(self, container: Mapping[str, Any]) -> dict[str, str]:
        """Container mount path -> the local directory of its emptyDir or PersistentVolumeClaim volume."""
        mounts: dict[str, str] = {}
        if self.volumes_dir is not None:
            mounts |= {
                path: str(self.volumes_dir / volume)
                for path, volume in empty_dir_mounts(self.pod, container).items()
            }
        if self.claims_dir is not None:
            mounts |= {
                path: str(self.claims_dir / claim)
                for path, claim in claim_mounts(self.pod, container).items()
            }
        return mounts

    @property
    def container(self) -> Mapping[str, Any]:
        return self.pod["spec"]["containers"][0]

    def status(self, **extra: Any) -> dict[str, Any]:
        return build_pod_status(
            container=self.container.get("name", "main"),
            image=self.container.get("image", ""),
            state=self.state,
            ready=self.info.ready,
            restart_count=self.info.restart_count,
            started=self.started,
            last_state=self.last_state,
            phase=self.phase,
            container_id=self.container_id,
            initialized=self.initialized,
            init_container_statuses=self.init_statuses,
            **extra,
        )


async def spawn_logged(
    log_path: Path, header: str, argv: Sequence[str], env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """Start a container's process in a session of its own, its output appended to the Pod's log after a
    `--- <time> <header>: <argv>` line (OSError: it cannot start, e.g. no such executable)."""
    with log_path.open("ab") as pod_log:
        pod_log.write(f"--- {_now()} {header}: {' '.join(argv)}\n".encode())
        pod_log.flush()
        return await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            stdout=pod_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


class PodRunner:
    """A kubelet-like loop over the emulated API; see the module docstring."""

    def __init__(
        self,
        api_url: str,
        *,
        command: PodCommand = container_command,
        node_name: str | None = None,
        namespace: str | None = None,
        label_selector: str = WORKER_SELECTOR,
        logs_dir: Path | None = None,
        volumes_dir: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        probe_interval: float = 0.2,
        restart_backoff: float = 0.5,
        max_restart_backoff: float = 8.0,
        simulated: bool = False,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.command = command
        self.node_name = node_name or f"ardiff-dev-{secrets.token_hex(3)}"
        self.namespace = namespace
        self.label_selector = label_selector
        self.logs_dir = logs_dir or Path(tempfile.mkdtemp(prefix="ardiff-pods-"))
        self.volumes_dir = volumes_dir or self.logs_dir / "volumes"
        self.extra_env = dict(extra_env or {})
        self.probe_interval = probe_interval
        self.restart_backoff = restart_backoff
        self.max_restart_backoff = max_restart_backoff
        self.simulated = (
            simulated  # worker Pods registered in Redis and Ready, no process (simulated_pods.py)
        )
        self._supervisors: dict[str, _Supervisor] = {}  # by Pod uid
        self._lock = threading.Lock()  # guards PodInfo snapshots read from other threads
        self._client: httpx.AsyncClient | None = None
        self._stopping: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- thread-safe accessors -----------------------------------------------------------------------

    def info(self, name: str, namespace: str = "default") -> PodInfo | None:
        """The current process of a Pod (the newest one when a name was reused), if this runner has it."""
        with self._lock:
            found = [
                s.info
                for s in self._supervisors.values()
                if (s.info.namespace, s.info.name) == (namespace, name)
            ]
        return found[-1] if found else None

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return [s.info for s in self._supervisors.values()]

    def kill(self, name: str, sig: int = signal.SIGKILL, namespace: str = "default") -> int:
        """Send `sig` to a Pod's process (as `kill -9` would); returns the pid. The runner restarts it."""
        info = self.info(name, namespace)
        if info is None or info.pid is None:
            raise LookupError(f"pod {namespace}/{name} has no running process on {self.node_name}")
        os.kill(info.pid, sig)
        return info.pid

    def wait_for(
        self, predicate: Callable[[PodInfo], bool], name: str, namespace: str = "default", timeout: float = 30
    ) -> PodInfo:
        """Poll until `predicate(info)` holds for the Pod; raise TimeoutError with the last state."""
        deadline = time.monotonic() + timeout
        info = None
        while time.monotonic() < deadline:
            info = self.info(name, namespace)
            if info is not None and predicate(info):
                return info
            time.sleep(0.05)
        raise TimeoutError(
            f"pod {namespace}/{name} did not reach the expected state within {timeout}s: {info}"
        )

    # --- running -------------------------------------------------------------------------------------

    def start(self, timeout: float = 10) -> Self:
        """Run on a background thread with its own event loop."""
        started: Future[None] = Future()

        def main() -> None:
            asyncio.run(self.run(started))

        self._thread = threading.Thread(target=main, name=f"pod-runner-{self.node_name}", daemon=True)
        self._thread.start()
        started.result(timeout)
        return self

    def stop(self, timeout: float = 60) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def run(self, started: Future[None] | None = None) -> None:
        """Watch and supervise until `stop()`; then stop every process and report the Pods stopped."""
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        async with httpx.AsyncClient(base_url=self.api_url, timeout=httpx.Timeout(10, read=None)) as client:
            self._client = client
            watcher = asyncio.create_task(self._watch_loop())
            if started is not None:
                started.set_result(None)
            await self._stopping.wait()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await asyncio.gather(
                *(self._shutdown(s) for s in list(self._supervisors.values())), return_exceptions=True
            )

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace else "/api/v1/pods"

    async def _watch_loop(self) -> None:
        assert self._client is not None
        while True:
            try:
                listing = (
                    await self._client.get(self._pods_path(), params={"labelSelector": self.label_selector})
                ).json()
                for pod in listing["items"]:
                    await self._observe("ADDED", pod)
                async for event_type, pod in self._events(listing["metadata"]["resourceVersion"]):
                    await self._observe(event_type, pod)
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                log.debug("pod watch interrupted (%s); listing again", exc)
                await asyncio.sleep(0.5)  # the API restarting, or a 410: list again

    async def _events(self, since: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        assert self._client is not None
        params = {"watch": "true", "labelSelector": self.label_selector, "resourceVersion": since}
        async with self._client.stream("GET", self._pods_path(), params=params) as response:
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return
                if event["type"] != "BOOKMARK":
                    yield event["type"], event["object"]

    async def _observe(self, event_type: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        supervisor = self._supervisors.get(uid)
        if supervisor is not None:
            supervisor.pod = pod
            if event_type == "DELETED":
                supervisor.grace_seconds = 0  # deleted under us (forced): stop now
                supervisor.terminating.set()
            elif meta.get("deletionTimestamp"):
                supervisor.grace_seconds = float(meta.get("deletionGracePeriodSeconds") or 0)
                supervisor.terminating.set()
            return
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            return
        if spec.get("nodeName") not in (None, self.node_name) or (pod.get("status") or {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            return  # another node's Pod, or one that already ran to completion
        if (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL, self.node_name) != self.node_name:
            return  # pinned to another node: how a test gives Pods to one of several runners
        if not spec.get("nodeName") and not await self._bind(pod):
            return
        self._start_supervisor(pod)

    async def _bind(self, pod: dict[str, Any]) -> bool:
        """Claim the Pod like the scheduler would; False if another runner was faster."""
        assert self._client is not None
        meta = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"]},
            "target": {"kind": "Node", "name": self.node_name},
        }
        response = await self._client.post(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding", json=binding
        )
        return response.status_code == 201

    def _start_supervisor(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        log_path = self.logs_dir / f"{meta['namespace']}_{meta['name']}.log"
        info = PodInfo(meta["namespace"], meta["name"], meta["uid"], free_port(), None, 0, False, log_path)
        volumes = self.volumes_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        supervisor = _Supervisor(
            info=info, pod=pod, volumes_dir=volumes, claims_dir=self.volumes_dir / "pvc" / meta["namespace"]
        )
        supervisor.initialized = not (pod.get("spec") or {}).get("initContainers")
        for container in [*pod["spec"].get("initContainers", []), supervisor.container]:
            for local in supervisor.mounts_of(container).values():
                Path(local).mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._supervisors[meta["uid"]] = supervisor
        supervisor.task = asyncio.create_task(self._supervise(supervisor))

    def _update_info(self, supervisor: _Supervisor, **changes: Any) -> None:
        with self._lock:
            supervisor.info = replace(supervisor.info, **changes)

    async def _fetch_refs(
        self, namespace: str, container: Mapping[str, Any]
    ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
        """The Secrets and ConfigMaps the container's env refers to, decoded."""
        assert self._client is not None
        wanted: dict[str, set[str]] = {"secrets": set(), "configmaps": set()}
        for var in container.get("env") or []:
            value_from = var.get("valueFrom") or {}
            if "secretKeyRef" in value_from:
                wanted["secrets"].add(value_from["secretKeyRef"]["name"])
            if "configMapKeyRef" in value_from:
                wanted["configmaps"].add(value_from["configMapKeyRef"]["name"])
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                wanted["secrets"].add(source["secretRef"]["name"])
            if "configMapRef" in source:
                wanted["configmaps"].add(source["configMapRef"]["name"])
        found: dict[str, dict[str, dict[str, str]]] = {"secrets": {}, "configmaps": {}}
        for plural, names in wanted.items():
            for name in names:
                response = await self._client.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
                if response.status_code == 200:
                    data = response.json().get("data") or {}
                    decode = plural == "secrets"
                    found[plural][name] = {
                        k: base64.b64decode(v).decode() if decode else v for k, v in data.items()
                    }
        return found["secrets"], found["configmaps"]

    async def _supervise(self, supervisor: _Supervisor) -> None:
        """Run the container until the Pod is deleted, restarting it as its restartPolicy says."""
        if self.simulated:
            await self._simulate(supervisor)
            await self._terminate(supervisor)
            return
        restart_policy = supervisor.pod["spec"].get("restartPolicy", "Always")
        if not await self._initialize(supervisor, restart_policy):
            await self._terminate(supervisor)
            return
        backoff = self.restart_backoff
        while not supervisor.terminating.is_set():
            exit_code = await self._run_once(supervisor)
            if supervisor.terminating.is_set():
                break
            if exit_code is not None and (
                restart_policy == "Never" or (restart_policy == "OnFailure" and exit_code == 0)
            ):
                supervisor.phase = "Succeeded" if exit_code == 0 else "Failed"
                await self._report(supervisor)
                await supervisor.terminating.wait()  # ran to completion: stay until the Pod is deleted
                break
            if exit_code is not None:
                supervisor.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {backoff}s restarting failed container",
                    }
                }
                await self._report(supervisor)
            await self._sleep_unless_terminating(supervisor, backoff)
            backoff = min(backoff * 2, self.max_restart_backoff)
            if exit_code is not None:
                self._update_info(supervisor, restart_count=supervisor.info.restart_count + 1)
        await self._terminate(supervisor)

    async def _simulate(self, supervisor: _Supervisor) -> None:
        """A simulated pod (`simulated_pods`): no init containers, no process; Running and Ready once its
        worker link registered in Redis, until the Pod is deleted."""
        supervisor.initialized = True
        while True:
            try:
                link = simulated_link(await self._container_env(supervisor))
                break
            except ValueError as exc:  # e.g. its Redis Secret is not there yet: the kubelet retries too
                supervisor.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                await self._report(supervisor)
                await self._sleep_unless_terminating(supervisor, self.restart_backoff)
                if supervisor.terminating.is_set():
                    return

        async def registered(incarnation: int) -> None:
            supervisor.phase = "Running"
            supervisor.container_id = f"ardiff-simulated://{supervisor.info.name}/{link.epoch}"
            supervisor.state = {"running": {"startedAt": _now()}}
            self._update_info(supervisor, ready=True, restart_count=incarnation)
            await self._report(supervisor)

        await run_simulated(link, supervisor.terminating, registered)
        self._update_info(supervisor, ready=False)

    async def _initialize(self, supervisor: _Supervisor, restart_policy: str) -> bool:
        """Run the init containers in order, each until it succeeds (retried with backoff; with restartPolicy
        Never a failure fails the Pod). False when the Pod went (or failed) before they all succeeded."""
        containers = supervisor.pod["spec"].get("initContainers") or []
        supervisor.init_statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            }
            for c in containers
        ]
        if containers:
            supervisor.state = {"waiting": {"reason": "PodInitializing"}}
        for index, container in enumerate(containers):
            backoff = self.restart_backoff
            while True:
                if supervisor.terminating.is_set():
                    return False
                code = await self._run_init_container(supervisor, index, container)
                if code == 0:
                    break
                if code is not None and restart_policy == "Never":
                    supervisor.phase = "Failed"
                    await self._report(supervisor)
                    await supervisor.terminating.wait()
                    return False
                supervisor.init_statuses[index]["restartCount"] += 1
                await self._sleep_unless_terminating(supervisor, backoff)
                backoff = min(backoff * 2, self.max_restart_backoff)
        supervisor.initialized = True
        return not supervisor.terminating.is_set()

    async def _run_init_container(
        self, supervisor: _Supervisor, index: int, container: Mapping[str, Any]
    ) -> int | None:
        """One run of an init container to its end: its exit code, or None when it could not start."""
        status = supervisor.init_statuses[index]
        pod = supervisor.pod
        try:
            secret_data, config_map_data = await self._fetch_refs(supervisor.info.namespace, container)
            local = {**pod, "status": {**(pod.get("status") or {}), "podIP": LOCAL_IP, "hostIP": LOCAL_IP}}
            env = build_env(
                local,
                container,
                base={**os.environ, **self.extra_env},
                secret_data=secret_data,
                config_map_data=config_map_data,
                mounts=supervisor.mounts_of(container),
                overrides={"OMP_NUM_THREADS": "1"},
            )
            argv = container_command(PodContext(pod, container, env, supervisor.info.port))
        except ValueError as exc:
            status["state"] = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            await self._report(supervisor)
            await self._sleep_unless_terminating(supervisor, self.restart_backoff)
            return None
        header = f"init container {container['name']}"
        try:
            process = await spawn_logged(supervisor.info.log_path, header, argv, env)
        except OSError as exc:
            status["state"] = {"waiting": {"reason": "RunContainerError", "message": str(exc)}}
            await self._report(supervisor)
            return 1
        supervisor.process = process  # so that deleting the Pod stops it
        started = _now()
        status["state"] = {"running": {"startedAt": started}}
        await self._report(supervisor)
        exited = asyncio.ensure_future(process.wait())
        terminating = asyncio.ensure_future(supervisor.terminating.wait())
        await asyncio.wait([exited, terminating], return_when=asyncio.FIRST_COMPLETED)
        terminating.cancel()
        if not exited.done():
            exited.cancel()
            return None  # the Pod goes: _terminate stops the process
        supervisor.process = None
        code = process.returncode
        assert code is not None
        exit_code = code if code >= 0 else 128 - code
        status["state"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started,
                "finishedAt": _now(),
            }
        }
        status["ready"] = code == 0
        await self._report(supervisor)
        return exit_code

    async def _container_env(self, supervisor: _Supervisor) -> dict[str, str]:
        """The main container's env as the process gets it (ValueError: a reference cannot be resolved)."""
        pod = supervisor.pod
        secret_data, config_map_data = await self._fetch_refs(supervisor.info.namespace, supervisor.container)
        local = {**pod, "status": {**(pod.get("status") or {}), "podIP": LOCAL_IP, "hostIP": LOCAL_IP}}
        return build_env(
            local,
            supervisor.container,
            # Locally the hostname is not the Pod's name, so the worker's default needs the name.
            base={**os.environ, **self.extra_env, "ARDIFF_POD_NAME": pod["metadata"]["name"]},
            secret_data=secret_data,
            config_map_data=config_map_data,
            mounts=supervisor.mounts,
            overrides={
                "ARDIFF_HOST": LOCAL_IP,
                "ARDIFF_POD_IP": LOCAL_IP,
                "ARDIFF_PORT": str(supervisor.info.port),
                "OMP_NUM_THREADS": "1",
            },
        )

    async def _run_once(self, supervisor: _Supervisor) -> int | None:
        """Start the process and supervise it until it exits (its exit code) or the Pod goes (None)."""
        port = supervisor.info.port
        pod = supervisor.pod
        try:
            env = await self._container_env(supervisor)
            argv = self.command(PodContext(pod, supervisor.container, env, port))
        except ValueError as exc:
            supervisor.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            await self._report(supervisor)
            return None
        header = f"start #{supervisor.info.restart_count}"
        try:
            process = await spawn_logged(supervisor.info.log_path, header, argv, env)
        except OSError as exc:  # e.g. the executable does not exist
            supervisor.state = {"waiting": {"reason": "RunContainerError", "message": str(exc)}}
            await self._report(supervisor)
            return None
        log.info(
            "pod %s/%s: started pid %d on port %d",
            supervisor.info.namespace,
            supervisor.info.name,
            process.pid,
            port,
        )
        supervisor.process = process
        supervisor.phase = "Running"
        supervisor.container_id = f"ardiff-dev://{process.pid}"
        supervisor.state = {"running": {"startedAt": _now()}}
        self._update_info(supervisor, pid=process.pid, ready=False)
        await self._report(supervisor)
        await self._probe_until_exit(supervisor)
        if supervisor.terminating.is_set():
            return None
        code = process.returncode
        assert code is not None
        terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": supervisor.state["running"]["startedAt"],
            "finishedAt": _now(),
            "containerID": supervisor.container_id,
        }
        if code < 0:
            terminated["signal"] = -code
        log.info(
            "pod %s/%s: pid %d exited with %d",
            supervisor.info.namespace,
            supervisor.info.name,
            process.pid,
            code,
        )
        supervisor.state = supervisor.last_state = {"terminated": terminated}
        self._update_info(supervisor, pid=None, ready=False)
        await self._report(supervisor)
        return terminated["exitCode"]

    async def _report(self, supervisor: _Supervisor, **extra: Any) -> None:
        """Write the Pod's status through the `status` subresource (merge patch)."""
        assert self._client is not None
        info = supervisor.info
        url = f"/api/v1/namespaces/{info.namespace}/pods/{info.name}/status"
        headers = {"Content-Type": "application/merge-patch+json"}
        with contextlib.suppress(httpx.HTTPError):  # the Pod or the API is going away
            await self._client.patch(
                url, content=json.dumps({"status": supervisor.status(**extra)}), headers=headers
            )

    async def _sleep_unless_terminating(self, supervisor: _Supervisor, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(supervisor.terminating.wait(), timeout=seconds)

    async def _probe_until_exit(self, supervisor: _Supervisor) -> None:
        """Probe readiness (the readinessProbe's httpGet path, else /readyz) while the process lives."""
        assert self._client is not None
        assert supervisor.process is not None
        probe = supervisor.container.get("readinessProbe") or {}
        path = (probe.get("httpGet") or {}).get("path", "/readyz")
        failure_threshold = int(probe.get("failureThreshold", 1))
        url = f"http://{LOCAL_IP}:{supervisor.info.port}{path}"
        exited = asyncio.ensure_future(supervisor.process.wait())
        failures = 0
        try:
            while not exited.done() and not supervisor.terminating.is_set():
                try:
                    ok = (await self._client.get(url, timeout=2)).status_code < 400
                except httpx.HTTPError:
                    ok = False
                failures = 0 if ok else failures + 1
                ready = supervisor.info.ready
                if (ok and not ready) or (not ok and ready and failures >= failure_threshold):
                    self._update_info(supervisor, ready=ok)
                    await self._report(supervisor)
                await asyncio.wait([exited], timeout=self.probe_interval)
        finally:
            if not exited.done():
                exited.cancel()

    async def _terminate(self, supervisor: _Supervisor) -> None:
        """SIGTERM, SIGKILL after the grace period, then the kubelet's final delete (grace 0)."""
        await self._stop_process(supervisor)
        assert self._client is not None
        info = supervisor.info
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": info.uid}}
        with contextlib.suppress(httpx.HTTPError):
            await self._client.request(
                "DELETE", f"/api/v1/namespaces/{info.namespace}/pods/{info.name}", json=body
            )
        _remove_volumes(supervisor)
        with self._lock:
            self._supervisors.pop(info.uid, None)

    async def _stop_process(self, supervisor: _Supervisor) -> None:
        process = supervisor.process
        if process is None or process.returncode is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=supervisor.grace_seconds)
        except TimeoutError:
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()
        self._update_info(supervisor, pid=None, ready=False)

    async def _shutdown(self, supervisor: _Supervisor) -> None:
        """The runner stops (a node shutting down): stop the process, report the Pod Failed."""
        if supervisor.task is not None:
            supervisor.task.cancel()
            await asyncio.gather(supervisor.task, return_exceptions=True)
        supervisor.grace_seconds = min(supervisor.grace_seconds, 10)
        await self._stop_process(supervisor)
        _remove_volumes(supervisor)
        supervisor.phase = "Failed"
        supervisor.state = {"terminated": {"exitCode": 137, "reason": "NodeShutdown", "finishedAt": _now()}}
        await self._report(
            supervisor, reason="Shutdown", message=f"the dev cluster's pod runner {self.node_name} stopped"
        )


def _remove_volumes(supervisor: _Supervisor) -> None:
    """emptyDir volumes live as long as their Pod."""
    if supervisor.volumes_dir is not None:
        shutil.rmtree(supervisor.volumes_dir, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    """Signal the Pod's whole process group (a worker may have children), like a container runtime."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
