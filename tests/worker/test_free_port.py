"""`free_port` chooses ports that no outgoing connection can take before their owner binds them: outside the
kernel's ephemeral range (CI of 2026-12-07: an Envoy of the gateway benchmark found the port `bind(0)` had
given it a moment before in use, `cannot bind '0.0.0.0:42765'`), free on every address, and not twice."""

from __future__ import annotations

import socket

from ardiff.worker import net
from ardiff.worker.net import CHOSEN_PORTS, ephemeral_ports, free_port


def test_the_ports_are_outside_the_kernels_ephemeral_range_and_not_handed_out_twice() -> None:
    ephemeral = ephemeral_ports()
    assert len(ephemeral) > 1000  # read from /proc: Linux's default 32768-60999 on the project's machines
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(port in CHOSEN_PORTS and port not in ephemeral for port in ports), ports
    assert all(free_port("::1") not in ephemeral for _ in range(20))


def test_a_port_in_use_on_any_address_is_not_chosen(monkeypatch) -> None:
    """A listener on 0.0.0.0 owns the port on 127.0.0.1 too: of three choosable ports with two taken that way,
    free_port returns the third, and then (that one handed out) the kernel's own pick."""
    ports = [free_port() for _ in range(3)]
    monkeypatch.setattr(net, "CHOSEN_PORTS", ports)
    monkeypatch.setattr(net, "_handed_out", set())
    held = []
    try:
        for port in ports[:2]:
            sock = socket.socket()
            sock.bind(("0.0.0.0", port))
            sock.listen()
            held.append(sock)
        assert free_port() == ports[2]
        assert free_port() in ephemeral_ports()
    finally:
        for sock in held:
            sock.close()
