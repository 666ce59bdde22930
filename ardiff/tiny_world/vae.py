"""Stage 1 of the tiny world's training: diffusers' `AutoencoderKLWan` in the tiny geometry on rendered
clips (`train_vae`), and the optional decoder-only fine-tune (`train_decoder`). The recipe: `train`'s
docstring."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ardiff.tiny_world import stages
from ardiff.tiny_world.stages import SAVE_EVERY_SECONDS, Progress

VAE_CONFIG: dict[str, Any] = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}


# -- stage 1: VAE -------------------------------------------------------------------------------------------


def train_vae(out: Path, clips: np.ndarray, minutes: float, *, batch: int = 4, lr: float = 2e-3) -> Path:
    import torch
    from diffusers import AutoencoderKLWan

    vae_dir = out / "vae"
    state = stages.load_state(out)
    if state.get("vae_done"):
        return vae_dir
    torch.manual_seed(0)
    vae = AutoencoderKLWan(**VAE_CONFIG)
    opt = torch.optim.AdamW(vae.parameters(), lr, weight_decay=0.0)
    ckpt = out / "vae_train.pt"
    step, elapsed = 0, 0.0
    rng = np.random.default_rng(0)
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        vae.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step, elapsed, rng = saved["step"], saved["elapsed"], saved["rng"]
    budget = minutes * 60
    progress = Progress("vae", budget, elapsed)
    n, length = clips.shape[:2]
    span = 5
    hist: list[float] = []
    last_save = time.monotonic()

    def save() -> None:
        stages.atomic_torch_save(
            {
                "model": vae.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "elapsed": progress.elapsed(),
                "rng": rng,
            },
            ckpt,
        )

    vae.train()
    while progress.elapsed() < budget:
        lr_now = stages.cosine(lr, progress.elapsed() / budget, step)
        for group in opt.param_groups:
            group["lr"] = lr_now
        idx = rng.integers(0, n, batch)
        # Windows start on a latent boundary (frame 0 or 1 + 4k), as the pipeline's causal encoder sees them.
        starts = 1 + 4 * rng.integers(0, (length - 1 - span) // 4 + 1, batch)
        starts = np.where(rng.random(batch) < 0.3, 0, starts)
        x = stages.to_tensor(np.stack([clips[i, s : s + span] for i, s in zip(idx, starts, strict=True)]))
        mu = vae.encode(x).latent_dist.mode()
        z = mu + 0.1 * mu.detach().std() * torch.randn_like(mu)
        y = vae.decode(z).sample
        loss = (y - x).abs().mean() + ((y - x) ** 2).mean() + 1e-4 * (mu**2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        step += 1
        hist.append(loss.item())
        progress.update(step, f"loss={np.mean(hist[-25:]):.4f} lr={lr_now:.1e}")
        if time.monotonic() - last_save > SAVE_EVERY_SECONDS:
            save()
            last_save = time.monotonic()
    progress.update(step, f"loss={np.mean(hist[-25:]) if hist else float('nan'):.4f}", force=True)
    progress.close()
    save()
    vae.eval()
    with torch.no_grad():
        mus = [
            vae.encode(stages.to_tensor(clips[rng.integers(0, n, 4), :9])).latent_dist.mode()
            for _ in range(8)
        ]
        flat = torch.cat(mus).permute(1, 0, 2, 3, 4).reshape(16, -1)
        mean, std = flat.mean(1), flat.std(1)
        x = stages.to_tensor(clips[:4, :9])
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        psnr = 10 * math.log10(4 / float(((y - x) ** 2).mean()))
    vae.register_to_config(latents_mean=mean.tolist(), latents_std=std.tolist())
    if vae_dir.exists():
        shutil.rmtree(vae_dir)
    vae.save_pretrained(vae_dir, safe_serialization=True)
    print(f"vae: {step} steps, 9-frame reconstruction PSNR {psnr:.2f} dB -> {vae_dir}", flush=True)
    state = stages.load_state(out)
    state.update(vae_done=True, vae_steps=step, vae_psnr=round(psnr, 2))
    stages.save_state(out, state)
    return vae_dir


def train_decoder(out: Path, clips: np.ndarray, minutes: float, *, batch: int = 3, lr: float = 1e-3) -> Path:
    """Fine-tune only the VAE's decoder (encoder frozen: the latent space and the DiT's targets stay), on
    sessions' first 9 or 21 frames as the pipeline decodes them; it can run beside the DiT stage. Saves into
    OUT_DIR/model/vae (every few minutes and at the end) and OUT_DIR/dec_train.pt (to resume)."""
    import torch
    from diffusers import AutoencoderKLWan

    vae_dir = out / "model" / "vae"
    vae = AutoencoderKLWan.from_pretrained(out / "vae")
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters())
    for p in vae.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr)
    ckpt = out / "dec_train.pt"
    step, elapsed, rng = 0, 0.0, np.random.default_rng(2)
    torch.manual_seed(2)
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        vae.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step, elapsed, rng = saved["step"], saved["elapsed"], saved["rng"]
    budget = minutes * 60
    progress = Progress("decoder", budget, elapsed)
    n = len(clips)
    hist: list[float] = []
    last_save = time.monotonic()

    def save() -> None:
        stages.atomic_torch_save(
            {
                "model": vae.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "elapsed": progress.elapsed(),
                "rng": rng,
            },
            ckpt,
        )
        staging = out / "vae.dec-staging"
        shutil.rmtree(staging, ignore_errors=True)
        vae.save_pretrained(staging, safe_serialization=True)
        for item in staging.iterdir():
            item.replace(vae_dir / item.name)
        shutil.rmtree(staging, ignore_errors=True)

    vae.train()
    while progress.elapsed() < budget:
        lr_now = stages.cosine(lr, progress.elapsed() / budget, step)
        for group in opt.param_groups:
            group["lr"] = lr_now
        idx = rng.integers(0, n, batch)
        # From the session's first frame, as the pipeline's streaming decoder sees the latents: chunk 0 alone
        # (9 frames) or chunks 0-1 (21 frames, the decoder's causal cache carried into a later chunk).
        span = 9 if step % 2 else 21
        x = stages.to_tensor(clips[idx, :span])
        with torch.no_grad():
            mu = vae.encode(x).latent_dist.mode()
        z = mu + 0.1 * mu.std() * torch.randn_like(mu)
        y = vae.decode(z).sample
        loss = (y - x).abs().mean() + ((y - x) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        hist.append(loss.item())
        progress.update(step, f"loss={np.mean(hist[-25:]):.4f} lr={lr_now:.1e}")
        if time.monotonic() - last_save > SAVE_EVERY_SECONDS:
            save()
            last_save = time.monotonic()
    progress.close()
    save()
    vae.eval()
    with torch.no_grad():
        x = stages.to_tensor(clips[:4, :9])
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        psnr = 10 * math.log10(4 / float(((y - x) ** 2).mean()))
    print(f"decoder: {step} steps, 9-frame reconstruction PSNR {psnr:.2f} dB -> {vae_dir}", flush=True)
    return vae_dir
