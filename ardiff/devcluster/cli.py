"""`ardiff up`, `ardiff down` and `ardiff demo`: the local cluster on CPU (a development harness).

Light on purpose: the dev cluster and the client are imported inside the commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_STATE_DIR = Path(".ardiff-dev")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
    up = subparsers.add_parser(
        "up",
        help="start the local dev cluster in the background (emulated API, Redis, operator, workers)",
        description="Returns once the cluster serves, and prints how to use it. Harmless if it runs.",
    )
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="pids, logs, kubeconfig")
    up.add_argument("-n", "--namespace", default="default", help="the namespace the operator watches")
    up.set_defaults(func=_up)

    down = subparsers.add_parser(
        "down",
        help="stop the local dev cluster and every process it ran",
        description="Harmless when no cluster runs.",
    )
    down.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    down.set_defaults(func=_down)

    demo = subparsers.add_parser(
        "demo",
        help="the whole system on CPU: a dev cluster, examples/ applied, every session ticked, MP4s written",
        description="Starts a dev cluster, applies examples/ (a pool of the tiny LingBot-World model, three "
        "sessions), waits for Ready, ticks every session with camera controls through the Python client, "
        "writes one MP4 per session, prints a table and `kubectl get ardiffusionsessions`, then tears "
        "everything down (also on Ctrl-C or an error).",
    )
    demo.add_argument("--examples", type=Path, default=Path("examples"), help="the manifests to apply")
    demo.add_argument("--out", type=Path, default=Path("demo-out"), help="where the MP4s go (kept)")
    demo.add_argument("--chunks", type=int, default=8, help="ticks per session")
    demo.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR / "demo", help="logs and kubeconfig of the demo"
    )
    demo.add_argument("--timeout", type=float, default=600, help="seconds to wait for the sessions")
    demo.set_defaults(func=_demo)


def _up(args: argparse.Namespace) -> int:
    from ardiff.devcluster.daemon import up, usage

    state, started = up(args.state_dir, args.namespace)
    print(usage(state, started))
    return 0


def _down(args: argparse.Namespace) -> int:
    from ardiff.devcluster.daemon import down

    state = down(args.state_dir)
    if state is None:
        print(f"no dev cluster runs from {args.state_dir.resolve()}")
    else:
        print(f"the dev cluster is down ({len(state.processes) + 1} processes stopped)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ardiff.devcluster.demo import DemoSettings, run_demo

    run_demo(
        DemoSettings(
            examples=args.examples,
            out_dir=args.out,
            chunks=args.chunks,
            state_dir=args.state_dir,
            timeout=args.timeout,
        )
    )
    return 0
