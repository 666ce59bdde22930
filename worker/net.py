"""Addresses and ports for the worker process: its own, so product code never imports the dev harness."""

from __future__ import annotations

import ipaddress
import random
import socket
from pathlib import Path

# Ports `free_port` chooses from: below the kernel's ephemeral range, so that no outgoing connection made
# between the choice and the bind takes one as its local port (a port `bind(0)` picked could be, and was:
# an Envoy of the gateway benchmark found its listener's port in use), and below the NodePort range.
CHOSEN_PORTS = range(20000, 30000)
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
_choices = random.SystemRandom()  # not the global generator, which a seeded test repeats in each process
_handed_out: set[int] = set()  # this process's choices, not handed out twice before their owners bind them


def ephemeral_ports() -> range:
    """The kernel's range for outgoing connections' local ports (Linux's default where it cannot be read)."""
    try:
        low, high = (int(n) for n in EPHEMERAL_PORTS.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on every address of `host`'s family a moment ago, outside the kernel's
    ephemeral range (the rendezvous port gloo/NCCL binds, a test's listener; best effort)."""
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    ephemeral = ephemeral_ports()
    candidates = [p for p in CHOSEN_PORTS if p not in ephemeral and p not in _handed_out]
    for port in _choices.sample(candidates, min(len(candidates), 64)):
        with socket.socket(family) as sock:
            try:
                sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    # Every choice taken (or the kernel's range covers them): the kernel's own pick.
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).version == 6
    except ValueError:
        return False


def url_host(host: str) -> str:
    """`host` as it goes into a URL's authority: an IPv6 literal bracketed (RFC 3986), anything else as is."""
    bare = host.strip("[]")
    return f"[{bare}]" if _is_ipv6(bare) else host


def http_url(host: str, port: int, *, tls: bool = False) -> str:
    """`http://<host>:<port>` (`https://` with `tls`), an IPv6 address bracketed: `http_url("fd00::1", 8000)`
    is `http://[fd00::1]:8000`."""
    return f"{'https' if tls else 'http'}://{url_host(host)}:{port}"


ANY_HOST = "0.0.0.0"  # the worker's default host: every address, IPv6 too where the host has it


def listen_socket(host: str, port: int) -> socket.socket | None:
    """For `host` == ANY_HOST on a host with IPv6: a socket bound to `[::]:port` that serves IPv4 too
    (dual-stack, IPV6_V6ONLY off whatever the sysctl default), so a worker on an IPv6 or dual-stack cluster
    answers on its pod IP of either family. None otherwise: the server binds `host` itself."""
    if host != ANY_HOST or not ipv6_available():
        return None
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
    except OSError:
        sock.close()
        raise
    return sock


def ipv6_available() -> bool:
    """Whether this host can bind an IPv6 socket (a dual-stack `::` listener then serves IPv4 too)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::", 0))
    except OSError:
        return False
    return True
