"""The tiny moving world: its grammar, its clips, its reward, its held-out split, and its preset."""

import numpy as np
import pytest
import torch

from solrl_core.data import tinyvideo as w
from solrl_core.data.prompts import load_prompts
from solrl_core.rewards.tinyvideo import TinyVideoReward, read_clip, score
from tests.conftest import FAST


def as_tensor(clips: list[np.ndarray]) -> torch.Tensor:
    """uint8 clips [F, H, W, 3] -> [B, F, 3, H, W] in [0, 1], as a model's decode gives them."""
    return torch.from_numpy(np.stack(clips)).permute(0, 1, 4, 2, 3).float() / 255


def test_every_caption_parses_back_to_its_spec_and_others_do_not_parse():
    specs = w.every_spec()
    assert len(specs) == len({w.describe(s) for s in specs}) == 6 * 3 * 6 + 6 * 3 * 4
    assert all(w.parse(w.describe(s)) == s for s in specs)
    assert w.parse("a red circle moving to the left") == w.Spec("motion", "red", "circle", "left")
    assert w.parse("Two blue squares moving up.") == w.Spec("count", "blue", "square", "up", 2)
    for outside in ("a red circle", "a pink circle growing", "two red circles growing", "a red circle moving sideways"):
        assert w.parse(outside) is None


def test_clips_are_a_pure_function_of_the_seed():
    a, b = w.example(42), w.example(42)
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[1].shape == (w.FRAMES, w.SIZE, w.SIZE, 3)
    assert any(w.example(s)[0] != a[0] or not np.array_equal(w.example(s)[1], a[1]) for s in (43, 44))


def test_shapes_move_as_their_caption_says():
    spec = w.Spec("motion", "red", "square", "left")
    clip = w.render(spec, [(12, 8)])
    columns = [np.nonzero((frame == w.COLORS["red"]).all(-1).any(0))[0] for frame in clip]
    assert [int(c.mean()) for c in columns] == [12, 10, 8, 6]
    grow = w.render(w.Spec("motion", "red", "square", "grow"), [(8, 8)])
    assert [int((f != f[0, 0]).any(-1).sum()) for f in grow] == [9, 25, 49, 81]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_prompt_sets_are_the_generators(split):
    assert load_prompts(f"tinyvideo_{split}") == w.prompts(split)


def test_heldout_pairs_never_appear_in_training_captions_or_pre_training_clips():
    train, heldout = load_prompts("tinyvideo_train"), load_prompts("tinyvideo_heldout")
    assert len(heldout) == 30 and not set(train) & set(heldout)
    pair = lambda spec: (spec.color, spec.motion)  # noqa: E731
    assert {pair(w.parse(p)) for p in heldout} == set(w.HELDOUT_PAIRS)
    assert not {pair(w.parse(p)) for p in train} & w.HELDOUT_PAIRS
    rng = np.random.default_rng(1)
    drawn = {pair(w.sample_spec(rng, "train")) for _ in range(3000)}
    assert len(drawn) == 6 * 6 - 6 and not drawn & w.HELDOUT_PAIRS  # every other pair is seen
    assert all(w.parse(w.example(s, "train")[0]).heldout is False for s in range(300))


def test_every_ground_truth_clip_scores_one():
    caps, clips = zip(*[w.example(s, split) for s in range(60) for split in ("train", "heldout")])
    assert TinyVideoReward()(as_tensor(list(clips)), list(caps)).eq(1.0).all()


@pytest.mark.parametrize("kind", w.KINDS)
def test_a_clip_with_the_wrong_motion_scores_lower(kind):
    reward = TinyVideoReward()
    rng = np.random.default_rng(0)
    for _ in range(20):
        spec = w.sample_spec(rng)
        while spec.kind != kind:
            spec = w.sample_spec(rng)
        clip = w.render(spec, w.layout(spec, rng))
        reversed_ = clip[::-1].copy()  # left becomes right, growing shrinking: the opposite motion
        still = np.repeat(clip[:1], w.FRAMES, axis=0)
        caption = w.describe(spec)
        scores = reward(as_tensor([clip, reversed_, still]), [caption] * 3)
        assert scores[0] == 1.0 and scores[1] == 0.5 and scores[2] == 0.5, (caption, scores)


def test_count_and_object_errors_lose_their_share():
    spec = w.Spec("count", "blue", "circle", "up", 2)
    rng = np.random.default_rng(3)
    two = w.render(spec, w.layout(spec, rng))
    one = w.render(w.Spec("motion", "blue", "circle", "up"), w.layout(w.Spec("motion", "blue", "circle", "up"), rng))
    assert score(spec, read_clip(two)) == 1.0 and score(spec, read_clip(one)) == 0.75
    wrong_shape = w.render(w.Spec("count", "blue", "square", "up", 2), w.layout(spec, rng))
    assert score(spec, read_clip(wrong_shape)) == 0.75
    motion = w.Spec("motion", "green", "triangle", "down")
    other_colour = w.render(w.Spec("motion", "red", "triangle", "down"), w.layout(motion, rng))
    assert score(motion, read_clip(other_colour)) == 0.0


def test_the_reward_is_a_video_reward_with_a_score_per_kind():
    from solrl_core.errors import SolrlError
    from solrl_core.rewards.registry import BUILTIN

    assert BUILTIN["tinyvideo_geneval"].media == "video" and BUILTIN["tinyvideo_geneval"].best == 1.0
    reward = TinyVideoReward()
    prompts = ["a red circle growing", "two green squares moving down", "a blue triangle moving up"]
    assert reward.groups(prompts) == {"motion": [0, 2], "count": [1]}
    summary = reward.summary(torch.tensor([1.0, 0.5, 0.0]), prompts)
    assert summary == {"strict_accuracy": pytest.approx(1 / 3), "motion": 0.5, "count": 0.5}
    with pytest.raises(SolrlError, match="tinyvideo_train"):
        reward.check_prompts(["a red circle"])
    with pytest.raises(ValueError, match="clips"):
        reward(torch.zeros(1, 3, w.SIZE, w.SIZE), ["a red circle growing"])


def test_the_preset_loads_the_shipped_weights_and_makes_clips():
    from solrl_core.config.presets import resolve_config
    from solrl_core.models import load_model

    cfg = resolve_config("tiny_video", "sol_rl")
    assert (cfg.model.frames == w.FRAMES and cfg.model.resolution == w.SIZE and cfg.reward.weights
            == {"tinyvideo_geneval": 1.0})
    model = load_model(cfg.model, torch.device("cpu"), torch.float32)
    assert "weights tinyvideo" in model.description and model.media == "video"
    assert model.latent_shape == (3, w.FRAMES, w.SIZE, w.SIZE)
    latents = torch.zeros(2, *model.latent_shape)
    with torch.no_grad():
        v = model.velocity(model.transformer, latents, torch.tensor([1.0, 0.5]),
                           model.encode(["a red circle growing"] * 2))
    assert v.shape == latents.shape and torch.isfinite(v).all()
    assert model.decode(latents).shape == (2, w.FRAMES, 3, w.SIZE, w.SIZE)


@pytest.mark.slow
def test_one_training_iteration_runs_on_the_preset(tmp_path):
    from solrl import train
    from solrl_core import events as ev

    result = train("tiny_video", sets=[*FAST, "run.eval_prompts=tinyvideo_heldout"], run_dir=tmp_path / "r",
                   iterations=1)
    assert result.finished
    done = [e for e in result.events if isinstance(e, ev.IterationFinished)]
    assert len(done) == 1 and all(np.isfinite(v) for v in done[0].loss.values())
    evals = [e for e in result.events if isinstance(e, ev.EvalFinished)]
    assert [e.weights for e in evals] == ["base", "ema"] and set(evals[0].extras) >= {"tinyvideo_geneval.motion",
                                                                                      "tinyvideo_geneval.count"}
    from PIL import Image

    with Image.open(result.evaluation.picture) as picture:  # base beside ema, each clip as its frames in a row
        assert picture.width > picture.height and result.evaluation.picture.name == "eval_000001.png"


@pytest.mark.slow
def test_the_families_benchmark_reports_stage_one_flops_on_the_video_world(benchmark_module, capsys):
    families = benchmark_module("families")
    families.main(["--model", "tiny_video", "--families", "sol_rl", "diffusionnft", "--iterations", "2", "--warmup",
                   "1",
                   "--n", "4", "--k", "2", "--prompts-per-iteration", "1", "--threads", "2",
                   "--set", "sampler.steps=4", "--set", "explore.steps=2", "--set", "run.eval_prompts="])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["sol_rl"], ["diffusionnft"])
            and "GFLOP" in line}
    assert set(rows) == {"sol_rl", "diffusionnft"}
    # sol_rl explores at 2 steps and regenerates its K at 4; diffusionnft rolls its K out once at 4
    assert float(rows["sol_rl"][1]) > 0 and float(rows["sol_rl"][3]) > 0 and rows["diffusionnft"][3] != "-"
