"""A run started with a relative prompt path resumes from any folder (its config.toml holds the path
made absolute), and a saved path that is gone is blamed on the run's config.toml and its key, not on
a --prompts the user never gave."""

import pytest
import tomllib
from typer.testing import CliRunner

from solrl_cli.app import app
from tests.conftest import FAST

runner = CliRunner()
CAPTIONS = "a red circle\ntwo blue squares\na green triangle left of a yellow circle\n"


@pytest.fixture
def started(tmp_path, monkeypatch):
    """A one-iteration run started in `first/` with --prompts p.txt (relative); the test then stands in `other/`."""
    monkeypatch.delenv("SOLRL_DEBUG", raising=False)
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    (first / "p.txt").write_text(CAPTIONS)
    monkeypatch.chdir(first)
    sets = [a for s in (*FAST, "run.eval_prompts=") for a in ("--set", s)]
    result = runner.invoke(app, ["train", *sets, "--prompts", "p.txt", "--run-dir", "r", "--iterations", "1"])
    assert result.exit_code == 0, result.output
    monkeypatch.chdir(other)
    return first


@pytest.mark.slow
def test_a_relative_prompt_path_is_saved_absolute_and_the_run_resumes_from_another_folder(started):
    saved = tomllib.loads((started / "r" / "config.toml").read_text())
    assert saved["run"]["prompts"] == str(started / "p.txt")
    result = runner.invoke(app, ["train", "--resume", str(started / "r"), "--iterations", "2"])
    assert result.exit_code == 0, result.output
    assert "resuming at iteration 1" in result.output and (started / "r" / "checkpoints" / "iter_000002").is_dir()


@pytest.mark.slow
def test_a_saved_prompt_file_that_is_gone_blames_the_runs_config_and_its_key(started):
    (started / "p.txt").unlink()
    result = runner.invoke(app, ["train", "--resume", str(started / "r"), "--iterations", "2"])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())  # the console may wrap the long line
    assert f"{started / 'p.txt'} does not exist: run.prompts in {started / 'r' / 'config.toml'}" in out
    assert "--set run.prompts=PATH" in out and "given to --prompts" not in out
