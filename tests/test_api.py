"""The Python API: `from solrl import train` runs what `solrl train` runs, and resumes; it prints the
CLI's plain lines, returns the evaluation and the warnings as fields; `evaluate` and `infer` are the
CLI's `eval` and `infer`."""

import logging

import pytest

import solrl
from solrl import train
from solrl_core import events as ev
from tests.conftest import FAST


def test_train_from_python_then_resume(tmp_path):
    seen = []
    first = train(sets=FAST, run_dir=tmp_path / "r", iterations=1, on_event=seen.append)
    assert first.finished and first.iteration == 1 and first.run_dir == tmp_path / "r"
    assert (first.run_dir / "checkpoints" / "iter_000001").is_dir()
    assert [type(e) for e in seen] == [type(e) for e in first.events]
    assert [e.iteration for e in first.events if isinstance(e, ev.IterationFinished)] == [1]
    more = train(resume=first.run_dir, iterations=2, quiet=True)
    assert more.finished and more.iteration == 2
    assert [e.iteration for e in more.events if isinstance(e, ev.IterationFinished)] == [2]


@pytest.fixture
def diffusers_warnings(monkeypatch):
    """What diffusers logs at warning level while the test runs (the CLI, run in-process by another
    test, may have raised its level to error)."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("diffusers")
    monkeypatch.setattr(logger, "level", logging.WARNING)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_train_prints_progress_returns_its_scores_and_evaluate_and_infer_reuse_it(tmp_path, monkeypatch, capsys,
                                                                                  diffusers_warnings):
    monkeypatch.chdir(tmp_path)
    told = []
    result = train(sets=FAST, run_dir="r", iterations=1)  # a relative folder
    printed = capsys.readouterr().out
    assert "solrl starting" in printed and "iter    1/1" in printed and "eval (base weights" in printed
    assert "done: 1 iteration" in printed and "\x1b[" not in printed  # the CLI's plain lines, no colour codes or bar
    assert result.run_dir == tmp_path / "r" and result.run_dir.is_absolute()
    report = result.evaluation
    assert report is not None and report.iteration == 1 and report.weights == "ema" and report.samples == 4
    kinds = {"reward", "tinyworld_geneval.strict_accuracy", "tinyworld_geneval.object", "tinyworld_geneval.position",
             "tinyworld_fidelity"}
    assert kinds <= set(report.metrics)
    reward = report.metrics["reward"]
    assert reward.change == pytest.approx(reward.final - reward.base) and reward.se is not None and reward.se >= 0
    assert report.picture is not None and report.picture.is_file()
    assert result.warnings == [e.message for e in result.events if isinstance(e, ev.RunWarning)]
    # solrl casts nothing already cast
    assert not [r for r in diffusers_warnings if "kept in float32" in r.getMessage()]

    scored = solrl.eval(result.run_dir, out="ev", on_progress=lambda *a: told.append(a))
    assert capsys.readouterr().out == ""  # a callback replaces the printing
    assert scored.out_dir == tmp_path / "ev" and (scored.out_dir / "summary.json").is_file()
    ema = scored.reports["ema"].metrics["reward"]
    # the run's own evaluation
    assert ema.base == pytest.approx(reward.base) and ema.final == pytest.approx(reward.final)
    assert told == [("eval ema", 4, 4)]  # the base was read back from the run folder, not scored again

    drawn = solrl.infer(result.run_dir, prompt="a red circle", seeds=1, out="inf", quiet=True)
    assert capsys.readouterr().out == ""
    assert drawn.grid is not None and drawn.grid.is_file() and drawn.index.read_text().count("\n") == 2  # base, ema
