"""Pre-train the tiny-world base model: flow matching on synthetic scenes, on a CPU.

    python scripts/pretrain_tinyworld.py --steps 8000 --save-every 1000 --out /tmp/tinyworld   # the shipped base: step_08000
    python scripts/pretrain_tinyworld.py --evaluate /tmp/tinyworld/step_*   # pick a snapshot

Writes a snapshot folder (config.json + model.safetensors, loadable as `model.weights`) every
--save-every steps. Everything derives from --seed: the init, the scenes (scene i of step s is
`tinyworld.example(seed * 10**9 + s * batch + i)`), sigmas and noise, so the same command
reproduces the same weights (on the same torch build and thread count). Only train-split prompts
are seen; held-out object pairs never are. Training stops long before the model is perfect, on
purpose: the shipped snapshot is chosen so RL has room to improve it.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from solrl_core.data import tinyworld
from solrl_core.models.tiny import TinyArch, build_modules, save_tiny

WORLD_ARCH = TinyArch(heads=4, head_dim=32, layers=4, patch_size=4, upscale=1, text_dim=64, text_layers=2,
                      max_tokens=12, vocab=tinyworld.VOCAB)


def batch_of(seed: int, step: int, size: int) -> tuple[list[str], torch.Tensor]:
    caps, imgs = [], []
    for i in range(size):
        cap, img = tinyworld.example(seed * 10**9 + step * size + i, "train")
        caps.append(cap)
        imgs.append(img)
    x0 = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return caps, x0


@torch.no_grad()
def evaluate_snapshot(folder: str, split: str, per_prompt: int = 4, steps: int = 10) -> tuple[float, float]:
    """Mean tinyworld_geneval reward and strict accuracy on a built-in prompt set, with the same
    fixed seeds `solrl train` uses for its evaluations."""
    from solrl_core.config.schema import ModelConfig
    from solrl_core.data.prompts import load_prompts
    from solrl_core.engine.sampler import Sampler
    from solrl_core.loop.evaluation import eval_seeds
    from solrl_core.models.tiny import build_tiny
    from solrl_core.rewards.tinyworld import TinyWorldReward, strict_accuracy

    model = build_tiny(ModelConfig(loader="tiny", weights=folder, resolution=tinyworld.SIZE), torch.device("cpu"), torch.float32)
    prompts = load_prompts(f"tinyworld_{split}")
    flat = [p for p in prompts for _ in range(per_prompt)]
    latents = Sampler(batch_size=64).generate(model, model.transformer, model.encode(flat),
                                              eval_seeds(len(prompts), per_prompt), steps, torch.float32)
    scores = TinyWorldReward()(model.decode(latents), flat)
    return float(scores.mean()), strict_accuracy(scores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--evaluate", nargs="+", metavar="FOLDER", help="score snapshot folders instead of training")
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--out", help="folder for step_NNNNN/ snapshots")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.evaluate:
        print("snapshot                          train: reward  strict   heldout: reward  strict")
        for folder in args.evaluate:
            tr, ho = evaluate_snapshot(folder, "train"), evaluate_snapshot(folder, "heldout")
            print(f"{folder:<32} {tr[0]:13.3f} {tr[1]:7.3f} {ho[0]:16.3f} {ho[1]:7.3f}", flush=True)
        return
    if not args.out:
        ap.error("--out is required for training")

    torch.manual_seed(args.seed)
    tokenizer, text_encoder, transformer = build_modules(WORLD_ARCH, tinyworld.SIZE)
    text_encoder.train()
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup)
                                                 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"tiny-world pre-training: {sum(p.numel() for p in params) / 1e6:.2f}M parameters, {args.steps} steps of {args.batch}")
    t0, running = time.perf_counter(), None
    for step in range(1, args.steps + 1):
        caps, x0 = batch_of(args.seed, step, args.batch)
        tok = tokenizer(caps, padding="max_length", truncation=True, max_length=WORLD_ARCH.max_tokens, return_tensors="pt")
        cond = text_encoder(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).last_hidden_state
        sigma = torch.sigmoid(torch.randn(args.batch, generator=gen))  # logit-normal, as SD3/SANA train
        eps = torch.randn(x0.shape, generator=gen)
        s = sigma.view(-1, 1, 1, 1)
        v = transformer(hidden_states=(1 - s) * x0 + s * eps, encoder_hidden_states=cond, timestep=sigma * 1000,
                        encoder_attention_mask=tok["attention_mask"], return_dict=False)[0]
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
