"""Who is blamed when the rewards stop telling images apart: a saturated reward is said to be
saturated, a diverged update is blamed on the update (and its learning rate), not on the reward."""

from __future__ import annotations

import pytest
import torch

from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.rewards.health import RewardHealth, diverged

GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_every_image_at_a_bounded_rewards_best_is_saturation_not_a_broken_reward():
    health = RewardHealth(min_std=1e-6, patience=2)
    (finding,) = health.check({"tinyworld_geneval": torch.ones(8)}, GROUPS)
    assert "saturated" in finding.message and "every one of the 8 images scores its best, 1" in finding.message
    assert "failed weight load" not in finding.message
    health.check({"tinyworld_geneval": torch.ones(8)}, GROUPS)
    failure = health.failure()
    assert (failure is not None and "best score, 1, 2 iterations in a row" in failure.message
            and "--prompts" in failure.fix)
    assert "weights load" not in failure.fix


def test_a_constant_score_below_the_best_or_of_an_unbounded_reward_still_points_at_the_reward():
    health = RewardHealth(min_std=1e-6, patience=1)
    (below,) = health.check({"tinyworld_geneval": torch.full((8,), 0.5)}, GROUPS)
    (unbounded,) = RewardHealth(min_std=1e-6, patience=1).check({"pickscore": torch.ones(8)}, GROUPS)
    for finding in (below, unbounded):
        assert "near-constant" in finding.message and "failed weight load" in finding.message
    assert "weights load" in health.failure().fix


def test_non_finite_outputs_blame_the_update_after_a_step_and_the_base_model_before():
    latents = torch.zeros(4, 3, 8, 8)
    assert diverged(latents, steps=3, lr=1e9) is None
    latents[1, 0, 0, :5] = float("nan")
    latents[2, 0, 0, 0] = float("inf")
    after = diverged(latents, steps=1, lr=1e9)
    assert "the update diverged: after 1 optimizer step at optimizer.lr=1e+09, 6 of 768 output values" in after.message
    assert "reward is not at fault" in after.message and "lower optimizer.lr" in after.fix
    before = diverged(latents, steps=0, lr=3e-4)
    assert "base model is broken before any update" in before.message and "run.dtype" in before.fix


@pytest.mark.slow
def test_a_diverging_run_stops_on_the_update_not_the_reward(fast_sets):
    from solrl_core.config.presets import resolve_config
    from solrl_core.loop.trainer import train

    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    sets = fast_sets("run.eval_prompts=", "optimizer.lr=1e9", "run.iterations=4")
    with pytest.raises(SolrlError) as failed:
        train(resolve_config("tiny", "sol_rl", sets=sets), bus)
    assert failed.value.message.startswith("the update diverged: after 1 optimizer step at optimizer.lr=1e+09")
    warnings = [e.message for e in seen if isinstance(e, ev.RunWarning)]
    assert not any("failed weight load" in w for w in warnings), warnings
    assert [e.iteration for e in seen if isinstance(e, ev.IterationFinished)] == [1]  # stopped as iteration 2 began
    (end,) = [e for e in seen if isinstance(e, ev.RunFinished)]
    assert end.reason == "failed" and not end.resumable  # its last line offers no resume beside the fix's new run
