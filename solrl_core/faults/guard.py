"""Rewards and steps that go wrong: non-finite scores are dropped, non-finite steps skipped.

A reward model can return NaN or infinity for some images (an fp16 overflow, a degenerate crop, a
broken preprocessing path). One such value poisons every advantage of the iteration (the std is
over all of them), so the samples it scored are dropped instead:

- Stage 1: a draft with a non-finite score is not selected while its group has K finite ones;
- the update: a sample with a non-finite score is left out; a group left with none is skipped;
  an iteration left with none makes no optimizer step;
- a reward whose every final score is non-finite `reward.health_patience` iterations in a row stops
  the run (with a checkpoint), as a near-constant one does.

An optimizer step whose gradient norm is not finite (or that had no finite loss term at all) is
skipped; `optimizer.max_nonfinite_steps` skipped steps in a row stop the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from solrl_core.errors import SolrlError
from solrl_core.text import plural


@dataclass
class FaultState:
    """The streaks that decide a stop, saved in each checkpoint's trainer_state.json."""

    # reward -> iterations in a row with no finite score
    nonfinite_rewards: dict[str, int] = field(default_factory=dict)
    skipped_steps: int = 0  # optimizer steps skipped in a row

    def to_dict(self) -> dict:
        return {"nonfinite_rewards": dict(self.nonfinite_rewards), "skipped_steps": self.skipped_steps}

    @classmethod
    def from_dict(cls, data: dict | None) -> "FaultState":
        data = data or {}
        return cls(dict(data.get("nonfinite_rewards", {})), int(data.get("skipped_steps", 0)))


@dataclass(frozen=True)
class Screen:
    """Which samples of one stage have a finite score from every reward."""

    valid: torch.Tensor  # [B] bool
    nonfinite: dict[str, int]  # reward -> samples it scored non-finite (only rewards with any)
    groups: int
    groups_without_valid: int

    @property
    def clean(self) -> bool:
        return not self.nonfinite

    @property
    def dropped(self) -> int:
        return int((~self.valid).sum())


def screen(components: dict[str, torch.Tensor], groups: torch.Tensor) -> Screen:
    valid = torch.ones(groups.numel(), dtype=torch.bool)
    nonfinite = {}
    for name, scores in components.items():
        finite = torch.isfinite(scores.float()).cpu()
        if not finite.all():
            nonfinite[name] = int((~finite).sum())
            valid &= finite
    ids = groups.cpu().unique()
    empty = sum(1 for g in ids if not valid[groups.cpu() == g].any()) if nonfinite else 0
    return Screen(valid, nonfinite, ids.numel(), empty)


def prefer_finite(members: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """A group's candidates for selection: its finite members, topped up (in order) with non-finite
    ones only when fewer than `k` are finite, so every group still sends K seeds to Stage 2 (every
    rank keeps the same number of samples); the update drops whatever is still non-finite there."""
    ok = members[valid[members]]
    if ok.numel() >= k:
        return ok
    return torch.cat([ok, members[~valid[members]][: k - ok.numel()]])


def record_rewards(state: FaultState, final: Screen, names: list[str], samples: int) -> None:
    """Count, per reward, the iterations in a row where it scored no final sample finitely."""
    for name in names:
        lost = final.nonfinite.get(name, 0) == samples
        state.nonfinite_rewards[name] = state.nonfinite_rewards.get(name, 0) + 1 if lost else 0


def record_step(state: FaultState, stepped: bool) -> int:
    state.skipped_steps = 0 if stepped else state.skipped_steps + 1
    return state.skipped_steps


def failure(state: FaultState, patience: int, max_skipped: int) -> SolrlError | None:
    """The error to stop with, once a streak reaches its limit (0 = never)."""
    for name, streak in state.nonfinite_rewards.items():
        if patience and streak >= patience:
            return SolrlError(f"reward '{name}' returned NaN or infinity for every image {plural(streak, 'iteration')} "
                              f"in a row",
                              f"check the reward's weights (reward.paths.{name}) and its input range; or raise "
                              "reward.health_patience (0 = never stop)")
    if max_skipped and state.skipped_steps >= max_skipped:
        return SolrlError(f"{state.skipped_steps} optimizer steps in a row were skipped: the loss or gradient norm was "
                          f"not finite",
                          "lower optimizer.lr or optimizer.grad_clip, check the rewards for huge values; or raise "
                          "optimizer.max_nonfinite_steps (0 = never stop)")
    return None
