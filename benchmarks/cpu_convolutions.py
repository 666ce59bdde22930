"""A bfloat16 Conv3d on CPU against the same convolution in float32 (`worker/cpu_platform.run_in_float32`).

DreamZero's pipeline runs in bfloat16 on every device, its VAE encode under `torch.autocast(bfloat16)`. On a
CPU without AVX-512 BF16 a bfloat16 Conv3d takes a slow path (oneDNN's, or ATen's own without it), which made
a tiny DreamZero tick take ~100 s on this project's 2-core machine. This times one `WanCausalConv3d`-sized
convolution (3x3x3, padding 1) the way the pipeline calls it (bfloat16 weights and input, under autocast)
against the same module after `run_in_float32`, in the same process, one torch thread, and prints the ratio.

    .venv/bin/python benchmarks/cpu_convolutions.py [--repeats 3] [--threads 1] [--smoke]

`--smoke`: the same four convolutions at a quarter of each side, one repeat (the test's run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ardiff.worker.cpu_platform import run_in_float32

# (channels, frames, height, width): the tiny DreamZero VAE encoder's first three levels on one 180x320 frame
# (base_dim 8, worker/tiny/dreamzero.py), then a real Wan VAE's first width (96) at a quarter of that size.
SHAPES = ((8, 1, 180, 320), (16, 1, 90, 160), (32, 1, 45, 80), (96, 1, 45, 80))
SMOKE_SHAPES = tuple(
    (channels, frames, height // 4, width // 4) for channels, frames, height, width in SHAPES
)


def timed(conv: torch.nn.Module, x: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """The median seconds of `conv(x)` under autocast, as the pipeline calls it, after a warm-up whose output
    is returned."""
    times = []
    with torch.no_grad(), torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = conv(x)
        for _ in range(repeats):
            started = time.perf_counter()
            conv(x)
            times.append(time.perf_counter() - started)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--smoke", action="store_true", help="each side a quarter, one repeat (the test's run)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"Conv3d 3x3x3 on CPU ({cpu}), torch threads={args.threads}, median of {args.repeats}")
    print(f"{'input':>18} {'bfloat16 ms':>12} {'float32 ms':>11} {'ratio':>8} {'max |diff|':>11}")
    for channels, frames, height, width in SMOKE_SHAPES if args.smoke else SHAPES:
        conv = torch.nn.Conv3d(channels, channels, 3, padding=1).to(torch.bfloat16)
        x = torch.randn(1, channels, frames, height, width).to(torch.bfloat16)
        slow, before = timed(conv, x, args.repeats)
        run_in_float32(conv)
        fast, after = timed(conv, x, args.repeats)
        diff = (before.float() - after.float()).abs().max().item()
        shape = f"{channels}x{frames}x{height}x{width}"
        print(f"{shape:>18} {1000 * slow:>12.1f} {1000 * fast:>11.1f} {slow / fast:>7.0f}x {diff:>11.4f}")


if __name__ == "__main__":
    main()
