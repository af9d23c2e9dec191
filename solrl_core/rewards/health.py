"""Reward health: catch a reward that stopped telling images apart.

A reward model that failed to load its weights, or a broken preprocessing step (black images, a
wrong value range), tends to give the same score to every image. Group-relative advantages are then
zero and the run trains on nothing while looking healthy. `RewardHealth` looks at each reward's
raw scores every iteration: near-constant over the whole batch, or within every prompt group, is a
warning; `patience` such iterations in a row of one reward is an error. A bounded reward that gives
every image its best score is saturated, not broken, and is said so: there is nothing left to learn
from those prompts. Outputs that are NaN or infinite are not the reward's fault: `diverged` names the
update (or the base model) instead, before the reward is blamed."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards.registry import BUILTINS
from solrl_core.text import plural

BEST = {r.name: r.best for r in BUILTINS if r.best is not None}  # bounded rewards: their highest score


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
    saturated: set[str] = field(default_factory=set)  # rewards whose last finding was every image at the best score

    def check(self, components: dict[str, torch.Tensor], groups: torch.Tensor) -> list[Finding]:
        """Update the streaks with one iteration's scores; one finding per near-constant reward."""
        findings = []
        for name, scores in components.items():
            reason = near_constant(scores.float(), groups, self.min_std)
            if reason is None:
                self.streaks[name] = 0
                continue
            self.streaks[name] = streak = self.streaks.get(name, 0) + 1
            if at_best(scores.float(), BEST.get(name), self.min_std):
                self.saturated.add(name)
                findings.append(Finding(name, f"reward '{name}' is saturated: every one of the {scores.numel()} images "
                                              f"scores its best, {BEST[name]:g} (iteration {streak} in a row), so the "
                                              f"advantages carry "
                                              "no signal (harder prompts would give one)", streak))
                continue
            self.saturated.discard(name)
            findings.append(Finding(name, f"reward '{name}' is near-constant: {reason} (iteration {streak} "
                                          f"in a row); a failed weight load or broken preprocessing looks like this",
                                    streak))
        return findings

    def failure(self) -> SolrlError | None:
        """The error to stop with once a reward has been near-constant `patience` iterations in a row."""
        for name, streak in self.streaks.items():
            if self.patience and streak >= self.patience and name in self.saturated:
                return SolrlError(f"reward '{name}' gave every image its best score, {BEST[name]:g}, "
                                  f"{plural(streak, 'iteration')} "
                                  "in a row: the prompts are solved, so the advantages carry no signal",
                                  "train on harder prompts (--prompts), or raise reward.health_patience (0 = never "
                                  "stop)")
            if self.patience and streak >= self.patience:
                return SolrlError(f"reward '{name}' was near-constant for {plural(streak, 'iteration')} in a row, so "
                                  "the advantages carry no signal",
                                  f"check that its weights load (reward.paths.{name}) and that it scores images in "
                                  "[0, 1]; or raise reward.health_patience (0 = never stop)")
        return None


def near_constant(scores: torch.Tensor, groups: torch.Tensor, min_std: float) -> str | None:
    """Why `scores` look constant, or None when they vary."""
    if scores.numel() < 2:
        return None
    batch_std = float(scores.std(unbiased=False))
    if batch_std <= min_std:
        return f"std {batch_std:.2e} over all {scores.numel()} images"
    group_stds = [float(scores[groups == g].std(unbiased=False)) for g in groups.unique()
                  if int((groups == g).sum()) > 1]
    if group_stds and max(group_stds) <= min_std:
        return f"std at most {max(group_stds):.2e} within each of {len(group_stds)} prompt groups"
    return None


def at_best(scores: torch.Tensor, best: float | None, tolerance: float) -> bool:
    """Every score at the reward's best (a bounded reward with nothing left to improve)."""
    return best is not None and bool(((scores - best).abs() <= tolerance).all())


def raise_if_diverged(latents: torch.Tensor, steps: int, lr: float) -> None:
    """Stop every rank together, before the rewards are blamed, when any rank's outputs are not finite."""
    from solrl_core.runtime import distributed

    problem = diverged(latents, steps, lr)
    if distributed.any_true(problem is not None):
        raise problem or SolrlError("another rank's model outputs are NaN or infinite", "see that rank's error")


def diverged(latents: torch.Tensor, steps: int, lr: float) -> SolrlError | None:
    """The error when a rollout's outputs hold NaN or infinity: after optimizer steps, the update
    diverged (the usual cause: a learning rate far too high); before any, the base model is broken."""
    bad = int((~torch.isfinite(latents)).sum())
    if not bad:
        return None
    share = f"{bad} of {latents.numel()} output values of the model are NaN or infinite"
    if steps:
        return SolrlError(f"the update diverged: after {plural(steps, 'optimizer step')} at optimizer.lr={lr:g}, "
                          f"{share} "
                          "(the reward is not at fault)",
                          "lower optimizer.lr (by 10x or more) and start a new run: resuming would keep the diverged "
                          "weights",
                          resumable=False)
    return SolrlError(f"the base model is broken before any update: {share}",
                      "check its weights (model.path, model.weights) and run.dtype (fp16 overflows: use bf16 or fp32)")
