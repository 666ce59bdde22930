"""The `ardiff` command line. Each component contributes its own sub-commands.

Component CLI modules are imported here, so they must stay light: anything heavy (torch, vllm, kopf)
is imported inside the command function that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence

from ardiff import __version__
from ardiff.errors import ArdiffError

# Each module defines `register(subparsers)`, adding its commands with `set_defaults(func=...)`.
COMMAND_MODULES = (
    "ardiff.kv.cli",
    "ardiff.worker.cli",
    "ardiff.operator.cli",
    "ardiff.gateway.cli",
    "ardiff.client_cli",
)
# The dev harness's commands, in a checkout only: it is in no distribution or image (pyproject.toml).
DEV_HARNESS_COMMAND_MODULES = ("ardiff.devcluster.cli", "ardiff.tiny_world.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ardiff", description="Serve AR-diffusion world models on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"ardiff {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    for module in DEV_HARNESS_COMMAND_MODULES:
        if importlib.util.find_spec(module.rpartition(".")[0]) is not None:
            importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except ArdiffError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
