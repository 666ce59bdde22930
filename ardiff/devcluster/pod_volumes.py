"""A Pod's volumes as the process kubelet makes them: one host directory per volume, bind-mounted into each
container that mounts it (`container_init`).

Kinds: `emptyDir` (a directory, mode 0777, gone with the Pod; `medium: Memory` is a directory too), `secret`,
`configMap`, `downwardAPI` and `projected` (files written from the objects, with `items`, `mode` and
`defaultMode`, group-owned by the Pod's `fsGroup`, rewritten when the objects change — a kubelet's periodic
sync; the dev cluster's period is `REFRESH_SECONDS`), projected `serviceAccountToken`s (a TokenRequest bound
to the Pod, as the kubelet asks for it, renewed at 80% of its life), `persistentVolumeClaim` (the bound
PersistentVolume's `hostPath`, which is what the dev cluster's provisioner makes) and `hostPath`. Other kinds
fail the mount (`VolumeError`: the Pod stays `ContainerCreating` with a `FailedMount` event, as on a kubelet
without that plugin).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REFRESH_SECONDS = 10.0
DEFAULT_MODE = 0o644
EMPTY_DIR_MODE = 0o777


class VolumeError(RuntimeError):
    """A volume could not be set up (a missing Secret, an unbound claim, an unsupported kind)."""


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A downward-API `fieldRef` (`metadata.name`, `metadata.labels['k']`, `status.podIP`, ...)."""
    meta = pod.get("metadata") or {}
    for kind in ("labels", "annotations"):
        prefix = f"metadata.{kind}['"
        if path.startswith(prefix) and path.endswith("']"):
            return str((meta.get(kind) or {}).get(path[len(prefix) : -2], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


@dataclass
class _Token:
    path: Path
    audience: tuple[str, ...]
    seconds: int
    renew_at: float = 0.0


@dataclass
class PodVolumes:
    """The volumes of one Pod under `directory`; `api` is the kubelet's client (its node credentials)."""

    pod: Mapping[str, Any]
    directory: Path
    api: httpx.AsyncClient
    paths: dict[str, Path] = field(default_factory=dict)
    _tokens: list[_Token] = field(default_factory=list)
    _next_refresh: float = 0.0

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def fs_group(self) -> int | None:
        return (self.pod["spec"].get("securityContext") or {}).get("fsGroup")

    async def prepare(self) -> dict[str, Path]:
        """Make every volume (VolumeError names the first that cannot be made); {volume name: host path}."""
        for volume in self.pod["spec"].get("volumes") or []:
            self.paths[volume["name"]] = await self._prepare(volume)
        self._next_refresh = time.monotonic() + REFRESH_SECONDS
        return dict(self.paths)

    async def refresh(self) -> None:
        """Rewrite Secret/ConfigMap/projected files that changed; renew tokens due (call it periodically)."""
        now = time.monotonic()
        for token in self._tokens:
            if now >= token.renew_at:
                await self._write_token(token)
        if now < self._next_refresh:
            return
        self._next_refresh = now + REFRESH_SECONDS
        for volume in self.pod["spec"].get("volumes") or []:
            if any(kind in volume for kind in ("secret", "configMap", "downwardAPI", "projected")):
                try:
                    await self._write_files(volume, self.paths[volume["name"]], tokens=False)
                except VolumeError:
                    continue  # the object went away: a kubelet keeps the files it has

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- kinds ---------------------------------------------------------------------------------------------

    async def _prepare(self, volume: Mapping[str, Any]) -> Path:
        name = volume["name"]
        target = self.directory / name
        if "emptyDir" in volume:
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(EMPTY_DIR_MODE)
            return target
        if "hostPath" in volume:
            return self._host_path(volume["hostPath"])
        if "persistentVolumeClaim" in volume:
            return await self._claim(volume["persistentVolumeClaim"]["claimName"])
        if any(kind in volume for kind in ("secret", "configMap", "downwardAPI", "projected")):
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o755)
            await self._write_files(volume, target, tokens=True)
            return target
        kinds = sorted(set(volume) - {"name"})
        raise VolumeError(
            f"volume {name!r}: kind {', '.join(kinds)} is not supported by the dev cluster's kubelet"
        )

    def _host_path(self, source: Mapping[str, Any]) -> Path:
        path = Path(source["path"])
        kind = source.get("type", "")
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate" and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        elif kind in ("Directory", "File", "Socket") and not path.exists():
            raise VolumeError(f"hostPath {path} does not exist (type {kind})")
        return path

    async def _claim(self, claim: str) -> Path:
        reply = await self.api.get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        if reply.status_code != 200:
            raise VolumeError(f"persistentvolumeclaim {claim!r} not found ({reply.status_code})")
        volume_name = (reply.json().get("spec") or {}).get("volumeName")
        if not volume_name or (reply.json().get("status") or {}).get("phase") != "Bound":
            raise VolumeError(f"persistentvolumeclaim {claim!r} is not bound yet")
        pv = await self.api.get(f"/api/v1/persistentvolumes/{volume_name}")
        if pv.status_code != 200:
            raise VolumeError(
                f"persistentvolume {volume_name!r} of claim {claim!r} not readable ({pv.status_code})"
            )
        host_path = (pv.json().get("spec") or {}).get("hostPath")
        if not host_path:
            raise VolumeError(f"persistentvolume {volume_name!r} is not a hostPath volume")
        path = Path(host_path["path"])
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(path.chmod, EMPTY_DIR_MODE)
        return path

    async def _object_data(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        plural = "secrets" if kind == "secret" else "configmaps"
        reply = await self.api.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        if reply.status_code == 404 and optional:
            return None
        if reply.status_code != 200:
            raise VolumeError(f"{kind} {name!r} not found ({reply.status_code})")
        obj = reply.json()
        if kind == "secret":
            return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return data

    async def _object_files(
        self, kind: str, source: Mapping[str, Any], default_mode: int
    ) -> dict[str, tuple[bytes, int]]:
        name = source.get("secretName" if kind == "secret" else "name", "")
        data = await self._object_data(kind, name, bool(source.get("optional")))
        if data is None:
            return {}
        items = source.get("items")
        if not items:
            return {key: (value, default_mode) for key, value in data.items()}
        files = {}
        for item in items:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise VolumeError(f"{kind} {name!r} has no key {item['key']!r}")
            files[item["path"]] = (data[item["key"]], item.get("mode", default_mode))
        return files

    def _downward_files(
        self, items: list[Mapping[str, Any]], default_mode: int
    ) -> dict[str, tuple[bytes, int]]:
        files = {}
        for item in items:
            if "fieldRef" in item:
                value = field_value(self.pod, item["fieldRef"]["fieldPath"])
            else:
                raise VolumeError(f"downwardAPI item {item.get('path')!r}: only fieldRef is supported")
            files[item["path"]] = (value.encode(), item.get("mode", default_mode))
        return files

    async def _write_files(self, volume: Mapping[str, Any], target: Path, *, tokens: bool) -> None:
        files: dict[str, tuple[bytes, int]] = {}
        if "secret" in volume:
            source = volume["secret"]
            files = await self._object_files("secret", source, source.get("defaultMode", DEFAULT_MODE))
        elif "configMap" in volume:
            source = volume["configMap"]
            files = await self._object_files("configmap", source, source.get("defaultMode", DEFAULT_MODE))
        elif "downwardAPI" in volume:
            source = volume["downwardAPI"]
            files = self._downward_files(source.get("items") or [], source.get("defaultMode", DEFAULT_MODE))
        else:
            source = volume["projected"]
            mode = source.get("defaultMode", DEFAULT_MODE)
            for part in source.get("sources") or []:
                if "secret" in part:
                    files |= await self._object_files("secret", part["secret"], mode)
                elif "configMap" in part:
                    files |= await self._object_files("configmap", part["configMap"], mode)
                elif "downwardAPI" in part:
                    files |= self._downward_files(part["downwardAPI"].get("items") or [], mode)
                elif "serviceAccountToken" in part:
                    if tokens:
                        spec = part["serviceAccountToken"]
                        token = _Token(
                            target / spec["path"],
                            (spec["audience"],) if spec.get("audience") else (),
                            int(spec.get("expirationSeconds", 3600)),
                        )
                        self._tokens.append(token)
                        await self._write_token(token)
                else:
                    raise VolumeError(
                        f"projected volume {volume['name']!r}: source {sorted(part)} not supported"
                    )
        for relative, (content, file_mode) in files.items():
            self._write(target / relative, content, file_mode)

    def _write(self, path: Path, content: bytes, mode: int) -> None:
        """Atomically, and only when it changed (a reader never sees half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.read_bytes() == content and (path.stat().st_mode & 0o777) == mode:
            return
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(content)
        partial.chmod(mode)
        if self.fs_group is not None:
            os.chown(partial, -1, self.fs_group)
        partial.replace(path)

    async def _write_token(self, token: _Token) -> None:
        meta = self.pod["metadata"]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": list(token.audience),
                "expirationSeconds": token.seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        reply = await self.api.post(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", json=body
        )
        if reply.status_code != 201:
            raise VolumeError(
                f"token for service account {account!r}: {reply.status_code} {reply.text[:300]}"
            )
        status = reply.json()["status"]
        self._write(token.path, status["token"].encode(), DEFAULT_MODE)
        lifetime = token.seconds
        token.renew_at = time.monotonic() + 0.8 * lifetime
