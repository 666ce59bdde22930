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

    world = commands.add_parser(
        "train-tiny-world",
        help="train the tiny LingBot-World checkpoint on the yaw-only ray-cast world (CPU, resumable)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    world.add_argument("out_dir", help="where the data, checkpoints and OUT_DIR/model go")
    world.add_argument("--minutes", type=float, default=60.0, help="the DiT's budget (over all runs)")
    world.add_argument("--vae-minutes", type=float, default=10.0, help="the VAE's training budget")
    world.add_argument("--resume", action="store_true", help="continue from OUT_DIR's last checkpoint")
    world.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads (the machine is shared)")
    world.add_argument("--nice", type=int, default=19, help="added to this process's niceness")
    world.add_argument("--batch", type=int, default=16, help="sessions per DiT step")
    world.add_argument("--sessions", type=int, default=384, help="rendered training sessions")
    world.add_argument("--lr", type=float, default=1.5e-3, help="the DiT's peak learning rate (cosine decay)")
    world.add_argument(
        "--self-forcing",
        type=float,
        default=0.0,
        metavar="P",
        help="fine-tune the trained DiT for --minutes (own checkpoint): with probability P per step the "
        "context blocks are the model's own samples through the KV cache, not the ground truth",
    )
    world.add_argument(
        "--turn-weight",
        type=float,
        default=0.0,
        metavar="W",
        help="weigh the DiT loss of latent frames where the camera turns by 1 + W",
    )
    world.add_argument(
        "--long-turns",
        type=int,
        default=0,
        metavar="N",
        help="add N training sessions of long turning (one direction kept with probability 0.95 per "
        "latent frame, idle pauses 15%%) to the --sessions random ones, for the views far from the start; "
        "any session that holds `j` or `l` throughout (a held-out benchmark case) is skipped. Changes the "
        "data: a new OUT_DIR, or one without its data.npz and dit_inputs.pt",
    )
    world.add_argument(
        "--decoder-only",
        action="store_true",
        help="fine-tune only the VAE decoder for --minutes (encoder frozen; may run beside the DiT stage)",
    )
    world.set_defaults(func=_train_tiny_world)

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


def _train_tiny_world(args: argparse.Namespace) -> int:
    import os

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.nice:
        os.nice(args.nice)
    from ardiff.worker.tiny.world_train import main

    path = main(
        args.out_dir,
        minutes=args.minutes,
        vae_minutes=args.vae_minutes,
        resume=args.resume,
        decoder_only=args.decoder_only,
        sessions=args.sessions,
        batch=args.batch,
        lr=args.lr,
        self_forcing=args.self_forcing,
        turn_weight=args.turn_weight,
        long_turns=args.long_turns,
    )
    print(f"trained tiny world: {path}")
    return 0
