"""A dev-cluster node run by the real kubelet (issue 39): the kubelet built from the control plane's Go
module, Debian's containerd and runc, Pod networking by the CNI `bridge`, `host-local` and `loopback` plugins.

One node is two processes in the node's network namespace (`ard<k>-n<n>`, made by `network`) and in one mount
namespace of their own: containerd first, started by `unshare --mount` after a shell bind-mounts the node's
directories over the fixed paths a kubelet and containerd use whatever their flags say (`/var/lib/kubelet`,
`/var/log/pods`, `/var/log/containers`, `/run/containerd`, `/run/netns`); then the kubelet, entered into
containerd's mount namespace with `nsenter` (the kubelet's volume mounts must be what containerd bind-mounts
into containers). Each node's Pods live in their own cgroup tree (`cgroupRoot`: `/ardiff<k>-<node>`), so two
nodes and the host never share one; `stop()` removes it, and the mount namespace's end releases every mount
and Pod network namespace the runtime made.

Why Debian's containerd 1.6 (end of life; the kubelet logs that it asks `RuntimeConfig` in vain and falls
back to the configured cgroup driver): it is the runtime this machine can install in seconds, and what ran
here first (../shared/notes/real-kubelet.md). containerd v2, built from its Go module, is the pairing
upstream supports from Kubernetes 1.36 on; the module's build is the next step if 1.6 falls short.

Two settings these hosts require: the kubelet's `failCgroupV1: false` (the hosts are cgroup v1) and
containerd's `restrict_oom_score_adj = true` (no `CAP_SYS_RESOURCE`: a negative `oom_score_adj` is refused).

The GPUs a pool's Pods ask for are an extended resource on the Node's status (`nvidia.com/gpu`), patched
once the node registers: the kubelet keeps extended resources it does not manage, and the scheduler counts
them like any other (the way Kubernetes documents advertising a node-level resource without a device plugin).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ardiff.devcluster.controlplane import ComponentProcess
from ardiff.devcluster.network import namespace_pids
from ardiff.devcluster.node_images import NodeImages

CNI_BIN_DIR = "/usr/lib/cni"
CNI_BRIDGE = "cbr0"
CGROUP_ROOT = Path("/sys/fs/cgroup")
STOP_SECONDS = 10.0
# Disk pressure on this machine's terms (~50 GB free of 252): the kubelet's defaults (imagefs.available < 15%)
# would evict from a disk that is 85% used; these evict only when a disk is nearly full.
EVICTION_HARD = {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"}
# The mounts the node's shell makes before containerd starts: node directory -> fixed path.
FIXED_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd", "/run/netns")

# The API server's identity at a real kubelet, which authorizes `logs`/`exec`/`port-forward` by a
# SubjectAccessReview (kubeadm binds the same).
KUBELET_API_ADMIN_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "ardiff:apiserver-kubelet-client"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:kubelet-api-admin",
    },
    "subjects": [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}
    ],
}
# A real node's extended resources, advertised on its status (its CPUs and memory are this machine's).
REAL_NODE_EXTENDED = {"nvidia.com/gpu": "8"}


class RealNodeError(RuntimeError):
    """containerd or the kubelet did not start (the log's tail is in the message)."""


def extended_resources_patch(capacity: Mapping[str, str]) -> list[dict[str, str]]:
    """The JSON patch of a real node's status that advertises its extended resources (`REAL_NODE_EXTENDED`
    and those of `capacity`; its CPUs and memory are the kubelet's to report)."""
    extended = {k: v for k, v in {**REAL_NODE_EXTENDED, **capacity}.items() if "/" in k}
    return [
        {"op": "add", "path": f"/status/capacity/{name.replace('/', '~1')}", "value": value}
        for name, value in extended.items()
    ]


@dataclass(frozen=True)
class RealNodeConfig:
    """What one real node needs from the cluster: its name, namespace and address, its credentials for the
    API server, its serving certificate, the cluster's DNS, and the images to import."""

    name: str
    network_index: int
    namespace: str
    node_ip: str
    kubeconfig: Path
    serving_cert: Path
    serving_key: Path
    client_ca: Path
    state_dir: Path
    cluster_dns: str
    cluster_domain: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    max_pods: int = 110

    def __post_init__(self) -> None:
        if not self.state_dir.is_absolute():
            raise ValueError(f"state_dir must be absolute, got {self.state_dir}")

    @property
    def cgroup_root(self) -> str:
        return f"/ardiff{self.network_index}-{self.name}"

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd" / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni"


def containerd_config(config: RealNodeConfig, sandbox_image: str) -> str:
    """containerd's config.toml: its root, state and socket under the node's directory; the CRI plugin with
    the local pause image, cgroupfs, the node's CNI directory and `restrict_oom_score_adj`."""
    base = config.state_dir / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f'root = "{base / "root"}"',
            f'state = "{base / "state"}"',
            "[grpc]",
            f'  address = "{config.containerd_socket}"',
            "[ttrpc]",
            f'  address = "{config.containerd_socket}.ttrpc"',
            f"[{cri}]",
            f'  sandbox_image = "{sandbox_image}"',
            "  restrict_oom_score_adj = true",
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{config.cni_conf_dir}"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            "",
        ]
    )


def kubelet_config(config: RealNodeConfig) -> dict[str, object]:
    """The KubeletConfiguration: webhook authentication and authorization by the API server (as a cluster's
    kubelet serves `logs`/`exec`), the node's serving certificate, cgroupfs under the node's own cgroup root,
    this machine's eviction thresholds, and cgroup v1 allowed."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": config.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(config.client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(config.serving_cert),
        "tlsPrivateKeyFile": str(config.serving_key),
        "clusterDNS": [config.cluster_dns],
        "clusterDomain": config.cluster_domain,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": config.cgroup_root,
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{config.containerd_socket}",
        "failSwapOn": False,
        "maxPods": config.max_pods,
        "evictionHard": EVICTION_HARD,
        "imageGCHighThresholdPercent": 98,
        "imageGCLowThresholdPercent": 97,
        "registerWithTaints": [dict(taint) for taint in config.taints],
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "fileCheckFrequency": "5s",
    }


def cni_conflist(pod_cidr: str) -> dict[str, object]:
    """The node's CNI network: a bridge `cbr0` holding the pod CIDR's first address (the Pods' gateway), no
    masquerade (the other nodes and the root namespace route the CIDR to this node), and loopback."""
    return {
        "cniVersion": "0.4.0",
        "name": "ardiff",
        "plugins": [
            {
                "type": "bridge",
                "bridge": CNI_BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def _cgroup_dirs(config: RealNodeConfig) -> list[Path]:
    """The node's cgroup root in every mounted v1 hierarchy (the kubelet refuses a root that is missing)."""
    return [
        controller / config.cgroup_root.lstrip("/")
        for controller in sorted(CGROUP_ROOT.iterdir())
        if controller.is_dir() and controller.name != "unified"
    ]


def _cgroup_tasks(top: Path) -> list[int]:
    """Every process in a cgroup directory tree."""
    if not top.exists():
        return []
    return [int(pid) for procs in top.rglob("cgroup.procs") for pid in procs.read_text().split()]


def _remove_cgroup_tree(top: Path) -> None:
    """rmdir a cgroup directory tree bottom up (a cgroup's files cannot be removed; its directory can, once
    empty of processes and children)."""
    if not top.exists():
        return
    for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            directory.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


@dataclass
class RealNode:
    """containerd + the kubelet of one node; see the module docstring."""

    config: RealNodeConfig
    kubelet_binary: Path
    images: NodeImages
    log_dir: Path
    containerd: ComponentProcess | None = None
    kubelet: ComponentProcess | None = None

    def start(self, timeout: float = 60) -> RealNode:
        config = self.config
        state = config.state_dir
        for name in ("containerd/root", "containerd/state", "cni", "kubelet", *FIXED_PATHS):
            (state / "mounts" / name.lstrip("/") if name.startswith("/") else state / name).mkdir(
                parents=True, exist_ok=True
            )
        for directory in _cgroup_dirs(config):
            directory.mkdir(exist_ok=True)
            if directory.parent.name == "cpuset":  # a new cpuset cgroup has no CPUs until given its parent's
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (directory / name).write_text((directory.parent / name).read_text())
        (state / "containerd.toml").write_text(containerd_config(config, self.images.pause))
        (state / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(config)))
        binds = "; ".join(
            f"mkdir -p {path}; mount --bind {shlex.quote(str(state / 'mounts' / path.lstrip('/')))} {path}"
            for path in FIXED_PATHS
        )
        self.containerd = ComponentProcess(
            f"containerd {config.name}",
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                f"set -e; {binds}; exec containerd --config {shlex.quote(str(state / 'containerd.toml'))}",
            ],
            config.namespace,
            self.log_dir / f"containerd-{config.name}.log",
        ).start()
        self._wait_socket(timeout)
        self.import_archive(self.images.archive)
        return self.start_kubelet()

    def start_kubelet(self) -> RealNode:
        """The kubelet, in containerd's mount namespace (again, after `stop_kubelet`: it finds its Pods'
        containers still running, as a kubelet restarted on a node does)."""
        config = self.config
        state = config.state_dir
        self.kubelet = ComponentProcess(
            f"kubelet {config.name}",
            [
                "nsenter",
                f"--mount=/proc/{self._containerd_pid()}/ns/mnt",
                "--",
                str(self.kubelet_binary),
                f"--config={state / 'kubelet.yaml'}",
                f"--kubeconfig={config.kubeconfig}",
                f"--hostname-override={config.name}",
                f"--node-ip={config.node_ip}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in config.labels.items()),
                "--v=1",
            ],
            config.namespace,
            self.log_dir / f"kubelet-{config.name}.log",
        ).start()
        return self

    def _containerd_pid(self) -> int:
        """containerd's pid, the holder of the node's mount namespace: `nsenter --net`, `unshare` (no
        `--fork`) and `sh -c 'exec …'` each exec the next, so it is the pid the node started."""
        assert self.containerd is not None
        assert self.containerd.process is not None
        return self.containerd.process.pid

    def _wait_socket(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.config.containerd_socket.exists():
            assert self.containerd is not None
            self.containerd.check_running()
            if time.monotonic() > deadline:
                raise RealNodeError(
                    f"containerd made no socket in {timeout:.0f} s:\n{self.containerd.tail()}"
                )
            time.sleep(0.1)

    def write_network(self, pod_cidr: str) -> None:
        """The node's CNI config, once the controller-manager gave it `spec.podCIDR` (the runtime reports
        its network ready, and the kubelet its node Ready, from then on)."""
        path = self.config.cni_conf_dir / "10-ardiff.conflist"
        path.write_text(json.dumps(cni_conflist(pod_cidr), indent=2))

    def ctr(self, *args: str) -> str:
        """`ctr` against this node's containerd, in the k8s.io namespace the kubelet's containers live in."""
        argv = ["ctr", "--address", str(self.config.containerd_socket), "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    def import_archive(self, archive: Path) -> None:
        """`ctr images import` of an OCI archive into this node's containerd (its images keep the names the
        archive tags them with)."""
        self.ctr("images", "import", str(archive))

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone (a node fault: its containers keep running, the node goes NotReady)."""
        if self.kubelet is not None:
            self.kubelet.stop()

    def stop(self) -> None:
        """The kubelet, then every container process of the node (SIGKILL of its cgroup tree's tasks),
        containerd and its shims (whatever else runs in the node's network namespace), then the cgroup tree;
        the mount namespace, and the Pods' network namespaces mounted in it, end with its last process."""
        self.stop_kubelet()
        self._kill(pid for directory in _cgroup_dirs(self.config) for pid in _cgroup_tasks(directory))
        if self.containerd is not None:
            self.containerd.stop()
        self._kill(namespace_pids(self.config.namespace))
        deadline = time.monotonic() + STOP_SECONDS
        for directory in _cgroup_dirs(self.config):
            while _cgroup_tasks(directory) and time.monotonic() < deadline:
                time.sleep(0.05)
            _remove_cgroup_tree(directory)

    @staticmethod
    def _kill(pids: Iterable[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
