"""benchmarks/tune_tiny.py: candidates parse or fail with a clear message, one short candidate trains
and is scored per kind before and after, and "worst kind gain" ignores only a kind held at its
ceiling. Nothing here checks a timing or a reward level."""

from __future__ import annotations

import argparse
import json

import pytest


@pytest.fixture
def tune(benchmark_module):
    return benchmark_module("tune_tiny")


def test_candidates_parse_and_bad_ones_are_named(tune):
    assert tune.parse_candidate("default") == ("default", [])
    assert tune.parse_candidate("fast=optimizer.lr=5e-4; run.iterations=40") == ("fast", ["optimizer.lr=5e-4",
                                                                                          "run.iterations=40"])
    with pytest.raises(argparse.ArgumentTypeError, match="has no name"):
        tune.parse_candidate("=optimizer.lr=5e-4")
    with pytest.raises(argparse.ArgumentTypeError, match="'lr' is not SECTION.KEY=VALUE"):
        tune.parse_candidate("x=lr")
    with pytest.raises(SystemExit):
        tune.parse_args(["--candidate", "a", "--candidate", "a"])


def test_worst_kind_gain_skips_only_a_kind_held_at_the_ceiling(tune):
    base = {"object": 1.0, "count": 0.8, "binding": 0.9, "position": 0.6}
    assert tune.worst_gain({"base": base,
                            "ema": {**base, "count": 0.85, "binding": 0.92, "position": 0.7}}) == pytest.approx(0.02)
    fell = {**base, "object": 0.98, "count": 0.85, "binding": 0.92, "position": 0.7}
    assert tune.worst_gain({"base": base, "ema": fell}) == pytest.approx(-0.02)  # at the ceiling, but it fell
    assert tune.worst_gain({"base": base, "ema": {**base, "count": 0.79}}) == pytest.approx(-0.01)


def test_a_short_candidate_is_scored_per_kind_before_and_after(tune, tmp_path, capsys):
    out = tmp_path / "tune.json"
    tune.main(["--device", "cpu", "--candidate", "short=run.iterations=1;run.prompts_per_iteration=2", "--eval-seeds",
               "1",
               "--eval-prompts", "tinyworld_train", "--set", "explore.group_size=4", "--set", "selection.group_size=2",
               "--json", str(out)])
    (r,) = json.loads(out.read_text())["candidates"]
    assert r["name"] == "short" and r["iterations"] == 1 and r["samples"] == 64 and r["train_s"] > 0
    for weights in ("base", "ema"):
        assert set(r[weights]) == {"mean", "object", "count", "binding", "position"}  # tinyworld_train has every kind
        assert all(0.0 <= v <= 1.0 for v in r[weights].values())
    assert set(r["se"]) == {"mean", "object", "count", "binding",
                            "position"} and all(v >= 0.0 for v in r["se"].values())
    text = capsys.readouterr().out
    assert ("| short | run.iterations=1; run.prompts_per_iteration=2 | 1 |" in text and "scored on tinyworld_train x 1 "
                                                                                        "seeds" in text)
