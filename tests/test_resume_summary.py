"""The end of a run says the same after a stop and a resume, and under --tui, as in one uninterrupted
plain run: the base -> ema change with its paired standard errors (the base's per-image scores are
kept in the run folder) and the seconds of every session."""

import io
import json

import pytest
from rich.console import Console

from solrl_view.display import TerminalDisplay
from solrl_cli.tui.app import outcome
from solrl_cli.tui.state import RunState
from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop.evaluation import BASE_FILE
from solrl_core.loop.trainer import train
from tests.helpers import stop_flag_after

CAPTIONS = "a red circle\ntwo blue squares\na green triangle left of a yellow circle\na red circle and a blue square\n"


def _train(sets, resume=False, stop_after=None):
    """A tiny run through the plain display; its printed text and events."""
    out, seen = io.StringIO(), []
    bus = ev.EventBus()
    bus.subscribe(seen.append)
    bus.subscribe(TerminalDisplay(Console(file=out, width=400, highlight=False, markup=False)))
    flag = stop_flag_after(bus, stop_after)
    train(resolve_config("tiny", "sol_rl", sets=sets), bus, resume=resume, stop=flag)
    return out.getvalue(), seen


def _summary(text):
    """The end summary's lines: the Stage-2 reward's change, the evaluation's and the eval rewards'."""
    return [line for line in text.splitlines()
            if line.startswith(("  mean Stage-2 reward:", "  eval on ", "  eval rewards (scored, not trained on):"))]


def _pictures(lines):
    return [line for line in lines if line.startswith("  picture:")]


def _next(lines):
    """The end's next commands ('  next:' and the commands under it, the run folder filled in)."""
    return [line for line in lines if line == "  next:" or line.startswith("    solrl ")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summary")
    (tmp / "ev.txt").write_text(CAPTIONS)
    from tests.conftest import FAST

    def sets(name):
        return [*FAST, f"run.run_dir={tmp / name}", f"run.eval_prompts={tmp / 'ev.txt'}", "sampler.eval_steps=3",
                "run.eval_every=2", "run.iterations=4"]

    straight = _train(sets("straight"))
    stopped = _train(sets("stopped"), stop_after=1)
    resumed = _train(sets("stopped"), resume=True)
    return {"straight": straight, "stopped": stopped, "resumed": resumed, "dir": tmp / "stopped"}


@pytest.mark.slow
def test_a_stopped_and_resumed_run_ends_with_the_summary_of_an_uninterrupted_one(runs):
    straight, _ = runs["straight"]
    resumed, seen = runs["resumed"]
    assert "evaluating the base weights" not in resumed  # not scored again: read back from the run folder
    expected = _summary(straight)
    # the tiny preset's tinyworld_fidelity
    assert len(expected) == 3 and "s.e." in expected[1] and "s.e." in expected[2]
    assert _summary(resumed) == expected  # the same numbers, standard errors included
    kept = json.loads((runs["dir"] / BASE_FILE).read_text())
    assert len(kept["total"]) == 4 and kept["event"]["weights"] == "base"


@pytest.mark.slow
def test_the_seconds_of_a_resumed_run_count_the_session_before_its_stop(runs):
    _, before = runs["stopped"]
    text, after = runs["resumed"]
    first = next(e for e in before if isinstance(e, ev.RunFinished))
    last = next(e for e in after if isinstance(e, ev.RunFinished))
    assert first.reason == "interrupted" and last.reason == "completed"
    assert last.total_seconds == pytest.approx(first.seconds + last.seconds, rel=0.05)
    assert f"done: 4 iterations in {last.total_seconds:.1f}s in all ({last.seconds:.1f}s this session)" in text
    straight = next(e for e in runs["straight"][1] if isinstance(e, ev.RunFinished))
    assert f"in {straight.seconds:.1f}s\n" in runs["straight"][0]  # one session: one figure


@pytest.mark.slow
def test_the_tui_leaves_the_same_end_summary_on_the_terminal(runs):
    straight, seen = runs["straight"]
    state = RunState()
    for event in seen:
        state.apply(ev.decode(event.to_dict()))  # as the app receives them, through the JSON form
    left = outcome(state).splitlines()
    assert left[0].startswith("solrl: done: 4 iterations")
    assert [line for line in left[1:] if line not in _pictures(left) + _next(left)] == _summary(straight)
    assert len(_next(left)) == 4 and _next(left) == _next(straight.splitlines())  # the same next commands
    # the last evaluation's picture, as the plain summary ends
    assert _pictures(left) == _pictures(straight.splitlines())[-1:]
