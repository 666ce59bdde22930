"""The real nodes' images that no Dockerfile of ours builds, made without a registry (issue 39):
`ardiff.dev/busybox:<version>` (Debian's static busybox, every applet linked), the Pod sandbox image
`ardiff.dev/pause:<version>` (the same layer, whose shell waits for SIGTERM as the pause binary does), and a
stand-in for the chart's bundled Redis image (`redis.bundled.image` in the chart's values, upstream
`redis:<tag>-alpine`): the busybox layer plus Debian's `redis-server` and `redis-cli` with the libraries they
link, the image's `redis` user (999) and its `/data` working directory. It runs Debian's Redis (7.0 on
bookworm) under the upstream name: what the chart uses of it (redis-server with a config file, redis-cli in
the probe, `sh`) behaves the same. Built once with `umoci` into an OCI layout archive under
`~/.cache/ardiff/node-images/<key>/` (keyed by the binaries, the name and this recipe) and imported into each
node's containerd (`RealNode.import_archive`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

CACHE_ROOT = Path(
    os.environ.get("ARDIFF_NODE_IMAGE_CACHE", Path.home() / ".cache" / "ardiff" / "node-images")
)
BUSYBOX = Path("/bin/busybox")  # busybox-static: no library to carry into the image
REPOSITORY = "ardiff.dev"
# The pause process: PID 1 of every sandbox, exiting at SIGTERM (a shell's `wait` is interruptible; `sleep`
# as PID 1 would ignore the signal and be killed after the grace period).
PAUSE_COMMAND = ("/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done")
RECIPE_VERSION = "3"
REDIS_BINARIES = (Path("/usr/bin/redis-server"), Path("/usr/bin/redis-cli"))
CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "ardiff" / "values.yaml"
REDIS_USER = 999  # the official image's `redis` user, which the chart's podSecurityContext names


class NodeImageError(RuntimeError):
    """umoci or ctr failed (the command and its output are in the message)."""


def _run(*argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NodeImageError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _busybox_version() -> str:
    first = _run(str(BUSYBOX)).splitlines()[0]  # "BusyBox v1.35.0 (Debian 1:1.35.0-4+b3) multi-call binary."
    return first.split()[1].removeprefix("v")


def _redis_image() -> str:
    image = yaml.safe_load(CHART_VALUES.read_text())["redis"]["bundled"]["image"]
    return f"{image['repository']}:{image['tag']}"


def _redis_files() -> list[Path]:
    """The Redis binaries and every library they load (as `ldd` resolves them here, the loader included)."""
    files = set(REDIS_BINARIES)
    for binary in REDIS_BINARIES:
        for line in _run("ldd", str(binary)).splitlines():
            path = line.split("=>")[-1].split("(")[0].strip()
            if path.startswith("/"):
                files.add(Path(path))
    return sorted(files)


def _key(redis_image: str, redis_files: list[Path]) -> str:
    digest = hashlib.sha256(f"{RECIPE_VERSION}\0{' '.join(PAUSE_COMMAND)}\0{redis_image}".encode())
    for path in (BUSYBOX, *redis_files):
        digest.update(f"\0{path}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class NodeImages:
    """The archive and the names of the images in it."""

    archive: Path
    busybox: str
    pause: str
    redis: str


def ensure_node_images() -> NodeImages:
    """Build the archive unless this recipe's is cached; its images."""
    version = _busybox_version()
    redis_files = _redis_files()
    redis = _redis_image()
    directory = CACHE_ROOT / _key(redis, redis_files)
    archive = directory / "images.tar"
    images = NodeImages(archive, f"{REPOSITORY}/busybox:{version}", f"{REPOSITORY}/pause:{version}", redis)
    if archive.exists():
        return images
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        work = Path(tmp)
        layout = work / "layout"
        _run("umoci", "init", "--layout", str(layout))
        _run("umoci", "new", "--image", f"{layout}:base")
        bundle = work / "bundle"
        _run("umoci", "unpack", "--rootless", "--image", f"{layout}:base", str(bundle))
        rootfs = bundle / "rootfs"
        (rootfs / "bin").mkdir(parents=True, exist_ok=True)
        for name in ("tmp", "etc", "proc", "sys", "dev"):
            (rootfs / name).mkdir(exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)  # any user's scratch space, as in every base image
        shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
        for applet in _run(str(BUSYBOX), "--list").split():
            link = rootfs / "bin" / applet
            if not link.exists():
                link.symlink_to("busybox")
        (rootfs / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
        )
        (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        _run("umoci", "repack", "--image", f"{layout}:base", str(bundle))
        # Full references as the layout's tags: `ctr images import` names an image by its tag when the tag
        # is one (a bare tag would become `import-<date>:<tag>`).
        _run("umoci", "config", "--image", f"{layout}:base", "--config.cmd", "sh", "--tag", images.busybox)
        argv = ["umoci", "config", "--image", f"{layout}:base", "--tag", images.pause]
        for part in PAUSE_COMMAND:
            argv += ["--config.cmd", part]
        _run(*argv)
        _add_redis(layout, work / "redis-bundle", redis_files, images.redis)
        _run("umoci", "rm", "--image", f"{layout}:base")
        _run("umoci", "gc", "--layout", str(layout))
        partial = work / "images.tar"
        _run("tar", "-C", str(layout), "-cf", str(partial), ".")
        partial.rename(archive)
    return images


def _add_redis(layout: Path, bundle: Path, files: list[Path], name: str) -> None:
    """The Redis image: a layer of its files over the busybox one, tagged `name`. Unpacked as root, not
    rootless, so that the layer keeps `/data`'s owner."""
    _run("umoci", "unpack", "--image", f"{layout}:base", str(bundle))
    rootfs = bundle / "rootfs"
    for path in files:
        target = rootfs / path.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path.resolve(), target)  # the library under the name the loader looks for
    with (rootfs / "etc" / "passwd").open("a") as passwd:
        passwd.write(f"redis:x:{REDIS_USER}:{REDIS_USER}::/data:/bin/sh\n")
    with (rootfs / "etc" / "group").open("a") as group:
        group.write(f"redis:x:{REDIS_USER}:\n")
    data = rootfs / "data"
    data.mkdir()
    os.chown(data, REDIS_USER, REDIS_USER)
    _run("umoci", "repack", "--image", f"{layout}:redis", str(bundle))
    _run("umoci", "config", "--image", f"{layout}:redis", "--config.workingdir", "/data",
         "--config.cmd", "redis-server", "--tag", name)  # fmt: skip
    _run("umoci", "rm", "--image", f"{layout}:redis")
