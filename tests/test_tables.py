"""Tables printed by the commands fit 80 columns, on a terminal and when piped: every number whole."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app
from tests.screens import consoles, printed, tokens


def rank_check_result(ks: list[int]) -> types.SimpleNamespace:
    arms = ["nvfp4-emulated@6", "nvfp4-emulated@10", "fp32@6", "fp32@10"]
    overall = {}
    for n, arm in enumerate(arms[:-1]):
        m = {"rho": 0.7123 - n / 10, "tau": 0.6117 - n / 10, "defined": 15, "prompts": 16,
             "gap_draft": 0.4123 + n / 100,
             "gap_final": 0.4691}
        m.update({f"top{k}": 0.5 + k / 100 + n / 1000 for k in ks})
        m.update({f"bottom{k}": 0.25 + k / 100 + n / 1000 for k in ks})
        overall[arm] = m
    return types.SimpleNamespace(arms=arms, overall=overall,
                                 seconds={"nvfp4-emulated@6": 131.04, "nvfp4-emulated@10": 48.75,
                                                                      "fp32@6": 24.5, "fp32@10": 41.25})


@pytest.mark.parametrize("ks", [[4, 8], [4, 8, 16]])
def test_rank_check_numbers_are_whole_at_80_columns_and_piped(monkeypatch, ks):
    from solrl_cli import explore_cmd

    result = rank_check_result(ks)
    for console in consoles():
        monkeypatch.setattr(explore_cmd, "console", console)
        monkeypatch.delenv("COLUMNS", raising=False)
        explore_cmd._print_arms(result, ks, 8, "cpu")
        text = printed(console)
        body = text.split("rho, tau:")[0]
        want = []
        for arm in result.arms[:-1]:
            m = result.overall[arm]
            want += [f"{m['rho']:.3f}", f"{m['tau']:.3f}", "15/16", f"{m['gap_draft']:.3f}", f"{m['gap_final']:.3f}"]
            want += [f"{m[f'{side}{k}']:.2f}" for side in ("top", "bottom") for k in ks]
        want += [f"{s:.1f}" for s in result.seconds.values()]
        found = tokens(body)
        assert all(w in found for w in want), (set(want) - set(found), text)
        for k in ks:  # headers whole too
            assert f"top{k}" in body and f"bot{k}" in body


def test_config_help_cuts_no_value_when_piped():
    """Each setting as `key = value` over its meaning, wrapped between words: a value is never broken
    (a table column once cut 'max-autotune-no-cudagraphs' after 'cudagr')."""
    from solrl_core.config.convert import help_table
    from solrl_core.config.presets import resolve_config

    out = CliRunner().invoke(app, ["config-help", "--all"], env={"COLUMNS": "80"}).output
    assert "…" not in out and all(len(line) <= 80 for line in out.splitlines())
    flat = re.sub(r"\s+", " ", out)
    rows = help_table(resolve_config("tiny", "sol_rl"))
    # every key and value whole
    assert all(f"{key} = {re.sub(chr(92) + 's+', ' ', value)}" in flat for key, value, _ in rows)
    assert "'max-autotune-no-cudagraphs'" in out.split()


def test_eval_table_fits_80_columns(monkeypatch, tmp_path):
    from solrl_cli import eval_cmd
    from solrl_core.config.schema import Config
    from solrl_core.loop import evaluation

    stats = {"base": {"rewards": {"tinyworld_geneval": {"mean": 0.69312, "std": 0.31234, "delta": 0.0,
                                                        "delta_se": 0.0}},
                      "extras": {"tinyworld_geneval.strict_accuracy": 0.47541, "tinyworld_geneval.position": 0.57401}},
             "ema": {"rewards": {"tinyworld_geneval": {"mean": 0.73918, "std": 0.29807, "delta": 0.04606,
                                                       "delta_se": 0.00613}},
                     "extras": {"tinyworld_geneval.strict_accuracy": 0.54303, "tinyworld_geneval.position": 0.62712},
                     "extras_delta": {"tinyworld_geneval.strict_accuracy": 0.06762,
                                      "tinyworld_geneval.position": 0.05311},
                     "extras_delta_se": {"tinyworld_geneval.position": 0.00822}}}
    monkeypatch.setattr(evaluation, "summary", lambda results: stats)
    req = types.SimpleNamespace(prompt_set="tinyworld_heldout_all", prompts=["a"] * 244, per_prompt=8, config=Config(),
                                out_dir=Path(tmp_path), save_images=False)
    for console in consoles():
        monkeypatch.setattr(eval_cmd, "console", console)
        eval_cmd._print_table([types.SimpleNamespace(weights="base")], req)
        text = printed(console)
        found = tokens(text)
        want = ["0.6931", "0.3123", "0.7392", "0.2981", "+0.0461", "0.0061", "0.4754", "0.5430", "+0.0676", "+0.0531",
                "0.0082"]
        assert all(w in found for w in want), (set(want) - set(found), text)
        assert all(h in text for h in ("weights", "mean", "std", "delta", "s.e."))


def test_grid_label_keeps_the_whole_prompt_and_its_seed():
    from solrl_core.io.images import font, grid_rows, wrap

    long = "a photo of three red cubes to the left of two small blue spheres on a wooden table"
    labels = grid_rows([long, "a cat"], [12345, 7])
    assert labels[0] == f"{long} / seed 12345" and labels[1] == "a cat / seed 7"
    lines = wrap(labels[0], font(), 200)
    assert len(lines) > 1 and " ".join(lines) == labels[0]  # wrapped, not cut: every word drawn
    assert all(font().getlength(line) <= 200 for line in lines)
