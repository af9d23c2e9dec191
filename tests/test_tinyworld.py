"""The synthetic world: determinism, grammar round trip, and the held-out split really held out."""

import numpy as np
import pytest

from solrl_core.data import tinyworld as w
from solrl_core.data.prompts import load_prompts


def test_scenes_are_a_pure_function_of_the_seed():
    a, b = w.example(42), w.example(42)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert not np.array_equal(w.example(43)[1], a[1]) or w.example(43)[0] != a[0]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_shipped_prompt_sets_match_the_generator(split):
    assert load_prompts(f"tinyworld_{split}") == w.prompt_set(split, 64)


def test_the_default_run_trains_on_count_most_and_never_on_a_heldout_pair():
    """The tiny preset's training prompts are the generator's: half count captions, a quarter each of
    binding and position (tinyworld_train's own), no object caption, no held-out pair."""
    from collections import Counter

    from solrl_core.config.presets import resolve_config

    run = resolve_config("tiny").run
    prompts = load_prompts(run.prompts)
    assert run.prompts == "tinyworld_rl" and prompts == w.rl_prompts() and len(set(prompts)) == 64
    specs = [w.parse(p) for p in prompts]
    assert Counter(s.kind for s in specs) == {"count": 32, "binding": 16, "position": 16} == w.RL_MIX
    two = [p for p, s in zip(prompts, specs) if len(s.objects) == 2]
    assert set(two) <= set(load_prompts("tinyworld_train"))
    heldout = {_pairs(w.parse(p)) for p in w.every_heldout_prompt() if len(w.parse(p).objects) == 2}
    assert not {_pairs(w.parse(p)) for p in two} & heldout


def test_captions_parse_back_to_their_spec():
    rng = np.random.default_rng(0)
    for _ in range(500):
        spec = w.sample_spec(rng)
        assert w.parse(w.describe(spec)) == spec
    assert w.parse("an orange circle above a red square").relation == "above"
    assert w.parse("a photo of a cat") is None and w.parse("a pink circle") is None


def _pairs(spec):
    return frozenset((c, s) for c, s, _ in spec.objects)


def test_heldout_pairs_never_appear_in_training_scenes():
    heldout = {_pairs(w.parse(p)) for p in load_prompts("tinyworld_heldout")}
    rng = np.random.default_rng(1)
    train_pairs = {_pairs(s) for s in (w.sample_spec(rng, "train") for _ in range(5000)) if len(s.objects) == 2}
    assert heldout and train_pairs and not heldout & train_pairs
    assert all(len(w.parse(p).objects) == 2 for p in load_prompts("tinyworld_heldout"))


def test_layout_honours_the_relation_and_keeps_shapes_apart():
    for seed in range(200):
        rng = np.random.default_rng(seed)
        spec = w.sample_spec(rng)
        objs = w.layout(spec, rng)
        if spec.relation:
            assert w.relation_holds(spec.relation, (objs[0].x, objs[0].y), (objs[1].x, objs[1].y))
        assert len(objs) == sum(n for *_, n in spec.objects)


def test_the_large_heldout_set_is_the_generators_and_every_pair_in_it_is_held_out():
    from collections import Counter

    prompts = load_prompts("tinyworld_heldout_all")
    assert prompts == w.every_heldout_prompt() and len(set(prompts)) == len(prompts) >= 200
    specs = [w.parse(p) for p in prompts]
    assert Counter(s.kind for s in specs) == {"object": 18, "count": 36, "binding": 38, "position": 152}
    rng = np.random.default_rng(1)
    train_pairs = {_pairs(s) for s in (w.sample_spec(rng, "train") for _ in range(5000)) if len(s.objects) == 2}
    two = {_pairs(s) for s in specs if len(s.objects) == 2}
    assert not two & train_pairs
    assert {_pairs(w.parse(p)) for p in load_prompts("tinyworld_heldout")} <= two  # the small set is a sample of it


def test_the_validation_set_holds_no_heldout_pair_and_no_training_caption_of_two_objects():
    from collections import Counter

    prompts = load_prompts("tinyworld_validation")
    assert prompts == w.validation_prompts() and len(set(prompts)) == len(prompts)
    specs = [w.parse(p) for p in prompts]
    assert Counter(s.kind for s in specs) == {"object": 18, "count": 36, "binding": 32, "position": 32}
    heldout = {_pairs(w.parse(p)) for p in load_prompts("tinyworld_heldout_all") if len(w.parse(p).objects) == 2}
    two = [p for p, s in zip(prompts, specs) if len(s.objects) == 2]
    assert not {_pairs(w.parse(p)) for p in two} & heldout
    assert not set(two) & (set(load_prompts("tinyworld_train")) | set(load_prompts("tinyworld_rl")))


def test_the_default_evaluation_scores_every_heldout_caption_with_the_images_each_kind_needs_in_fewer_images():
    """The tiny preset's evaluation set is the generator's: every held-out caption, each kind with the
    images its change needs (position, the widest spread, most; object at its ceiling least;
    docs/BENCHMARKS.md), and under
    three quarters of the 244 x 8 images it scored before."""
    from collections import Counter

    from solrl_core.config.presets import resolve_config

    run = resolve_config("tiny").run
    prompts = load_prompts(run.eval_prompts)
    assert run.eval_prompts == "tinyworld_eval" and prompts == w.evaluation_prompts()
    every = w.every_heldout_prompt()
    assert {p for p in every if w.parse(p).kind != "position"} <= set(prompts) <= set(every)
    positions = [p for p in prompts if w.parse(p).kind == "position"]  # every relation of every pair, once
    assert Counter(w.parse(p).relation for p in positions) == {"left of": 38, "right of": 38, "above": 38, "below": 38}
    images = {kind: n * run.eval_seeds for kind, n in Counter(w.parse(p).kind for p in prompts).items()}
    assert images == {"object": 54, "count": 432, "binding": 342, "position": 456}
    assert sum(images.values()) < 244 * 8 * 0.75
