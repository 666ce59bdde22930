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


def http_url(host: str, port: int) -> str:
    """`http://<host>:<port>`, an IPv6 address bracketed: `http_url("fd00::1", 8000)` is `http://[fd00::1]:8000`."""
    return f"http://{url_host(host)}:{port}"


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
