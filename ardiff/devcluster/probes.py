"""Container probes as a kubelet runs them: `httpGet` and `tcpSocket` from the node's network namespace to the
Pod's address (the kubelet is in it), `exec` inside the container (its mount, network and UTS namespaces, its
root, user and environment, through `nsenter`), each within `timeoutSeconds`. `grpc` probes are not run by the
dev cluster's kubelet: they fail, saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}


@dataclass(frozen=True)
class ProbeTarget:
    """Where a container's probes go: its Pod's address, its named ports, its process and environment."""

    address: str
    ports: Mapping[str, int]
    pid: int
    uid: int
    gid: int
    env: Mapping[str, str]


def setting(probe: Mapping[str, Any], name: str) -> int:
    return int(probe.get(name, DEFAULTS[name]))


def _port(value: int | str, target: ProbeTarget) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    if value not in target.ports:
        raise ValueError(f"the container has no port named {value!r}")
    return target.ports[value]


async def run_probe(
    probe: Mapping[str, Any], target: ProbeTarget, client: httpx.AsyncClient
) -> tuple[bool, str]:
    """One attempt: (succeeded, what happened)."""
    timeout = setting(probe, "timeoutSeconds")
    try:
        if "httpGet" in probe:
            return await _http(probe["httpGet"], target, client, timeout)
        if "tcpSocket" in probe:
            return await _tcp(probe["tcpSocket"], target, timeout)
        if "exec" in probe:
            return await _exec(probe["exec"]["command"], target, timeout)
    except ValueError as exc:
        return False, str(exc)
    return False, f"probe kind {sorted(set(probe) - set(DEFAULTS))} is not run by the dev cluster's kubelet"


async def _http(
    action: Mapping[str, Any], target: ProbeTarget, client: httpx.AsyncClient, seconds: float
) -> tuple[bool, str]:
    scheme = str(action.get("scheme", "HTTP")).lower()
    host = action.get("host") or target.address
    url = f"{scheme}://{host}:{_port(action['port'], target)}{action.get('path', '/')}"
    headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.37")
    try:
        reply = await client.get(url, headers=headers, timeout=seconds)
    except httpx.HTTPError as exc:
        return False, f"Get {url}: {type(exc).__name__}: {exc}"
    ok = 200 <= reply.status_code < 400
    return ok, f"HTTP probe {url} answered {reply.status_code}"


async def _tcp(action: Mapping[str, Any], target: ProbeTarget, seconds: float) -> tuple[bool, str]:
    host = action.get("host") or target.address
    port = _port(action["port"], target)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), seconds)
    except (OSError, TimeoutError) as exc:
        return False, f"dial tcp {host}:{port}: {exc or type(exc).__name__}"
    writer.close()
    return True, f"tcp {host}:{port} open"


async def _exec(command: Sequence[str], target: ProbeTarget, seconds: float) -> tuple[bool, str]:
    argv = [
        "nsenter",
        f"--target={target.pid}",
        "--mount",
        "--net",
        "--uts",
        "--root",
        "--wd",
        f"--setuid={target.uid}",
        f"--setgid={target.gid}",
        "--",
        *command,
    ]
    process = await asyncio.create_subprocess_exec(
        *argv, env=dict(target.env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), seconds)
    except TimeoutError:
        process.kill()
        await process.wait()
        return False, f"command {list(command)} timed out after {seconds}s"
    text = output.decode(errors="replace").strip()[-300:]
    return process.returncode == 0, f"command exited {process.returncode}: {text}"
