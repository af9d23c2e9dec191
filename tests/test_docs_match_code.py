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
