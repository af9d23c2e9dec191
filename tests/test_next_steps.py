"""Every fix a refusal prints leads somewhere when followed: one next step, about a run that exists,
naming only what the command then accepts."""

from __future__ import annotations

import json
import re
import subprocess

from typer.testing import CliRunner

from solrl_cli.app import app
from tests.conftest import FAST

runner = CliRunner()


def _sets(*extra: str) -> list[str]:
    return [a for s in (*FAST, *extra) for a in ("--set", s)]


def test_a_failure_whose_fix_rules_out_resuming_ends_without_offering_a_resume():
    """The diverged run's last line (the trainer's RunFinished, tests/test_health.py) and its error agree."""
    from solrl_view.stop_text import finished_message
    from solrl_core import events as ev

    end = ev.RunFinished(reason="failed", iteration=1, seconds=1.0, first_reward=None, last3_reward=None, run_dir="r",
                         resumable=False)
    assert (finished_message(end) == "failed with 1 iteration finished; no checkpoint was saved; the error's fix says "
                                     "what to do next")
    assert "--resume r" in finished_message(ev.RunFinished(reason="failed", iteration=1, seconds=1.0, first_reward=None,
                                                           last3_reward=None, run_dir="r"))


def test_a_preset_typo_suggests_only_presets_that_resolve():
    from solrl_core.config.presets import resolve_config

    result = runner.invoke(app, ["train", "--preset", "tiny_video_sol_rl_tinyworld_genevl", "--dump-config"])
    assert result.exit_code == 2, result.output
    suggested = re.findall(r"'([a-z0-9_]+)'", result.output.split("did you mean", 1)[1].split("?")[0])
    assert suggested and "tiny_video_sol_rl_tinyworld_geneval" not in suggested  # a video model with an image reward
    for name in suggested:
        resolve_config(preset=name)  # each one is accepted


def test_an_empty_prompt_suggests_words_the_chosen_model_knows():
    import torch

    from solrl_core.config.presets import resolve_config
    from solrl_core.models import load_model
    from solrl_core.tools.inference import check_vocabulary

    for model in ("tiny", "tiny_video"):
        result = runner.invoke(app, ["infer", "--model", model, "--prompt", ""])
        assert result.exit_code == 2, result.output
        example = re.search(r"e\.g\. --prompt '([^']+)'", result.output).group(1)
        # the check `infer` makes before it writes anything: the model knows every word of the example
        check_vocabulary(load_model(resolve_config(model, "sol_rl").model, torch.device("cpu"),
                                    torch.float32), [example])


def test_a_plugin_of_the_wrong_shape_is_refused_before_the_model_loads_and_leaves_no_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import torch\n\ndef score(images, prompts):\n    return "
                                     "torch.zeros(images.shape[0], 2)\n")
    loaded = []
    import solrl_core.loop.session as session

    monkeypatch.setattr(session, "open_engine", lambda *a, **k: loaded.append(1))
    result = runner.invoke(app, ["train", "--reward", "bad.py:score", *_sets("run.eval_prompts="), "--run-dir", "run"])
    assert result.exit_code == 2, result.output
    assert "returned shape [2, 2] for 2 images, not [2] (on a probe batch of 2 random 32x32 images" in result.output
    assert loaded == [] and not (tmp_path / "run").exists()


def test_a_run_that_failed_before_its_first_iteration_starts_again_with_the_same_command(tmp_path, monkeypatch):
    """A reward that fails on the first real batch (past the probe) ends the run with no checkpoint:
    the same command then starts it again instead of being refused as 'already holds a run'."""
    from solrl_core.io.rundir import check_new_run_dir, list_checkpoints

    monkeypatch.chdir(tmp_path)
    (tmp_path / "late.py").write_text("import torch\n\ndef score(images, prompts):\n    if len(prompts) > 2:\n        "
                                      "raise ValueError('only small batches')\n    return torch.zeros(len(prompts))\n")
    args = ["train", "--reward", "late.py:score", *_sets("run.eval_prompts=", "reward.retries=0"), "--iterations", "1",
            "--run-dir", "run"]
    first = runner.invoke(app, args)
    assert first.exit_code == 2 and "only small batches" in first.output, first.output
    assert (tmp_path / "run" / "config.toml").is_file()  # the run had started
    assert "continues from iter_000000" not in first.output and list_checkpoints(tmp_path / "run") == []
    check_new_run_dir("run")  # what refused the same command ("already holds a run") now lets it start again


def test_compare_on_a_damaged_log_names_the_line_and_how_to_go_on(tmp_path):
    from tests.helpers import record_events as _record

    run = tmp_path / "run"
    run.mkdir()
    _record(run, "sol_rl", [0.5, 0.6], seconds=3.0)
    log = run / "events.jsonl"
    lines = log.read_text().splitlines()
    lines[2] = lines[2][:30] + "#" + lines[2][31:]  # one byte flipped in the middle of the file
    log.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["compare", str(run), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output  # the line is skipped with one warning, the rest compared
    said = result.output.replace("\n", "")
    assert result.output.count("warning:") == 1 and f"{log} line 3 skipped: damaged (not JSON" in said
    assert "other folders" not in said and f"sed -i '3d' {log}" in said
    subprocess.run(["sed", "-i", "3d", str(log)], check=True)  # the fix, followed
    again = runner.invoke(app, ["compare", str(run), "--out", str(tmp_path / "out")])
    assert again.exit_code == 0 and "warning:" not in again.output
    assert all(json.loads(line) for line in log.read_text().splitlines())
