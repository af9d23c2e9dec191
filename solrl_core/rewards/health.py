"""Reward health: catch a reward that stopped telling images apart.

A reward model that failed to load its weights, or a broken preprocessing step (black images, a
wrong value range), tends to give the same score to every image. Group-relative advantages are then
zero and the run trains on nothing while looking healthy. `RewardHealth` looks at each reward's
raw scores every iteration: near-constant over the whole batch, or within every prompt group, is a
warning; `patience` such iterations in a row of one reward is an error."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from solrl_core.errors import SolrlError
from solrl_core.text import plural


@dataclass(frozen=True)
class Finding:
    reward: str
    message: str
    streak: int  # consecutive near-constant iterations of this reward, this one included


@dataclass
class RewardHealth:
    min_std: float
    patience: int  # 0 = never stop
    streaks: dict[str, int] = field(default_factory=dict)

    def check(self, components: dict[str, torch.Tensor], groups: torch.Tensor) -> list[Finding]:
        """Update the streaks with one iteration's scores; one finding per near-constant reward."""
        findings = []
        for name, scores in components.items():
            reason = near_constant(scores.float(), groups, self.min_std)
            if reason is None:
                self.streaks[name] = 0
                continue
            self.streaks[name] = self.streaks.get(name, 0) + 1
            findings.append(Finding(name, f"reward '{name}' is near-constant: {reason} (iteration {self.streaks[name]} "
                                          f"in a row); a failed weight load or broken preprocessing looks like this", self.streaks[name]))
        return findings

    def failure(self) -> SolrlError | None:
        """The error to stop with once a reward has been near-constant `patience` iterations in a row."""
        for name, streak in self.streaks.items():
            if self.patience and streak >= self.patience:
                return SolrlError(f"reward '{name}' was near-constant for {plural(streak, 'iteration')} in a row, so the advantages carry "
                                 f"no signal", f"check that its weights load (reward.paths.{name}) and that it scores images in "
                                 "[0, 1]; or raise reward.health_patience (0 = never stop)")
        return None


def near_constant(scores: torch.Tensor, groups: torch.Tensor, min_std: float) -> str | None:
    """Why `scores` look constant, or None when they vary."""
    if scores.numel() < 2:
        return None
    batch_std = float(scores.std(unbiased=False))
    if batch_std <= min_std:
        return f"std {batch_std:.2e} over all {scores.numel()} images"
    group_stds = [float(scores[groups == g].std(unbiased=False)) for g in groups.unique() if int((groups == g).sum()) > 1]
    if group_stds and max(group_stds) <= min_std:
        return f"std at most {max(group_stds):.2e} within each of {len(group_stds)} prompt groups"
    return None
