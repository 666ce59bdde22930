"""`ardiff train-tiny-world`: train the tiny LingBot-World checkpoint on the yaw-only world.

Two stages, each resumable from its last checkpoint in OUT_DIR (written every few minutes and at the end):

1. **VAE.** diffusers' `AutoencoderKLWan` in the tiny geometry (the layout the pipeline loads) on 5-frame
   clips of rendered sessions, L1 + MSE with a little latent noise (robustness to the DiT's imperfect
   latents); the per-channel latent mean/std go into its config, as the pipeline normalises with them.
2. **DiT.** The real `CausalLingBotWorldTransformer3DModel`, loaded by the worker's own loader in a
   `DiffusionWorker`; every conditioning tensor made by the pipeline's own code (`encode_prompt`, the Wan
   condition encoder as `_prepare_condition_chunk` runs it, `integrate_lingbot_camera_actions` +
   `_prepare_camera`). The loss follows the sampler: sigma drawn from the pipeline's shifted DMD schedule,
   x_t = (1 - sigma) x0 + sigma eps, x0_hat = x_t - sigma * flow, MSE(x0_hat, x0). Teacher forcing through the
   real request-local KV cache: block b is probed noisy (`update_cache=False`) against blocks < b, each
   committed clean at t = 0 (`update_cache=True`) as `commit_block_kv` does.
3. **Self-forcing fine-tune** (`--self-forcing P`, optional): resumes the DiT from stage 2's checkpoint with
   its own budget and checkpoint (OUT_DIR/dit_sf_train.pt). With probability P per step, each context block
   is not the clean ground truth but the model's own sample: the sampler's 4 DMD steps from noise
   (x0 = x_t - sigma * flow, re-noised at the next sigma, as `apply_transition` does), probed through the same
   KV cache, then committed at t = 0 -- the context the model sees at inference (Self Forcing, Huang et al.
   2025). The target stays the ground truth, so the model learns to recover from its own drift.
   `--turn-weight W` weighs the loss of latent frames whose camera turns by 1 + W (any stage).

Data: `--sessions` rendered sessions of random held-key turning, plus `--long-turns N` sessions that keep
turning one way (with pauses) for the views far from the start; never a held-out benchmark case (hold `j` or
`l` throughout).

The result is OUT_DIR/model, a LingBot model directory `ardiff worker serve --model` loads.
Reference recipe and its limits: shared/reference/tiny-world/README.md.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ardiff.tiny_world import stages, world
from ardiff.tiny_world.data import (
    N_CHUNKS,
    chunk_actions,
    make_dataset,
    turning_frames,
    write_training_record,
)
from ardiff.tiny_world.stages import SAVE_EVERY_SECONDS, Progress
from ardiff.tiny_world.vae import train_decoder, train_vae


def transformer_config() -> dict[str, Any]:
    """The trained world's DiT: the tiny config with a wider feed-forward. Its KV geometry (layers, heads,
    head size, sink, window) stays the tiny one's, so the `tiny-lingbot-64x64` capacity preset plans it."""
    from ardiff.worker.tiny.model import TRANSFORMER_CONFIG

    return {**TRANSFORMER_CONFIG, "ffn_dim": 512}


def build_model_dir(out: Path, vae_dir: Path) -> Path:
    """OUT_DIR/model: the tiny tokenizer, text encoder and scheduler, the trained VAE, a fresh DiT."""
    from ardiff.worker.tiny import model as tiny_model

    model = out / "model"
    if (model / "model_index.json").is_file():
        return model
    staging = out / "model.staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    vocab = tiny_model._write_tokenizer(staging / "tokenizer")
    tiny_model._write_text_encoder(staging / "text_encoder", vocab, 0)
    shutil.copytree(vae_dir, staging / "vae")
    tiny_model._write_transformer(staging / "transformer", 0, transformer_config())
    (staging / "scheduler").mkdir()
    tiny_model.write_json(staging / "scheduler" / "scheduler_config.json", tiny_model.SCHEDULER_CONFIG)
    tiny_model.write_json(staging / "model_index.json", tiny_model.MODEL_INDEX)
    staging.rename(model)
    return model


def export_transformer(transformer: Any, path: Path) -> None:
    """The DiT's weights under the checkpoint's names (q/k/v unfused), written atomically."""
    from safetensors.torch import save_file

    state = {}
    for name, value in transformer.state_dict().items():
        value = value.detach().float().contiguous()
        if ".self_attn.qkv." in name:
            for part, chunk in zip("qkv", value.chunk(3, dim=0), strict=True):
                state[name.replace(".self_attn.qkv.", f".self_attn.{part}.")] = chunk.contiguous()
        else:
            state[name] = value
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp))
    tmp.replace(path)


def train_dit(
    out: Path,
    data: dict[str, np.ndarray],
    minutes: float,
    *,
    batch: int,
    lr: float,
    sessions: int,
    context_noise: float = 0.1,
    self_forcing: float = 0.0,
    turn_weight: float = 0.0,
) -> Path:
    """Stage 2 (teacher forcing) or, with `self_forcing` > 0, stage 3 (the self-forcing fine-tune started
    from stage 2's weights and optimizer, with its own step count, budget and checkpoint). One step loop."""
    import torch

    from ardiff.worker.settings import WorkerSettings
    from ardiff.worker.vllm_runtime import load_vllm_runtime

    model_dir = out / "model"
    settings = WorkerSettings(
        model=str(model_dir), height=world.HEIGHT, width=world.WIDTH, session_capacity=1
    )
    adapter = load_vllm_runtime(settings)
    worker, od_config, pipe = adapter._worker, adapter._od_config, adapter._pipeline
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from vllm_omni.diffusion.forward_context import set_forward_context
    from vllm_omni.diffusion.models.lingbot_world.actions import integrate_lingbot_camera_actions
    from vllm_omni.diffusion.models.lingbot_world.pipeline import _build_shifted_flow_schedule

    tr = pipe.transformer
    schedule = [sigma for _, sigma in _build_shifted_flow_schedule(flow_shift=5.0)]
    sigmas = torch.tensor(schedule)
    clips, actions = data["clips"][:sessions], data["actions"][:sessions]
    n = len(clips)
    # Per latent frame: 1 + turn_weight where the camera turns into it (its keys are not idle), else 1.
    frame_weights = torch.from_numpy(1.0 + turn_weight * turning_frames(actions)).float()
    height, width = world.HEIGHT, world.WIDTH
    lat_h, lat_w = height // 8, width // 8

    @torch.no_grad()
    def prep(ids: list[int]) -> tuple[Any, Any, Any]:
        clip = stages.to_tensor(clips[ids])
        mu = pipe.vae.encode(clip).latent_dist.mode()
        mean, std = pipe._vae_latent_stats(mu)
        latents = (mu - mean) / std
        # == pipe._prepare_condition_chunk, batched: the same encoder calls and feat_cache protocol.
        vae = pipe.vae
        enc_cache = [None] * int(vae._cached_conv_counts["encoder"])
        image = clip[:, :, :1]
        zeros = torch.zeros(len(ids), 3, 4, height, width)
        context = getattr(vae, "_execution_context", None)
        conds = []
        for c in range(N_CHUNKS):
            enc = []
            with context() if callable(context) else nullcontext():
                for index in range(3):
                    px = image if c == 0 and index == 0 else zeros
                    enc.append(vae.encoder(px, feat_cache=enc_cache, feat_idx=[0]))
                moments = vae.quant_conv(torch.cat(enc, 2))
            lc = (moments.chunk(2, dim=1)[0] - mean) / std
            mask = lc.new_zeros(len(ids), 4, *lc.shape[2:])
            if c == 0:
                mask[:, :, 0] = 1
            conds.append(torch.cat((mask, lc), 1))
        cams = []
        for i in ids:
            tail, pitch, per = None, 0.0, []
            for frames in chunk_actions(actions[i]):
                trajectory, pitch = integrate_lingbot_camera_actions(
                    frames,
                    width=width,
                    height=height,
                    initial_pose=None if tail is None else tail.poses[-1],
                    initial_pitch=pitch,
                )
                inputs = SimpleNamespace(
                    camera_trajectory=trajectory,
                    camera_actions=frames,
                    num_latent_frames=3,
                    num_frames=9,
                    height=height,
                    width=width,
                )
                cam, tail = pipe._prepare_camera(inputs, dtype=torch.float32, previous=tail)
                per.append(cam[0])
            cams.append(torch.cat(per, 1))
        return latents, torch.cat(conds, 2), torch.stack(cams)

    cache_path = out / "dit_inputs.pt"
    cached = torch.load(cache_path) if cache_path.is_file() else None
    if cached is not None and len(cached[0]) == n:
        lat_all, cond_all, cam_all = cached
    else:
        t0 = time.monotonic()
        parts = [prep(list(range(s, min(n, s + 16)))) for s in range(0, n, 16)]
        lat_all, cond_all, cam_all = (torch.cat(p) for p in zip(*parts, strict=True))
        stages.atomic_torch_save((lat_all, cond_all, cam_all), cache_path)
        print(
            f"dit: prepared {n} sessions in {time.monotonic() - t0:.0f}s: latents {tuple(lat_all.shape)} "
            f"std {float(lat_all.std()):.3f}, conditions {tuple(cond_all.shape)}, "
            f"cameras {tuple(cam_all.shape)}",
            flush=True,
        )
    with torch.no_grad():
        prompt_embeds = pipe.encode_prompt(world.PROMPT, max_sequence_length=512, dtype=torch.float32)

    # The inference-only static buffer (CUDA-graph address pinning) breaks a second backward; the values are
    # the same without it.
    tr._stage_timestep_projection = lambda projection: projection
    params = list(tr.parameters())
    for p in params:
        p.requires_grad_(True)
    tr.train()
    opt = torch.optim.AdamW(params, lr, weight_decay=0.01, betas=(0.9, 0.99))
    stage = "dit-sf" if self_forcing > 0 else "dit"
    ckpt = out / ("dit_sf_train.pt" if self_forcing > 0 else "dit_train.pt")
    step, elapsed, rng = 0, 0.0, np.random.default_rng(3 if self_forcing > 0 else 1)
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        tr.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step, elapsed, rng = saved["step"], saved["elapsed"], saved["rng"]
        torch.set_rng_state(saved["torch_rng"])
    elif self_forcing > 0:
        base = out / "dit_train.pt"
        if not base.is_file():
            raise SystemExit(f"--self-forcing fine-tunes the teacher-forced DiT: {base} is missing")
        saved = torch.load(base, weights_only=False)
        tr.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        torch.manual_seed(3)
    else:
        torch.manual_seed(1)

    def rollout_loss(idx: Any, own_context: bool) -> Any:
        """Per-block x0 loss of one rollout of N_CHUNKS blocks through the request-local KV cache. Context
        blocks are committed at t = 0 as `commit_block_kv` does: the (lightly perturbed) ground truth, or with
        `own_context` the model's own sample of the block through the sampler's steps (no gradient)."""
        b = len(idx)
        lat, cond, cam, weights = lat_all[idx], cond_all[idx], cam_all[idx], frame_weights[idx]
        emb = prompt_embeds.expand(b, -1, -1)
        cache = tr.allocate_cache(
            batch_size=b,
            latent_height=lat_h,
            latent_width=lat_w,
            device=torch.device("cpu"),
            dtype=torch.float32,
        )
        losses = []
        for block in range(N_CHUNKS):
            sl = slice(3 * block, 3 * block + 3)
            x0, cb, kb, w = lat[:, :, sl], cond[:, :, sl], cam[:, :, sl], weights[:, sl]

            def forward(x: Any, sigma: Any, *, update: bool, cb: Any = cb, kb: Any = kb, block: int = block):
                return tr(
                    hidden_states=torch.cat((x, cb), 1),
                    timestep=sigma.view(b) * 1000,
                    encoder_hidden_states=emb,
                    camera_hidden_states=kb,
                    cache=cache,
                    start_frame=3 * block,
                    update_cache=update,
                )

            s = sigmas[torch.from_numpy(rng.integers(0, len(sigmas), b))].view(b, 1, 1, 1, 1)
            xt = (1 - s) * x0 + s * torch.randn_like(x0)
            err = ((xt - s * forward(xt, s, update=False) - x0) ** 2).mean((1, 3, 4))  # (b, latent frames)
            losses.append((err * w).sum() / w.sum())
            if block + 1 < N_CHUNKS:
                if own_context:
                    with torch.no_grad():
                        ctx_x0 = sample_block(x0.shape, lambda x, sigma: forward(x, sigma, update=False))
                else:
                    ctx_x0 = x0 + context_noise * torch.rand(b, 1, 1, 1, 1) * torch.randn_like(x0)
                forward(ctx_x0, torch.zeros(b), update=True)
        return torch.stack(losses)

    def sample_block(shape: tuple[int, ...], flow_at: Any) -> Any:
        """The sampler's steps for one block, as the pipeline runs them: from noise, x0 = x_t - sigma * flow,
        re-noised at the next sigma (`apply_transition`); the last step's x0 is the block."""
        x = torch.randn(shape)
        for i, sigma in enumerate(schedule):
            x0 = x - sigma * flow_at(x, torch.full((shape[0],), sigma))
            if i + 1 < len(schedule):
                x = (1 - schedule[i + 1]) * x0 + schedule[i + 1] * torch.randn(shape)
        return x0

    weights = model_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    budget = minutes * 60
    progress = Progress(stage, budget, elapsed)
    hist: list[np.ndarray] = []
    last_save = time.monotonic()

    def save() -> None:
        stages.atomic_torch_save(
            {
                "model": tr.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "elapsed": progress.elapsed(),
                "rng": rng,
                "torch_rng": torch.get_rng_state(),
            },
            ckpt,
        )
        export_transformer(tr, weights)
        state = stages.load_state(out)
        prefix = stage.replace("-", "_")
        state.update({f"{prefix}_steps": step, f"{prefix}_seconds": round(progress.elapsed())})
        stages.save_state(out, state)

    context = set_forward_context(vllm_config=worker.vllm_config, omni_diffusion_config=od_config)
    with context:
        while progress.elapsed() < budget:
            lr_now = stages.cosine(lr, progress.elapsed() / budget, step)
            for group in opt.param_groups:
                group["lr"] = lr_now
            own_context = self_forcing > 0 and rng.random() < self_forcing
            per_block = rollout_loss(torch.from_numpy(rng.integers(0, n, batch)), own_context)
            loss = per_block.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            step += 1
            hist.append(per_block.detach().numpy())
            recent = np.mean(hist[-25:], 0)
            progress.update(
                step,
                f"loss={recent.mean():.4f} blocks={'/'.join(f'{v:.3f}' for v in recent)} "
                f"gn={float(grad_norm):.2f} lr={lr_now:.1e}",
            )
            if time.monotonic() - last_save > SAVE_EVERY_SECONDS:
                save()
                last_save = time.monotonic()
    progress.update(step, "done", force=True)
    progress.close()
    save()
    print(f"{stage}: {step} steps in {stages.clock(progress.elapsed())} -> {model_dir}", flush=True)
    worker.shutdown()
    return model_dir


def main(
    out_dir: str,
    *,
    minutes: float,
    vae_minutes: float,
    resume: bool,
    decoder_only: bool = False,
    sessions: int = 384,
    batch: int = 16,
    lr: float = 1.5e-3,
    seed: int = 7,
    self_forcing: float = 0.0,
    turn_weight: float = 0.0,
    long_turns: int = 0,
) -> Path:
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and any(out.iterdir()) and not resume:
        raise SystemExit(
            f"{out} is not empty: pass --resume to continue its training, or choose a new directory"
        )
    out.mkdir(parents=True, exist_ok=True)
    from ardiff.worker.settings import DEFAULT_CPU_FREE_MEMORY_BYTES
    from ardiff.worker.vllm_runtime import prepare_vllm_omni

    prepare_vllm_omni(cpu_free_memory_bytes=DEFAULT_CPU_FREE_MEMORY_BYTES)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    t0 = time.monotonic()
    data = make_dataset(out, sessions, seed, long_turns)
    clips = data["clips"]
    print(f"data: {clips.shape[0]} sessions x {clips.shape[1]} frames ({time.monotonic() - t0:.0f}s)")
    vae_dir = train_vae(out, data["clips"], vae_minutes)
    model_dir = build_model_dir(out, vae_dir)
    write_training_record(model_dir, sessions=sessions, seed=seed, long_turns=long_turns)
    if decoder_only:
        return train_decoder(out, data["clips"], minutes)
    return train_dit(
        out,
        data,
        minutes,
        batch=batch,
        lr=lr,
        sessions=sessions + long_turns,
        self_forcing=self_forcing,
        turn_weight=turn_weight,
    )
