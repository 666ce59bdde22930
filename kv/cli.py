"""Command-line entry points of this component (see ardiff/cli.py)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
