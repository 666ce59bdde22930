"""The first process of every container the process kubelet starts: it makes the container, then execs
its command.

Run as `python -I -S container_init.py SPEC STATUS_FD` (standard library only, so that it starts fast and
needs none of the dev venv), as root, with the JSON `SPEC` file the kubelet wrote:
1. joins the pod's network namespace (`netns`; absent for hostNetwork pods: the node's, which it is in);
2. gets a mount and a UTS namespace of its own (mounts made here never reach the machine; the hostname is
   the Pod's);
3. mounts the container's root: an overlay whose lower layer is this machine's `/` and whose upper layer is
   the container's own directory, so that what the container writes anywhere outside its volumes stays in
   it and goes with it (`/proc`, `/dev` and `/sys` are the machine's, bound in);
4. adds the image's layer (`directories`, `files`) and the Pod's mounts (`mounts`: volumes, subPaths, the
   kubelet's /etc/hosts, /etc/resolv.conf and /etc/hostname), each resolved inside the new root;
5. makes the root read-only when the container asks for `readOnlyRootFilesystem`;
6. chroots, changes to `workdir`, takes the container's groups and user, and execs `argv` with `env`.

Anything that fails before the exec is written to `STATUS_FD` (and exit code 128, as runc's start errors);
on a successful exec the descriptor closes (close-on-exec) with nothing written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import sys
from pathlib import PurePosixPath

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def resolve_in_root(root: str, path: str) -> str:
    """`path` inside the tree at `root`, its symlinks followed as if `root` were `/` (a container's view)."""
    parts = list(PurePosixPath(path).parts[1:])
    current = root
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current if current == root else os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks resolving {path} in the container's root")
            link = os.readlink(candidate)
            if link.startswith("/"):
                current = root
            parts = list(PurePosixPath(link).parts[1 if link.startswith("/") else 0 :]) + parts
            continue
        current = candidate
    return current


def _make_target(root: str, path: str, *, is_file: bool) -> str:
    target = resolve_in_root(root, path)
    if is_file:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    else:
        os.makedirs(target, exist_ok=True)
    return target


def setup(spec: dict) -> None:
    if spec.get("netns"):
        with open(spec["netns"]) as handle:
            _check(_libc.setns(handle.fileno(), CLONE_NEWNET), f"setns {spec['netns']}")
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    rootfs = spec["rootfs"]
    root = rootfs["merged"]
    for directory in (rootfs["upper"], rootfs["work"], root):
        os.makedirs(directory, exist_ok=True)
    mount("overlay", root, "overlay", 0, f"lowerdir=/,upperdir={rootfs['upper']},workdir={rootfs['work']}")
    for special in ("/proc", "/sys", "/dev"):
        mount(special, os.path.join(root, special[1:]), None, MS_BIND | MS_REC)
    for directory in spec["directories"]:
        target = resolve_in_root(root, directory["path"])
        os.makedirs(target, exist_ok=True)
        os.chown(target, directory["uid"], directory["gid"])
        os.chmod(target, directory["mode"])
    for item in spec["mounts"]:
        target = _make_target(root, item["target"], is_file=item["file"])
        mount(item["source"], target, None, MS_BIND | MS_REC)
        if item["read_only"]:
            mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    workdir = resolve_in_root(root, spec["workdir"])
    os.makedirs(workdir, exist_ok=True)
    if rootfs["read_only"]:
        mount("none", root, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    socket.sethostname(spec["hostname"])
    os.chroot(root)
    os.chdir(spec["workdir"])
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    os.umask(0o022)


def main() -> None:
    spec_path, status_fd = sys.argv[1], int(sys.argv[2])
    os.set_inheritable(status_fd, False)
    try:
        with open(spec_path) as handle:
            spec = json.load(handle)
        setup(spec)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except Exception as exc:  # the container did not start: the kubelet reports why
        message = f"{type(exc).__name__}: {exc}"
        os.write(status_fd, message.encode(errors="replace")[:4000])
        print(f"container start failed: {message}", file=sys.stderr, flush=True)
        os._exit(128)


if __name__ == "__main__":
    main()
