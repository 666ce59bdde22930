"""The dev cluster's network: Linux network namespaces and veth pairs, one instance per slot, nothing routed
beyond them.

One instance (slot `k` of `SLOTS`, held by a lock file for as long as its owner runs) owns every name that
starts with `ard<k>` — network namespaces `ard<k>-*`, the root namespace's link `ard<k>` — and these
addresses:

    10.(100+k).0.0/24     the underlay: a bridge in namespace `ard<k>-net` (a switch, no address), joined by
                          the root namespace (10.K.0.1: this machine — tests, the operator run outside the
                          cluster, their Redis), the control plane's namespace `ard<k>-cp` (10.K.0.2: etcd,
                          the API server, controller-manager, scheduler), each node (10.K.0.(10+n): its
                          kubelet's API, hostNetwork pods) and the outside (10.K.0.(240+n): a laptop's view,
                          `add_outside`)
    10.(100+k).128.0/17   the cluster CIDR: the controller-manager gives each Node a /22 (`spec.podCIDR`);
                          the node's bridge `cbr0` holds the first address, pods the next ones
    10.(150+k).0.0/16     Services (kube-proxy DNATs them in each node's namespace); .10 is the cluster DNS

Every process of the cluster runs in one of the slot's namespaces, so removing them stops it all. Each node is
a network namespace `ard<k>-n<n>` with IP forwarding on (its pods reach the other node and the root namespace
through it); each pod has a namespace `ard<k>-p<id>` with `eth0` on its node's bridge. No namespace has a
route beyond these prefixes and the root namespace never forwards, so pod traffic can only reach the
instance's own addresses. The next owner of a slot whose owner died removes what is left (`reclaim`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SLOTS = 40
STATE_DIR = Path(os.environ.get("ARDIFF_NETWORK_STATE_DIR", "/run/ardiff/network"))
NODE_CIDR_MASK = 22


class NetworkError(RuntimeError):
    """A namespace, link or address could not be set up (the command and its output are in the message)."""


def ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """`ip [-n namespace] <args>`; its stdout."""
    argv = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def require_root(what: str) -> None:
    """Network namespaces and bridges need root: say so plainly rather than fail deep inside `ip`."""
    if os.geteuid() != 0:
        raise NetworkError(
            f"{what} needs root (it makes network namespaces, veth pairs and bridges for the cluster's "
            "nodes and pods); run it as root, e.g. with sudo"
        )


def short_pod_id(uid: str) -> str:
    """A Pod's short id in the names of its namespace and veth (interface names have at most 15 bytes)."""
    return uid.replace("-", "")[:10]


def host_veth(pod: str) -> str:
    """The node-side end of Pod `pod`'s (a `short_pod_id`) veth pair, on the node's bridge."""
    return f"v{pod}"[:15]


def namespaces() -> list[str]:
    """The names of every network namespace `ip netns` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def namespace_pids(namespace: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", namespace, check=False).split()]


def _kill_namespace(namespace: str) -> None:
    """Kill what still runs in `namespace` (a crashed owner's pods), remove its interfaces, then delete it.

    The interfaces go first, and explicitly: the kernel frees a namespace only when its last reference goes,
    and then asynchronously (once 108 s late on a loaded machine), and until then its interfaces keep their
    addresses and answer ARP on the bridge they are attached to, beside whoever is given the address next."""
    for _ in range(50):
        pids = namespace_pids(namespace)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for link in ip("-o", "link", "show", namespace=namespace, check=False).splitlines():
        name = link.split(":")[1].strip().partition("@")[0]
        if name != "lo":
            ip("link", "delete", name, namespace=namespace, check=False)
    ip("netns", "delete", namespace, check=False)


@dataclass(frozen=True)
class PodInterface:
    """What a pod's namespace got: its name, address and gateway."""

    namespace: str
    ip: str
    gateway: str
    prefix_length: int


@dataclass(frozen=True)
class ClusterNetwork:
    """The addresses and names of slot `index` (see the module docstring); `up()` makes the underlay."""

    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < SLOTS:
            raise ValueError(f"cluster network index must be in [0, {SLOTS}), got {self.index}")

    @property
    def prefix(self) -> str:
        return f"ard{self.index}"

    @property
    def underlay_namespace(self) -> str:
        return f"{self.prefix}-net"

    @property
    def host_ip(self) -> str:
        return f"10.{100 + self.index}.0.1"

    @property
    def control_plane_ip(self) -> str:
        return f"10.{100 + self.index}.0.2"

    @property
    def control_plane_namespace(self) -> str:
        return f"{self.prefix}-cp"

    @property
    def underlay(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{100 + self.index}.0.0/24")

    @property
    def cluster_cidr(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{100 + self.index}.128.0/17")

    @property
    def service_cidr(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{150 + self.index}.0.0/16")

    @property
    def api_service_ip(self) -> str:
        """The `kubernetes` Service's ClusterIP: the first of the range, as the API server allocates it."""
        return str(self.service_cidr[1])

    @property
    def dns_ip(self) -> str:
        return str(self.service_cidr[10])

    def node_namespace(self, number: int) -> str:
        return f"{self.prefix}-n{number}"

    def node_ip(self, number: int) -> str:
        if not 1 <= number <= 200:
            raise ValueError(f"cluster network node number must be in [1, 200], got {number}")
        return str(self.underlay[10 + number])

    def outside_namespace(self, number: int) -> str:
        return f"{self.prefix}-x{number}"

    def outside_ip(self, number: int) -> str:
        if not 1 <= number <= 9:
            raise ValueError(f"cluster network outside number must be in [1, 9], got {number}")
        return str(self.underlay[240 + number])

    def pod_namespace(self, pod_id: str) -> str:
        return f"{self.prefix}-p{pod_id}"

    # --- the underlay -------------------------------------------------------------------------------------

    def up(self) -> None:
        """The underlay switch and the root namespace's link to it (idempotent after `reclaim`)."""
        require_root("the dev cluster's network")
        ns = self.underlay_namespace
        ip("netns", "add", ns)
        ip("link", "set", "lo", "up", namespace=ns)
        ip("link", "add", "br0", "type", "bridge", namespace=ns)
        ip("link", "set", "br0", "up", namespace=ns)
        ip("link", "add", self.prefix, "type", "veth", "peer", "name", "root", "netns", ns)
        ip("link", "set", "root", "master", "br0", "up", namespace=ns)
        ip("addr", "add", f"{self.host_ip}/{self.underlay.prefixlen}", "dev", self.prefix)
        ip("link", "set", self.prefix, "up")

    def _add_host(self, ns: str, uplink: str, address: str) -> None:
        """A namespace with `eth0` (`address`) on the underlay."""
        ip("netns", "add", ns)
        ip("link", "set", "lo", "up", namespace=ns)
        under = self.underlay_namespace
        ip("link", "add", uplink, "type", "veth", "peer", "name", "eth0", "netns", ns, namespace=under)
        ip("link", "set", uplink, "master", "br0", "up", namespace=under)
        ip("addr", "add", f"{address}/{self.underlay.prefixlen}", "dev", "eth0", namespace=ns)
        ip("link", "set", "eth0", "up", namespace=ns)

    def add_control_plane(self) -> str:
        """The control plane's namespace on the underlay; its name."""
        self._add_host(self.control_plane_namespace, "cp", self.control_plane_ip)
        return self.control_plane_namespace

    def add_node(self, number: int) -> str:
        """Node `number`'s namespace on the underlay, forwarding for its pods; its name."""
        ns = self.node_namespace(number)
        self._add_host(ns, f"n{number}", self.node_ip(number))
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"], check=True)
        return ns

    def add_outside(self, number: int) -> str:
        """A namespace outside the cluster (issue 37): a laptop on the nodes' network that reaches the nodes'
        and the API server's addresses and nothing else (no route to the pod or Service CIDRs: what it
        reaches of the sessions, it reaches through a NodePort); its name. Idempotent."""
        ns = self.outside_namespace(number)
        if ns not in namespaces():
            self._add_host(ns, f"x{number}", self.outside_ip(number))
        return ns

    def node_bridge(self, number: int, pod_cidr: str) -> None:
        """The node's pod bridge `cbr0` with the first address of its `spec.podCIDR` (idempotent)."""
        ns = self.node_namespace(number)
        network = ipaddress.IPv4Network(pod_cidr)
        if network.subnet_of(self.cluster_cidr) is False:
            raise NetworkError(f"pod CIDR {pod_cidr} is outside the cluster CIDR {self.cluster_cidr}")
        if "cbr0" not in ip("-o", "link", "show", namespace=ns):
            ip("link", "add", "cbr0", "type", "bridge", namespace=ns)
            ip("addr", "add", f"{network[1]}/{network.prefixlen}", "dev", "cbr0", namespace=ns)
            ip("link", "set", "cbr0", "up", namespace=ns)

    def route_node_cidr(self, pod_cidr: str, node_ip: str, *, from_namespaces: Sequence[str | None]) -> None:
        """Route a node's pod CIDR via its underlay address from the root namespace (None) and other nodes."""
        for ns in from_namespaces:
            ip("route", "replace", pod_cidr, "via", node_ip, namespace=ns)

    # --- pods ---------------------------------------------------------------------------------------------

    def add_pod(self, number: int, pod_id: str, address: str, pod_cidr: str) -> PodInterface:
        """A pod's own namespace with `eth0` (`address`) on node `number`'s bridge, default route via it."""
        node_ns = self.node_namespace(number)
        ns = self.pod_namespace(pod_id)
        network = ipaddress.IPv4Network(pod_cidr)
        gateway = str(network[1])
        ip("netns", "add", ns)
        try:
            ip("link", "set", "lo", "up", namespace=ns)
            host_side = host_veth(pod_id)
            ip(
                "link",
                "add",
                host_side,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
                namespace=node_ns,
            )
            ip("link", "set", host_side, "master", "cbr0", "up", namespace=node_ns)
            ip("addr", "add", f"{address}/{network.prefixlen}", "dev", "eth0", namespace=ns)
            ip("link", "set", "eth0", "up", namespace=ns)
            ip("route", "add", "default", "via", gateway, namespace=ns)
        except NetworkError:
            _kill_namespace(ns)
            raise
        return PodInterface(ns, address, gateway, network.prefixlen)

    def remove_pod(self, pod_id: str) -> None:
        """Its namespace goes, and with it both ends of its veth pair."""
        _kill_namespace(self.pod_namespace(pod_id))

    # --- teardown -----------------------------------------------------------------------------------------

    def owned_namespaces(self) -> list[str]:
        return [ns for ns in namespaces() if ns.startswith(f"{self.prefix}-")]

    def down(self) -> None:
        """Remove every namespace and link of this slot (and what still runs in a namespace)."""
        pods = [ns for ns in self.owned_namespaces() if ns.startswith(f"{self.prefix}-p")]
        for ns in [*pods, *(ns for ns in self.owned_namespaces() if ns not in pods)]:
            _kill_namespace(ns)
        ip("link", "delete", self.prefix, check=False)


class SlotLock:
    """Holds slot `index` for this process (an exclusive `flock` on `<STATE_DIR>/<index>.lock`)."""

    def __init__(self, index: int, handle: int) -> None:
        self.index = index
        self._handle = handle

    def release(self) -> None:
        if self._handle >= 0:
            os.close(self._handle)
            self._handle = -1


def _try_lock(index: int) -> SlotLock | None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    handle = os.open(STATE_DIR / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        return None
    os.ftruncate(handle, 0)
    os.write(handle, str(os.getpid()).encode())
    return SlotLock(index, handle)


@contextlib.contextmanager
def claimed_network(preferred: Sequence[int] = ()) -> Iterator[tuple[ClusterNetwork, SlotLock]]:
    """The first free slot (`preferred` first): what a dead owner left there is removed, the underlay made;
    everything is removed again on exit."""
    require_root("the dev cluster's network")
    order = [*preferred, *(i for i in range(SLOTS) if i not in preferred)]
    for index in order:
        lock = _try_lock(index)
        if lock is None:
            continue
        network = ClusterNetwork(index)
        try:
            network.down()  # what a crashed owner of this slot left behind
            network.up()
            yield network, lock
        finally:
            network.down()
            lock.release()
        return
    raise NetworkError(f"all {SLOTS} dev cluster network slots are in use ({STATE_DIR})")


def reclaim(index: int) -> bool:
    """Remove what slot `index` left behind if its owner is gone (its lock is free); False while it lives."""
    lock = _try_lock(index)
    if lock is None:
        return False
    try:
        ClusterNetwork(index).down()
    finally:
        lock.release()
    return True
