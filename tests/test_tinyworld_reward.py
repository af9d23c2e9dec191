"""The tiny world's GenEval-style reward: exact on ground truth, robust to mild noise and blur,
and lowered by each kind of error a text-to-image model makes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from solrl_core.data.tinyworld import COLORS, RADIUS, SHAPES, SIZE, Obj, example, parse, render
from solrl_core.errors import SolrlError
from solrl_core.rewards.tinyworld import TinyWorldReward, analyze, score
from solrl_core.rewards.world import strict_accuracy

SEEDS = [(s, "train") for s in range(300)] + [(s, "heldout") for s in range(100)]


@pytest.fixture(scope="module")
def scenes() -> list[tuple[str, np.ndarray]]:
    return [example(seed, split) for seed, split in SEEDS]


def judge(prompt: str, image: np.ndarray) -> float:
    spec = parse(prompt)
    assert spec is not None
    return score(spec, analyze(image))


def noisy(image: np.ndarray, seed: int, std: float = 8.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(image + rng.normal(0.0, std, image.shape)), 0, 255).astype(np.uint8)


def blurred(image: np.ndarray) -> np.ndarray:
    """3x3 box blur, edges replicated."""
    pad = np.pad(image.astype(np.float32), ((1, 1), (1, 1), (0, 0)), mode="edge")
    out = sum(pad[dy:dy + SIZE, dx:dx + SIZE] for dy in range(3) for dx in range(3)) / 9
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def test_every_ground_truth_scene_scores_one(scenes):
    failed = [(seed, caption) for (seed, _), (caption, image) in zip(SEEDS, scenes) if judge(caption, image) != 1.0]
    assert failed == []


# Measured on these 400 scenes: 100% under noise (std 8/255) and 100% under the 3x3 box blur
# (also 100% for both together; with std 16/255 noise after the blur, 98.5% over 1,300 scenes).
@pytest.mark.parametrize("corrupt", ["noise", "blur"])
def test_mildly_corrupted_ground_truth_still_scores_one(scenes, corrupt):
    images = [noisy(img, i) if corrupt == "noise" else blurred(img) for i, (_, img) in enumerate(scenes)]
    rate = np.mean([judge(caption, img) == 1.0 for (caption, _), img in zip(scenes, images)])
    assert rate >= 0.97


def test_analyze_finds_colour_shape_and_centre_of_a_single_shape_anywhere():
    names = list(COLORS)
    positions = range(RADIUS + 1, SIZE - RADIUS - 1)  # every centre the layout can choose
    for i, (shape, x, y) in enumerate((s, x, y) for s in SHAPES for x in positions for y in positions):
        color = names[i % len(names)]
        clean = render([Obj(color, shape, x, y)])
        for image in (clean, blurred(clean)) if (x + y) % 2 else (clean,):  # blurred: every other
            (found,) = analyze(image)
            assert (found.color, found.shape) == (color, shape)
            assert abs(found.x - x) <= 1 and abs(found.y - y) <= 1


def test_empty_background_scores_zero_for_every_kind():
    empty = render([])
    assert analyze(empty) == []
    for prompt in ("a red circle", "two blue squares", "a red circle and a blue square",
                   "a red circle left of a blue square"):
        assert judge(prompt, empty) == 0.0


def test_object_errors():
    assert judge("a red circle", render([Obj("red", "circle", 15, 15)])) == 1.0
    assert judge("a red circle", render([Obj("red", "square", 15, 15)])) == 0.5  # wrong shape
    assert judge("a red circle", render([Obj("blue", "circle", 15, 15)])) == 0.0  # wrong colour


def test_count_errors():
    squares = [Obj("blue", "square", 8, 8), Obj("blue", "square", 22, 8), Obj("blue", "square", 8, 22)]
    assert judge("two blue squares", render(squares[:2])) == 1.0
    assert judge("two blue squares", render(squares[:1])) == 0.5  # one too few
    assert judge("two blue squares", render(squares)) == 0.5  # one too many
    assert judge("two blue squares", render([Obj("blue", "circle", 8, 8), Obj("blue", "circle", 22, 8)])) == 0.0


def test_binding_errors():
    prompt = "a red circle and a blue square"
    assert judge(prompt, render([Obj("red", "circle", 8, 15), Obj("blue", "square", 22, 15)])) == 1.0
    assert judge(prompt, render([Obj("red", "circle", 8, 15), Obj("green", "square", 22, 15)])) == 0.5
    assert judge(prompt, render([Obj("red", "circle", 8, 15), Obj("blue", "circle", 22, 15)])) == 0.75
    assert judge(prompt, render([Obj("blue", "circle", 8, 15), Obj("red", "square", 22, 15)])) == 0.5  # swapped
    assert judge(prompt, render([Obj("red", "circle", 8, 15)])) == 0.5  # missing object


def test_one_detection_serves_one_requested_object():
    assert judge("a red circle and a red square", render([Obj("red", "circle", 15, 15)])) == 0.5


def test_position_errors():
    prompt = "a red circle left of a blue square"
    left, right = (8, 15), (22, 15)
    assert judge(prompt, render([Obj("red", "circle", *left), Obj("blue", "square", *right)])) == 1.0
    assert judge(prompt, render([Obj("red", "circle", *right), Obj("blue", "square", *left)])) == 0.5  # swapped
    assert judge(prompt, render([Obj("red", "circle", *left)])) == 0.25  # missing object
    assert judge(prompt, render([Obj("red", "circle", *left), Obj("blue", "circle", *right)])) == 0.25  # wrong shape
    assert judge(prompt, render([Obj("red", "circle", *left), Obj("green", "square", *right)])) == 0.25  # wrong colour


def test_position_uses_the_triangle_centre_not_its_centroid():
    # Centres 4 px apart vertically; the triangle's centroid lies ~1.8 px lower, which alone would
    # break the relation's 3 px margin.
    image = render([Obj("blue", "triangle", 8, 10), Obj("red", "circle", 22, 14)])
    assert judge("a blue triangle above a red circle", image) == 1.0
    assert judge("a red circle below a blue triangle", image) == 1.0


def test_blur_joining_two_same_coloured_shapes_still_counts_two():
    image = blurred(render([Obj("red", "circle", 10, 15), Obj("red", "circle", 22, 15)]))
    assert [(d.color, d.shape) for d in analyze(image)] == [("red", "circle")] * 2
    assert judge("two red circles", image) == 1.0


def test_prompts_outside_the_grammar_raise_with_a_fix():
    reward = TinyWorldReward()
    reward.check_prompts(["a red circle", "two blue squares"])
    with pytest.raises(SolrlError, match="a photo of a cat") as err:
        reward.check_prompts(["a red circle", "a photo of a cat"])
    assert "tinyworld_train" in err.value.fix
    with pytest.raises(SolrlError, match="a photo of a cat"):
        reward(torch.zeros(1, 3, SIZE, SIZE), ["a photo of a cat"])


def test_batch_interface_scores_each_image_against_its_prompt():
    pairs = [
        ("a red circle", [Obj("red", "circle", 15, 15)]),
        ("a red circle", [Obj("red", "square", 15, 15)]),
        ("two blue squares", [Obj("blue", "square", 8, 8)]),
        ("a red circle and a blue square", [Obj("red", "circle", 8, 15), Obj("blue", "circle", 22, 15)]),
        ("a green triangle left of a yellow circle", [Obj("green", "triangle", 8, 9), Obj("yellow", "circle", 22, 20)]),
        ("a purple square", []),
    ]
    images = torch.from_numpy(np.stack([render(objs) for _, objs in pairs])).permute(0, 3, 1, 2).float() / 255
    reward = TinyWorldReward()
    scores = reward(images, [prompt for prompt, _ in pairs])
    assert reward.name == "tinyworld_geneval"
    assert scores.dtype == torch.float32 and scores.device.type == "cpu"
    assert scores.tolist() == [1.0, 0.5, 0.5, 0.75, 1.0, 0.0]
    assert strict_accuracy(scores) == pytest.approx(2 / 6)
    assert strict_accuracy(torch.tensor([])) == 0.0


def test_the_image_reward_refuses_clips_in_one_line_as_the_clip_reward_refuses_images():
    with pytest.raises(ValueError, match=r"tinyworld_geneval judges images \[B, 3, H, W\], not a tensor of shape \(1, "
                                         r"4, 3, 32, 32\)"):
        TinyWorldReward()(torch.zeros(1, 4, 3, SIZE, SIZE), ["a red circle"])
    with pytest.raises(ValueError, match="2 images but 1 prompts"):
        TinyWorldReward()(torch.zeros(2, 3, SIZE, SIZE), ["a red circle"])


def test_the_summary_reports_each_kind_of_prompt_apart():
    prompts = ["a red circle", "two blue squares", "a red circle and a blue square", "a red circle left of a blue "
                                                                                     "square",
               "a green triangle"]
    scores = torch.tensor([1.0, 0.5, 0.25, 0.75, 0.0])
    out = TinyWorldReward().summary(scores, prompts)
    assert out == {"strict_accuracy": pytest.approx(0.2), "object": pytest.approx(0.5), "count": pytest.approx(0.5),
                   "binding": pytest.approx(0.25), "position": pytest.approx(0.75)}
    only_pairs = TinyWorldReward().summary(scores[2:4], prompts[2:4])
    assert set(only_pairs) == {"strict_accuracy", "binding", "position"}


def test_an_evaluation_gives_each_kinds_change_a_paired_standard_error():
    """Same prompts and seeds for base and tuned: the standard error is that of the per-image
    differences, overall and within each kind (a kind of 2 images here, so a hand-checkable value)."""
    from solrl_core.loop.evaluation import Evaluation, summary
    from solrl_core.rewards import Scores

    prompts = ["a red circle", "a green square", "two blue squares", "three red circles"]
    groups = TinyWorldReward().groups(prompts)
    assert groups == {"object": [0, 1], "count": [2, 3]}

    def evaluation(weights, values):
        scores = torch.tensor(values)
        return Evaluation(weights, prompts, torch.arange(4), Scores(scores, {"tinyworld_geneval": scores}),
                          {f"tinyworld_geneval.{k}": v for k, v in TinyWorldReward().summary(scores, prompts).items()},
                          0.0,
                          {"tinyworld_geneval": groups})

    base, tuned = evaluation("base", [1.0, 0.5, 0.5, 0.0]), evaluation("ema", [1.0, 1.0, 1.0, 0.5])
    out = summary([base, tuned])
    diffs = torch.tensor([0.0, 0.5, 0.5, 0.5], dtype=torch.float64)
    assert out["ema"]["rewards"]["total"]["delta_se"] == pytest.approx(float(diffs.std() / 2))
    assert out["base"]["rewards"]["total"]["delta_se"] == 0.0 and "extras_delta" not in out["base"]
    assert out["ema"]["extras_delta"]["tinyworld_geneval.count"] == pytest.approx(0.5)
    assert out["ema"]["extras_delta_se"]["tinyworld_geneval.count"] == 0.0  # both count images rose by 0.5
    # diffs 0, 0.5: std 0.354 / sqrt 2
    assert out["ema"]["extras_delta_se"]["tinyworld_geneval.object"] == pytest.approx(0.25)
