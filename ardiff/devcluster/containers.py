"""One container of a Pod on the process kubelet: its process, its probes, its restarts, and the state the
kubelet reports for it.

`ContainerRunner.run_once()` resolves the image (`images`), asks its Pod for the container's spec (env,
mounts, user: `PodWorker.container_spec`), starts `container_init` with it in a session of its own (its
output appended to the container's log file, one per restart), then runs the startup, liveness and
readiness probes (`probes`) while the process lives and records how it ended (exit code, signal, reason).
`run()` restarts it per the Pod's `restartPolicy` with the kubelet's back-off (`CrashLoopBackOff`, doubling
from the kubelet's initial back-off to its maximum; reset after `BACKOFF_RESET_SECONDS` of running).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ardiff.devcluster import container_init
from ardiff.devcluster.container_env import ContainerConfigError
from ardiff.devcluster.images import ImageNotFound
from ardiff.devcluster.probes import ProbeTarget, run_probe, setting

if TYPE_CHECKING:
    from ardiff.devcluster.pod_worker import PodWorker

# A container that ran this long without exiting gets the initial back-off again (the kubelet's rule).
BACKOFF_RESET_SECONDS = 600.0


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ContainerRunner:
    """One container of a Pod: its process, probes, restarts and the state the kubelet reports."""

    def __init__(self, worker: PodWorker, spec: Mapping[str, Any], *, init: bool) -> None:
        self.worker = worker
        self.spec = spec
        self.init = init
        self.name: str = spec["name"]
        self.restart_count = 0
        self.state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict[str, Any] = {}
        self.ready = False
        self.started = False
        self.container_id = ""
        self.process: asyncio.subprocess.Process | None = None
        self.target: ProbeTarget | None = None
        self.stopping = False
        self.kill_reason: str | None = None
        self.exit_code: int | None = None

    # --- status ---------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        image = self.spec.get("image", "")
        status = {
            "name": self.name,
            "image": image,
            "imageID": f"ardiff-dev://{image}",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status

    def log_path(self, restart: int | None = None) -> Path:
        count = self.restart_count if restart is None else restart
        return self.worker.directory / "logs" / self.name / f"{count}.log"

    # --- running --------------------------------------------------------------------------------------------

    async def run_once(self) -> int | None:
        """Start the process and supervise it to its end: its exit code (None: it could not start)."""
        worker = self.worker
        try:
            image = worker.kubelet.images.resolve(self.spec.get("image", ""))
        except ImageNotFound as exc:
            self._waiting("ErrImagePull", str(exc))
            await worker.event(
                "Failed", f"Failed to pull image {self.spec.get('image')!r}: {exc}", warning=True
            )
            return None
        try:
            spec = await worker.container_spec(self.spec, image)
        except (ContainerConfigError, ValueError) as exc:
            self._waiting("CreateContainerConfigError", str(exc))
            await worker.event("Failed", f"Error: {exc}", warning=True)
            return None
        path = self.log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        spec_path = worker.directory / f"{self.name}.container.json"
        spec_path.write_text(json.dumps(spec))
        read_status, write_status = os.pipe()
        with path.open("ab") as output:
            self.process = await asyncio.create_subprocess_exec(
                worker.kubelet.config.python,
                "-I",
                "-S",
                container_init.__file__,
                str(spec_path),
                str(write_status),
                stdout=output,
                stderr=output,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(write_status,),
            )
        os.close(write_status)
        failure = await asyncio.to_thread(_read_all, read_status)
        if failure:
            await self.process.wait()
            self.process = None
            self._waiting("RunContainerError", failure)
            await worker.event(
                "Failed", f"Error: failed to start container {self.name!r}: {failure}", warning=True
            )
            return None
        started_at = now_rfc3339()
        self.container_id = f"process://{self.process.pid}"
        self.state = {"running": {"startedAt": started_at}}
        self.exit_code = None
        self.kill_reason = None
        self.target = ProbeTarget(
            address=worker.sandbox.ip if worker.sandbox else "127.0.0.1",
            ports={p["name"]: int(p["containerPort"]) for p in self.spec.get("ports") or [] if p.get("name")},
            pid=self.process.pid,
            uid=spec["uid"],
            gid=spec["gid"],
            env=spec["env"],
        )
        await worker.event("Started", f"Started container {self.name}")
        worker.changed()
        probes = None if self.init else asyncio.create_task(self._probe())
        code = await self.process.wait()
        if probes is not None:
            probes.cancel()
            await asyncio.gather(probes, return_exceptions=True)
        self.ready = False
        self.started = False
        exit_code = code if code >= 0 else 128 - code
        reason = self.kill_reason or ("Completed" if exit_code == 0 else "Error")
        terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started_at,
            "finishedAt": now_rfc3339(),
            "containerID": self.container_id,
        }
        if code < 0:
            terminated["signal"] = -code
        self.state = {"terminated": terminated}
        self.exit_code = exit_code
        self.process = None
        worker.changed()
        return exit_code

    def _waiting(self, reason: str, message: str) -> None:
        self.state = {"waiting": {"reason": reason, "message": message}}
        self.worker.changed()

    async def run(self, restart_policy: str) -> None:
        """Run, restarting per `restart_policy` with back-off, until the Pod stops it or it is done."""
        backoff = self.worker.kubelet.config.restart_backoff_seconds
        while not self.stopping:
            began = time.monotonic()
            code = await self.run_once()
            if self.stopping:
                return
            if code is not None and (
                restart_policy == "Never" or (restart_policy == "OnFailure" and code == 0)
            ):
                return
            if time.monotonic() - began > BACKOFF_RESET_SECONDS:
                backoff = self.worker.kubelet.config.restart_backoff_seconds
            if code is not None:
                self.last_state = self.state
                self.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {backoff:g}s restarting failed container={self.name} "
                        f"pod={self.worker.name}_{self.worker.namespace}({self.worker.uid})",
                    }
                }
                self.worker.changed()
                await self.worker.event(
                    "BackOff", f"Back-off restarting failed container {self.name}", warning=True
                )
            await self.worker.sleep_unless_stopping(backoff)
            backoff = min(backoff * 2, self.worker.kubelet.config.max_restart_backoff_seconds)
            if code is not None and not self.stopping:
                self.restart_count += 1

    async def _probe(self) -> None:
        """Startup first (nothing else runs until it passes), then liveness and readiness side by side."""
        startup = self.spec.get("startupProbe")
        if startup is not None:
            passed = await self._probe_loop("startup", startup)
            if not passed:
                return
        self.started = True
        if self.spec.get("readinessProbe") is None:
            self.ready = True
        self.worker.changed()
        loops = [
            self._probe_loop(kind, self.spec[f"{kind}Probe"])
            for kind in ("liveness", "readiness")
            if self.spec.get(f"{kind}Probe") is not None
        ]
        await asyncio.gather(*loops)

    async def _probe_loop(self, kind: str, probe: Mapping[str, Any]) -> bool:
        """Run one probe kind for the life of the process; for `startup`, return once it passed (True) or
        failed for good (False: the container is killed)."""
        assert self.target is not None
        client = self.worker.kubelet.probe_client
        await asyncio.sleep(setting(probe, "initialDelaySeconds"))
        successes = failures = 0
        while self.process is not None:
            ok, message = await run_probe(probe, self.target, client)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if kind == "startup":
                if ok:
                    return True
                if failures >= setting(probe, "failureThreshold"):
                    await self.kill("Startup probe failed: " + message)
                    return False
            elif kind == "liveness" and failures >= setting(probe, "failureThreshold"):
                await self.kill(f"Liveness probe failed: {message}")
                return False
            elif kind == "readiness":
                if not self.ready and successes >= setting(probe, "successThreshold"):
                    self.ready = True
                    self.worker.changed()
                elif self.ready and failures >= setting(probe, "failureThreshold"):
                    self.ready = False
                    self.worker.changed()
                    await self.worker.event("Unhealthy", f"Readiness probe failed: {message}", warning=True)
            await asyncio.sleep(setting(probe, "periodSeconds"))
        return False

    async def kill(self, why: str) -> None:
        """A failed liveness or startup probe: the container is stopped (and restarted per policy)."""
        await self.worker.event("Unhealthy", why, warning=True)
        await self.worker.event("Killing", f"Container {self.name} failed liveness probe, will be restarted")
        await self.stop_process(self.worker.grace_seconds())

    async def stop_process(self, grace: float) -> None:
        """SIGTERM to the container's process group, SIGKILL after `grace` seconds."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=max(grace, 0))
        except TimeoutError:
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()


def _read_all(fd: int) -> str:
    chunks = []
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _signal_group(pid: int, sig: int) -> None:
    """Signal the container's whole process group (its command may have children), as a runtime would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
