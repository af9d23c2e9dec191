"""Evaluation: fixed prompts x fixed seeds at the eval step count, scored, for base or EMA weights.

The same (prompt, seed) pairs are used for every evaluation of a run, so two evaluations differ
only by the weights: a rise is the model's, not the noise's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from solrl_core.rewards import Scores
from solrl_core.rollout import generate
from solrl_core.sampler import sigma_grid
from solrl_core.session import Session

EVAL_SEED_BASE = 1_000_000_007  # far from training seeds' typical draws; any fixed value works


@dataclass(frozen=True)
class Evaluation:
    weights: str
    prompts: list[str]
    seeds: torch.Tensor
    scores: Scores
    extras: dict[str, float]
    seconds: float

    @property
    def mean(self) -> float:
        return float(self.scores.total.mean())


def eval_seeds(n_prompts: int, per_prompt: int) -> torch.Tensor:
    return EVAL_SEED_BASE + torch.arange(n_prompts * per_prompt, dtype=torch.long)


@torch.no_grad()
def evaluate(session: Session, prompts: list[str], per_prompt: int, weights: str) -> Evaluation:
    """Score `weights` ("base": adapters off, "ema": the EMA adapter, "trained": the live adapter)."""
    t0 = time.perf_counter()
    flat = [p for p in prompts for _ in range(per_prompt)]
    seeds = eval_seeds(len(prompts), per_prompt)
    cfg = session.config.sampler
    with session.policy.weights(weights) as net:
        latents = generate(session.model, net, session.conditioning(flat), seeds, sigma_grid(cfg.eval_steps, cfg.shift),
                           cfg.rollout_batch, cfg.solver, session.dtype)
    scores = session.rewards(session.model.decode(latents), flat)
    return Evaluation(weights, prompts, seeds, scores, session.rewards.summary(scores), time.perf_counter() - t0)
