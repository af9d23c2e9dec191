"""The eval rewards of a run (`run.eval_rewards`): rewards scored at every evaluation besides the
trained one(s), on the same images, never trained on (evaluation.py scores them). Loaded as a run
opens, before the model, so one that cannot load stops the run in its preflight, named."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.rewards import RewardSet


@dataclass(frozen=True)
class HeldOut:
    """The eval rewards of an evaluation, in order: `rewards` scores those the run does not train on;
    a name among the trained rewards reuses that component's scores (the same images)."""

    names: tuple[str, ...]
    rewards: RewardSet | None


def held_out_rewards(cfg: Any, names: tuple[str, ...], device: torch.device) -> HeldOut | None:
    """Load the eval rewards `names` (None when there are none). One that cannot load is a SolrlError
    naming it as an eval reward, with its own fix and how to go on without it."""
    if not names:
        return None
    others = tuple(n for n in names if n not in cfg.reward.weights)
    if not others:
        return HeldOut(names, None)
    try:
        section = replace(cfg.reward, weights=dict.fromkeys(others, 1.0),
                          paths={k: v for k, v in cfg.reward.paths.items() if k in others})
        return HeldOut(names, RewardSet.from_config(section, device))
    except SolrlError as exc:
        # as the reward errors name it
        failed = next((n for n in others if f"'{n}'" in exc.message or f" {n}:" in exc.message), None)
        rest = ",".join(n for n in names if n != failed)
        raise SolrlError(f"eval reward (run.eval_rewards): {exc.message}",
                         f"{exc.fix}; or evaluate without it: --set run.eval_rewards={rest}") from exc
