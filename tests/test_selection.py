import numpy as np
import pytest
import torch

from solrl_core.loop.selection import select

REWARDS = torch.tensor([0.3, 0.9, -0.2, 0.5, 0.1, 0.8, -0.7, 0.0])


def test_best_worst_returns_top_and_bottom_half_k():
    chosen = select(REWARDS, 4, "best_worst", np.random.default_rng(0)).tolist()
    assert chosen == [1, 5, 2, 6]  # 0.9, 0.8 best; -0.2, -0.7 worst


@pytest.mark.parametrize("mode", ["random", "mean_deviation", "extremes_random", "best_worst"])
def test_every_mode_keeps_k_distinct_seeds(mode):
    chosen = select(REWARDS, 6, mode, np.random.default_rng(1))
    assert chosen.numel() == 6 and len(set(chosen.tolist())) == 6


def test_mean_deviation_keeps_farthest_from_mean():
    mean = float(REWARDS.mean())  # 0.2125
    chosen = set(select(REWARDS, 2, "mean_deviation", np.random.default_rng(0)).tolist())
    assert chosen == {6, 1} and mean > 0  # -0.7 and 0.9 are farthest


def test_extremes_random_always_holds_the_extremes():
    for seed in range(5):
        chosen = set(select(REWARDS, 4, "extremes_random", np.random.default_rng(seed)).tolist())
        assert {1, 6} <= chosen


def test_keeping_all_returns_all():
    assert sorted(select(REWARDS, 8, "best_worst", np.random.default_rng(0)).tolist()) == list(range(8))


def test_prompt_groups_shard_whole_and_in_order():
    from solrl_core.data.prompts import shard
    from solrl_core.errors import SolrlError

    groups = [f"p{i}" for i in range(6)]
    assert [shard(groups, r, 3) for r in range(3)] == [["p0", "p1"], ["p2", "p3"], ["p4", "p5"]]
    with pytest.raises(SolrlError, match="multiple of 4"):
        shard(groups, 0, 4)
