"""A TCP link the fault injector can slow down and cut (issue 40 item 1): a forwarder process between two
parts of the dev cluster.

This kernel has no `netem`, so a delay is made in user space: every chunk read from one side is written to
the other `delay_ms` later (in order; the link's bandwidth is not limited, only its latency). A cut resets
every open connection at once (both ends get a TCP RST, as when a load balancer or an API server drops its
watches) and the link goes on accepting new ones. A silent drop is not this module's: that is a partition
(iptables, `faults.FaultInjector.partition`), which can be put on the link's port.

`LinkProxy.start()` runs `python -m ardiff.devcluster.link_proxy` in a network namespace (or this one), which
prints `listening <port>` once bound. It is told what to do on its stdin, a line per command, and answers each
on its stdout once done: `delay <ms>` (what is read from then on is written that much later; `delay <ms>`),
`cut` (`cut <n>`: the connections it reset). Its stdin's end stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import selectors
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Self

# Chunks read at a time, and the most a direction holds while it waits out its delay (the reader stops
# reading beyond it): 1,024 x 64 KiB = 64 MiB per direction.
CHUNK_BYTES = 64 << 10
QUEUED_CHUNKS = 1024
START_TIMEOUT_SECONDS = 10.0
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class LinkError(RuntimeError):
    """The link process did not start or did not answer (its output is in the message)."""


@dataclass
class LinkProxy:
    """Forwards `listen_host`:port (0: a free one, `port` once started) to `target`, `delay_ms` late, from
    inside network namespace `namespace` (None: this process's)."""

    listen_host: str
    target: tuple[str, int]
    delay_ms: int = 0
    namespace: str | None = None
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"link delay_ms must be >= 0, got {self.delay_ms}")

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def start(self) -> Self:
        argv = [
            sys.executable,
            "-m",
            "ardiff.devcluster.link_proxy",
            f"{self.listen_host}:{self.port}",
            f"{self.target[0]}:{self.target[1]}",
            f"--delay-ms={self.delay_ms}",
        ]
        if self.namespace is not None:
            argv = ["nsenter", f"--net=/run/netns/{self.namespace}", "--", *argv]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0
        )
        words = self._line("listening").split()
        self.port = int(words[1])
        return self

    def cut(self) -> int:
        """Reset every connection open now; how many there were."""
        return int(self._command("cut").split()[1])

    def set_delay(self, delay_ms: int) -> None:
        """From now on, what the link reads is written `delay_ms` later (a server that starts through a slow
        link takes a round trip per request of its start: start it first, then slow the link)."""
        if delay_ms < 0:
            raise ValueError(f"link delay_ms must be >= 0, got {delay_ms}")
        self._command(f"delay {delay_ms}")
        self.delay_ms = delay_ms

    def _command(self, line: str) -> str:
        assert self.process is not None, "the link is not started"
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())
        return self._line(line.split()[0])

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # its end stops the link
            try:
                self.process.wait(timeout=START_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self.process = None

    def _line(self, word: str) -> str:
        """The process's next line, which must start with `word` (it prints nothing else)."""
        assert self.process is not None
        assert self.process.stdout is not None
        line = _read_line(self.process.stdout, START_TIMEOUT_SECONDS)
        if not line.startswith(word):
            rest = "" if self.process.poll() is None else self.process.stdout.read().decode(errors="replace")
            raise LinkError(f"link {self.address} -> {self.target}: expected {word!r}, got {line + rest!r}")
        return line


def _read_line(stream: IO[bytes], timeout: float) -> str:
    """One line of a child's unbuffered stdout within `timeout` (what came before its end or the timeout).
    Byte by byte: a buffered reader could take the next line too and leave the selector nothing to see."""
    deadline = time.monotonic() + timeout
    line = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while not line.endswith(b"\n") and selector.select(max(0.0, deadline - time.monotonic())):
            byte = os.read(stream.fileno(), 1)
            if not byte:
                break
            line += byte
    return line.decode(errors="replace")


# --- the process ------------------------------------------------------------------------------------------


class Link:
    """The running forwarder: its open connections, each a pair of transports' sockets."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self.open: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def serve(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(client)
            return
        pair = (client, upstream)
        self.open.add(pair)
        pumps = [
            asyncio.create_task(self._pump(client_reader, upstream)),
            asyncio.create_task(self._pump(upstream_reader, client)),
        ]
        try:
            # Both directions end at their end of stream; one that fails (a reset) ends the other at once.
            done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            if pending or any(task.exception() for task in done):
                for writer in pair:
                    _reset(writer)
        finally:
            for task in pumps:
                task.cancel()
            self.open.discard(pair)
            for writer in pair:
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy `reader` to `writer`, each chunk `delay` after it was read; pass the end of stream on."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED_CHUNKS)

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                await queue.put((loop.time() + self.delay, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    def cut(self) -> int:
        pairs = list(self.open)
        for pair in pairs:
            for writer in pair:
                _reset(writer)
        self.open.clear()
        return len(pairs)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    writer.transport.abort()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(listen: tuple[str, int], target: tuple[str, int], delay_ms: int) -> None:
    link = Link(target, delay_ms / 1000)
    server = await asyncio.start_server(link.serve, *listen, reuse_address=True)
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        while line := (await commands.readline()).decode():
            match line.split():
                case ["cut"]:
                    print(f"cut {link.cut()}", flush=True)
                case ["delay", milliseconds] if milliseconds.isdigit():
                    link.delay = int(milliseconds) / 1000
                    print(f"delay {milliseconds}", flush=True)
                case _:
                    print(f"unknown command {line.strip()!r}", flush=True)
        link.cut()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("listen", help="host:port to listen on (port 0: a free one)")
    parser.add_argument("target", help="host:port to forward to")
    parser.add_argument("--delay-ms", type=int, default=0, help="each chunk is written this much later")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error(f"--delay-ms must be >= 0, got {args.delay_ms}")
    asyncio.run(_main(_host_port(args.listen), _host_port(args.target), args.delay_ms))


if __name__ == "__main__":
    main()
