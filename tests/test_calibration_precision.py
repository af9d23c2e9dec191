"""explore.calibrate=steps+precision: the cheapest (precision, steps) by measured time whose recall
reaches the floor, on a constructed case whose answer is known; the calibration's copies (one per
other precision, the chosen one kept); a resumed run equals an uninterrupted one; the rank check
reuses the calibration's full-precision rollouts; bad combinations refused in one line."""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.loop import calibration
from solrl_core.loop.calibration import calibrate_engine
from tests.helpers import train_recording as _run

REFERENCE = torch.arange(8.0)
LOW, OTHER = "nvfp4-emulated", "fp8-e5m2-tensor"
# rewards per (precision, steps): recall of the best_worst K=4 selection against REFERENCE in the comments
REWARDS = {
    (LOW, 2): torch.arange(8.0).flip(0),  # 0
    (LOW, 3): torch.tensor([3.0, 4.0, 0.0, 1.0, 2.0, 5.0, 6.0, 7.0]),  # 0.5
    (LOW, 4): REFERENCE,  # 1.0: the fixed setting, so the auto floor is 1.0
    (OTHER, 2): torch.tensor([3.0, 4.0, 0.0, 1.0, 2.0, 5.0, 6.0, 7.0]),  # 0.5
    (OTHER, 3): torch.tensor([0.0, 1.0, 3.0, 2.0, 5.0, 4.0, 6.0, 7.0]),  # 1.0
    (OTHER, 4): REFERENCE,  # 1.0
}


class FakeCopy:
    def __init__(self, precision: str) -> None:
        self.precision, self.compiled = precision, None


@dataclasses.dataclass(frozen=True)
class FakeEngine:
    """What calibrate_engine uses of an Engine: rollouts whose "images" are the rewards they score."""

    explore_copy: FakeCopy
    built: list = dataclasses.field(default_factory=list)  # every copy explore_copy_at made, weakly
    config: object = dataclasses.field(default_factory=lambda: resolve_config("tiny", "sol_rl",
            sets=["sampler.steps=4", "explore.steps=4"]))
    dtype_name: str = "fp32"
    device: torch.device = torch.device("cpu")
    sampler: object = dataclasses.field(default_factory=lambda: type("S", (), {"batch_size": 8})())

    def rewards(self, images: torch.Tensor, prompts: list[str]):  # type: ignore[no-untyped-def]
        return type("Scores", (), {"total": images})()

    def images(self, prompts: list[str], seeds: torch.Tensor, steps: int, on: str) -> torch.Tensor:
        if steps == 1:  # the warm-up call
            return torch.zeros(len(prompts))
        row = REFERENCE if on == "rollout" else REWARDS[(self.explore_copy.precision, steps)]
        return row.repeat(len(prompts) // 8)

    def explore_copy_at(self, precision: str) -> FakeCopy:
        made = FakeCopy(precision)
        self.built.append(weakref.ref(made))
        return made


def _timed(seconds_per_step: dict[str, float], measured: list[str] | None = None):  # type: ignore[no-untyped-def]
    """calibration.roll_arm with the real rewards and known seconds: steps x the precision's rate."""
    real = calibration.roll_arm

    def roll(arm, generate, score, shape):  # type: ignore[no-untyped-def]
        rewards, _ = real(arm, generate, score, shape)
        precision = arm.name.rpartition("@")[0] if arm.network == "explore" else "reference"
        if measured is not None:
            measured.append(arm.name)
        return rewards, arm.steps * seconds_per_step.get(precision, 1.0)
    return roll


def _calibrate(monkeypatch, rates: dict[str, float], *, whole_curve: bool = False,  # type: ignore[no-untyped-def]
               min_recall: float = 0.0):
    measured: list[str] = []
    monkeypatch.setattr(calibration, "roll_arm", _timed(rates, measured))
    engine = FakeEngine(FakeCopy(LOW))
    found = calibrate_engine(engine, ["a", "b"], torch.arange(16).view(2, 8), keep=4, fixed_steps=4,
                             min_recall=min_recall,
                             precisions=[LOW, OTHER], whole_curve=whole_curve)
    return found, engine, measured


def test_the_cheapest_precision_and_steps_that_reach_the_floor_is_chosen(monkeypatch):
    # OTHER is twice as fast a step: OTHER@3 (1.5 s, recall 1.0) beats LOW@4 (4 s, the fixed setting)
    found, engine, measured = _calibrate(monkeypatch, {LOW: 1.0, OTHER: 0.5})
    assert (found.chosen.name, found.min_recall, found.fixed) == (f"{OTHER}@3", 1.0, f"{LOW}@4")
    assert {m.name: m.recall for m in found.candidates} == {f"{LOW}@2": 0.0, f"{LOW}@3": 0.5, f"{LOW}@4": 1.0,
                                                            f"{OTHER}@2": 0.5, f"{OTHER}@3": 1.0}
    # a training run stops measuring OTHER once a step count reached the floor: @4 could not be chosen
    assert measured == ["reference", f"{LOW}@2", f"{LOW}@3", f"{LOW}@4", f"{OTHER}@2", f"{OTHER}@3"]
    assert found.copy is not None and found.copy.precision == OTHER  # kept for the run to explore on
    assert engine.explore_copy.precision == LOW  # the run's copy is replaced by stage1.calibrate, not here


def test_a_slower_precision_is_measured_freed_and_not_chosen(monkeypatch):
    # OTHER a step at 3 s: its cheapest reaching the floor (@3, 9 s) costs more than LOW@4 (4 s)
    found, engine, measured = _calibrate(monkeypatch, {LOW: 1.0, OTHER: 3.0})
    assert found.chosen.name == f"{LOW}@4" and found.copy is None
    assert measured[-1] == f"{OTHER}@2"  # 6 s already above the 4 s chosen: no more steps tried
    gc.collect()
    assert [ref() for ref in engine.built] == [None]  # the calibration's copy was freed


def test_an_explicit_floor_and_the_whole_curve(monkeypatch):
    found, _, measured = _calibrate(monkeypatch, {LOW: 1.0, OTHER: 0.5}, whole_curve=True, min_recall=0.5)
    assert found.chosen.name == f"{OTHER}@2" and found.min_recall == 0.5  # 1 s, recall 0.5
    assert f"{OTHER}@4" in measured  # rank-check --candidates: every step count of every precision
    assert calibration.steps_only(found, 0.5).name == f"{LOW}@3"  # what explore.calibrate=steps would pick


def test_refused_in_one_line_where_there_is_no_low_precision_to_choose():
    with pytest.raises(SolrlError) as caught:
        resolve_config("tiny", "sol_rl",
                       sets=["explore.calibrate=steps+precision", "explore.precision=fp32"]).validate()
    assert "explore.calibrate=steps+precision" in str(caught.value) and "\n" not in str(caught.value)
    assert "explore.precision=auto" in caught.value.fix
    with pytest.raises(SolrlError, match="explore.calibrate=steps"):
        resolve_config("tiny", "naive_quant", sets=["explore.calibrate=steps+precision"]).validate()
    with pytest.raises(SolrlError, match="did you mean .steps\+precision"):
        resolve_config("tiny", "sol_rl", sets=["explore.calibrate=precision"]).validate()


# OTHER's steps a tenth of LOW's: any OTHER step count reaching the (explicit, low) floor is the cheapest
RATES = {LOW: 1.0, OTHER: 0.1}
WEIGHING = ("explore.steps=3", "explore.calibrate=steps+precision", "explore.min_recall=0.01",
            "explore.recalibrate_every=3",
            "run.iterations=4", "run.checkpoint_every=2", "run.eval_prompts=")


@pytest.mark.slow
def test_a_resumed_precision_calibrating_run_equals_an_uninterrupted_one(fast_sets, monkeypatch):
    monkeypatch.setattr(calibration, "roll_arm", _timed(RATES))
    straight, seen = _run(fast_sets(*WEIGHING, run_dir="a"))
    done = [e for e in seen if isinstance(e, ev.CalibrationDone)]
    assert [e.iteration for e in done] == [1, 4] and done[0].precisions == [OTHER, LOW]
    assert done[0].precision == OTHER and straight.run.engine.explore_copy.precision == done[-1].precision
    assert "precision and preview steps calibrated" in next(e for e in seen if isinstance(e, ev.RunStarted)).plan
    _run(fast_sets(*WEIGHING, run_dir="b"), stop_after=2)
    saved = json.loads((Path(straight.run.run_dir).parent / "b" / "checkpoints" / "iter_000002"
                        / "trainer_state.json").read_text())
    assert (saved["explore_precision"], saved["explore_steps"]) == (done[0].precision, done[0].steps)
    resumed, seen = _run(fast_sets(*WEIGHING, run_dir="b"), resume=True)
    assert f"continues at the last calibration's {done[0].chosen}" in next(e for e in seen
                                                                           if isinstance(e, ev.RunStarted)).plan
    again = [e for e in seen if isinstance(e, ev.CalibrationDone)]
    assert [e.iteration for e in again] == [4]  # iteration 3 explores on the checkpoint's precision, 4 recalibrates
    assert [(c["name"], c["recall"]) for c in again[0].candidates] == [(c["name"], c["recall"])
                                                                       for c in done[1].candidates]
    assert again[0].chosen == done[1].chosen
    assert resumed.state.history == pytest.approx(straight.state.history, abs=1e-7)
    for which in ("default", "old", "ema"):
        a, b = straight.run.engine.policy.state(which), resumed.run.engine.policy.state(which)
        assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a), which


def _counting_rollouts(monkeypatch) -> list[tuple[str, int, int]]:  # type: ignore[no-untyped-def]
    """Every Engine.generate call as (network, steps, samples)."""
    from solrl_core.engine.engine import Engine

    calls: list[tuple[str, int, int]] = []
    real = Engine.generate

    def generate(self, cond, seeds, steps, on, **kw):  # type: ignore[no-untyped-def]
        calls.append((on, steps, int(seeds.numel())))
        return real(self, cond, seeds, steps, on, **kw)
    monkeypatch.setattr(Engine, "generate", generate)
    return calls


REUSING = ("explore.steps=3", "explore.calibrate=steps", "explore.rank_check_every=1", "run.iterations=1",
           "run.eval_prompts=")


@pytest.mark.slow
def test_the_rank_check_reuses_the_calibrations_full_precision_rollouts(fast_sets, monkeypatch):
    monkeypatch.setattr(calibration, "roll_arm", _timed(RATES))
    calls = _counting_rollouts(monkeypatch)
    reused, seen = _run(fast_sets(*REUSING, run_dir="a"))
    # full precision, full steps (the warm-ups take 1 step)
    full = [c for c in calls if c[0] == "rollout" and c[1] == 4]
    check = next(e for e in seen if isinstance(e, ev.RankCheckResult))
    cal = next(e for e in seen if isinstance(e, ev.CalibrationDone))
    calls.clear()
    monkeypatch.setattr(calibration.Calibration, "reference_of", lambda self, prompt, seeds: None)  # reuse off
    regenerated, seen_off = _run(fast_sets(*REUSING, run_dir="b"))
    full_off = [c for c in calls if c[0] == "rollout" and c[1] == 4]
    check_off = next(e for e in seen_off if isinstance(e, ev.RankCheckResult))
    # with reuse: the calibration's reference (2 groups x 8 seeds) and Stage 2 (2 x K=4); without: the rank check's 8
    # between
    assert check.reused and not check_off.reused
    assert [c[2] for c in full] == [16, 8] and [c[2] for c in full_off] == [16, 8, 8]
    assert (check.prompt, check.seeds) == (check_off.prompt, check_off.seeds)
    assert check.rho == pytest.approx(check_off.rho) and check.tau == pytest.approx(check_off.tau)
    assert check.full_mean == pytest.approx(check_off.full_mean, abs=1e-6)
    assert cal.candidates == next(e for e in seen_off if isinstance(e, ev.CalibrationDone)).candidates
    assert reused.state.history == pytest.approx(regenerated.state.history, abs=1e-7)


def test_the_calibration_measures_the_iterations_own_stage1_seeds(fast_sets):
    from solrl_core.loop.session import open_session
    from solrl_core.loop.stages import iteration_prompts

    session = open_session(resolve_config("tiny", "sol_rl", sets=fast_sets("run.eval_prompts=")))
    run = session.run
    prompts, seeds = calibration.calibration_inputs(run, 5)
    rng = np.random.default_rng([run.config.run.seed, 5])
    drawn = iteration_prompts(run, rng)
    stage1 = rng.integers(0, 2**31 - 1, size=len(drawn) * run.plan.explore_seeds)  # stages.explore's draw
    assert prompts == drawn[:2] and seeds.flatten().tolist() == stage1[:seeds.numel()].tolist()
    run.lock.release()


def test_the_precision_choice_is_shown_in_the_terminal_the_tui_and_the_trackers():
    from rich.console import Console

    from solrl_view.display import TerminalDisplay
    from solrl_view.words import log_line
    from solrl_core.tracking.metrics import scalars as metrics

    done = ev.CalibrationDone(iteration=1, prompts=2, seeds=8, reference="fp32@4", chosen=f"{OTHER}@2", steps=2,
                              precision=OTHER, min_recall=0.5, why="cheapest (0.10s) with recall 0.625 >= 0.500",
                              fixed_steps=3, seconds=1.5, precisions=[OTHER, LOW], fixed=f"{LOW}@3",
                              candidates=[{"name": f"{p}@{s}", "precision": p, "steps": s, "recall": r, "seconds": t}
                                          for p, s, r, t in ((OTHER, 2, 0.625, 0.1), (LOW, 2, 0.5, 0.2), (LOW, 3, 0.625,
                                                                                                          0.3))])
    assert (((((((((((((((((f"Stage 1 at {OTHER}@2; recall by precision@steps {OTHER}@2:0.62  {LOW}@2:0.50  "
                            f"{LOW}@3:0.62" in log_line(done))))))))))))))))))
    console = Console(record=True, width=250)
    TerminalDisplay(console)(done)
    text = console.export_text()
    assert f"precisions {OTHER}, {LOW}" in text and f"Stage 1 at {OTHER}@2: cheapest" in text
    step, scalars = metrics(done)
    assert (scalars[f"calibration/chosen_precision/{OTHER}"] == 1.0 and scalars[f"calibration/chosen_precision/{LOW}"]
            == 0.0)
    check = ev.RankCheckResult(iteration=1, prompt="p", seeds=8, rho=0.5, tau=0.4, draft_mean=0.1, full_mean=0.2,
                               seconds=0.0,
                               reused=True)
    assert "reused from the calibration" in log_line(check)


@pytest.mark.slow
def test_bench_auto_explore_prices_an_iteration_at_the_pick_labelled_derived(tmp_path):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "--size", "tiny", "--device", "cpu", "--family", "sol_rl", "--n", "4",
                                      "--k", "2",
                                      "--rollout-batch", "4", "--iterations", "2", "--auto-explore", "--json",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert "explore.calibrate=steps+precision would pick" in result.output and "DERIVED, not measured" in result.output
    row = json.loads(out.read_text())["rows"][0]
    auto, seconds = row["auto_explore"], row["seconds"]
    assert {c["precision"] for c in auto["candidates"]} == {LOW, OTHER} and auto["fixed"] == f"{LOW}@6"
    chosen = next(c for c in auto["candidates"] if c["name"] == auto["chosen"])
    fixed = next(c for c in auto["candidates"] if c["name"] == auto["fixed"])
    assert auto["time_ratio"] == pytest.approx(chosen["cost"] / fixed["cost"])
    assert auto["derived_seconds"]["total"] == pytest.approx(seconds["total"] - seconds["explore"]
                                                             * (1 - auto["time_ratio"]))
