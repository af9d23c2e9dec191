"""explore.calibrate=steps: the cheapest preview step count whose measured recall of the
full-precision selection reaches the floor, on a constructed case whose answer is known; a resumed
calibrating run equals an uninterrupted one; 1 and 2 processes choose alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.loop.calibration import candidate_arms, choose, measure
from solrl_core.loop.fidelity import Arm, run_arms
from solrl_core.loop.trainer import StopFlag, train
from tests.helpers import train_recording as _run

# The reference ranks seeds 0..7 by their index; each candidate's rewards by steps, per prompt:
REFERENCE = torch.arange(8.0)
BY_STEPS = {
    2: torch.arange(8.0).flip(0),  # reversed: keeps the reference's worst as best: recall 0
    3: torch.tensor([3.0, 4.0, 0.0, 1.0, 2.0, 5.0, 6.0, 7.0]),  # best two right, worst two middle ones: 0.5
    4: torch.tensor([0.0, 1.0, 3.0, 2.0, 5.0, 4.0, 6.0, 7.0]),  # middle shuffled, ends right: 1.0
    5: REFERENCE, 6: REFERENCE,
}


def _constructed(seconds: dict[int, float]):  # type: ignore[no-untyped-def]
    """A rank check of the candidates 2..6 steps against a 6-step reference on two prompts, its
    measured seconds replaced by `seconds` (steps -> s) so the cost is known."""
    arms = [*candidate_arms("nvfp4-emulated", "explore", 6), Arm("fp32@6", "rollout", 6)]

    def images(network: str, steps: int) -> torch.Tensor:
        row = REFERENCE if network == "rollout" else BY_STEPS[steps]
        return row.repeat(2)  # the "images" are the rewards they will score

    result = run_arms(arms, images, lambda x: x, ["a", "b"], torch.arange(16).view(2, 8), [2], 4)
    result = dataclasses.replace(result,
                                 seconds={**{f"nvfp4-emulated@{s}": t for s, t in seconds.items()}, "fp32@6": 9.0})
    return measure(result, arms, keep=4)


def test_recall_is_the_share_of_the_reference_selection_recovered():
    measured = _constructed({s: float(s) for s in range(2, 7)})
    assert [m.steps for m in measured] == [2, 3, 4, 5, 6]
    assert [m.recall for m in measured] == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert all(m.recall_se == 0.0 for m in measured)  # both prompts alike
    assert measured[0].rho == pytest.approx(-1.0) and measured[-1].tau == pytest.approx(1.0)


def test_auto_floor_picks_the_cheapest_candidate_as_good_as_the_fixed_setting():
    measured = _constructed({s: float(s) for s in range(2, 7)})
    fixed = measured[-1]  # 6 steps: recall 1.0, s.e. 0 -> floor 1.0
    chosen, floor, why = choose(measured, 0.0, fixed)
    assert (chosen.steps, floor) == (4, 1.0)
    assert "nvfp4-emulated@6's recall 1.000" in why


def test_an_explicit_floor_picks_the_cheapest_that_reaches_it():
    measured = _constructed({s: float(s) for s in range(2, 7)})
    assert choose(measured, 0.5, measured[-1])[0].steps == 3
    assert choose(measured, 0.6, measured[-1])[0].steps == 4


def test_cheapest_is_by_measured_seconds_across_precisions_never_more_steps_for_less():
    # 5 steps measured faster than 4 (noise): a running maximum makes it cost no less, so 4 is chosen.
    measured = _constructed({2: 1.0, 3: 1.5, 4: 2.0, 5: 1.8, 6: 3.0})
    assert [m.cost for m in measured] == [1.0, 1.5, 2.0, 2.0, 3.0]
    assert choose(measured, 0.9, measured[-1])[0].steps == 4
    # A faster precision that reaches the floor wins over fewer steps of a slower one.
    fast = dataclasses.replace(measured[4], name="fp8@6", precision="fp8", seconds=0.5, cost=0.5)
    assert choose([*measured, fast], 0.9, measured[-1])[0].name == "fp8@6"


def test_no_candidate_reaching_an_explicit_floor_keeps_the_fixed_setting():
    measured = _constructed({s: float(s) for s in range(2, 7)})
    worse = [dataclasses.replace(m, recall=0.5) for m in measured]
    chosen, _, why = choose(worse, 0.9, worse[2])
    assert chosen is worse[2] and "no candidate reached" in why


CALIBRATING = ("explore.steps=4", "explore.calibrate=steps", "explore.recalibrate_every=3", "run.iterations=4",
               "run.checkpoint_every=2", "run.eval_prompts=")


def _calibrations(seen: list) -> list[ev.CalibrationDone]:
    return [e for e in seen if isinstance(e, ev.CalibrationDone)]


def test_a_resumed_calibrating_run_equals_an_uninterrupted_one(fast_sets):
    straight, seen = _run(fast_sets(*CALIBRATING, run_dir="a"))
    done = _calibrations(seen)
    assert [e.iteration for e in done] == [1, 4]  # at start, then after recalibrate_every=3 iterations
    assert [c["steps"] for c in done[0].candidates] == [2, 3, 4]
    assert all(e.seconds["calibrate"] > 0 for e in seen if isinstance(e, ev.IterationFinished)
               and e.iteration in (1, 4))
    _run(fast_sets(*CALIBRATING, run_dir="b"), stop_after=2)
    saved = json.loads((Path(straight.run.run_dir).parent / "b" / "checkpoints" / "iter_000002"
                        / "trainer_state.json").read_text())
    assert saved["explore_steps"] == done[0].steps
    resumed, seen = _run(fast_sets(*CALIBRATING, run_dir="b"), resume=True)
    again = _calibrations(seen)
    assert [e.iteration for e in again] == [4]  # iteration 3 runs at the checkpoint's choice, 4 recalibrates
    assert [(c["name"], c["recall"]) for c in again[0].candidates] == [(c["name"], c["recall"])
                                                                       for c in done[1].candidates]
    assert again[0].steps == done[1].steps
    # what the run reports: its start event at the checkpoint's choice, the monitor at the last calibration's
    from solrl_cli.tui.state import RunState

    start = next(e for e in seen if isinstance(e, ev.RunStarted))
    assert (start.explore_steps, start.explore_seeds, start.keep, start.regenerate) == (done[0].steps, 8, 4, True)
    monitor = RunState()
    for event in seen:
        monitor.apply(event)
    assert f"({again[0].steps} steps, {again[0].precision})" in monitor.explore_speed()[0]
    assert resumed.state.history == pytest.approx(straight.state.history, abs=1e-7)
    for which in ("default", "old", "ema"):
        a, b = straight.run.engine.policy.state(which), resumed.run.engine.policy.state(which)
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), which


def test_off_by_default_and_refused_where_stage1_has_no_preview_steps():
    assert resolve_config("tiny", "sol_rl").explore.calibrate == "off"
    with pytest.raises(SolrlError, match="explore.calibrate"):
        resolve_config("tiny", "naive_scaling", sets=["explore.calibrate=steps"]).validate()


def test_rank_check_candidates_prints_the_curve_and_the_setting_auto_would_pick(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["rank-check", "--candidates", "--count", "2", "--seeds", "4", "--preview-steps",
                                      "3",
                                      "--full-steps", "4", "--min-recall", "0.75", "--out", "rc"])
    assert result.exit_code == 0, result.output
    for row in ("nvfp4-emulated@2", "nvfp4-emulated@3 (fixed)", "nvfp4-emulated@4", "fp8-e5m2-tensor@4", "fp32@4 ref",
                "explore.calibrate=steps would pick", "explore.calibrate=steps+precision would pick"):
        assert row in result.output
    data = json.loads((tmp_path / "rc" / "calibration.json").read_text())
    assert [(c["precision"], c["steps"]) for c in data["candidates"]] == [
        (p, s) for p in ("fp8-e5m2-tensor", "nvfp4-emulated") for s in (2, 3, 4)] and data["min_recall"] == 0.75
    for key, among in (("chosen_steps_only", ("nvfp4-emulated",)), ("chosen", ("nvfp4-emulated", "fp8-e5m2-tensor"))):
        reached = [c for c in data["candidates"] if c["recall"] >= 0.75 and c["precision"] in among]
        expected = min(reached, key=lambda c: (c["cost"], c["steps"]))["name"] if reached else "nvfp4-emulated@3"
        assert data[key] == expected, key


def _calibrating_worker(rank: int, world: int, port: int, root: Path) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    session = train(resolve_config("tiny", "sol_rl", sets=_two_process_sets(root, "two")), ev.EventBus(),
                    stop=StopFlag())
    (root / f"rank{rank}.json").write_text(json.dumps({"explore_steps": session.state.explore_steps}))


def _two_process_sets(root: Path, run: str) -> list[str]:
    from tests.helpers import DISTRIBUTED_SETS as SETS

    return [*SETS, f"run.run_dir={root / run}", *CALIBRATING[:3], "run.iterations=1", "run.eval_prompts="]


@pytest.mark.slow
def test_one_and_two_processes_choose_the_same_preview_steps(tmp_path):
    from tests.helpers import logged_events as _events, spawn as _spawn

    _spawn(2, tmp_path, worker=_calibrating_worker)
    train(resolve_config("tiny", "sol_rl", sets=_two_process_sets(tmp_path, "one")), ev.EventBus(), stop=StopFlag())
    one, two = ([e for e in _events(tmp_path / d) if e["event"] == "calibration"] for d in ("one", "two"))
    assert len(one) == len(two) == 1
    assert [(c["name"], c["recall"], c["rho"]) for c in two[0]["candidates"]] == \
        [(c["name"], c["recall"], c["rho"]) for c in one[0]["candidates"]]
    assert two[0]["chosen"] == one[0]["chosen"]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())["explore_steps"] for r in range(2)]
    assert ranks == [one[0]["steps"]] * 2  # rank 1 explores at rank 0's choice


def test_the_choice_is_shown_in_the_terminal_the_tui_and_the_trackers():
    from rich.console import Console

    from solrl_view.display import TerminalDisplay
    from solrl_view.words import log_line
    from solrl_core.tracking.metrics import scalars as metrics

    done = ev.CalibrationDone(iteration=1, prompts=2, seeds=8, reference="fp32@4", chosen="nvfp4-emulated@3", steps=3,
                              precision="nvfp4-emulated", min_recall=0.75, why="cheapest (0.30s) with recall 0.800 >= "
                                                                               "0.750",
                              fixed_steps=4, seconds=1.5,
                              candidates=[{"name": f"nvfp4-emulated@{s}", "steps": s, "recall": r, "seconds": 0.1 * s}
                                          for s, r in ((2, 0.5), (3, 0.8), (4, 0.9))])
    assert "Stage 1 at nvfp4-emulated@3; recall by preview steps 2:0.50  3:0.80  4:0.90; floor 0.750" in log_line(done)
    console = Console(record=True, width=200)
    TerminalDisplay(console)(done)
    assert "Stage 1 at nvfp4-emulated@3: cheapest" in console.export_text()
    step, scalars = metrics(done)
    assert step == 1 and scalars["calibration/steps"] == 3 and scalars["calibration/recall/nvfp4-emulated@2"] == 0.5
