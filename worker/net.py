"""Addresses and ports for the worker process: its own, so product code never imports the dev harness."""

from __future__ import annotations

import ipaddress
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (the rendezvous port gloo/NCCL binds; best effort)."""
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
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
