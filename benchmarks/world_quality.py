"""How well a LingBot-World checkpoint renders the yaw-only world (issue 16 item 4), next to the random one.

For held-out control sequences (hold `j`, hold `l`, and random held-key turning from another seed than the
training data's, skipping every sequence the measured model was trained on: its directory's `training.json`,
`tiny_world.data.trained_on`), each model runs a session of 4 chunks from the world's start image through
the worker's normal path (`load_vllm_runtime` -> `ARDiffusionSessionAdapter.prepare/forward`: the real
vllm-omni runner, paged KV, the session's streaming VAE decoder). Each chunk's frames are compared with the
ray-caster's ground truth for the same camera path (`ardiff.tiny_world.world`): PSNR and SSIM per chunk.
Control response: for every (case, chunk) whose ground truth turns (its frames move over the chunk), the
sign of the horizontal image shift from the chunk's first frame (chunk 0) or the previous chunk's last frame
(later chunks) to the chunk's last frame (`tiny_world.world.horizontal_shift`: the move whose overlap differs
least), in the generated frames against the ground truth's; beside it, the stricter count of shifts the right
way and at least half as far, and the turn read another way: between the yaws whose true views are nearest the
two generated frames (`tiny_world.world.nearest_yaw`).

Each model runs in its own child process (one vllm-omni worker per process), the same cases in the same run.

    .venv/bin/python benchmarks/world_quality.py [--model tiny-world-trained] [--baseline tiny-lingbot-world]
        [--cases 24] [--seed 1000] [--threads 1] [--json OUT.json] [--frames DIR]

Targets: mean PSNR over chunks 0-3 at least 6 dB above the random checkpoint's; the turn direction right in
at least 90% of the turning cases.

`--smoke`: 3 cases (hold `j`, hold `l` and one random sequence), both models (the test's run).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ardiff.tiny_world import world

N_CHUNKS = 4


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 10 * np.log10(255.0**2 / max(mse, 1e-10))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM over frames and RGB channels (7x7 uniform window, the usual constants, data range 255)."""
    from scipy.ndimage import uniform_filter

    x, y = a.astype(np.float64), b.astype(np.float64)
    size = (1, 7, 7, 1)  # frames, height, width, channels
    mx, my = uniform_filter(x, size), uniform_filter(y, size)
    vx = uniform_filter(x * x, size) - mx * mx
    vy = uniform_filter(y * y, size) - my * my
    cxy = uniform_filter(x * y, size) - mx * my
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s[:, 3:-3, 3:-3].mean())


def turn_checks(generated: np.ndarray, truth: np.ndarray) -> list[dict[str, float]]:
    """Per turning chunk: the ground truth's and the generated frames' horizontal shift over the chunk."""

    checks = []
    for chunk, frames in enumerate(world.chunk_frame_slices(N_CHUNKS)):
        first = 0 if chunk == 0 else frames.start - 1
        last = frames.stop - 1
        gt = world.horizontal_shift(truth[first], truth[last])
        if gt == 0:
            continue
        gen = world.horizontal_shift(generated[first], generated[last])
        right = bool(np.sign(gen) == np.sign(gt))
        # Two readings beside the target's: the right way and at least half as far; and the turn between the
        # true views nearest the two generated frames (a left turn moves the picture right: the signs differ).
        far_enough = right and abs(gen) >= abs(gt) / 2
        view_turn = math.remainder(
            world.nearest_yaw(generated[last]) - world.nearest_yaw(generated[first]), math.tau
        )
        checks.append(
            {
                "chunk": chunk,
                "gt_px": gt,
                "gen_px": gen,
                "right": right,
                "far_enough": far_enough,
                "view_turn_degrees": math.degrees(view_turn),
                "view_right": bool(np.sign(view_turn) == -np.sign(gt)),
            }
        )
    return checks


def run_model(
    model: str, session_cases: list[tuple[str, world.Actions]], model_cache: str, frames_out: Path | None
) -> dict[str, Any]:
    """In this process: every case through the worker's normal path; per-chunk figures (and, with
    `frames_out`, every generated frame, by case name, to look at or measure again)."""
    import PIL.Image
    import torch

    from ardiff.worker import tick_rules
    from ardiff.worker.conditioning import Conditioning, conditioning_image
    from ardiff.worker.runtime import run_tick
    from ardiff.worker.settings import WorkerSettings, resolve_model
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    buffer = io.BytesIO()
    PIL.Image.fromarray(world.start_image()).save(buffer, format="PNG")
    picture = conditioning_image(buffer.getvalue(), 0, world.HEIGHT, world.WIDTH)
    conditioning = Conditioning(seed=0, prompt=world.PROMPT, picture=picture)
    adapter = load_vllm_runtime(
        WorkerSettings(
            model=resolve_model(model), height=world.HEIGHT, width=world.WIDTH, model_cache=model_cache
        )
    )
    results, generated_frames = [], {}
    try:
        for name, actions in session_cases:
            session = f"q-{name}"
            frames = []
            for chunk, keys in enumerate(actions):
                body = {
                    "request_id": f"{session}-{chunk}",
                    "chunk_index": chunk,
                    "controls": [
                        {
                            "track": "camera",
                            "schema": "lingbot.camera_actions.v1",
                            "data": {"mode": "frames", "frames": keys},
                        }
                    ],
                    "close_session": chunk == len(actions) - 1,
                }
                tick = tick_rules.parse_tick(session, body)
                frames.append(run_tick(adapter, adapter.ticks.prepare(tick, conditioning)).frames)
            generated = generated_frames[name] = np.concatenate(frames)
            truth = world.render_session(actions)
            slices = world.chunk_frame_slices(N_CHUNKS)
            results.append(
                {
                    "case": name,
                    "actions": ["|".join("".join(k) or "-" for k in chunk) for chunk in actions],
                    "psnr": [psnr(generated[s], truth[s]) for s in slices],
                    "ssim": [ssim(generated[s], truth[s]) for s in slices],
                    "turns": turn_checks(generated, truth),
                }
            )
    finally:
        adapter.shutdown()
    if frames_out is not None:
        np.savez_compressed(frames_out, **generated_frames)
    return {"model": model, "cases": results}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    psnrs = np.array([case["psnr"] for case in result["cases"]])
    ssims = np.array([case["ssim"] for case in result["cases"]])
    turns = [turn for case in result["cases"] for turn in case["turns"]]
    return {
        "psnr_per_chunk": psnrs.mean(0).round(2).tolist(),
        "psnr_mean": round(float(psnrs.mean()), 2),
        "ssim_per_chunk": ssims.mean(0).round(3).tolist(),
        "ssim_mean": round(float(ssims.mean()), 3),
        "turns_right": sum(turn["right"] for turn in turns),
        "turns_far_enough": sum(turn["far_enough"] for turn in turns),
        "turns_by_view": sum(turn["view_right"] for turn in turns),
        "turns": len(turns),
    }


def _share(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / max(1, total):.0f}%)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-world-trained", help="the checkpoint measured")
    parser.add_argument("--baseline", default="tiny-lingbot-world", help="the random checkpoint beside it")
    parser.add_argument(
        "--cases", type=int, default=24, help="held-out control sequences (2 held, rest random)"
    )
    parser.add_argument("--seed", type=int, default=1000, help="the random sequences' seed (training uses 7)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--frames", help="write each model's generated frames to DIR/<model>.npz, by case")
    parser.add_argument("--smoke", action="store_true", help="3 cases (the test's run)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-cases", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--child-frames", help=argparse.SUPPRESS)
    parser.add_argument("--model-cache", default=str(Path("~/.cache/ardiff/models").expanduser()))
    args = parser.parse_args()
    if args.smoke:
        args.cases = 3
    if args.child:
        session_cases = [(name, actions) for name, actions in json.loads(Path(args.child_cases).read_text())]
        frames_out = Path(args.child_frames) if args.child_frames else None
        result = run_model(args.child, session_cases, args.model_cache, frames_out)
        Path(args.child_out).write_text(json.dumps(result))
        return 0
    from ardiff.tiny_world.data import trained_on
    from ardiff.worker.settings import resolve_model

    training = trained_on(Path(resolve_model(args.model)))
    session_cases, skipped = world.held_out_cases(args.cases, args.seed, N_CHUNKS, training or [])
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    out: dict[str, Any] = {}
    for model in (args.model, args.baseline):
        with tempfile.TemporaryDirectory() as scratch:
            result = Path(scratch) / "result.json"
            case_file = Path(scratch) / "cases.json"
            case_file.write_text(json.dumps(session_cases))
            command = [sys.executable, __file__, "--child", model, "--child-cases", str(case_file)]
            command += ["--child-out", str(result), "--model-cache", args.model_cache]
            if args.frames:
                Path(args.frames).mkdir(parents=True, exist_ok=True)
                command += ["--child-frames", str(Path(args.frames) / f"{Path(model).name}.npz")]
            proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            if proc.returncode or not result.is_file():
                sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
                raise SystemExit(f"{model}: child failed ({proc.returncode})")
            out[model] = json.loads(result.read_text())
    rows = {model: summary(result) for model, result in out.items()}
    trained, baseline = rows[args.model], rows[args.baseline]
    gain = trained["psnr_mean"] - baseline["psnr_mean"]
    share = trained["turns_right"] / max(1, trained["turns"])
    print(f"{args.cases} held-out cases x {N_CHUNKS} chunks (seed {args.seed}), 64x64, same run")
    if training is None:
        print(f"{args.model} has no training record: the random cases are not checked against its training")
    else:
        print(f"none among its {len(training)} training sessions ({skipped} random draws skipped as such)")
    print(
        "| model | PSNR chunk 0/1/2/3 (dB) | mean PSNR | SSIM chunk 0/1/2/3 | mean SSIM | turn direction "
        "| and at least half as far | by the nearest true views |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for model, row in rows.items():
        print(
            f"| `{model}` | {' / '.join(f'{v:.2f}' for v in row['psnr_per_chunk'])} | "
            f"{row['psnr_mean']:.2f} | "
            f"{' / '.join(f'{v:.3f}' for v in row['ssim_per_chunk'])} | {row['ssim_mean']:.3f} | "
            f"{_share(row['turns_right'], row['turns'])} | {_share(row['turns_far_enough'], row['turns'])} | "
            f"{_share(row['turns_by_view'], row['turns'])} |"
        )
    print(
        f"PSNR gain {gain:+.2f} dB (target >= +6): {'met' if gain >= 6 else 'NOT met'}; "
        f"turn direction {100 * share:.0f}% (target >= 90%): {'met' if share >= 0.9 else 'NOT met'}"
    )
    if args.json:
        with tempfile.NamedTemporaryFile("w", dir=Path(args.json).parent or ".", delete=False) as handle:
            json.dump({"summary": rows, "runs": out}, handle, indent=1)
        os.replace(handle.name, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
