"""What every reward is and is given: the `Reward` protocol and the `RewardContext` it is built
for (the reward modules import these from here, not from the package that registers them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class Reward(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


@dataclass(frozen=True)
class RewardContext:
    """What a reward needs to load: where to run and where its weights are."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    path: str = ""  # a local folder or file from reward.paths; '' = the hub id (or the HF cache offline)
    batch_size: int = 32  # images per forward pass of a model reward
