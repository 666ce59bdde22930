"""`ardiff operator run`: the kopf control plane (docs/contracts.md §5).

Kept light: kopf, the Kubernetes client and the handlers are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import gc
import os
from typing import get_args

from ardiff.operator.config import WorkerRedisUsers

# Python's collector in the operator's process: its youngest generation collected every 20,000 allocations
# instead of 700. Each watch event allocates thousands of objects (kopf's bodies, causes, patches; ours), so
# by default the collector ran several times an event: ~11% of the operator's CPU in a burst of admissions
# (docs/benchmarks.md "Operator reconcile"). What is collected is the same, only less often.
GC_THRESHOLDS = (20_000, 10, 10)

CONFIG_FLAGS = (
    "redis_url",
    "worker_redis_url",
    "namespaces",
    "all_namespaces",
    "standalone",
    "peering",
    "priority",
    "liveness",
    "metrics",
    "reconcile_seconds",
    "follow_drains",
    "allowed_volume_types",
    "allowed_service_accounts",
    "worker_redis_users",
    "gateway_public_url",
    "gateway_redis_secret",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
    operator = subparsers.add_parser("operator", help="the kopf control plane")
    commands = operator.add_subparsers(dest="operator_command", metavar="COMMAND", required=True)
    run = commands.add_parser(
        "run",
        help="reconcile ARDiffusionWorkerPools and ARDiffusionSessions",
        description="Run the operator. Namespaced by default (ARDIFF_WATCH_NAMESPACES, else the Pod's own "
        "namespace, else `default`); it then needs no cluster-scoped rights.",
    )
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", dest="namespaces", action="append", metavar="NS", help="watch NS (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    run.add_argument("--redis-url", help="placement store the operator uses (env ARDIFF_REDIS_URL)")
    run.add_argument(
        "--worker-redis-url", help="placement store URL given to worker Pods (env ARDIFF_WORKER_REDIS_URL)"
    )
    run.add_argument(
        "--worker-redis-users",
        choices=get_args(WorkerRedisUsers),
        help="who makes each pool's Redis user: the operator (default; its own user may ACL SETUSER) or the "
        "administrator, who names it in the pool's <pool>-workers-redis Secret (a managed Redis; env "
        "ARDIFF_WORKER_REDIS_USERS)",
    )
    run.add_argument(
        "--gateway-public-url",
        metavar="URL",
        help="the front door's public base URL: each session's status.url is URL/pools/<namespace>/<pool> "
        "(env ARDIFF_GATEWAY_PUBLIC_URL; unset: no status.url)",
    )
    run.add_argument(
        "--gateway-redis-secret",
        metavar="NAME",
        help="keep the front door's Redis URL and user in Secret NAME of the operator's own namespace (env "
        "ARDIFF_GATEWAY_REDIS_SECRET; unset: no gateway user)",
    )
    peering = run.add_mutually_exclusive_group()
    peering.add_argument("--standalone", action="store_true", help="no peering: this is the only operator")
    peering.add_argument("--peering", metavar="NAME", help="mandatory kopf peering (HA: one active replica)")
    run.add_argument("--priority", type=int, help="peering priority; the highest one is active")
    run.add_argument(
        "--liveness", metavar="URL", help="serve kopf's health probe, e.g. http://0.0.0.0:8080/healthz"
    )
    run.add_argument(
        "--metrics",
        metavar="URL",
        help="serve Prometheus metrics (operator/metrics.py), e.g. http://0.0.0.0:9090/metrics",
    )
    run.add_argument(
        "--follow-drains",
        action="store_true",
        help="move sessions off cordoned nodes so drains complete; needs `get nodes` (cluster-scoped; env "
        "ARDIFF_OPERATOR_FOLLOW_DRAINS=1; the chart's operator.followDrains)",
    )
    run.add_argument(
        "--allowed-volume-types",
        metavar="TYPES",
        help="volume types a pool's Pods may carry, comma-separated (env "
        "ARDIFF_OPERATOR_ALLOWED_VOLUME_TYPES; default the Pod Security Standards' restricted set, "
        "no hostPath)",
    )
    run.add_argument(
        "--allowed-service-accounts",
        metavar="NAMES",
        help="ServiceAccounts a pool's Pods may run as besides `default`, comma-separated (env "
        "ARDIFF_OPERATOR_ALLOWED_SERVICE_ACCOUNTS; default none)",
    )
    run.add_argument(
        "--reconcile-seconds",
        type=float,
        help="a pool's reconcile period (env ARDIFF_OPERATOR_RECONCILE_SECONDS, default 2)",
    )
    run.set_defaults(func=run_operator)
    uninstall = commands.add_parser(
        "uninstall",
        help="delete sessions and pools, wait until they and their worker pods are gone (pre-delete hook)",
        description="Delete the sessions, then the pools, of the namespaces and wait until none of them and "
        "none of their worker Pods is left (with the operator running, their Redis state goes at once). Exit "
        "1 when some are left at the timeout.",
    )
    scope = uninstall.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "-n", "--namespace", dest="namespaces", action="append", metavar="NS", help="namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace holding one")
    uninstall.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    uninstall.set_defaults(func=run_uninstall)
    smoke = commands.add_parser(
        "smoke-test",
        help="create a session on a pool, wait for Ready, tick it once, delete it (helm test)",
        description="Exit 0 when the session's first tick answered 200; the session is deleted in any case.",
    )
    smoke.add_argument("-n", "--namespace", required=True)
    smoke.add_argument("--pool", required=True, help="the ARDiffusionWorkerPool's name")
    smoke.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for Ready (default 900)")
    smoke.add_argument(
        "--gateway-url", help="tick through the front door at this base (its Service), not at the Pod"
    )
    smoke.set_defaults(func=run_smoke_test)


def run_smoke_test(args: argparse.Namespace) -> int:
    from ardiff.operator.smoke import smoke_test

    passed = smoke_test(args.namespace, args.pool, timeout_seconds=args.timeout, gateway_url=args.gateway_url)
    return 0 if passed else 1


def run_uninstall(args: argparse.Namespace) -> int:
    from ardiff.operator.uninstall import uninstall

    left = uninstall(args.namespaces, all_namespaces=args.all_namespaces, timeout_seconds=args.timeout)
    return 1 if left else 0


def tune_gc() -> None:
    """`GC_THRESHOLDS`, once the start-up's objects are out of the collector's generations (`gc.freeze`:
    kopf's, the Kubernetes client's and our modules live as long as the process; no full collection scans
    them)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_operator(args: argparse.Namespace) -> int:
    from ardiff.operator.config import config_from_env

    # Every flag is an OperatorConfig field of the same name; unset ones fall back to the environment.
    config = config_from_env(**{name: getattr(args, name) for name in CONFIG_FLAGS})

    import kopf

    import ardiff.operator.handlers  # noqa: F401  (registers the handlers with kopf's default registry)
    from ardiff.operator import kopf_compat

    # kopf's start is quadratic in the objects it lists, and its indexing of each event costs more than its
    # indexes need (operator/kopf_compat.py); the environment variable is for benchmarks/scale_operator.py's
    # before/after only.
    if os.environ.get(kopf_compat.UNPATCHED_ENV) != "1":
        kopf_compat.apply()

    tune_gc()
    kopf.run(
        clusterwide=config.all_namespaces,
        namespaces=config.namespaces,
        standalone=config.standalone or None,
        peering_name=config.peering,
        priority=config.priority,
        liveness_endpoint=config.liveness,
        memo=kopf.Memo(config=config),
    )
    return 0
