"""`ardiff worker serve`, `make-tiny-model` and `download-model` (light: heavy imports happen later)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this component's commands to `ardiff`."""
    from ardiff.worker.settings import add_settings_arguments

    worker = subparsers.add_parser("worker", help="the GPU worker: vllm-omni's paged-KV runner behind HTTP")
    commands = worker.add_subparsers(dest="worker_command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="serve ticks over HTTP (settings: flags, else ARDIFF_* env, see docs/contracts.md §3)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_settings_arguments(serve)
    serve.set_defaults(func=_serve)

    tiny = commands.add_parser(
        "make-tiny-model", help="write a tiny random checkpoint (LingBot-World: a few MB; DreamZero: ~20 MB)"
    )
    tiny.add_argument("directory", help="where to write it (created; must be empty or absent)")
    tiny.add_argument(
        "--family", default="lingbot", choices=("lingbot", "dreamzero"), help="the model family (pipeline)"
    )
    tiny.add_argument("--seed", type=int, default=0, help="weights are a pure function of the seed")
    tiny.set_defaults(func=_make_tiny_model)

    download = commands.add_parser(
        "download-model",
        help="fetch a model (Hugging Face repo or URL) into a directory: the pool's modelDownload step",
    )
    source = download.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf-repo", help="a Hugging Face model repo id (owner/name)")
    source.add_argument("--url", help="an http(s) URL of one file or a .tar/.tar.gz/.tgz (unpacked)")
    download.add_argument("--revision", help="the repo's branch, tag or commit (default main)")
    download.add_argument("--dest", required=True, help="the model directory (kept when already complete)")
    download.add_argument("--sha256", help="with --url: the SHA-256 (hex) the fetched bytes must have")
    download.add_argument(
        "--max-bytes",
        type=int,
        help="with --url: the most it may fetch, and unpack (default: download.py's MAX_DOWNLOAD_BYTES)",
    )
    download.set_defaults(func=_download_model)


def _serve(args: argparse.Namespace) -> int:
    from ardiff.worker.server import serve
    from ardiff.worker.settings import build_settings

    try:
        settings = build_settings(args)
    except ValueError as exc:
        from ardiff.errors import ArdiffError

        raise ArdiffError(str(exc), code="invalid_settings") from None
    serve(settings)
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from ardiff.worker.families import family_named
    from ardiff.worker.settings import DEFAULT_CPU_FREE_MEMORY_BYTES
    from ardiff.worker.vllm_runtime import prepare_vllm_omni

    family = family_named(args.family)
    prepare_vllm_omni(cpu_free_memory_bytes=DEFAULT_CPU_FREE_MEMORY_BYTES)
    path = family.write_tiny_model(args.directory, seed=args.seed)
    label = {"lingbot": "LingBot-World", "dreamzero": "DreamZero"}[family.name]
    print(f"wrote a tiny {label} checkpoint to {path}")
    return 0


def _download_model(args: argparse.Namespace) -> int:
    from ardiff.worker.download import MAX_DOWNLOAD_BYTES, main

    max_bytes = MAX_DOWNLOAD_BYTES if args.max_bytes is None else args.max_bytes
    try:
        done = main(args.url, args.hf_repo, args.revision, args.dest, sha256=args.sha256, max_bytes=max_bytes)
    except ValueError as exc:  # a source the flags cannot name (a --sha256 without --url, a malformed one)
        from ardiff.errors import ArdiffError

        raise ArdiffError(str(exc), code="invalid_download") from None
    print(done, flush=True)
    return 0
