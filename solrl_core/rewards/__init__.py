"""Rewards score a batch of images against their prompts: one float per image.

A reward is any object with a `name` and `__call__(images, prompts) -> Tensor[B]`, where images are
float tensors [B, 3, H, W] in [0, 1]. Optionally `check_prompts(prompts)` rejects prompts it cannot
score (called before a run writes anything) and `summary(scores) -> dict` adds named statistics
(e.g. GenEval-style strict accuracy) to evaluations. Several rewards combine as a weighted sum (`RewardSet`).
New rewards register their constructor in `BUILDERS` once; presets in presets/rewards/ name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from solrl_core.errors import SolrlError, close_matches
from solrl_core.rewards.jpeg import JpegSize
from solrl_core.rewards.tinyworld import TinyWorldReward


class Reward(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


BUILDERS: dict[str, Callable[[], Reward]] = {
    "jpeg_compressibility": lambda: JpegSize("jpeg_compressibility", sign=-1.0, scale=1 / 500),
    "jpeg_incompressibility": lambda: JpegSize("jpeg_incompressibility", sign=1.0, scale=1.0),
    "tinyworld_geneval": TinyWorldReward,
}


@dataclass(frozen=True)
class Scores:
    """Per-image total reward and each component's raw score."""

    total: torch.Tensor
    components: dict[str, torch.Tensor]


class RewardSet:
    """Several rewards with weights; `aggregation` decides how they meet the advantage."""

    def __init__(self, weights: dict[str, float]) -> None:
        unknown = [n for n in weights if n not in BUILDERS]
        if unknown:
            raise SolrlError(f"unknown reward '{unknown[0]}'", close_matches(unknown[0], list(BUILDERS)))
        self.weights = dict(weights)
        self.rewards = {n: BUILDERS[n]() for n in weights}

    def check_prompts(self, prompts: list[str]) -> None:
        for reward in self.rewards.values():
            check = getattr(reward, "check_prompts", None)
            if check is not None:
                check(prompts)

    def summary(self, scores: Scores) -> dict[str, float]:
        """Extra named statistics the rewards define, keyed 'reward.statistic'."""
        out = {}
        for name, reward in self.rewards.items():
            summarize = getattr(reward, "summary", None)
            if summarize is not None:
                out.update({f"{name}.{k}": v for k, v in summarize(scores.components[name]).items()})
        return out

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> Scores:
        components = {n: r(images, prompts).float().cpu() for n, r in self.rewards.items()}
        total = sum(self.weights[n] * s for n, s in components.items())
        return Scores(total=total, components=components)  # type: ignore[arg-type]
