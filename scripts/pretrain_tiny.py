"""Pre-train a tiny world's base model: flow matching on its synthetic images or clips, on a CPU.

    python scripts/pretrain_tiny.py --world image --steps 8000 --save-every 1000 --out /tmp/tinyworld # shipped:
    step_08000
    python scripts/pretrain_tiny.py --world video --steps 3000 --save-every 500 --out /tmp/tinyvideo # see
    docs/BENCHMARKS.md
    python scripts/pretrain_tiny.py --world image --evaluate /tmp/tinyworld/step_*   # pick a snapshot

`--world image` trains the tiny world's SANA on 32x32 scenes (`solrl_core.data.tinyworld`, loader
`tiny`); `--world video` the tiny moving world's Wan on clips of 4 frames of 16x16
(`solrl_core.data.tinyvideo`, loader `tiny_video`). Writes a snapshot folder (config.json +
model.safetensors, loadable as `model.weights` with the world's loader) every --save-every steps.
Everything derives from --seed: the init, the samples (sample i of step s is the world's
`example(seed * 10**9 + s * batch + i)`), sigmas and noise, so the same command reproduces the same
weights (on the same torch build and thread count). Only train-split captions are seen; held-out
ones never are. Training stops long before the model is perfect, on purpose: the shipped snapshot is
chosen so RL has room to improve it.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from solrl_core.data import tinyvideo, tinyworld
from solrl_core.data.world import World
from solrl_core.models.tiny import SANA, Arch, TinyArch, TinyKind, TinyParts, save_tiny, text_states
from solrl_core.models.tiny_video import VIDEO
from solrl_core.rewards.tinyvideo import TinyVideoReward
from solrl_core.rewards.tinyworld import TinyWorldReward
from solrl_core.rewards.world import WorldReward

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Setup:
    """One world's pre-training: what it draws, what it trains, and the command's defaults."""

    world: World
    kind: TinyKind
    arch: Arch  # the architecture trained
    loader: str  # model.loader of its snapshots
    reward: Callable[[], WorldReward]
    steps: int
    batch: int
    threads: int


SETUPS = {
    "image": Setup(tinyworld.WORLD, SANA,
                   TinyArch(heads=4, head_dim=32, layers=4, text_dim=64, text_layers=2, max_tokens=12,
                                                   vocab=tinyworld.VOCAB, patch_size=4, upscale=1),
                   "tiny", TinyWorldReward, steps=8000, batch=64, threads=2),
    "video": Setup(tinyvideo.WORLD, VIDEO, VIDEO.default, "tiny_video", TinyVideoReward, steps=3000, batch=32,
                   threads=1),
}


def batch_of(world: World, seed: int, step: int, size: int) -> tuple[list[str], torch.Tensor]:
    """Step `step`'s captions and pixels in [-1, 1], [B, 3, H, W] (clips: [B, 3, F, H, W])."""
    caps, pixels = zip(*(world.example(seed * 10**9 + step * size + i, "train") for i in range(size)))
    return list(caps), torch.from_numpy(np.stack(pixels)).movedim(-1, 1).float() / 127.5 - 1.0


@torch.no_grad()
def evaluate_snapshot(setup: Setup, folder: str, split: str, per_prompt: int = 4, steps: int = 10) -> tuple[float,
        dict[str, float]]:
    """Mean reward and its summary (strict accuracy, per-kind means) on the world's built-in prompt
    set of `split`, with the same fixed seeds `solrl train` uses for its evaluations."""
    from solrl_core.config.schema import ModelConfig
    from solrl_core.data.prompts import load_prompts
    from solrl_core.engine.sampler import Sampler
    from solrl_core.loop.evaluation import eval_seeds
    from solrl_core.models import load_model

    world = setup.world
    cfg = ModelConfig(loader=setup.loader, weights=folder, resolution=world.size, frames=world.frames)
    model = load_model(cfg, CPU, torch.float32)
    prompts = load_prompts(world.prompt_set(split))
    flat = [p for p in prompts for _ in range(per_prompt)]
    latents = Sampler(batch_size=64).generate(model, model.transformer, model.encode(flat),
                                              eval_seeds(len(prompts), per_prompt), steps, torch.float32)
    reward = setup.reward()
    scores = reward(model.decode(latents), flat)
    return float(scores.mean()), reward.summary(scores, flat)


def train(setup: Setup, args: argparse.Namespace) -> None:
    world, kind, arch = setup.world, setup.kind, setup.arch
    torch.manual_seed(args.seed)
    parts = TinyParts(arch, *kind.modules(arch, world.size, world.frames), origin=f"random init (seed {args.seed})")
    transformer, text_encoder = parts.transformer, parts.text_encoder
    text_encoder.train()
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup)
                                                 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"{world.name} pre-training: {sum(p.numel() for p in params) / 1e6:.2f}M parameters, "
          f"{args.steps} steps of {args.batch} {world.unit}s")
    t0, running = time.perf_counter(), None
    for step in range(1, args.steps + 1):
        caps, x0 = batch_of(world, args.seed, step, args.batch)
        cond = text_states(parts, kind, caps, CPU)
        sigma = torch.sigmoid(torch.randn(args.batch, generator=gen))  # logit-normal, as SD3/SANA train
        eps = torch.randn(x0.shape, generator=gen)
        s = sigma.view(-1, *[1] * (x0.dim() - 1))
        loss = torch.nn.functional.mse_loss(kind.velocity(transformer, (1 - s) * x0 + s * eps, sigma, cond), eps - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        running = float(loss.detach()) if running is None else 0.98 * running + 0.02 * float(loss.detach())
        if step % 50 == 0:
            print(f"step {step:>6}  loss {running:.4f}  lr {schedule.get_last_lr()[0]:.2e}  "
                  f"{time.perf_counter() - t0:7.0f}s", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            save_tiny(f"{args.out}/step_{step:05d}", arch, transformer, text_encoder.eval())
            text_encoder.train()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", required=True, choices=sorted(SETUPS), help="image: the tiny world; video: the tiny "
                                                                           "moving world")
    ap.add_argument("--evaluate", nargs="+", metavar="FOLDER", help="score snapshot folders instead of training")
    ap.add_argument("--splits", nargs="+", default=["train", "heldout"], choices=["train", "heldout"],
                    help="the prompt sets --evaluate scores (default: both)")
    ap.add_argument("--steps", type=int, help="default: 8000 (image), 3000 (video)")
    ap.add_argument("--batch", type=int, help="default: 64 (image), 32 (video)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="default: 2 (image), 1 (video)")
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--out", help="folder for step_NNNNN/ snapshots")
    args = ap.parse_args(argv)
    setup = SETUPS[args.world]
    for name in ("steps", "batch", "threads"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(setup, name))
    if not args.evaluate and not args.out:
        ap.error("--out is required for training")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup = SETUPS[args.world]
    torch.set_num_threads(args.threads)
    if not args.evaluate:
        train(setup, args)
        return
    for folder in args.evaluate:
        for split in args.splits:
            mean, summary = evaluate_snapshot(setup, folder, split)
            kinds = "  ".join(f"{k} {v:.3f}" for k, v in summary.items())
            print(f"{folder}  {split:<8} reward {mean:.3f}  {kinds}", flush=True)


if __name__ == "__main__":
    main()
