"""Figures and names the docs give that the code decides, checked against the code: the run folder's
name (README), the tiny preset's evaluation set and its size (docs/commands.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_names_run_folders_as_they_are_made(tmp_path, monkeypatch):
    from solrl_core.io.rundir import fresh_run_dir

    monkeypatch.chdir(tmp_path)
    made = fresh_run_dir("tiny_sol_rl_tinyworld_geneval")
    assert made.parent == Path("runs") and re.fullmatch(r"\d{8}-\d{6}-tiny_sol_rl_tinyworld_geneval", made.name)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`runs/<time>-<preset>/`" in readme and "<preset>-<time>" not in readme


def test_commands_md_gives_the_tiny_presets_evaluation_set_and_its_size():
    from solrl_core.config.presets import resolve_config
    from solrl_core.data.prompts import load_prompts

    text = re.sub(r"\s+", " ", (ROOT / "docs" / "commands.md").read_text(encoding="utf-8"))
    said = re.search(r"The tiny preset evaluates `(\w+)` \((\d+) prompts x (\d+) seeds, (\d+) images", text)
    assert said, "docs/commands.md no longer says what the tiny preset evaluates"
    run = resolve_config("tiny", "sol_rl").run
    prompts = len(load_prompts(run.eval_prompts))
    assert said.groups() == (run.eval_prompts, str(prompts), str(run.eval_seeds), str(prompts * run.eval_seeds))


def test_the_readme_gives_the_default_runs_figures_over_three_seeds_of_the_preset_as_it_is(monkeypatch):
    """The README's figures of the default run are the mean and spread over run seeds 0 1 2 of
    docs/frontier_results.json's runs of the tiny preset as it is now (each run keyed by the digest of its
    config): a changed preset, or a figure typed by hand, fails here until the runs are made again."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("frontier", None)
    import frontier

    data = frontier.load_results(ROOT / "docs" / "frontier_results.json")
    rows = frontier.summarise(data, [("default", [])], [0, 1, 2], [], frontier.config_digest("tiny"))
    assert rows and rows[0]["n"] == 3, "no three runs of the tiny preset as it is now in docs/frontier_results.json"
    row = rows[0]
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    gain, fidelity = row["gain"], row["fidelity_change"]
    assert f"gains {gain[0]:+.3f} +- {gain[1]:.3f} held-out" in readme
    assert f"moves {fidelity[0]:+.3f} +- {fidelity[1]:.3f}" in readme
    kinds = ", ".join(f"{k} {row['kinds'][k][0]:+.3f}" for k in ("count", "binding", "position"))
    assert kinds in readme and row["every_kind_up"]
