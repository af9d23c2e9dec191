"""Stage 1 alone (`solrl explore`): N seeds per prompt through the explore copy at the preview step
count, scored, ranked, and the K seeds Stage 2 would regenerate selected, exactly as a training
iteration does (same selection function, same stable tie order)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from solrl_core.inference import Loaded, decode_in_chunks, encode_each
from solrl_core.rewards import RewardSet
from solrl_core.sampler import Sampler
from solrl_core.selection import select


@dataclass(frozen=True)
class ExploreResult:
    prompts: list[str]
    seeds: torch.Tensor  # [P, N]
    rewards: torch.Tensor  # [P, N] total reward
    components: dict[str, torch.Tensor]  # [P, N] per reward
    ranks: torch.Tensor  # [P, N] 1 = best, stable ties by seed order
    selected: torch.Tensor  # [P, K] indices into N, in selection order
    images: torch.Tensor  # [P, N, 3, H, W]
    seconds: float
    precision: str
    steps: int


@torch.no_grad()
def explore_only(loaded: Loaded, rewards: RewardSet, prompts: list[str], n: int, keep: int, mode: str, seed_base: int,
                 steps: int) -> ExploreResult:
    """Seeds seed_base + i*N ... seed_base + i*N + N-1 for prompt i (so a result names its seeds)."""
    copy_ = loaded.explore_copy
    if copy_ is None:
        raise ValueError("explore needs the model loaded with its explore copy (load_tuned(..., explore=True))")
    smp = loaded.config.sampler
    t0 = time.perf_counter()
    flat = [p for p in prompts for _ in range(n)]
    seeds = seed_base + torch.arange(len(prompts) * n, dtype=torch.long)
    cond = encode_each(loaded.model, prompts, n)
    latents = Sampler.of(smp).generate(loaded.model, copy_.forward, cond, seeds, steps, copy_.dtype)
    images = decode_in_chunks(loaded.model, latents, smp.rollout_batch)
    scores = rewards(images, flat)
    total = scores.total.view(len(prompts), n)
    order = torch.argsort(total, dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, n + 1).expand(len(prompts), n).contiguous())
    rng = np.random.default_rng(seed_base)
    selected = torch.stack([select(total[i], keep, mode, rng) for i in range(len(prompts))])
    return ExploreResult(prompts, seeds.view(len(prompts), n), total,
                         {k: v.view(len(prompts), n) for k, v in scores.components.items()}, ranks, selected,
                         images.view(len(prompts), n, *images.shape[1:]), time.perf_counter() - t0, copy_.precision, steps)
