"""The chart's images built from the repository's Dockerfiles, as written, with buildah (issue 39 item 3), and
exported as OCI archives that each real node's containerd imports.

No registry is reachable here, so the Dockerfiles' base images are local stand-ins under their upstream names:
`docker.io/library/python:3.11-slim-bookworm` is Debian bookworm's minbase with python3.11, pip and venv
(`debootstrap`), `python` and `pip` on PATH and pip installs allowed (Debian marks its python externally
managed; the upstream image does not), trusting the certificate authorities this machine trusts (its egress
to PyPI passes through one). On a real machine the upstream images are used.

Everything lives under `~/.cache/ardiff/buildah/` (buildah's storage, the archives); an image is built again
only when its inputs change: the stand-in's recipe and the machine's CAs, or an image's Dockerfile, its base
image and the build context its `.dockerignore` lets through (the key is a label on the image).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ardiff.devcluster.images import CONTEXT_FILES, DEV_HARNESS_DIRS, SOURCE_DIRS

CACHE_ROOT = Path(os.environ.get("ARDIFF_BUILDAH_CACHE", Path.home() / ".cache" / "ardiff" / "buildah"))
PYTHON_BASE = "docker.io/library/python:3.11-slim-bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PYTHON_BASE_PACKAGES = ("python3", "python3-pip", "python3-venv")
MACHINE_CAS = Path("/usr/local/share/ca-certificates")
KEY_LABEL = "dev.ardiff.inputs"
RECIPE_VERSION = "1"


class ImageBuildError(RuntimeError):
    """buildah or debootstrap failed (the command and the end of its output are in the message)."""


def buildah(*args: str) -> str:
    """buildah with this cache's storage (root and run root), never the machine's default one."""
    argv = ["buildah", "--root", str(CACHE_ROOT / "storage"), "--runroot", str(CACHE_ROOT / "run"), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageBuildError(
            f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()[-3000:]}"
        )
    return done.stdout.strip()


def _label(image: str) -> str | None:
    """The input key an image was built with; None when there is no such image."""
    try:
        return buildah(
            "inspect",
            "--type",
            "image",
            "--format",
            f'{{{{index .OCIv1.Config.Labels "{KEY_LABEL}"}}}}',
            image,
        )
    except ImageBuildError:
        return None


def _python_base_key() -> str:
    digest = hashlib.sha256(f"{RECIPE_VERSION} {DEBIAN_MIRROR} {PYTHON_BASE_PACKAGES}".encode())
    for ca in sorted(MACHINE_CAS.glob("*.crt")):
        digest.update(ca.name.encode() + ca.read_bytes())
    return digest.hexdigest()[:16]


def ensure_python_base() -> str:
    """The `python:3.11-slim-bookworm` stand-in (see the module docstring); its image id."""
    key = _python_base_key()
    if _label(PYTHON_BASE) != key:
        container = buildah("from", "scratch")
        try:
            root = Path(buildah("mount", container))
            include = ",".join(PYTHON_BASE_PACKAGES)
            done = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={include}",
                    "bookworm",
                    str(root),
                    DEBIAN_MIRROR,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise ImageBuildError(f"debootstrap failed ({done.returncode}): {done.stdout[-3000:]}")
            for name, target in (("python", "python3"), ("pip", "pip3")):
                if not (root / "usr/bin" / name).exists():  # Debian's pip package has `pip`, not `python`
                    (root / "usr/bin" / name).symlink_to(target)
            (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
            for ca in MACHINE_CAS.glob("*.crt"):
                (root / "usr/local/share/ca-certificates" / ca.name).write_bytes(ca.read_bytes())
            buildah("run", "--network", "host", container, "update-ca-certificates")
            buildah(
                "run",
                "--network",
                "host",
                container,
                "sh",
                "-c",
                "rm -rf /var/lib/apt/lists/* /var/cache/apt/*",
            )
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                "--label",
                f"{KEY_LABEL}={key}",
                container,
            )
            buildah("commit", "--quiet", container, PYTHON_BASE)
        finally:
            buildah("rm", container)
    return buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", PYTHON_BASE)


def _context_digest(checkout: Path) -> str:
    """The build context's files as the Dockerfiles see them: tracked and untracked-but-not-ignored files of
    the context (`images.CONTEXT_FILES`, the package folders but the dev harness; bytecode is ignored by both
    .gitignore and .dockerignore)."""
    pathspecs = [*CONTEXT_FILES, *SOURCE_DIRS, *(f":(exclude){folder}" for folder in DEV_HARNESS_DIRS)]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *pathspecs],
        cwd=checkout,
        capture_output=True,
        check=True,
    ).stdout
    digest = hashlib.sha256()
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        path = checkout / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class BuiltImage:
    """One image built from a Dockerfile and its OCI archive."""

    name: str
    archive: Path


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time in this storage (two checkouts, CI beside a developer)."""
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with (CACHE_ROOT / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_image(checkout: Path, dockerfile: str, name: str) -> BuiltImage:
    """`buildah bud` of `dockerfile` (relative to the checkout, the build context) tagged `name`, unless an
    image of the same inputs exists; then its archive, exported once per key."""
    with _build_lock():
        return _build_image(checkout, dockerfile, name)


def _build_image(checkout: Path, dockerfile: str, name: str) -> BuiltImage:
    base = ensure_python_base()
    digest = hashlib.sha256(
        (checkout / dockerfile).read_bytes()
        + (checkout / ".dockerignore").read_bytes()
        + base.encode()
        + _context_digest(checkout).encode()
    )
    key = digest.hexdigest()[:16]
    if _label(name) != key:
        buildah(
            "bud",
            "--network",
            "host",
            "--layers",
            "--pull-never",
            "--label",
            f"{KEY_LABEL}={key}",
            "--file",
            str(checkout / dockerfile),
            "--tag",
            name,
            str(checkout),
        )
        # The image this one replaced and its build's intermediate layers, and a failed build's containers
        # (the lock makes every container in this storage ours).
        buildah("rm", "--all")
        buildah("rmi", "--prune")
    archive = CACHE_ROOT / "archives" / f"{name.rsplit('/', 1)[-1].replace(':', '-')}-{key}.tar"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        for stale in archive.parent.glob(f"{name.rsplit('/', 1)[-1].split(':')[0]}-*.tar"):
            stale.unlink()
        partial = archive.with_suffix(".partial")
        buildah("push", "--quiet", name, f"oci-archive:{partial}:{name}")
        partial.rename(archive)
    return BuiltImage(name, archive)
