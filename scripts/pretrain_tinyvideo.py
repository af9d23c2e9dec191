"""Pre-train the tiny moving world's base model: flow matching on synthetic clips, on one CPU core.

    python scripts/pretrain_tinyvideo.py --steps 3000 --save-every 500 --out /tmp/tinyvideo   # the shipped base: see docs/BENCHMARKS.md
    python scripts/pretrain_tinyvideo.py --evaluate /tmp/tinyvideo/step_*   # pick a snapshot

Writes a snapshot folder (config.json + model.safetensors, loadable as `model.weights` with the
tiny_video loader) every --save-every steps. Everything derives from --seed: the init, the clips
(clip i of step s is `tinyvideo.example(seed * 10**9 + s * batch + i)`), sigmas and noise, so the same
command reproduces the same weights (on the same torch build and thread count). Only train-split
captions are seen; held-out (colour, motion) pairs never are. Training stops long before the model
is perfect, on purpose: the shipped snapshot is chosen so RL has room to improve it.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from solrl_core.data import tinyvideo
from solrl_core.models.tiny import save_tiny
from solrl_core.models.tiny_video import VideoArch, build_video_modules

WORLD_ARCH = VideoArch()


def batch_of(seed: int, step: int, size: int) -> tuple[list[str], torch.Tensor]:
    caps, clips = [], []
    for i in range(size):
        cap, clip = tinyvideo.example(seed * 10**9 + step * size + i, "train")
        caps.append(cap)
        clips.append(clip)
    x0 = torch.from_numpy(np.stack(clips)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0  # [B, 3, F, H, W]
    return caps, x0


@torch.no_grad()
def evaluate_snapshot(folder: str, split: str, per_prompt: int = 4, steps: int = 10) -> tuple[float, dict[str, float]]:
    """Mean tinyvideo_geneval reward and its per-kind means on every caption of a split, with the same
    fixed seeds `solrl train` uses for its evaluations."""
    from solrl_core.config.schema import ModelConfig
    from solrl_core.engine.sampler import Sampler
    from solrl_core.loop.evaluation import eval_seeds
    from solrl_core.models.tiny_video import build_tiny_video
    from solrl_core.rewards.tinyvideo import TinyVideoReward

    cfg = ModelConfig(loader="tiny_video", weights=folder, resolution=tinyvideo.SIZE, frames=tinyvideo.FRAMES)
    model = build_tiny_video(cfg, torch.device("cpu"), torch.float32)
    prompts = tinyvideo.prompts(split)
    flat = [p for p in prompts for _ in range(per_prompt)]
    latents = Sampler(batch_size=64).generate(model, model.transformer, model.encode(flat),
                                              eval_seeds(len(prompts), per_prompt), steps, torch.float32)
    reward = TinyVideoReward()
    scores = reward(model.decode(latents), flat)
    return float(scores.mean()), reward.summary(scores, flat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evaluate", nargs="+", metavar="FOLDER", help="score snapshot folders instead of training")
    ap.add_argument("--splits", nargs="+", default=["train", "heldout"], choices=["train", "heldout"],
                    help="the caption sets --evaluate scores (default: both)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--out", help="folder for step_NNNNN/ snapshots")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.evaluate:
        for folder in args.evaluate:
            for split in args.splits:
                mean, extras = evaluate_snapshot(folder, split)
                kinds = "  ".join(f"{k} {v:.3f}" for k, v in extras.items())
                print(f"{folder}  {split:<8} reward {mean:.3f}  {kinds}", flush=True)
        return
    if not args.out:
        ap.error("--out is required for training")

    torch.manual_seed(args.seed)
    tokenizer, text_encoder, transformer = build_video_modules(WORLD_ARCH, tinyvideo.SIZE, tinyvideo.FRAMES)
    text_encoder.train()
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup)
                                                 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"tiny moving world pre-training: {sum(p.numel() for p in params) / 1e6:.2f}M parameters, "
          f"{args.steps} steps of {args.batch} clips")
    t0, running = time.perf_counter(), None
    for step in range(1, args.steps + 1):
        caps, x0 = batch_of(args.seed, step, args.batch)
        tok = tokenizer(caps, padding="max_length", truncation=True, max_length=WORLD_ARCH.max_tokens, return_tensors="pt")
        mask = tok["attention_mask"]
        cond = text_encoder(input_ids=tok["input_ids"], attention_mask=mask).last_hidden_state * mask[..., None]
        sigma = torch.sigmoid(torch.randn(args.batch, generator=gen))  # logit-normal, as SD3/SANA train
        eps = torch.randn(x0.shape, generator=gen)
        s = sigma.view(-1, 1, 1, 1, 1)
        v = transformer(hidden_states=(1 - s) * x0 + s * eps, timestep=sigma * 1000, encoder_hidden_states=cond,
                        return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(v, eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        running = float(loss.detach()) if running is None else 0.98 * running + 0.02 * float(loss.detach())
        if step % 50 == 0:
            print(f"step {step:>6}  loss {running:.4f}  lr {schedule.get_last_lr()[0]:.2e}  {time.perf_counter() - t0:7.0f}s", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save_tiny(f"{args.out}/step_{step:05d}", WORLD_ARCH, transformer, text_encoder.eval())
            text_encoder.train()


if __name__ == "__main__":
    main()
