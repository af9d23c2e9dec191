"""`solrl explore` keeps exactly the seeds a training iteration keeps: it ranks and selects through the
training's own code, for every selection mode and aggregation of several rewards."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.data.prompts import text_keys
from solrl_core.engine.engine import open_engine
from solrl_core.faults import guard
from solrl_core.loop.selection import select
from solrl_core.loop.stages import GlobalScores, Scored, select_seeds
from solrl_core.rewards import RewardSet
from solrl_core.tools.explore import explore_only
from tests.conftest import FAST

# Counts and positions: the tiny world's reward varies within these groups, so ranking by the raw
# weighted total and by the combined advantage disagree somewhere (what `explore` used to get wrong).
PROMPTS = ["three red circles", "a green triangle left of a blue square", "a green square above a green triangle",
           "two blue squares", "a red circle and a blue square"]
N, K = 16, 4


def _training_selection(cfg, result) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The seeds stages.select_seeds keeps from the same Stage-1 scores, as [P, K] indices into N."""
    flat = [p for p in result.prompts for _ in range(N)]
    groups = torch.arange(len(result.prompts)).repeat_interleave(N)
    components = {k: v.flatten() for k, v in result.components.items()}
    scores = GlobalScores(result.rewards.flatten(), components, groups, slice(0, len(flat)),
                          torch.tensor(text_keys(flat), dtype=torch.long))
    run = SimpleNamespace(config=cfg, plan=SimpleNamespace(keep=K))
    drafts = Scored(batch=None, scores=scores, screen=guard.screen(components, groups))
    kept = select_seeds(run, drafts, np.random.default_rng(0))
    return kept.view(len(result.prompts), K) - torch.arange(len(result.prompts))[:, None] * N


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["sum", "advantage"])
def test_explore_keeps_the_seeds_training_keeps(tmp_path, aggregation):
    sets = [*FAST, f"run.run_dir={tmp_path / 'r'}", f"reward.aggregation={aggregation}"]
    cfg = resolve_config("tiny", "sol_rl", "tinyworld_geneval=1.0,jpeg_compressibility=1.0", sets=sets)
    engine = open_engine(cfg, explore=True, rewards=RewardSet.from_config(cfg.reward, torch.device("cpu")))
    differ_from_total = 0
    for mode in ("best_worst", "random", "mean_deviation", "extremes_random"):
        mode_cfg = cfg.__class__(**{**cfg.__dict__,
                                    "selection": cfg.selection.__class__(**{**cfg.selection.__dict__, "mode": mode})})
        result = explore_only(engine, PROMPTS, N, K, mode, seed_base=0, steps=cfg.explore.steps)
        assert torch.equal(result.selected, _training_selection(mode_cfg, result)), mode
        rng = np.random.default_rng(0)  # what `explore` kept before: the K of the raw weighted total
        by_total = torch.stack([select(result.rewards[i], K, mode, rng) for i in range(len(PROMPTS))])
        differ_from_total += int(not torch.equal(by_total, result.selected))
    if aggregation == "advantage":  # the case the two used to disagree on: the raw total keeps other seeds
        assert differ_from_total > 0


def test_explore_ranks_by_the_trainings_ranking_with_an_unscored_seed_last():
    """A seed whose reward is NaN: training keeps it only to fill a group (guard.prefer_finite), and
    `explore` ranks it last, the others by the same values training selects by (stages.draft_ranking),
    so its `rank` column agrees with its `selected` one."""
    from solrl_core.config.schema import RewardConfig

    drafts = torch.tensor([0.5, float("nan"), 0.9, 0.1, 0.7, 0.3])
    images = torch.zeros(6, 3, 4, 4)
    engine = SimpleNamespace(
        explore_copy=SimpleNamespace(precision="nvfp4"),
        config=SimpleNamespace(reward=RewardConfig(weights={"r": 1.0})),
        conditioning=lambda prompts: prompts,
        generate=lambda cond, seeds, steps, copy, **_: SimpleNamespace(images=images[: len(seeds)]),
        rewards=lambda imgs, prompts: SimpleNamespace(total=drafts.clone(), components={"r": drafts.clone()}),
    )
    result = explore_only(engine, ["three red circles"], 6, 2, "best_worst", seed_base=0, steps=2)
    assert result.ranks.tolist() == [[3, 6, 1, 5, 2, 4]]
    assert sorted(result.selected[0].tolist()) == [2, 3]  # the best and the worst finitely scored seeds
    assert sorted(int(result.ranks[0, j]) for j in result.selected[0]) == [1, 5]
