"""`solrl bench` figures from several iterations: each phase's median with its spread, and the ratio
against the compiled baseline with the range the iterations allow, said when that range holds 1.0x
(two noisy iterations once printed "2.73x vs compile" with nothing to judge it by)."""

import pytest

from solrl_cli.bench_cmd import ratio_text
from solrl_core import events as ev
from solrl_core.bench import run as bench_run
from solrl_core.events import RewardStats


def _iteration(i, explore, regenerate, total):
    stats = RewardStats(mean=0.0, std=0.0, best=0.0, worst=0.0, components={})
    return ev.IterationFinished(iteration=i, iterations=9,
                                seconds={"explore": explore, "regenerate": regenerate, "total": total},
                                draft=None, final=stats, loss={}, nonfinite_losses=0, grad_norm=0.0, old_decay=0.0)


def _row(family, its):
    return {"model": "sana", "family": family, **bench_run.phase_seconds(its)}


def test_each_phase_is_the_median_of_the_measured_iterations_with_their_spread():
    figures = bench_run.phase_seconds([_iteration(1, 1.0, 0.5, 2.0), _iteration(2, 3.0, 0.5, 9.0),
                                       _iteration(3, 2.0, 0.7, 4.0)])
    assert figures["seconds"]["total"] == 4.0 and figures["seconds"]["explore"] == 2.0  # the median, not the mean 5.0
    assert figures["spread"]["total"] == [2.0, 9.0] and figures["spread"]["regenerate"] == [0.5, 0.7]
    assert figures["seconds_each"]["total"] == [2.0, 9.0, 4.0]


def test_the_ratio_against_compile_carries_the_range_its_iterations_allow():
    sol = _row("sol_rl", [_iteration(1, 1.0, 1.0, 4.0), _iteration(2, 1.0, 1.0, 5.0), _iteration(3, 2.0, 1.0, 6.0)])
    compiled = _row("compile", [_iteration(1, 3.0, 2.0, 8.0), _iteration(2, 4.0, 2.0, 10.0),
                                _iteration(3, 3.0, 3.0, 12.0)])
    bench_run.add_ratios([sol, compiled])
    vs = sol["vs_compile"]
    assert vs["total"] == 10.0 / 5.0 and vs["total_range"] == [8.0 / 6.0, 12.0 / 4.0]
    assert vs["rollout"] == (3.0 + 2.0) / (1.0 + 1.0) and vs["rollout_range"] == [5.0 / 3.0, 6.0 / 2.0]
    assert compiled["vs_compile"] is None


@pytest.mark.parametrize("span,overlaps", [([0.8, 1.6], True), ([1.05, 1.6], False), ([0.5, 0.9], False)])
def test_the_report_says_when_the_spread_overlaps_one(span, overlaps):
    text = ratio_text(1.2, span)
    assert text.startswith(f"1.20x (range {span[0]:.2f}x-{span[1]:.2f}x")
    assert ("overlaps 1.0x" in text) == overlaps


def test_the_default_bench_measures_several_iterations():
    options = bench_run.BenchOptions()
    assert options.iterations - options.warmup >= 5
