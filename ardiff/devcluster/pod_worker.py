"""One Pod on the process kubelet, from its sandbox to its final delete.

`PodWorker.run()` does what a kubelet's pod worker does, in order: the sandbox (the Pod's network namespace
and address from the node's `podCIDR`, or the node's own for `hostNetwork`; its /etc/hosts, /etc/resolv.conf
and /etc/hostname: `Kubelet.make_sandbox`), the volumes (`pod_volumes`; a failure is a `FailedMount` event and
a retry), the init containers one after another to completion, then every container at once, each under a
`ContainerRunner` (`containers`), for which it composes the spec `container_init` runs (env: `container_env`;
mounts, the image's layer and accounts, the user). Status goes to `pods/<name>/status` as a strategic merge
patch (conditions, container statuses with exit codes and restart counts, pod IPs, phase, start time), as a
kubelet patches it. On deletion: `preStop` hooks, SIGTERM, SIGKILL after the grace period, the final
status, then the delete with grace 0 (uid precondition). A `simulated` Pod has no sandbox or process: it
registers in Redis through the worker's own link (`simulated_pods`) and is Running and Ready once registered.

Each container's output goes to `<pod dir>/logs/<container>/<restart count>.log` (what the kubelet's API
serves to `kubectl logs`, `--previous` included).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ardiff.devcluster.container_env import (
    ContainerConfigError,
    build_env,
    expand_references,
    referenced_objects,
)
from ardiff.devcluster.containers import ContainerRunner, now_rfc3339
from ardiff.devcluster.images import Image, ImageNotFound
from ardiff.devcluster.pod_volumes import PodVolumes, VolumeError
from ardiff.devcluster.probes import run_probe
from ardiff.devcluster.simulated_pods import run_simulated, simulated_link

if TYPE_CHECKING:
    from ardiff.devcluster.kubelet import Kubelet

log = logging.getLogger(__name__)

STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
# This machine's accounts, read once: an image's /etc/passwd and /etc/group add its own to them.
ETC_PASSWD = Path("/etc/passwd").read_text()
ETC_GROUP = Path("/etc/group").read_text()


def _condition(kind: str, value: bool, since: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if value else "False", "lastTransitionTime": since}


@dataclass
class Sandbox:
    """The Pod's network: its namespace (None: the node's, for hostNetwork) and address."""

    namespace: str | None
    ip: str
    etc_dir: Path  # hosts, resolv.conf, hostname


@dataclass
class PodWorker:
    """See the module docstring."""

    kubelet: Kubelet
    pod: dict[str, Any]
    directory: Path
    sandbox: Sandbox | None = None
    volumes: PodVolumes | None = None
    init_runners: list[ContainerRunner] = field(default_factory=list)
    runners: list[ContainerRunner] = field(default_factory=list)
    initialized: bool = False
    sandbox_ready: bool = False
    start_time: str = field(default_factory=now_rfc3339)
    since: dict[str, str] = field(default_factory=dict)  # condition type -> last transition time
    last_conditions: dict[str, bool] = field(default_factory=dict)
    terminating: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    deleted: bool = False  # the API object is gone (a forced delete): nothing left to report
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    phase: str = "Pending"
    reason: str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        spec = self.pod["spec"]
        self.init_runners = [ContainerRunner(self, c, init=True) for c in spec.get("initContainers") or []]
        self.runners = [ContainerRunner(self, c, init=False) for c in spec["containers"]]

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def uid(self) -> str:
        return self.pod["metadata"]["uid"]

    @property
    def restart_policy(self) -> str:
        return self.pod["spec"].get("restartPolicy", "Always")

    @property
    def host_network(self) -> bool:
        return bool(self.pod["spec"].get("hostNetwork"))

    def grace_seconds(self) -> float:
        meta_grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if meta_grace is not None:
            return float(meta_grace)
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def container(self, name: str) -> ContainerRunner | None:
        return next((r for r in [*self.init_runners, *self.runners] if r.name == name), None)

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the Pod from the watch (labels, annotations, deletion)."""
        self.pod = pod
        if self.volumes is not None:
            self.volumes.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.terminating.is_set():
            self.terminating.set()

    def changed(self) -> None:
        self._dirty.set()

    async def sleep_unless_stopping(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.terminating.wait(), timeout=seconds)

    async def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        await self.kubelet.post_event(self.pod, reason, message, warning=warning)

    # --- the whole life -------------------------------------------------------------------------------------

    async def run(self) -> None:
        reporter = asyncio.create_task(self._report_loop())
        try:
            if self.kubelet.config.simulated:
                await self._run_simulated()
            elif await self._prepare():
                await self._run_containers()
            await self._terminate()
        finally:
            self.finished.set()
            self.changed()
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
            if not self.deleted:
                await self._report()
                if self.terminating.is_set():
                    await self.kubelet.delete_pod(self.pod)
            self._remove_sandbox()
            if self.volumes is not None:
                self.volumes.remove()
            # The containers' layers go with the Pod; its logs stay in the Pod's directory for a post-mortem.
            shutil.rmtree(self.directory / "containers", ignore_errors=True)

    async def _prepare(self) -> bool:
        """Sandbox and volumes; False when the Pod went first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sandbox = await asyncio.to_thread(self.kubelet.make_sandbox, self)
        self.sandbox_ready = True
        self.changed()
        self.volumes = PodVolumes(self.pod, self.directory / "volumes", self.kubelet.api)
        delay = 1.0
        while not self.terminating.is_set():
            try:
                await self.volumes.prepare()
                return True
            except VolumeError as exc:
                await self.event("FailedMount", f"MountVolume.SetUp failed: {exc}", warning=True)
                await self.sleep_unless_stopping(delay)
                delay = min(delay * 2, 30)
        return False

    async def _run_containers(self) -> None:
        for runner in self.init_runners:
            if not await self._run_init(runner):
                return
        self.initialized = True
        self.changed()
        tasks = [asyncio.create_task(r.run(self.restart_policy)) for r in self.runners]
        refresher = asyncio.create_task(self._refresh_volumes())
        stopper = asyncio.create_task(self.terminating.wait())
        done = asyncio.gather(*tasks)
        await asyncio.wait([done, stopper], return_when=asyncio.FIRST_COMPLETED)
        refresher.cancel()
        stopper.cancel()
        if not done.done():
            await self._stop_containers()
            await asyncio.gather(done, return_exceptions=True)
        self._complete()

    async def _run_init(self, runner: ContainerRunner) -> bool:
        backoff = self.kubelet.config.restart_backoff_seconds
        while not self.terminating.is_set():
            code = await runner.run_once()
            if code == 0:
                runner.ready = True
                self.changed()
                return True
            if code is not None and self.restart_policy == "Never":
                self.phase = "Failed"
                self.changed()
                await self.terminating.wait()
                return False
            await self.sleep_unless_stopping(backoff)
            backoff = min(backoff * 2, self.kubelet.config.max_restart_backoff_seconds)
            if code is not None:
                runner.restart_count += 1
        return False

    async def _refresh_volumes(self) -> None:
        while True:
            await asyncio.sleep(2)
            if self.volumes is not None:
                with contextlib.suppress(httpx.HTTPError):
                    await self.volumes.refresh()

    async def _stop_containers(self) -> None:
        """preStop hooks, then SIGTERM; SIGKILL what is left when the grace period ends."""
        grace = self.grace_seconds()
        deadline = time.monotonic() + grace
        for runner in self.runners:
            runner.stopping = True
        await asyncio.gather(*(self._pre_stop(r, deadline) for r in self.runners), return_exceptions=True)
        for runner in self.runners:
            if runner.process is not None:
                await self.event("Killing", f"Stopping container {runner.name}")
        await asyncio.gather(
            *(r.stop_process(deadline - time.monotonic()) for r in self.runners), return_exceptions=True
        )

    async def _pre_stop(self, runner: ContainerRunner, deadline: float) -> None:
        hook = ((runner.spec.get("lifecycle") or {}).get("preStop")) or None
        if hook is None or runner.target is None:
            return
        remaining = max(deadline - time.monotonic(), 0)
        if "sleep" in hook:
            await asyncio.sleep(min(float(hook["sleep"]["seconds"]), remaining))
            return
        probe = {**hook, "timeoutSeconds": max(int(remaining), 1)}
        ok, message = await run_probe(probe, runner.target, self.kubelet.probe_client)
        if not ok:
            await self.event("FailedPreStopHook", message, warning=True)

    def _complete(self) -> None:
        """Every container ended without a restart coming: Succeeded or Failed (restartPolicy Never or
        OnFailure), or the Pod was stopped."""
        codes = [r.exit_code for r in self.runners]
        if all(c is not None for c in codes) and not self.terminating.is_set():
            self.phase = "Succeeded" if all(c == 0 for c in codes) else "Failed"
            self.changed()

    async def _terminate(self) -> None:
        """A finished Pod (Succeeded/Failed) stays until it is deleted; its sandbox goes at once."""
        if not self.terminating.is_set():
            self._remove_sandbox()
            await self.terminating.wait()

    def _remove_sandbox(self) -> None:
        if self.sandbox is not None:
            self.kubelet.remove_sandbox(self)
            self.sandbox = None

    async def _run_simulated(self) -> None:
        self.initialized = self.sandbox_ready = True
        self.sandbox = Sandbox(None, self.kubelet.allocate_ip(self.uid), self.directory)
        runner = self.runners[0]
        while not self.terminating.is_set():
            try:
                image = self.kubelet.images.resolve(runner.spec.get("image", ""))
                env = await self.container_env(runner.spec, image)
                link = simulated_link(env)
                break
            except (ContainerConfigError, ValueError, ImageNotFound) as exc:
                runner._waiting("CreateContainerConfigError", str(exc))
                await self.sleep_unless_stopping(1.0)
        else:
            return

        async def registered(incarnation: int) -> None:
            runner.state = {"running": {"startedAt": now_rfc3339()}}
            runner.container_id = f"simulated://{self.name}/{link.epoch}"
            runner.ready = runner.started = True
            runner.restart_count = incarnation
            self.changed()

        await run_simulated(link, self.terminating, registered)
        runner.ready = False

    # --- containers -----------------------------------------------------------------------------------------

    async def _fetch(self, kind: str, names: set[str]) -> dict[str, dict[str, str] | None]:
        found: dict[str, dict[str, str] | None] = {}
        for name in names:
            plural = "secrets" if kind == "secret" else "configmaps"
            reply = await self.kubelet.api.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
            if reply.status_code != 200:
                found[name] = None
                continue
            data = reply.json().get("data") or {}
            if kind == "secret":
                found[name] = {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
            else:
                found[name] = dict(data)
        return found

    async def container_env(self, spec: Mapping[str, Any], image: Image) -> dict[str, str]:
        secret_names, config_map_names = referenced_objects(spec)
        config = self.kubelet.config
        base = {
            **image.env,
            "HOSTNAME": self.name,
            "KUBERNETES_SERVICE_HOST": config.api_service_host,
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            "KUBERNETES_PORT": f"tcp://{config.api_service_host}:443",
        }
        if not self.kubelet.config.simulated:
            base["OMP_NUM_THREADS"] = "1"  # the dev cluster's torch shares two cores with everything else
        pod = self._with_addresses()
        return build_env(
            pod,
            spec,
            base=base,
            secrets=await self._fetch("secret", secret_names),
            config_maps=await self._fetch("configmap", config_map_names),
            allocatable=config.capacity,
        )

    def _with_addresses(self) -> dict[str, Any]:
        """The Pod as the downward API sees it: with the addresses this kubelet gave it."""
        ip = self.sandbox.ip if self.sandbox else ""
        status = {**(self.pod.get("status") or {}), "podIP": ip, "hostIP": self.kubelet.config.node_ip}
        return {**self.pod, "status": status}

    async def container_spec(self, spec: Mapping[str, Any], image: Image) -> dict[str, Any]:
        """What `container_init` needs to make and start the container."""
        assert self.sandbox is not None, "the Pod has no sandbox yet"
        assert self.volumes is not None, "the Pod's volumes are not made yet"
        env = await self.container_env(spec, image)
        command = [expand_references(a, env) for a in spec.get("command") or []]
        args = [expand_references(a, env) for a in spec.get("args") or []]
        argv = image.argv(command, args)
        if not argv:
            raise ContainerConfigError(
                f"container {spec['name']!r}: no command and the image has no entrypoint"
            )
        pod_context = self.pod["spec"].get("securityContext") or {}
        context = {**pod_context, **(spec.get("securityContext") or {})}
        uid = int(context.get("runAsUser", image.user))
        gid = int(context.get("runAsGroup", image.group if "runAsUser" not in context else 0))
        if context.get("runAsNonRoot") and uid == 0:
            raise ContainerConfigError(
                f"container {spec['name']!r} has runAsNonRoot and image will run as root "
                f"(pod: {self.namespace}/{self.name}, container: {spec['name']})"
            )
        groups = sorted(
            {
                gid,
                *pod_context.get("supplementalGroups", []),
                *([pod_context["fsGroup"]] if "fsGroup" in pod_context else []),
            }
        )
        mounts = []
        volume_paths = self.volumes.paths
        for mount in spec.get("volumeMounts") or []:
            source = volume_paths.get(mount["name"])
            if source is None:
                raise ContainerConfigError(
                    f"volume {mount['name']!r} of mount {mount['mountPath']} is not defined"
                )
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True, exist_ok=True)
                    source.chmod(0o777)
            mounts.append(
                {
                    "source": str(source),
                    "target": mount["mountPath"],
                    "read_only": bool(mount.get("readOnly")),
                    "file": source.is_file(),
                }
            )
        etc = self.sandbox.etc_dir
        for name in ("hosts", "resolv.conf", "hostname"):
            mounts.append(
                {"source": str(etc / name), "target": f"/etc/{name}", "read_only": False, "file": True}
            )
        container_dir = self.directory / "containers" / spec["name"]
        shutil.rmtree(container_dir, ignore_errors=True)  # a restarted container starts from its image again
        accounts = container_dir / "accounts"
        accounts.mkdir(parents=True)
        passwd, group = image.account_files(ETC_PASSWD, ETC_GROUP)
        (accounts / "passwd").write_text(passwd)
        (accounts / "group").write_text(group)
        image_files = {
            **image.files,
            "/etc/passwd": str(accounts / "passwd"),
            "/etc/group": str(accounts / "group"),
        }
        for target, host_path in image_files.items():
            mounts.append(
                {"source": host_path, "target": target, "read_only": True, "file": is_file(host_path)}
            )
        return {
            "argv": argv,
            "env": env,
            "workdir": spec.get("workingDir") or image.workdir,
            "uid": uid,
            "gid": gid,
            "groups": groups,
            "rootfs": {
                "upper": str(container_dir / "upper"),
                "work": str(container_dir / "work"),
                "merged": str(container_dir / "rootfs"),
                "read_only": bool(context.get("readOnlyRootFilesystem")),
            },
            "directories": [vars(d) for d in image.directories],
            "mounts": mounts,
            "hostname": self.pod["spec"].get("hostname") or self.name,
            "netns": f"/run/netns/{self.sandbox.namespace}" if self.sandbox.namespace else None,
        }

    # --- status ---------------------------------------------------------------------------------------------

    def _conditions(self) -> list[dict[str, str]]:
        ready_containers = bool(self.runners) and all(r.ready for r in self.runners)
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates") or []]
        others = {
            c["type"]: c.get("status") == "True"
            for c in (self.pod.get("status") or {}).get("conditions") or []
        }
        values = {
            "PodReadyToStartContainers": self.sandbox_ready and self.sandbox is not None,
            "Initialized": self.initialized,
            "ContainersReady": ready_containers,
            "Ready": ready_containers and all(others.get(g, False) for g in gates),
        }
        conditions = []
        for kind, value in values.items():
            if self.last_conditions.get(kind) != value:
                self.last_conditions[kind] = value
                self.since[kind] = now_rfc3339()
            conditions.append(_condition(kind, value, self.since[kind]))
        return conditions

    def _phase(self) -> str:
        if self.phase in ("Succeeded", "Failed"):
            return self.phase
        if not self.initialized:
            return "Pending"
        states = [r.state for r in self.runners]
        if any("running" in s for s in states) or any(r.restart_count or r.last_state for r in self.runners):
            return "Running"
        return "Pending"

    def status(self) -> dict[str, Any]:
        config = self.kubelet.config
        status: dict[str, Any] = {
            "phase": self._phase(),
            "conditions": self._conditions(),
            "hostIP": config.node_ip,
            "hostIPs": [{"ip": config.node_ip}],
            "startTime": self.start_time,
            "containerStatuses": [r.status() for r in self.runners],
        }
        if self.init_runners:
            status["initContainerStatuses"] = [r.status() for r in self.init_runners]
        if self.sandbox is not None:
            status["podIP"] = self.sandbox.ip
            status["podIPs"] = [{"ip": self.sandbox.ip}]
        if self.reason:
            status["reason"] = self.reason
        if self.message:
            status["message"] = self.message
        return status

    async def _report(self) -> None:
        body = json.dumps({"status": self.status()})
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"
        with contextlib.suppress(httpx.HTTPError):
            reply = await self.kubelet.api.patch(path, content=body, headers=STRATEGIC)
            if reply.status_code == 404:
                self.deleted = True
            elif reply.status_code >= 400:
                log.warning(
                    "pod %s/%s status: %s %s", self.namespace, self.name, reply.status_code, reply.text[:300]
                )

    async def _report_loop(self) -> None:
        """Report whenever something changed, at most every 50 ms (a burst of changes is one patch)."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._report()
            await asyncio.sleep(0.05)


def is_file(path: str) -> bool:
    """Whether `path` is a file (an image's files may be directories: its base layer). A stat, not worth a
    thread."""
    return Path(path).is_file()
