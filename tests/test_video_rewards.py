"""Rewards on video clips: image rewards scored on sampled frames (how many, how combined), the
temporal-consistency reward, and the one-line refusals of a reward that cannot judge what the model
makes. Offline: programmatic rewards and a tiny random CLIP saved locally."""

from __future__ import annotations

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.rewards import RewardSet
from solrl_core.rewards.jpeg import JpegSize
from solrl_core.rewards.video import frame_indices, score_frames
from tests.helpers import clip_dir  # noqa: F401,F811  (fixtures, used by name)


def clips(b: int = 2, f: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.rand(b, f, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_frame_indices_are_evenly_spaced_first_and_last_included():
    assert frame_indices(5, 0) == [0, 1, 2, 3, 4]
    assert frame_indices(5, 9) == [0, 1, 2, 3, 4]
    assert frame_indices(5, 2) == [0, 4]
    assert frame_indices(9, 3) == [0, 4, 8]
    assert frame_indices(81, 4) == [0, 27, 53, 80]
    assert frame_indices(5, 1) == [2]


def test_an_image_reward_scores_each_clip_on_its_frames_then_combines():
    reward = JpegSize("jpeg_incompressibility", sign=1.0, scale=1.0)
    video = clips()
    per_frame = torch.stack([reward(video[i], ["p"] * 5) for i in range(2)])  # [B, F], each frame on its own
    assert torch.allclose(score_frames(reward, video, ["a", "b"]), per_frame.mean(dim=1))
    assert torch.allclose(score_frames(reward, video, ["a", "b"], count=2), per_frame[:, [0, 4]].mean(dim=1))
    assert torch.equal(score_frames(reward, video, ["a", "b"], reduce="min"), per_frame.min(dim=1).values)
    seen: list[list[str]] = []
    score_frames(lambda x, p: seen.append(p) or torch.zeros(len(p)), video, ["a", "b"], count=3)
    assert seen == [["a"] * 3 + ["b"] * 3]  # every frame scored with its own clip's prompt, in one call


def test_a_reward_set_scores_clips_as_the_reward_section_says():
    video = clips(seed=1)
    frames = RewardSet({"jpeg_incompressibility": 1.0}, video_frames=2, frame_reduce="min")(video, ["a", "b"])
    jpeg = JpegSize("jpeg_incompressibility", sign=1.0, scale=1.0)
    expected = torch.minimum(jpeg(video[:, 0], ["a", "b"]), jpeg(video[:, 4], ["a", "b"]))
    assert torch.equal(frames.total, expected)
    images = RewardSet({"jpeg_incompressibility": 1.0})(video[:, 0], ["a", "b"])  # images pass through as before
    assert torch.equal(images.total, jpeg(video[:, 0], ["a", "b"]))
    cfg = resolve_config("wan21_t2v_1_3b", "sol_rl", "jpeg_incompressibility",
                         sets=["reward.video_frames=2", "reward.frame_reduce=min"])
    assert (cfg.reward.video_frames, cfg.reward.frame_reduce) == (2, "min")


def test_temporal_consistency_is_one_for_a_still_clip_and_lower_when_frames_change(clip_dir):  # noqa: F811
    rewards = RewardSet({"temporal_consistency": 1.0}, paths={"temporal_consistency": str(clip_dir)})
    still = clips(2, 1).expand(2, 4, 3, 16, 16)
    moving = clips(2, 4, seed=3)
    assert torch.allclose(rewards(still, ["a", "b"]).total, torch.ones(2), atol=1e-5)
    score = rewards(moving, ["a", "b"]).total
    assert (score < 1 - 1e-4).all() and (score >= -1).all()
    # The same frames in another order: consecutive pairs change, so does the score (it is about motion).
    reordered = rewards(moving[:, [0, 2, 1, 3]], ["a", "b"]).total
    assert not torch.allclose(score, reordered)


def test_a_reward_that_cannot_judge_the_models_samples_is_refused_in_one_line():
    with pytest.raises(SolrlError,
                       match="reward 'temporal_consistency' judges videos and this model makes images") as err:
        resolve_config("sana", "sol_rl", "temporal_consistency").validate()
    assert "\n" not in str(err.value) and "wan21_t2v_1_3b" in err.value.fix
    with pytest.raises(SolrlError, match="run.eval_rewards"):
        resolve_config("sana", "sol_rl", sets=["run.eval_rewards=temporal_consistency"]).validate()
    with pytest.raises(SolrlError, match="tinyworld_fidelity' judges only the tiny world's still images"):
        resolve_config("wan21_t2v_1_3b", "sol_rl", "tinyworld_fidelity").validate()
    both = resolve_config("wan21_t2v_1_3b", "sol_rl", "imagereward=1.0,temporal_consistency=0.5")
    assert both.validate().reward.weights == {"imagereward": 1.0, "temporal_consistency": 0.5}
