"""`ardiff gateway picker` and `ardiff gateway bootstrap`: the front door's two processes (light: the picker's
gRPC stack is imported when it runs).

Settings are flags, else `ARDIFF_GATEWAY_*` environment variables (the chart sets those; docs/contracts.md
"Front door"): `ARDIFF_GATEWAY_REDIS_URL` or `ARDIFF_GATEWAY_REDIS_URL_FILE` (the gateway's own Redis
user), `ARDIFF_GATEWAY_LISTEN`, `ARDIFF_GATEWAY_HTTP_LISTEN` for the picker; the bootstrap's ports, the
picker's address, the TLS files and the dynamic clusters' directory for Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"ARDIFF_GATEWAY_{name}", default)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
    gateway = subparsers.add_parser("gateway", help="the front door: Envoy and the session endpoint picker")
    commands = gateway.add_subparsers(dest="gateway_command", metavar="COMMAND", required=True)

    picker = commands.add_parser(
        "picker",
        help="serve Envoy's external processing: which Pod serves each session request",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    picker.add_argument(
        "--redis-url", default=_env("REDIS_URL"), help="the placement store, as the gateway's Redis user"
    )
    picker.add_argument(
        "--redis-url-file",
        default=_env("REDIS_URL_FILE"),
        help="a file holding that URL (a mounted Secret's key), read again every few seconds",
    )
    picker.add_argument("--listen", default=_env("LISTEN", "0.0.0.0:9002"), help="gRPC (ext_proc, health)")
    picker.add_argument(
        "--http-listen", default=_env("HTTP_LISTEN", "0.0.0.0:9003"), help="/healthz, /readyz, /metrics"
    )
    picker.add_argument(
        "--dynamic-dir",
        default=_env("DYNAMIC_DIR"),
        help="where the TLS pools' clusters are written (Envoy's)",
    )
    picker.add_argument(
        "--envoy-admin", default=_env("ENVOY_ADMIN"), help="Envoy's admin host:port (loopback)"
    )
    picker.set_defaults(func=_picker)

    boot = commands.add_parser(
        "bootstrap",
        help="write the front door's Envoy configuration",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    boot.add_argument("--out", type=Path, required=True, help="the file to write (its directory is made)")
    boot.add_argument("--listen-port", type=int, default=int(_env("LISTEN_PORT", "8080") or 8080))
    boot.add_argument("--health-port", type=int, default=int(_env("HEALTH_PORT", "8081") or 8081))
    boot.add_argument("--admin-port", type=int, default=int(_env("ADMIN_PORT", "9901") or 9901))
    boot.add_argument("--picker", default=_env("PICKER", "127.0.0.1:9002"), help="the picker's host:port")
    boot.add_argument("--tls-cert-file", default=_env("TLS_CERT_FILE"), help="serve https with this chain")
    boot.add_argument("--tls-key-file", default=_env("TLS_KEY_FILE"), help="and this key")
    boot.add_argument(
        "--dynamic-dir", default=_env("DYNAMIC_DIR"), help="where the TLS pools' clusters are written"
    )
    boot.set_defaults(func=_bootstrap)


def _picker(args: argparse.Namespace) -> int:
    from ardiff.gateway.picker import PickerSettings, serve

    try:
        settings = PickerSettings(
            redis_url=args.redis_url or "",
            redis_url_file=args.redis_url_file,
            listen=args.listen,
            http_listen=args.http_listen,
            dynamic_dir=args.dynamic_dir,
            envoy_admin=args.envoy_admin,
        )
        settings.current_redis_url()
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, stop)

    asyncio.run(run())
    return 0


def _bootstrap(args: argparse.Namespace) -> int:
    from ardiff.gateway.envoy_config import CDS_FILE, EnvoySettings, render, write_tls_clusters

    try:
        settings = EnvoySettings(
            listen_port=args.listen_port,
            health_port=args.health_port,
            admin_port=args.admin_port,
            picker=args.picker,
            tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_key_file,
            dynamic_dir=args.dynamic_dir,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(settings))
    if settings.dynamic_dir is not None and not (Path(settings.dynamic_dir) / CDS_FILE).exists():
        write_tls_clusters(Path(settings.dynamic_dir), {})  # Envoy starts with no TLS pool
    print(f"wrote {args.out}")
    return 0
