"""`ardiff kv ...`: plan and explain how many sessions a worker pod holds (see ardiff/cli.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from ardiff.kv.capacity import GIB, KVDoesNotFit, build_footprint, check_fraction, format_bytes
from ardiff.kv.pod_plan import plan_for_pool
from ardiff.kv.presets import DEFAULT_PRESETS, PRESETS, get_preset

DEFAULT_GPU_MEMORY_GIB = (80.0, 141.0)  # H100/A100 80 GB, H200 141 GB
# vllm-omni's LingBot deploy uses 0.6 and the ardiff worker defaults to 0.9; 0.5 shows the trend.
DEFAULT_FRACTIONS = (0.5, 0.6, 0.9)

COLUMNS = (
    ("preset", "preset"),
    ("gpu", "GPU"),
    ("fraction", "fraction"),
    ("weights", "weights"),
    ("overhead", "overhead"),
    ("budget", "KV budget"),
    ("page", "bytes/page"),
    ("pages", "pages/session"),
    ("scratch", "scratch"),
    ("cross", "cross-attn"),
    ("owned", "model-owned"),
    ("sessions", "sessions"),
    ("limit", "binding limit"),
)


def _positive_gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"GPU memory must be a number of GiB, got {text!r}") from None
    if not 0 < value < 1 << 20:
        raise argparse.ArgumentTypeError(f"GPU memory must be a positive number of GiB, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        return check_fraction(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"fraction must be in (0, 1], got {text!r}") from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"session capacity must be a positive integer, got {text!r}")
    return int(text)


def plan_rows(
    presets: Sequence[str],
    gpu_memory_gib: Sequence[float],
    fractions: Sequence[float],
    session_capacity: int | None,
) -> list[dict[str, object]]:
    """A row per preset, GPU size and fraction, in bytes; a row that does not fit says so, not fails."""
    rows: list[dict[str, object]] = []
    for name in presets:
        model = get_preset(name)
        footprint = build_footprint(model.spec, dtype=model.dtype, knobs=model.knobs)
        for gib in gpu_memory_gib:
            device_bytes = int(gib * GIB)
            for fraction in fractions:
                row: dict[str, object] = {
                    "preset": name,
                    "gpu_memory_bytes": device_bytes,
                    "fraction": fraction,
                    "weights_bytes": model.weights_bytes,
                    "runtime_overhead_bytes": model.runtime_overhead_bytes,
                    "page_bytes": footprint.page_bytes,
                    "pages_per_session": footprint.pages_per_session,
                    "scratch_pages": footprint.scratch_blocks,
                    "cross_attention_bytes_per_session": footprint.cross_attention_bytes_per_session,
                    "model_owned_bytes_per_session": footprint.model_owned_bytes_per_session,
                    "one_session_bytes": footprint.required_bytes(1),
                }
                try:
                    plan = plan_for_pool(
                        model,
                        device_memory_bytes=device_bytes,
                        gpu_memory_fraction=fraction,
                        pool_session_capacity=session_capacity,
                    )
                except KVDoesNotFit as exc:
                    row |= {
                        "available_bytes": exc.available_bytes,
                        "kv_budget_bytes": None,
                        "managed_blocks": 0,
                        "sessions": 0,
                        "binding_limit": KVDoesNotFit.code,
                    }
                else:
                    row |= {
                        "available_bytes": plan.kv.available_bytes,
                        "kv_budget_bytes": plan.kv.budget_bytes,
                        "managed_blocks": plan.kv.managed_blocks,
                        "sessions": plan.sessions,
                        "binding_limit": plan.binding_limit.value,
                    }
                rows.append(row)
    return rows


def _cells(row: dict[str, object]) -> dict[str, str]:
    budget = row["kv_budget_bytes"]
    limit = str(row["binding_limit"])
    if budget is None:
        limit = (
            f"does not fit: needs {format_bytes(row['one_session_bytes'])}, "  # type: ignore[arg-type]
            f"{format_bytes(row['available_bytes'])} free"  # type: ignore[arg-type]
        )
    return {
        "preset": str(row["preset"]),
        "gpu": f"{row['gpu_memory_bytes'] / GIB:g} GiB",  # type: ignore[operator]
        "fraction": f"{row['fraction']:g}",
        "weights": format_bytes(row["weights_bytes"]),  # type: ignore[arg-type]
        "overhead": format_bytes(row["runtime_overhead_bytes"]),  # type: ignore[arg-type]
        "budget": "-" if budget is None else format_bytes(budget),  # type: ignore[arg-type]
        "page": format_bytes(row["page_bytes"]),  # type: ignore[arg-type]
        "pages": str(row["pages_per_session"]),
        "scratch": str(row["scratch_pages"]),
        "cross": format_bytes(row["cross_attention_bytes_per_session"]),  # type: ignore[arg-type]
        "owned": format_bytes(row["model_owned_bytes_per_session"]),  # type: ignore[arg-type]
        "sessions": str(row["sessions"]),
        "limit": limit,
    }


def render_table(rows: Sequence[dict[str, object]]) -> str:
    cells = [_cells(row) for row in rows]
    widths = {key: max(len(title), *(len(c[key]) for c in cells)) for key, title in COLUMNS}
    left = {"preset", "limit"}  # text left, numbers right

    def line(values: dict[str, str]) -> str:
        return "  ".join(
            values[key].ljust(widths[key]) if key in left else values[key].rjust(widths[key])
            for key, _ in COLUMNS
        ).rstrip()

    header = line(dict(COLUMNS))
    return "\n".join([header, "-" * len(header), *(line(c) for c in cells)])


def _plan(args: argparse.Namespace) -> int:
    rows = plan_rows(args.preset, args.gpu_memory_gib, args.fraction, args.session_capacity)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(render_table(rows))
    print(
        "\nPer GPU; cross-attention and model-owned state are per session. "
        "Weights: parameter counts x dtype. Runtime overhead: an estimate of what is in use besides "
        "the weights when the runner sizes its pool. "
        "A running pod's capacity is what its runner reports after load; "
        "`ardiff kv explain PRESET --gpu-memory-gib G --fraction F` shows the arithmetic."
    )
    return 0


def _explain(args: argparse.Namespace) -> int:
    plan = plan_for_pool(
        get_preset(args.preset),
        device_memory_bytes=int(args.gpu_memory_gib * GIB),
        gpu_memory_fraction=args.fraction,
        pool_session_capacity=args.session_capacity,
    )
    print("\n".join(plan.explain()))
    return 0


def _redis_user(args: argparse.Namespace) -> int:
    # Imported here: `ardiff kv plan` needs no Redis client installed.
    from ardiff.kv.acl import administrator_acl_line, pool_username
    from ardiff.kv.records import PoolId

    pool = PoolId(args.namespace, args.pool)
    print(administrator_acl_line(pool, args.username or pool_username(pool)))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ardiff kv plan`, `ardiff kv explain` and `ardiff kv redis-user`."""
    kv = subparsers.add_parser("kv", help="KV capacity: sessions per worker pod")
    commands = kv.add_subparsers(dest="kv_command", metavar="COMMAND", required=True)

    plan = commands.add_parser("plan", help="table of sessions per pod for presets, GPU sizes and fractions")
    plan.add_argument(
        "--preset",
        nargs="+",
        choices=sorted(PRESETS),
        default=list(DEFAULT_PRESETS),
        metavar="NAME",
        help=f"model presets (default: {' '.join(DEFAULT_PRESETS)}; all: {' '.join(sorted(PRESETS))})",
    )
    plan.add_argument(
        "--gpu-memory-gib",
        nargs="+",
        type=_positive_gib,
        default=list(DEFAULT_GPU_MEMORY_GIB),
        metavar="GIB",
        help="GPU memory per device, GiB (default: 80 141)",
    )
    plan.add_argument(
        "--fraction",
        nargs="+",
        type=_fraction,
        default=list(DEFAULT_FRACTIONS),
        metavar="F",
        help="KV gpu_memory_fraction values (default: 0.5 0.6 0.9)",
    )
    plan.add_argument("--session-capacity", type=_positive_int, help="the pool's kv.sessionCapacity cap")
    plan.add_argument("--json", action="store_true", help="rows as JSON, numbers in bytes")
    plan.set_defaults(func=_plan)

    explain = commands.add_parser(
        "explain", help="the budget arithmetic for one preset, GPU size and fraction"
    )
    explain.add_argument("preset", choices=sorted(PRESETS), metavar="PRESET", help=", ".join(sorted(PRESETS)))
    explain.add_argument("--gpu-memory-gib", type=_positive_gib, required=True, metavar="GIB")
    explain.add_argument("--fraction", type=_fraction, required=True, metavar="F")
    explain.add_argument("--session-capacity", type=_positive_int, help="the pool's kv.sessionCapacity cap")
    explain.set_defaults(func=_explain)

    redis_user = commands.add_parser(
        "redis-user",
        help="the ACL SETUSER command that makes a pool's Redis user (--worker-redis-users administrator)",
        description="Print the command an administrator runs on every Redis node to make the user of one "
        "pool's workers: its keys, the commands the worker sends, nothing else. Replace PASSWORD, then write "
        "the user's name and password into the pool's <pool>-workers-redis Secret (keys redis-username and "
        "redis-password).",
    )
    redis_user.add_argument("namespace", help="the pool's namespace")
    redis_user.add_argument("pool", help="the ARDiffusionWorkerPool's name")
    redis_user.add_argument("--username", help="the user's name (default ardiff-pool.<namespace>.<pool>)")
    redis_user.set_defaults(func=_redis_user)
