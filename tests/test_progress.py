"""Evaluations say how far they are (an evaluation of 1,952 images took 330-670 s on a busy machine
with nothing on the screen): progress events from the evaluation, and the plain display's lines
when its output is no terminal (a log file, `| tee`, nohup)."""

import io

import pytest
from rich.console import Console

from solrl_view.display import TerminalDisplay
from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.engine import PROGRESS_REPORTS
from solrl_core.loop.evaluation import evaluate
from solrl_core.loop.session import open_session
from tests.conftest import FAST

PROMPTS = ["a red circle", "two blue squares", "a green triangle", "a yellow circle", "a blue square"]


@pytest.mark.slow
def test_an_evaluation_reports_the_images_generated_batch_by_batch_a_few_dozen_times_at_most(tmp_path):
    cfg = resolve_config("tiny", "sol_rl", sets=[*FAST, f"run.run_dir={tmp_path / 'r'}", "sampler.rollout_batch=1",
                                                 "sampler.eval_steps=1", "run.eval_prompts="])
    run = open_session(cfg).run
    seen = []
    result = evaluate(run, PROMPTS, 2, "base", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(i, 10) for i in range(1, 11)]  # 10 images, 1 a batch: one report per batch
    again = evaluate(run, PROMPTS, 2, "base")
    assert result.scores.total.tolist() == again.scores.total.tolist()  # reporting changes nothing scored
    long = []
    evaluate(run, PROMPTS * 9, 1, "base", progress=lambda done, total: long.append(done))
    assert long[-1] == 45 and long == sorted(long) and len(long) <= PROGRESS_REPORTS + 1


def _display_lines(console):
    display = TerminalDisplay(console)
    start = ev.EvalStarted(iteration=0, weights="base", prompts="tinyworld_heldout_all", samples=1952, time=100.0)
    display(start)
    for i in range(1, 21):  # every 5%, as an evaluation reports
        done = min(1952, i * 98)
        display(ev.EvalProgress(iteration=0, weights="base", done=done, total=1952, time=100.0 + i * 10))
    return display


def test_the_plain_display_without_a_terminal_prints_a_line_at_each_quarter():
    out = io.StringIO()
    _display_lines(Console(file=out, width=200, highlight=False, markup=False))
    lines = [line for line in out.getvalue().splitlines() if "images (" in line]
    assert lines == ["  evaluating base weights: 490/1952 images (25%, 50s)",
                     "  evaluating base weights: 980/1952 images (50%, 100s)",
                     "  evaluating base weights: 1470/1952 images (75%, 150s)"]
