"""The Stage-1 setting: what each iteration's Stage 1 runs at, decided in one place.

The run's plan (plan/plan.py RunPlan, made once at start-up) holds the fixed setting: N seeds a
prompt, K kept, the preview steps and the explore precision. With explore.calibrate a calibration
(calibration.py) replaces the steps (with steps+precision the precision too) by measured ones; the
choice is held in the loop state and saved with every checkpoint. `iteration_plan` makes one
iteration's IterationPlan from the two, and nothing else derives it: the loop makes it once at the
top of each iteration (`plan_iteration`, which calibrates first where due) and hands it to explore,
regenerate and the rank check; a session's start and a rollback's restore put the explore copy at
the held precision and take their setting from `hold_calibration`.

Dependencies run one way: this module uses calibration.py and fidelity.py (the arms and rank
measures the calibration shares with `solrl rank-check`'s rankcheck.py) and stages.roll_out; none
of them reads the loop state's choice, nor imports this module."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from solrl_core import events as ev
from solrl_core.engine.rollout import RolloutBatch, RolloutCopy
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.session import Run
from solrl_core.loop.stages import roll_out
from solrl_core.plan.plan import IterationPlan
from solrl_core.runtime import distributed

if TYPE_CHECKING:
    from solrl_core.loop.calibration import Calibration
    from solrl_core.loop.phases import PhaseRecorder


def iteration_plan(run: Run, state: LoopState) -> IterationPlan:
    """What Stage 1 runs at in the iteration after `state.iteration`: the last calibration's preview
    steps and precision, else the plan's (RunPlan.at), and whether the rank check is due."""
    every = run.config.explore.rank_check_every
    # the first group is rank 0's; sharded, every rank regenerates its own first group (each forward
    # gathers the weights from all), and rank 0's result alone is heard
    due = bool(every) and run.plan.regenerate and state.iteration % every == 0 and (run.rank == 0 or run.sharded)
    return run.plan.at(state.explore_steps, state.explore_precision, rank_check=due)


def hold_calibration(run: Run, state: LoopState) -> IterationPlan:
    """Where a session starts (a resume) or a rollback restores a checkpoint: the explore copy at the
    precision the checkpoint's calibration chose (when it chose one), and the setting Stage 1 runs at."""
    if state.explore_precision:
        use_explore_precision(run, state.explore_precision)
    return iteration_plan(run, state)


def at_setting(run: Run, setting: IterationPlan) -> Run:
    """The run with its plan at `setting`: what the start event and the live MFU's counts
    (telemetry/model_flops.py) are made for."""
    return replace(run, plan=setting.applied_to(run.plan))


def calibration_due(run: Run, iteration: int, held: IterationPlan) -> bool:
    """Before this iteration's Stage 1 (`iteration` finished so far): at the start of a run, when no
    choice is held yet (a resume from before the first), and every explore.recalibrate_every."""
    if not run.plan.calibrated:
        return False
    every = run.config.explore.recalibrate_every
    return not held.steps_calibrated or bool(every and iteration % every == 0)


def plan_iteration(run: Run, state: LoopState, bus: ev.EventBus,
                   phases: PhaseRecorder) -> tuple[IterationPlan, Calibration | None]:
    """This iteration's Stage-1 setting, after the calibration where one is due (`calibrate`, as its
    own phase), and that calibration (its reference rollouts the rank check reuses)."""
    held = iteration_plan(run, state)
    if not calibration_due(run, state.iteration, held):
        return held, None
    with phases.phase("calibrate", memory=False):
        found = calibrate(run, state, bus)
    return iteration_plan(run, state), found


def calibrate(run: Run, state: LoopState, bus: ev.EventBus) -> Calibration | None:
    """Choose Stage 1's preview steps (with explore.calibrate=steps+precision, its precision too) from
    measured rank fidelity (calibration.py): on rank 0, its choice broadcast, so every rank explores
    alike, and held in the loop state; emits CalibrationDone and the live MFU's counts at the chosen
    setting (a calibrating run announces none before). Returns rank 0's calibration."""
    from solrl_core.loop.calibration import calibrate_engine, calibration_inputs
    from solrl_core.precision.hardware import runnable_low_precisions
    from solrl_core.telemetry.model_flops import model_flops

    weighs = run.plan.calibrated_precision
    precisions = runnable_low_precisions(run.device) if weighs else []
    found = None
    if run.rank == 0:
        prompts, seeds = calibration_inputs(run, state.iteration)
        found = calibrate_engine(run.engine, prompts, seeds, keep=run.plan.keep, fixed_steps=run.plan.explore_steps,
                                 min_recall=run.config.explore.min_recall, precisions=precisions, whole_curve=False)
    chosen = (found.chosen.steps, found.chosen.precision) if found is not None else None
    steps, precision = distributed.broadcast_object(chosen)
    state.explore_steps = int(steps)
    if weighs:
        use_explore_precision(run, precision, found.copy if found is not None else None)
        state.explore_precision = precision
    if found is None:
        return None
    bus.emit(ev.CalibrationDone(iteration=state.iteration + 1, prompts=found.prompts, seeds=found.seeds,
                                reference=found.reference, candidates=found.to_dict(), chosen=found.chosen.name,
                                steps=found.chosen.steps, precision=found.chosen.precision, min_recall=found.min_recall,
                                why=found.why, fixed_steps=run.plan.explore_steps, seconds=found.seconds,
                                precisions=sorted({c.precision for c in found.candidates}) if weighs else [],
                                fixed=found.fixed))
    bus.emit(model_flops(at_setting(run, iteration_plan(run, state))))
    return found


def use_explore_precision(run: Run, precision: str, built: RolloutCopy | None = None) -> None:
    """Stage 1 at `precision` from now on: the engine's explore copy becomes `built` (the calibration's
    copy of it) or one built now (the other ranks; a resumed run), unless it is at that precision already."""
    current = run.engine.explore_copy
    if current is not None and current.precision != precision:
        current.take_over(built if built is not None else run.engine.explore_copy_at(precision))


def rank_check(run: Run, state: LoopState, bus: ev.EventBus, drafts: RolloutBatch, setting: IterationPlan,
               calibrated: Calibration | None = None) -> None:
    """Regenerate every Stage-1 seed of the first prompt at full precision and `setting`'s full steps;
    log rho, tau. Where this iteration's calibration rolled out that prompt at those seeds (its
    reference, before Stage 1 and the update, on the same weights), its rewards are used instead of
    regenerating them. Uses no random draw, so it does not change the run it observes."""
    from solrl_core.loop.fidelity import group_correlation

    t0 = time.perf_counter()
    group = drafts.subset(torch.nonzero(drafts.groups == drafts.groups[0]).flatten())
    full = calibrated.reference_of(group.prompts[0], group.seeds) if calibrated is not None else None
    reused = full is not None
    if full is None:
        full = roll_out(run, group.draws, setting.full_steps, explore=False).rewards
    rho, tau = group_correlation(group.rewards, full)
    bus.emit(ev.RankCheckResult(iteration=state.iteration + 1, prompt=group.prompts[0], seeds=len(group.prompts),
                                rho=rho, tau=tau, draft_mean=float(group.rewards.mean()),
                                full_mean=float(full.float().mean()), seconds=time.perf_counter() - t0, reused=reused))
