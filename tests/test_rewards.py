"""Several rewards at once, their aggregation, reward health, and reward configuration."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.convert import set_value
from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.loop.nft import combined_advantages, group_advantages
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.rewards import RewardSet, parse_weights
from solrl_core.rewards.base import RewardContext
from solrl_core.rewards.health import RewardHealth, near_constant
from solrl_core.rewards.registry import BUILTIN, RewardInfo


def test_reward_spec_parses_weights_and_rejects_nonsense():
    assert parse_weights("imagereward=1.0, pickscore=0.5") == {"imagereward": 1.0, "pickscore": 0.5}
    assert parse_weights("hpsv2") == {"hpsv2": 1.0}
    with pytest.raises(SolrlError, match="not a number"):
        parse_weights("imagereward=lots")
    with pytest.raises(SolrlError, match="named twice"):
        parse_weights("pickscore=1,pickscore=2")


def test_several_rewards_on_the_command_line_become_the_weights():
    cfg = resolve_config("tiny", "sol_rl", reward="jpeg_compressibility=1.0,jpeg_incompressibility=0.25")
    assert cfg.reward.weights == {"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.25}
    assert cfg.preset == "tiny_sol_rl_jpeg_compressibility+jpeg_incompressibility"
    with pytest.raises(SolrlError, match="did you mean 'pickscore'"):
        resolve_config("tiny", "sol_rl", reward="pikscore=1,hpsv2=1")


def test_reward_paths_take_one_entry_at_a_time_and_must_name_a_used_reward():
    cfg = set_value(Config(), "reward.weights=hpsv2=1.0")
    cfg = set_value(cfg, "reward.paths.hpsv2=/ckpts/hps")
    assert cfg.reward.paths == {"hpsv2": "/ckpts/hps"}
    assert set_value(cfg, "reward.paths=hpsv2=/other").reward.paths == {"hpsv2": "/other"}
    with pytest.raises(SolrlError, match="not among the run's rewards"):
        set_value(cfg, "reward.paths.pickscore=/x").validate()


def test_sum_aggregation_is_the_advantage_of_the_weighted_sum():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([10.0, 0.0, 30.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    total = a + 0.5 * b
    got = combined_advantages(total, {"a": a, "b": b}, {"a": 1.0, "b": 0.5}, groups, "sum", 5.0)
    assert torch.allclose(got, group_advantages(total, groups, 5.0))


def test_advantage_aggregation_normalises_each_reward_before_weighting():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])  # small scale
    b = torch.tensor([1000.0, 0.0, 0.0, 1000.0])  # large scale, opposite order in group 1
    groups = torch.tensor([0, 0, 1, 1])
    got = combined_advantages(a + b, {"a": a, "b": b}, {"a": 1.0, "b": 1.0}, groups, "advantage", 100.0)
    # by hand: per reward (r - group mean) / (batch std + 1e-4), then summed
    adv_a = torch.tensor([-0.5, 0.5, -0.5, 0.5]) / (a.std(unbiased=False) + 1e-4)
    adv_b = torch.tensor([500.0, -500.0, -500.0, 500.0]) / (b.std(unbiased=False) + 1e-4)
    assert torch.allclose(got, adv_a + adv_b, atol=1e-5)
    # the raw sum would let b decide alone; here a's order still counts as much as b's
    summed = combined_advantages(a + b, {"a": a, "b": b}, {"a": 1.0, "b": 1.0}, groups, "sum", 100.0)
    assert not torch.allclose(got, summed, atol=1e-2)
    assert torch.allclose(combined_advantages(a, {"a": a}, {"a": 1.0}, groups, "advantage", 5.0),
                          combined_advantages(a, {"a": a}, {"a": 1.0}, groups, "sum", 5.0))


def test_advantage_aggregation_is_clipped():
    a = torch.tensor([0.0, 1.0, 0.0, 1.0])
    got = combined_advantages(a, {"a": a}, {"a": 100.0}, torch.tensor([0, 0, 1, 1]), "advantage", 5.0)
    assert got.abs().max() == 5.0


def test_health_fires_on_a_constant_reward_and_stays_silent_on_a_healthy_one():
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    health = RewardHealth(min_std=1e-6, patience=2)
    healthy = torch.tensor([0.1, 0.5, 0.3, 0.9, 0.2, 0.4])
    assert health.check({"good": healthy}, groups) == [] and health.failure() is None
    findings = health.check({"good": healthy, "flat": torch.full((6,), 0.7)}, groups)
    assert [f.reward for f in findings] == ["flat"] and "near-constant" in findings[0].message
    assert health.failure() is None  # one iteration is a warning, not yet an error
    health.check({"good": healthy, "flat": torch.full((6,), 0.7)}, groups)
    err = health.failure()
    assert err is not None and "'flat'" in err.message and "reward.paths.flat" in err.fix
    health.check({"good": healthy, "flat": healthy}, groups)  # recovered: the streak restarts
    assert health.failure() is None


def test_health_sees_a_reward_constant_within_every_group():
    groups = torch.tensor([0, 0, 1, 1])
    assert "within each of 2 prompt groups" in near_constant(torch.tensor([1.0, 1.0, 2.0, 2.0]), groups, 1e-6)
    assert near_constant(torch.tensor([1.0, 1.1, 2.0, 2.0]), groups, 1e-6) is None


class _Constant:
    name = "constant"

    def __call__(self, images, prompts):
        return torch.zeros(images.shape[0])


def test_a_constant_reward_warns_then_stops_the_run_with_a_checkpoint(fast_sets, monkeypatch):
    monkeypatch.setitem(BUILTIN, "constant", RewardInfo("constant", "always 0", lambda ctx: _Constant()))
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("reward.weights=constant=1.0", "run.iterations=5",
                                                          "reward.health_patience=2"))
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    with pytest.raises(SolrlError, match="near-constant for 2 iterations"):
        train(cfg, bus, stop=StopFlag())
    warnings = [e for e in seen if isinstance(e, ev.RunWarning)]
    assert len(warnings) == 2 and all("reward 'constant' is near-constant" in w.message for w in warnings)
    assert [e.iteration for e in seen if isinstance(e, ev.CheckpointSaved)] == [2]
    assert seen[-1].reason == "failed"


def test_a_healthy_reward_gives_no_health_warning(fast_sets):
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    train(resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=2")), bus, stop=StopFlag())
    assert not [e for e in seen if isinstance(e, ev.RunWarning) and "near-constant" in e.message]


def test_advantage_aggregation_trains_with_two_rewards_and_logs_each(fast_sets):
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    cfg = resolve_config("tiny", "sol_rl", reward="tinyworld_geneval=1.0,jpeg_compressibility=0.5",
                         sets=fast_sets("run.iterations=1", "reward.aggregation=advantage"))
    train(cfg, bus, stop=StopFlag())
    it = next(e for e in seen if isinstance(e, ev.IterationFinished))
    assert set(it.final.components) == {"tinyworld_geneval", "jpeg_compressibility"}
    assert set(it.draft.components) == {"tinyworld_geneval", "jpeg_compressibility"}


def test_unknown_reward_and_a_missing_backend_are_clear_errors(monkeypatch):
    with pytest.raises(SolrlError, match="did you mean 'hpsv2'"):
        RewardSet({"hpsv3": 1.0})

    def missing(ctx):
        raise ImportError("No module named 'open_clip'")
    monkeypatch.setitem(BUILTIN, "hpsv2", replace(BUILTIN["hpsv2"], build=missing))
    with pytest.raises(SolrlError, match=r"solrl\[rewards\]"):
        RewardSet({"hpsv2": 1.0})


@pytest.mark.parametrize("name",
                         sorted(n for n, info in BUILTIN.items() if info.build is not None and not info.weights))
def test_every_reward_without_weights_builds_and_scores_in_its_range(name):
    """Each weight-free built-in is built through its registry entry and scores a batch: one float per
    image (per clip for a video reward), finite, and no higher than its declared best."""
    info = BUILTIN[name]
    reward = info.build(RewardContext(torch.device("cpu"), torch.float32))
    shape = (2, 4, 3, 16, 16) if info.media == "video" else (2, 3, 32, 32)
    prompts = {"tinyworld_geneval": ["a red circle", "two blue squares"],
               "tinyworld_fidelity": ["a red circle", "two blue squares"],
               "tinyvideo_geneval": ["a red circle moving to the left",
                                     "two blue squares moving up"]}.get(name, ["a photo", "a cat"])
    scores = torch.as_tensor(reward(torch.rand(shape, generator=torch.Generator().manual_seed(0)), prompts))
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    assert info.best is None or bool((scores <= info.best).all())


def test_image_reward_and_open_clip_import_on_this_install():
    from solrl_core.rewards.compat import import_image_reward

    classes = import_image_reward()
    assert isinstance(classes.BertModel, type) and issubclass(classes.BertModel, torch.nn.Module)
    import open_clip  # noqa: F401
    import torchvision  # noqa: F401
