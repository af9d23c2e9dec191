"""Which K of a prompt's N explored seeds go on to Stage 2 and training."""

from __future__ import annotations

import math

import numpy as np
import torch

from solrl_core.loop.nft import combined_advantages


def select(rewards: torch.Tensor, k: int, mode: str, rng: np.random.Generator) -> torch.Tensor:
    """Indices (into one prompt's N rewards) of the K kept seeds, best first where ranked.

    best_worst       the K/2 highest and K/2 lowest rewards (the official default)
    random           K uniformly at random
    mean_deviation   the K farthest from the group mean, either side
    extremes_random  the K/4 highest and K/4 lowest, the rest at random from the middle
    Ties are broken by position (stable sort), so a selection is reproducible. The official code
    (NVlabs/Sana train_scripts/sol_rl/train_utils.py, `select_indices_by_mode`) takes the best and the
    worst with two `torch.topk` calls, whose order among equal rewards is the kernel's: tied seeds keep
    the same reward values there and here, but may be other seeds. With K = N and ties across the
    middle, its two calls can both return the same seed (all N rewards equal: 24 indices, 12 distinct),
    training it twice and another seed never; here K = N keeps each seed once, which is what keeping
    all N means.
    """
    n = rewards.numel()
    if k > n:
        raise ValueError(f"cannot keep {k} of {n} seeds")
    order = torch.argsort(rewards.float(), descending=True, stable=True)
    if k == n:
        return order
    if mode == "best_worst":
        return torch.cat([order[: k // 2], order[n - k // 2:]])
    if mode == "random":
        return torch.as_tensor(np.sort(rng.choice(n, size=k, replace=False)), dtype=torch.long)
    if mode == "mean_deviation":
        dev = (rewards.float() - rewards.float().mean()).abs()
        return torch.argsort(dev, descending=True, stable=True)[:k]
    if mode == "extremes_random":
        e = k // 4
        ends = torch.cat([order[:e], order[n - e:]]) if e else order[:0]
        middle = order[e:n - e]
        pick = rng.choice(middle.numel(), size=k - 2 * e, replace=False)
        return torch.cat([ends, middle[torch.as_tensor(np.sort(pick), dtype=torch.long)]])
    raise ValueError(f"unknown selection mode {mode}")


def ranking_values(total: torch.Tensor, components: dict[str, torch.Tensor], weights: dict[str, float],
                   texts: torch.Tensor, aggregation: str) -> torch.Tensor:
    """What seeds are ranked by within a prompt group: the advantage the update will see (unclipped),
    so that with several rewards and `reward.aggregation = advantage` the kept seeds are the ones the
    update weighs most. Training (stages.select_seeds) and `solrl explore` (tools/explore.py) both rank by it."""
    return combined_advantages(total, components, weights, texts, aggregation, math.inf)
