"""`ardiff session tick NAME --chunks N --out FILE.mp4` (tick a session through the Python client), `ardiff
session fork PARENT CHILD [--at N]` and `ardiff session rewind NAME N` (branch a session at a kept chunk, put
it back at one), and `ardiff view NAME` (a local page that shows the session and steers it with the
keyboard)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
    session = subparsers.add_parser("session", help="use an ARDiffusionSession through the Python client")
    commands = session.add_subparsers(dest="session_command", metavar="COMMAND", required=True)
    tick = commands.add_parser(
        "tick",
        help="wait for the session to be Ready, tick it N times, write the frames as an MP4",
        description="Continues at the session's next chunk. A session that lost its KV cache (resetRequired) "
        "is only started over with --reset.",
    )
    tick.add_argument("name", help="the ARDiffusionSession's name")
    tick.add_argument("--chunks", type=_positive, required=True, help="how many ticks")
    tick.add_argument("--out", type=Path, required=True, help="the MP4 to write")
    tick.add_argument(
        "--keys",
        help="LingBot camera keys held on every tick (W/A/S/D move, I/J/K/L look), e.g. 'wj'; "
        "default: a short tour",
    )
    tick.add_argument("--reset", action="store_true", help="start the session over at chunk 0 first")
    _cluster_arguments(tick, timeout_help="seconds to wait for Ready")
    _ca_file_argument(tick)
    tick.set_defaults(func=_tick)

    fork = commands.add_parser(
        "fork",
        help="create CHILD at a kept chunk of PARENT and wait for it to be Ready",
        description="The child starts at the parent's state before its chunk N: its next chunk with the same "
        "controls is the parent's chunk N. It is in the parent's pool and family, with the parent's prompt, "
        "seed and image; the parent must keep chunk N (spec.history.keepChunks) and is left as it is.",
    )
    fork.add_argument("parent", help="the ARDiffusionSession to branch")
    fork.add_argument("child", help="the new ARDiffusionSession's name")
    fork.add_argument(
        "--at", type=_positive, help="the kept chunk the child generates first; default: the parent's latest"
    )
    fork.add_argument(
        "--keep-chunks", type=int, help="the child's own spec.history.keepChunks (default: none kept)"
    )
    _cluster_arguments(fork, timeout_help="seconds to wait for the child to be Ready")
    fork.set_defaults(func=_fork)

    rewind = commands.add_parser(
        "rewind",
        help="put the session back at its kept chunk N (the next tick generates chunk N again)",
        description="Kept chunks after N are dropped; with the same controls the next chunk is the one "
        "generated before. Chunk 0 is not kept: start over with `ardiff session tick --reset`.",
    )
    rewind.add_argument("name", help="the ARDiffusionSession's name")
    rewind.add_argument("chunk", type=_positive, help="the kept chunk to go back to")
    _cluster_arguments(rewind, timeout_help="seconds to wait for Ready")
    _ca_file_argument(rewind)
    rewind.set_defaults(func=_rewind)

    view = subparsers.add_parser(
        "view",
        help="a local web page that shows a session's frames; W/A/S/D and I/J/K/L (or arrows) steer it",
        description="Serves a page on this machine and proxies the session's stream to it (pod IPs need "
        "not be reachable from here, and the token stays in this process). Prints the page's URL.",
    )
    view.add_argument("name", help="the ARDiffusionSession's name")
    view.add_argument("-n", "--namespace", default="default")
    view.add_argument("--kubeconfig", type=Path, help="default: KUBECONFIG, ~/.kube/config or in-cluster")
    view.add_argument("--host", default="127.0.0.1", help="where the page listens")
    view.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    view.add_argument("--format", default="jpeg", choices=("jpeg", "webp"), help="how frames travel")
    view.add_argument("--open", action="store_true", help="open the page in the default browser")
    view.set_defaults(func=_view)


def _cluster_arguments(parser: argparse.ArgumentParser, *, timeout_help: str) -> None:
    """Where the session is: its namespace and the cluster's credentials; how long to wait for it."""
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--kubeconfig", type=Path, help="default: KUBECONFIG, ~/.kube/config or in-cluster")
    parser.add_argument("--timeout", type=float, default=300, help=timeout_help)


def _ca_file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-file",
        type=Path,
        help="the CA that signed the session's https base URL's certificate (the front door's, or a pool's "
        "with spec.tls: its Secret's ca.crt); default: the system's CAs or SSL_CERT_FILE",
    )


def _positive(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {raw}")
    return value


def _tick(args: argparse.Namespace) -> int:
    from ardiff.client import CAMERA_TOUR, KubeSessions, ResetRequired, hold, write_mp4
    from ardiff.errors import ArdiffError

    try:
        fixed = [hold(args.keys)] if args.keys is not None else None
    except ValueError as exc:
        raise ArdiffError(str(exc), code="invalid_keys") from None
    sessions = KubeSessions(args.namespace, kubeconfig=args.kubeconfig)
    with sessions.connect(args.name, timeout=args.timeout, ca_file=args.ca_file) as client:
        if args.reset:
            client.reset()
        chunks = []
        for _ in range(args.chunks):
            controls = fixed or [CAMERA_TOUR[client.next_chunk_index % len(CAMERA_TOUR)]]
            try:
                chunk = client.tick(controls)
            except ResetRequired as exc:
                raise ResetRequired(f"{exc.message}; run again with --reset to start it over") from None
            chunks.append(chunk.frames)
            frames, height, width, _ = chunk.frames.shape
            print(
                f"{args.name} chunk {chunk.metadata.chunk_index}: {frames} frames {height}x{width} "
                f"in {chunk.latency_s * 1000:.0f} ms ({client.endpoint})",
                flush=True,
            )
    path = write_mp4(args.out, chunks)
    print(f"wrote {sum(len(c) for c in chunks)} frames to {path}")
    return 0


def _fork(args: argparse.Namespace) -> int:
    from ardiff.client import KubeSessions, base_url

    sessions = KubeSessions(args.namespace, kubeconfig=args.kubeconfig)
    options = {} if args.keep_chunks is None else {"keep_chunks": args.keep_chunks}
    sessions.fork(args.parent, args.child, args.at, **options)
    status = sessions.wait_ready(args.child, timeout=args.timeout)
    print(
        f"{args.child}: forked from {args.parent}, Ready on {status.get('pod')} at chunk "
        f"{status.get('chunkIndex')} ({base_url(status)})"
    )
    return 0


def _rewind(args: argparse.Namespace) -> int:
    from ardiff.client import KubeSessions

    sessions = KubeSessions(args.namespace, kubeconfig=args.kubeconfig)
    with sessions.connect(args.name, timeout=args.timeout, ca_file=args.ca_file) as client:
        rewind = client.rewind(args.chunk)
    kept = ", ".join(str(n) for n in rewind.kept_chunks) or "none"
    print(f"{rewind.session}: rewound, its next chunk is {rewind.chunk_index} (kept chunks: {kept})")
    return 0


def _view(args: argparse.Namespace) -> int:
    import asyncio

    from ardiff.viewer import ViewerSettings, serve

    settings = ViewerSettings(
        session=args.name,
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        frame_format=args.format,
        host=args.host,
        port=args.port,
    )
    asyncio.run(serve(settings, open_browser=args.open))
    return 0
