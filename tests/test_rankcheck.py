"""Rank statistics against scipy and by hand; the explore and rank-check commands; the in-run check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from solrl_cli.app import app
from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.fidelity import average_ranks, compare, kendall_tau_b, spearman
from solrl_core.loop.trainer import StopFlag, train

runner = CliRunner()


@pytest.mark.parametrize("seed", range(5))
def test_rho_and_tau_b_match_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 5, size=24).astype(float)  # many ties, like a partial-credit reward
    b = a + rng.integers(-2, 3, size=24)
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert kendall_tau_b(a, b) == pytest.approx(stats.kendalltau(a, b, variant="b").statistic)
    assert np.allclose(average_ranks(a), stats.rankdata(a))


def test_statistics_by_hand_and_the_constant_case():
    assert spearman(np.array([1.0, 2, 3]), np.array([3.0, 2, 1])) == pytest.approx(-1.0)
    assert kendall_tau_b(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(4 / 6)
    assert spearman(np.ones(4), np.arange(4.0)) is None and kendall_tau_b(np.arange(4.0), np.ones(4)) is None


def test_hit_rates_and_selected_reward():
    draft = np.array([0.9, 0.8, 0.1, 0.2, 0.5, 0.4])
    final = np.array([1.0, 0.1, 0.9, 0.0, 0.5, 0.4])
    out = compare(draft, final, [1, 2], keep=2)
    assert out["top1"] == 1.0 and out["top2"] == 0.5  # draft's best two {0, 1}; final's {0, 2}
    assert out["bottom1"] == 0.0 and out["bottom2"] == 0.5  # draft's worst two {2, 3}; final's {3, 1}
    assert out["gap_draft"] == pytest.approx(1.0 - 0.9)  # draft keeps its best (0) and worst (2) seeds
    assert out["gap_final"] == pytest.approx(1.0 - 0.0)  # the reference keeps 0 and 3


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_explore_writes_every_seed_ranked_and_the_selection(in_tmp):
    result = runner.invoke(app, ["explore", "--prompt", "a red circle", "--prompt", "two blue squares", "--n", "6",
                                 "--k", "2",
                                 "--steps", "2", "--seed", "100", "--out", "ex"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in Path("ex/seeds.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == list(range(100, 112))
    for prompt in ("a red circle", "two blue squares"):
        group = [r for r in rows if r["prompt"] == prompt]
        assert sorted(r["rank"] for r in group) == list(range(1, 7))
        best, worst = min(group, key=lambda r: r["rank"]), max(group, key=lambda r: r["rank"])
        assert best["selected"] and worst["selected"] and sum(r["selected"] for r in group) == 2
        assert best["reward"] == max(r["reward"] for r in group)
    assert Path("ex/grid.png").is_file() and "nvfp4-emulated" in result.output


def test_rank_check_prints_four_arms_and_writes_json_and_plot(in_tmp):
    result = runner.invoke(app, ["rank-check", "--count", "2", "--seeds", "4", "--hit-k", "1", "--hit-k", "2",
                                 "--preview-steps", "2", "--full-steps", "4", "--out", "rc"])
    assert result.exit_code == 0, result.output
    for arm in ("nvfp4-emulated@2", "nvfp4-emulated@4", "fp32@2", "fp32@4 ref"):
        assert arm in result.output
    data = json.loads(Path("rc/rank_check.json").read_text())
    assert data["arms"] == ["nvfp4-emulated@2", "nvfp4-emulated@4", "fp32@2", "fp32@4"]
    assert np.array(data["rewards"]["fp32@4"]).shape == (2, 4)
    assert set(data["overall"]) == {"nvfp4-emulated@2", "nvfp4-emulated@4", "fp32@2"}
    assert Path("rc/rank_check.png").stat().st_size > 1000
    bad = runner.invoke(app, ["rank-check", "--seeds", "4", "--hit-k", "4"])
    assert bad.exit_code == 2 and "too few" in bad.output


def test_in_run_rank_check_logs_rho_and_tau_and_leaves_the_run_unchanged(fast_sets):
    def run(extra, name):
        bus, seen = ev.EventBus(), []
        bus.subscribe(seen.append)
        train(resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=2", *extra, run_dir=name)), bus,
              stop=StopFlag())
        return seen
    checked = run(["explore.rank_check_every=1"], "a")
    plain = run([], "b")
    checks = [e for e in checked if isinstance(e, ev.RankCheckResult)]
    assert [c.iteration for c in checks] == [1, 2] and all(c.seeds == 8 for c in checks)
    assert all(c.rho is None or -1 <= c.rho <= 1 for c in checks)
    finals = lambda seen: [e.final.mean for e in seen if isinstance(e, ev.IterationFinished)]  # noqa: E731
    assert finals(checked) == finals(plain)
