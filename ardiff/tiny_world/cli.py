"""`ardiff train-tiny-world`: the tiny world's training as a command (light: torch is imported later).

A dev-harness command: like `ardiff.devcluster`, it runs from a checkout and ships in no image."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train-tiny-world` to `ardiff`."""
    world = subparsers.add_parser(
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


def _train_tiny_world(args: argparse.Namespace) -> int:
    import os

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.nice:
        os.nice(args.nice)
    from ardiff.tiny_world.train import main

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
