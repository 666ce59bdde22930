"""`ardiff session tick NAME --chunks N --out FILE.mp4` (tick a session through the Python client) and
`ardiff view NAME` (a local page that shows the session and steers it with the keyboard)."""

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
    tick.add_argument("-n", "--namespace", default="default")
    tick.add_argument("--chunks", type=_positive, required=True, help="how many ticks")
    tick.add_argument("--out", type=Path, required=True, help="the MP4 to write")
    tick.add_argument(
        "--keys",
        help="LingBot camera keys held on every tick (W/A/S/D move, I/J/K/L look), e.g. 'wj'; "
        "default: a short tour",
    )
    tick.add_argument("--reset", action="store_true", help="start the session over at chunk 0 first")
    tick.add_argument("--kubeconfig", type=Path, help="default: KUBECONFIG, ~/.kube/config or in-cluster")
    tick.add_argument("--timeout", type=float, default=300, help="seconds to wait for Ready")
    tick.add_argument(
        "--ca-file",
        type=Path,
        help="the CA that signed an https endpoint's certificate (a pool with spec.tls: its Secret's "
        "ca.crt); default: the system's CAs or SSL_CERT_FILE",
    )
    tick.set_defaults(func=_tick)

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
