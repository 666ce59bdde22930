"""What each image the cluster runs is on this machine (no container runtime runs here).

An `Image` is what a container runtime would take from an image's config and layers: its entrypoint and cmd,
its environment, its user, working directory, and the files its layers add on top of this machine's root
filesystem (a container's root is an overlay of `/`; see `ardiff.devcluster.container_init`). The table:

| image (any tag)                   | what runs                                                              |
|-----------------------------------|------------------------------------------------------------------------|
| `ghcr.io/ardiff/ardiff-worker`    | a venv made by a non-editable `pip install '.[worker]'` of the sources |
|                                   | over the dev venv's packages (the vllm-omni base image's role), as     |
|                                   | worker/Dockerfile installs over that image; user 1000, its ENV         |
| `ghcr.io/ardiff/ardiff-operator`  | a venv made by a non-editable `pip install '.[operator]'` only, as     |
|                                   | operator/Dockerfile; user 10001                                        |
| `ghcr.io/ardiff/ardiff-gateway`   | a venv made by a non-editable `pip install '.[gateway]'` only, and the |
|                                   | pinned Envoy at /usr/local/bin/envoy, as ardiff/gateway/Dockerfile;    |
|                                   | user 10001                                                             |
| `docker.io/library/redis`         | Debian's `redis-server` and `redis-cli` (the `redis` user 999)         |
| `registry.k8s.io/kube-proxy`      | the kube-proxy built from k8s.io/kubernetes, /usr/local/bin/kube-proxy |
| `registry.k8s.io/coredns/coredns` | the CoreDNS built from github.com/coredns/coredns, at /coredns         |

Image venvs are built once per content of the checkout's package sources (`source_digest`) into
`~/.cache/ardiff/images/`, so a test run builds them once and a changed module builds them again. The table is
written as JSON for the kubelets (`ImageTable.to_json`). An image not in the table fails like an image that
cannot be pulled (`ErrImagePull`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Self

from ardiff.devcluster.binaries import KubernetesBinaries, ensure_envoy

IMAGES_CACHE = Path(os.environ.get("ARDIFF_IMAGES_CACHE", Path.home() / ".cache" / "ardiff" / "images"))
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNUSED_SECONDS = 86400.0
WORKER_IMAGE = "ghcr.io/ardiff/ardiff-worker"
OPERATOR_IMAGE = "ghcr.io/ardiff/ardiff-operator"
GATEWAY_IMAGE = "ghcr.io/ardiff/ardiff-gateway"
REDIS_IMAGE = "docker.io/library/redis"
KUBE_PROXY_IMAGE = "registry.k8s.io/kube-proxy"
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns"
# What the Dockerfiles COPY into the image's build context before `pip install` (.dockerignore lets nothing
# else through): pyproject.toml, README.md and the package folders, but the dev harness, which runs from a
# checkout and is in no distribution or image (issue 41 item 6).
CONTEXT_FILES = ("pyproject.toml", "README.md")
SOURCE_DIRS = ("ardiff", "kv", "operator", "worker")
DEV_HARNESS_DIRS = ("ardiff/devcluster", "ardiff/tiny_world")


def repository(reference: str) -> str:
    """`redis:7` -> `docker.io/library/redis`: the reference's repository, normalized as Docker does."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{name}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{name}"
    return name


@dataclass(frozen=True)
class ImageDirectory:
    """A directory an image's layers make: its owner and mode."""

    path: str
    uid: int = 0
    gid: int = 0
    mode: int = 0o755


@dataclass(frozen=True)
class ImageUser:
    """An account the image's /etc/passwd and /etc/group have (a Dockerfile's `useradd`)."""

    name: str
    uid: int
    gid: int
    home: str = "/nonexistent"


@dataclass(frozen=True)
class Image:
    """One image's config and the files its layers add (see the module docstring)."""

    repository: str
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    user: int = 0
    group: int = 0
    workdir: str = "/"
    # container path -> host file or directory, read-only and over the Pod's volumes (as an image's own
    # layers are never hidden by a volume mounted above their path in a real image: here they are host paths)
    files: Mapping[str, str] = field(default_factory=dict)
    directories: tuple[ImageDirectory, ...] = ()
    users: tuple[ImageUser, ...] = ()

    def argv(self, command: Sequence[str], args: Sequence[str]) -> list[str]:
        """Kubernetes' rule: `command` replaces the entrypoint (and drops cmd), `args` replaces cmd."""
        if command:
            return [*command, *args]
        return [*self.entrypoint, *(args or self.cmd)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["directories"] = [asdict(d) for d in self.directories]
        data["users"] = [asdict(u) for u in self.users]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls(
            repository=data["repository"],
            entrypoint=tuple(data["entrypoint"]),
            cmd=tuple(data["cmd"]),
            env=dict(data["env"]),
            user=data["user"],
            group=data["group"],
            workdir=data["workdir"],
            files=dict(data["files"]),
            directories=tuple(ImageDirectory(**d) for d in data["directories"]),
            users=tuple(ImageUser(**u) for u in data["users"]),
        )

    def account_files(self, passwd: str, group: str) -> tuple[str, str]:
        """This machine's /etc/passwd and /etc/group with the image's accounts added (as its layer has
        them)."""
        names = {line.split(":", 1)[0] for line in passwd.splitlines()}
        users = [u for u in self.users if u.name not in names]
        passwd += "".join(f"{u.name}:x:{u.uid}:{u.gid}::{u.home}:/usr/sbin/nologin\n" for u in users)
        group += "".join(f"{u.name}:x:{u.gid}:\n" for u in users)
        return passwd, group


class ImageNotFound(LookupError):
    """The kubelet reports it as `ErrImagePull`."""


@dataclass(frozen=True)
class ImageTable:
    images: Mapping[str, Image]

    def resolve(self, reference: str) -> Image:
        found = self.images.get(repository(reference))
        if found is None:
            known = ", ".join(sorted(self.images))
            raise ImageNotFound(
                f"image {reference!r} is not in the dev cluster's image table (it has: {known})"
            )
        return found

    def to_json(self) -> str:
        return json.dumps({name: image.to_dict() for name, image in self.images.items()}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls({name: Image.from_dict(data) for name, data in json.loads(text).items()})


# --- image venvs -------------------------------------------------------------------------------------------


def source_digest(checkout: Path) -> str:
    """A digest of what `pip install .` would copy (pyproject, README, the package folders' files)."""
    digest = hashlib.sha256()
    for path in _context_files(checkout):
        digest.update(str(path.relative_to(checkout)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _context_files(checkout: Path) -> list[Path]:
    files = [checkout / name for name in CONTEXT_FILES]
    left_out = [checkout / folder for folder in DEV_HARNESS_DIRS]
    for folder in SOURCE_DIRS:
        files += sorted(
            p
            for p in (checkout / folder).rglob("*")
            if p.is_file()
            and "__pycache__" not in p.parts
            and p.suffix != ".pyc"
            and not any(p.is_relative_to(harness) for harness in left_out)
        )
    return files


def build_context(checkout: Path, destination: Path) -> Path:
    """The files the Dockerfiles COPY (pyproject.toml, README.md, the package folders but the dev harness) in
    `destination`: what `pip install .` sees there is what an image build sees, and the checkout gets no
    `build/` folder."""
    for path in _context_files(checkout):
        target = destination / path.relative_to(checkout)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return destination


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def build_image_venv(checkout: Path, extra: str, *, base_site_packages: Path | None = None) -> Path:
    """A venv with a non-editable `pip install '.[<extra>]'` of `checkout` (cached by its sources).

    `base_site_packages`: packages the venv sees after its own (a `.pth` line naming the directory: its own
    `.pth` files, like an editable install's finder, are not run) — the base image's layer."""
    # Keyed by the base too: a venv built over another checkout's packages would name them in its `.pth`.
    digest = source_digest(checkout)
    if base_site_packages is not None:
        digest = hashlib.sha256(f"{digest}\0{base_site_packages}".encode()).hexdigest()[:16]
    name = f"{extra}-{digest}"
    venv = IMAGES_CACHE / name
    with _locked(IMAGES_CACHE / f".{extra}.lock"):
        _remove_unused(extra, keep=venv)
        if (venv / ".complete").exists():
            (venv / ".complete").touch()  # in use: kept by the sweep
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        if base_site_packages is not None:
            (_site_packages(venv) / "zz-base-image.pth").write_text(f"{base_site_packages}\n")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        with tempfile.TemporaryDirectory(prefix="ardiff-image-context-") as tmp:
            context = build_context(checkout, Path(tmp) / "context")
            # Not from inside the context: its `operator/` folder would shadow the standard library's module.
            done = subprocess.run(
                [*pip, f"{context}[{extra}]"], cwd=tmp, capture_output=True, text=True, check=False
            )
        if done.returncode != 0:
            raise RuntimeError(f"pip install '.[{extra}]' into {venv} failed:\n{done.stdout}\n{done.stderr}")
        (venv / ".complete").touch()
    return venv


def _remove_unused(extra: str, keep: Path) -> None:
    """Image venvs of older sources not used for `UNUSED_SECONDS` (another run may still use a recent one)."""
    for stale in IMAGES_CACHE.glob(f"{extra}-*"):
        marker = stale / ".complete"
        age = time.time() - (marker.stat().st_mtime if marker.exists() else stale.stat().st_mtime)
        if stale != keep and age > UNUSED_SECONDS:
            shutil.rmtree(stale, ignore_errors=True)


def dev_site_packages() -> Path:
    """This interpreter's site-packages: the dev venv with torch, vllm and vllm-omni at their pins."""
    return Path(sysconfig.get_paths()["purelib"])


def build_image_table(checkout: Path, binaries: KubernetesBinaries, *, worker: bool = True) -> ImageTable:
    """Every image of the table; `worker=False` leaves out the worker image (its venv is not built)."""
    # Python lives under /root on these machines: non-root images need it traversable in their root.
    python_home = [
        ImageDirectory(str(p), mode=0o755) for p in _private_ancestors(Path(sys.executable).resolve())
    ]
    images = [
        _slim_python_image(
            OPERATOR_IMAGE, build_image_venv(checkout, "operator"), ("operator", "run"), python_home
        ),
        _slim_python_image(
            GATEWAY_IMAGE,
            build_image_venv(checkout, "gateway"),
            ("gateway", "picker"),
            python_home,
            files={"/usr/local/bin/envoy": str(ensure_envoy())},
        ),
        Image(
            REDIS_IMAGE,
            cmd=("redis-server",),
            env={"PATH": DEFAULT_PATH},
            workdir="/data",
            directories=(ImageDirectory("/data", 999, 999),),
            users=(ImageUser("redis", 999, 999, "/data"),),
        ),
        Image(
            KUBE_PROXY_IMAGE,
            entrypoint=("/usr/local/bin/kube-proxy",),
            env={"PATH": DEFAULT_PATH},
            files={"/usr/local/bin/kube-proxy": str(binaries.kube_proxy)},
        ),
        Image(
            COREDNS_IMAGE,
            entrypoint=("/coredns",),
            env={"PATH": DEFAULT_PATH},
            files={"/coredns": str(binaries.coredns)},
            user=65532,
            group=65532,
            users=(ImageUser("nonroot", 65532, 65532, "/home/nonroot"),),
        ),
    ]
    if worker:
        base = dev_site_packages()
        worker_venv = build_image_venv(checkout, "worker", base_site_packages=base)
        images.append(
            Image(
                WORKER_IMAGE,
                entrypoint=("ardiff",),
                cmd=("worker", "serve"),
                env={
                    "PATH": f"{worker_venv / 'bin'}:{DEFAULT_PATH}",
                    "HOME": "/home/ardiff",
                    "HF_HOME": "/home/ardiff/.cache/huggingface",
                    "ARDIFF_MODEL_CACHE": "/home/ardiff/.cache/ardiff/models",
                    "PYTHONUNBUFFERED": "1",
                },
                user=1000,
                group=1000,
                workdir="/opt/ardiff",
                directories=(
                    *python_home,
                    ImageDirectory("/opt/ardiff"),
                    ImageDirectory("/home/ardiff", 1000, 1000),
                    ImageDirectory("/home/ardiff/.cache", 1000, 1000),
                ),
                users=(ImageUser("ardiff", 1000, 1000, "/home/ardiff"),),
                # The base layer at its own path: a checkout under /tmp must not vanish under the /tmp
                # emptyDir the chart's worker Pods mount.
                files={str(base): str(base)},
            )
        )
    return ImageTable({image.repository: image for image in images})


def _slim_python_image(
    repository: str,
    venv: Path,
    cmd: tuple[str, ...],
    python_home: list[ImageDirectory],
    files: Mapping[str, str] | None = None,
) -> Image:
    """An image of the slim-Python kind (operator/Dockerfile, ardiff/gateway/Dockerfile): `ardiff` as the
    entrypoint from `venv`, user 10001, no bytecode written (a read-only root)."""
    return Image(
        repository,
        entrypoint=("ardiff",),
        cmd=cmd,
        env={
            "PATH": f"{venv / 'bin'}:{DEFAULT_PATH}",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        },
        user=10001,
        group=10001,
        files=dict(files or {}),
        directories=tuple(python_home),
        users=(ImageUser("ardiff", 10001, 10001),),
    )


def _private_ancestors(path: Path) -> list[Path]:
    """The directories above `path` that other users cannot enter (e.g. /root)."""
    return [p for p in reversed(path.parents) if p != Path("/") and not os.stat(p).st_mode & 0o001]
