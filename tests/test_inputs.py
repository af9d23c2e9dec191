"""Bad input answered with one clear line (never `internal error`), questionable input refused,
printed text shown as written (no rich markup eaten), and config errors answered before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from solrl_cli.app import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    return tmp_path


def _clear_error(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "internal error" not in result.output
    for word in words:
        assert word in result.output, result.output


# -- item 14: config errors come before torch ------------------------------------------------------

_PROBE = """
import sys
from typer.testing import CliRunner
from solrl_cli.app import app
result = CliRunner().invoke(app, sys.argv[1:])
print(result.exit_code)
print(result.output)
print("TORCH" if "torch" in sys.modules else "NO-TORCH")
"""


@pytest.mark.parametrize("args,message", [
    (["train", "--set", "nope.x=1"], "unknown config section 'nope'"),
    (["train", "--model", "nosuch"], "unknown model 'nosuch'"),
    (["train", "--reward", "nosuch"], "unknown reward"),
    (["train", "--set", "optimizer.lr=-1"], "optimizer.lr"),
    (["infer", "--set", "nope.x=1"], "unknown config section 'nope'"),
])
def test_config_errors_are_answered_without_importing_torch(args, message, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SOLRL_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "2", proc.stdout + proc.stderr
    assert message in proc.stdout
    assert lines[-1] == "NO-TORCH", "torch was imported before the config error was reported"


def test_existing_run_dir_is_refused_before_anything_loads(tmp_path):
    (tmp_path / "old" / "checkpoints" / "iter_000001").mkdir(parents=True)  # a run with a checkpoint: one
    (tmp_path / "old" / "config.toml").write_text("")  # without any starts again (test_stopping.py)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PROBE, "train", "--run-dir", "old"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert "already holds a run" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH"


# -- item 10: bad values are clear errors, not internal ones ---------------------------------------

def test_yaml_syntax_error_names_line_and_column(in_tmp):
    (in_tmp / "bad.yaml").write_text("optimizer:\n  lr: [1e-4\nrun:\n  seed: 1\n")
    result = runner.invoke(app, ["train", "--config", "bad.yaml"])
    _clear_error(result, "bad.yaml could not be parsed at line", "column")


@pytest.mark.parametrize("assignment,words", [
    ("optimizer.lr=-1", ("optimizer.lr=-1", "> 0")),
    ("optimizer.lr=0", ("optimizer.lr=0", "> 0")),
    ("optimizer.beta2=1.5", ("optimizer.beta2=1.5", "in [0, 1)")),
    ("optimizer.eps=nan", ("optimizer.eps=nan", "> 0")),
    ("algorithm.adv_clip_max=-2", ("algorithm.adv_clip_max=-2", "> 0")),
    ("optimizer.weight_decay=-0.1", ("optimizer.weight_decay=-0.1", ">= 0")),
    ("run.threads=-1", ("run.threads=-1", ">= 0")),
])
def test_out_of_range_values_name_field_value_and_range(assignment, words, in_tmp):
    result = runner.invoke(app, ["train", "--set", assignment])
    _clear_error(result, "out of range", *words)
    assert not (in_tmp / "runs").exists()


FAST_ARGS = [a for s in ("explore.group_size=8", "selection.group_size=4", "explore.steps=2", "sampler.steps=4",
                         "run.prompts_per_iteration=2", "sampler.rollout_batch=16", "optimizer.micro_batch=8",
                         "algorithm.timestep_fraction=0.5", "run.threads=2", "model.resolution=32", "run.eval_prompts=")
             for a in ("--set", s)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny run trained to its end (2 iterations, a checkpoint at the end)."""
    run = tmp_path_factory.mktemp("finished") / "run"
    result = runner.invoke(app, ["train", *FAST_ARGS, "--iterations", "2", "--device", "cpu", "--run-dir", str(run)])
    assert result.exit_code == 0, result.output
    return run


def _copy_run(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to / "run", ignore=shutil.ignore_patterns("*.lock", ".lock*"))
    return to / "run"


def test_bad_value_in_a_runs_saved_config_is_a_clear_error(finished_run, in_tmp):
    run = _copy_run(finished_run, in_tmp)
    cfg = run / "config.toml"
    cfg.write_text(cfg.read_text().replace("lr = 0.0003", "lr = -5"))
    result = runner.invoke(app, ["train", "--resume", str(run), "--iterations", "4"])
    _clear_error(result, "optimizer.lr=-5", "> 0")


def test_changed_lora_rank_is_blamed_on_the_config_not_the_checkpoint(finished_run, in_tmp):
    run = _copy_run(finished_run, in_tmp)
    cfg = run / "config.toml"
    text = cfg.read_text()
    rank = int(text.split("lora_rank = ")[1].split()[0])
    cfg.write_text(text.replace(f"lora_rank = {rank}", f"lora_rank = {rank * 2}"))
    result = runner.invoke(app, ["train", "--resume", str(run), "--iterations", "4"])
    _clear_error(result, f"lora_rank ({rank * 2})", f"(rank {rank})", f"restore lora_rank = {rank}")
    assert "corrupt" not in result.output


def test_resume_of_a_finished_run_says_how_to_go_further(finished_run, in_tmp):
    run = _copy_run(finished_run, in_tmp)
    result = runner.invoke(app, ["train", "--resume", str(run)])
    _clear_error(result, "already reached its 2 iterations", "--iterations 4")


# -- item 13: bracketed text is printed as written -------------------------------------------------

def test_presets_show_bracketed_text_as_written():
    result = runner.invoke(app, ["presets"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "solrl[rewards]" in result.output
    assert "FLUX.2 [klein] 4B" in result.output


def test_help_shows_the_tracking_extra():
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    assert ".[tracking]" in result.output


def test_error_messages_keep_brackets(in_tmp):
    result = runner.invoke(app, ["train", "--reward", "pickscore[x]=1"])
    _clear_error(result, "pickscore[x]")


# -- item 17: plurals ------------------------------------------------------------------------------

def test_plural():
    from solrl_core.text import plural

    assert (plural(1, "iteration"), plural(0, "prompt"), plural(3, "seed")) == ("1 iteration", "0 prompts", "3 seeds")
    assert plural(2, "loss", "losses") == "2 losses"


# -- item 11: input that was accepted and should not be --------------------------------------------

def test_model_path_is_refused_for_the_tiny_model(in_tmp):
    result = runner.invoke(app, ["train", "--model-path", "/nonexistent"])
    _clear_error(result, "tiny model takes no --model-path", "model.weights")
    assert not (in_tmp / "runs").exists()


def test_a_model_path_that_does_not_exist_is_refused(in_tmp):
    result = runner.invoke(app, ["train", "--model", "sana", "--model-path", "/nonexistent", "--dump-config"])
    _clear_error(result, "/nonexistent does not exist")


def test_infer_names_words_outside_the_tiny_vocabulary(in_tmp):
    result = runner.invoke(app, ["infer", "--prompt", "a red dog above a blue zebra", "--steps", "2", "--seeds", "1",
                                 "--device", "cpu", "--out", "imgs", "--set", "model.resolution=32"])
    _clear_error(result, "'dog', 'zebra'", "circle")
    assert not (in_tmp / "imgs").exists()
