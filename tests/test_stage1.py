"""One Stage-1 setting per iteration: loop/stage1.py makes the IterationPlan from the run's plan and
the calibration held in the loop state, and is the only module that reads that choice; explore,
regenerate and the rank check run at the one IterationPlan the iteration made; the calibration and
the rank measures depend one way."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.loop import stage1
from solrl_core.loop.loop_state import LoopState
from solrl_core.plan.plan import IterationPlan, plan_stages

ROOT = Path(__file__).resolve().parents[1]
HELD = ("explore_steps", "explore_precision")  # the calibration's choice in LoopState


def _run(*sets: str, rank: int = 0, sharded: bool = False) -> SimpleNamespace:
    cfg = resolve_config("tiny", "sol_rl", sets=list(sets))
    return SimpleNamespace(config=cfg, plan=plan_stages(cfg, "fp32", "nvfp4-emulated"), rank=rank, sharded=sharded)


def test_the_iteration_plan_is_the_plans_setting_until_a_calibration_is_held():
    run = _run("explore.steps=4", "explore.calibrate=steps", "explore.rank_check_every=2")
    state = LoopState()
    fixed = stage1.iteration_plan(run, state)
    assert fixed == IterationPlan(seeds=run.plan.explore_seeds, keep=run.plan.keep, steps=4, precision="nvfp4-emulated",
                                  full_steps=run.plan.full_steps, regenerate=True, rank_check=True)
    assert stage1.calibration_due(run, 0, fixed)  # nothing held: the first calibration is due
    state.iteration, state.explore_steps, state.explore_precision = 1, 3, "fp8-e5m2-tensor"
    held = stage1.iteration_plan(run, state)
    assert (held.steps, held.precision, held.steps_calibrated, held.precision_calibrated) == \
        (3, "fp8-e5m2-tensor", True, True)
    assert not held.rank_check  # every 2 iterations: iteration 0, 2, ...
    assert not stage1.calibration_due(run, 1, held)  # held, and recalibrate_every is 0 (once)
    flops = held.applied_to(run.plan)
    assert (flops.explore_steps, flops.explore_precision) == (3, "fp8-e5m2-tensor")


def test_the_rank_check_is_due_on_rank_0_or_every_rank_when_sharded():
    state = LoopState()
    assert not stage1.iteration_plan(_run("explore.rank_check_every=1", rank=1), state).rank_check
    assert stage1.iteration_plan(_run("explore.rank_check_every=1", rank=1, sharded=True), state).rank_check
    assert not stage1.iteration_plan(_run(), state).rank_check  # off by default


def _reads_of_the_held_choice(path: Path) -> list[int]:
    """Lines of `path` that read or set LoopState's calibration choice (`state.explore_steps`, ...)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in HELD and isinstance(node.value, ast.Name) \
                and node.value.id == "state":
            lines.append(node.lineno)
    return lines


def test_only_stage1_reads_the_calibration_held_in_the_loop_state():
    readers = {path.relative_to(ROOT).as_posix() for path in (ROOT / "solrl_core").rglob("*.py")
               if _reads_of_the_held_choice(path)}
    assert readers == {"solrl_core/loop/stage1.py"}, readers  # loop_state.py itself saves and restores it (as self)


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_calibration_and_the_rank_measures_depend_one_way():
    loop = ROOT / "solrl_core" / "loop"
    fidelity, calibration, rankcheck = (_imports(loop / f"{m}.py") for m in ("fidelity", "calibration", "rankcheck"))
    inrun = {"solrl_core.loop.stage1", "solrl_core.loop.stages", "solrl_core.loop.loop_state"}
    assert not fidelity & {"solrl_core.loop.calibration", "solrl_core.loop.rankcheck", *inrun}
    assert "solrl_core.loop.fidelity" in calibration and not calibration & {"solrl_core.loop.rankcheck", *inrun}
    assert "solrl_core.loop.fidelity" in rankcheck and not rankcheck & {"solrl_core.loop.calibration", *inrun}


@pytest.mark.slow
def test_explore_regenerate_and_the_rank_check_run_at_the_one_plan_the_iteration_made(fast_sets, monkeypatch):
    from solrl_core.loop import trainer

    handed: dict[str, list] = {"explore": [], "regenerate": [], "rank_check": []}
    for name in handed:
        real = getattr(trainer, name)

        def spy(*args, _real=real, _name=name):  # type: ignore[no-untyped-def]
            handed[_name].append(next(a for a in args if isinstance(a, IterationPlan)))
            return _real(*args)

        monkeypatch.setattr(trainer, name, spy)
    bus, seen = ev.EventBus(), []
    bus.subscribe(seen.append)
    sets = fast_sets("explore.steps=4", "explore.calibrate=steps", "explore.rank_check_every=1", "run.iterations=2",
                     "run.eval_prompts=")
    session = trainer.train(resolve_config("tiny", "sol_rl", sets=sets), bus, stop=trainer.StopFlag())
    chosen = next(e for e in seen if isinstance(e, ev.CalibrationDone)).steps
    assert [len(v) for v in handed.values()] == [2, 2, 2]
    for i in range(2):  # the same object, each iteration, at the calibration's choice
        assert handed["explore"][i] is handed["regenerate"][i] is handed["rank_check"][i]
        assert (handed["explore"][i].steps, handed["explore"][i].steps_calibrated) == (chosen, True)
    assert session.state.explore_steps == chosen
