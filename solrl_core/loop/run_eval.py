"""A training run's evaluations (evaluation.py scores them): the base one before the first iteration,
then the EMA weights every `run.eval_every` iterations and after the last.

An evaluation is not an iteration. A stop requested while one runs drops it between two rollout
batches (or a few seconds into a scoring call: rewards/watchdog.py), and one due when a stop was
already asked is skipped; either way the loop state records it as pending (`evaluation_pending`,
saved with the checkpoint of the iteration it belongs to), so a resume does it first, where an
uninterrupted run did it. Evaluations draw nothing the iterations use (fixed seeds, the EMA swapped
back), so a resumed run trains exactly as an uninterrupted one.
"""

from __future__ import annotations

from typing import Callable

from solrl_core import events as ev
from solrl_core.faults.phase import charged_to
from solrl_core.loop.evaluation import Evaluation, RunEvals, digest, evaluate, progress_events
from solrl_core.loop.frontier import previous, too_little, trade
from solrl_core.loop.hacking import SIGNIFICANCE, flagged, floors, verdict
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.session import Run
from solrl_core.runtime import distributed
from solrl_core.runtime.stopping import StopAtBoundary, StopFlag

EVALUATION = "evaluation"  # StopFlag.phase while one runs: a stop's acknowledgement says it is dropped


def evaluate_now(run: Run, state: LoopState, bus: ev.EventBus, flag: StopFlag, evals: RunEvals) -> None:
    """The evaluation due after iteration `state.iteration` ('base' before the first). On rank 0 alone
    (every rank holds the same weights); the others wait. Sharded, every rank runs it (each forward
    gathers the weights from all), and rank 0's bus alone is heard. `evals` keeps the base evaluation
    (and writes it to the run folder), against which a later one's change gets its paired standard
    errors, and the latest one. Leaves `state.evaluation_pending` true on every rank when a stop
    dropped it."""
    weights = "base" if state.iteration == 0 else "ema"
    what = "the base evaluation" if weights == "base" else f"the evaluation of iteration {state.iteration}"
    # sharded, every rank generates: all must drop it at the same batch
    stop = (lambda: distributed.any_true(flag.requested)) if run.sharded else (lambda: flag.requested)
    evals.hacked, evals.short, dropped = False, [], ""  # an evaluation a stop drops warns of nothing
    if run.rank == 0 or run.sharded:
        flag.phase = EVALUATION
        try:
            _score(run, state, bus, weights, evals, stop)
        except StopAtBoundary as stopped:  # GenerationStopped, or ScoringAbandoned a few seconds into a scoring call
            dropped = getattr(stopped, "message", str(stopped))
        finally:
            flag.phase = ""
    state.evaluation_pending = distributed.any_true(bool(dropped))  # also the barrier: the others waited here
    if dropped:
        bus.emit(ev.RunWarning(message=f"{what} is dropped ({dropped}): a resume does it first"))


def _score(run: Run, state: LoopState, bus: ev.EventBus, weights: str, evals: RunEvals,
           stop: Callable[[], bool]) -> None:
    bus.emit(ev.EvalStarted(iteration=state.iteration, weights=weights, prompts=run.config.run.eval_prompts,
                            samples=len(run.eval_prompts) * run.config.run.eval_seeds))
    pictures = evals.pictures
    with charged_to("evaluation"):
        result = evaluate(run, run.eval_prompts, run.config.run.eval_seeds, weights,
                          progress_events(bus, state.iteration, weights), run.held_out, stop,
                          keep=pictures.index if pictures is not None else None)
        picture = (pictures.draw(run.engine, state.iteration, weights, result.shown, result.scores.total, result.seeds)
                   if pictures is not None and result.shown is not None else "")
    changes = evals.changes(result)
    before = previous(state.evaluations, state.iteration)
    traded = (trade(before, result.mean - evals.base.mean, changes["eval_changes"], changes["eval_se"], SIGNIFICANCE)
              if evals.base is not None and weights != "base" else None)
    event = ev.EvalFinished(iteration=state.iteration, weights=weights, prompts=run.config.run.eval_prompts,
                            samples=len(result.seeds), mean=result.mean,
                            components={k: float(v.mean()) for k, v in result.scores.components.items()},
                            extras=result.extras, seconds=result.seconds, delta_se=evals.delta_se(result),
                            eval_rewards={k: float(v.mean()) for k, v in result.held_out.items()},
                            **changes, picture=picture, eval_floors=floors(run.config, evals.base or result),
                            trade=traded or {},
                            trade_since=-1 if traded is None else before["iteration"] if before else 0,
                            kept=digest(evals.record(result)) if weights == "base" and evals.write else "")
    bus.emit(event)
    _warn_of_hacking(run, state, bus, evals, result)
    _stop_on_trade(run, bus, evals, event)
    evals.finished(result, event)


def _stop_on_trade(run: Run, bus: ev.EventBus, evals: RunEvals, event: ev.EvalFinished) -> None:
    """The early stop (run.min_trade): `evals.short` names the eval rewards whose loss since the last
    evaluation bought less gain per unit than run.min_trade; the loop stops on it, with a checkpoint."""
    min_trade = run.config.run.min_trade
    evals.short = too_little(event.trade, min_trade)
    if evals.short:
        name = evals.short[0]
        bus.emit(ev.RunWarning(message=f"iteration {event.iteration}: since iteration {event.trade_since} the trained "
                                       f"reward gained {event.trade[name]:.3g} per unit of {name} lost, below "
                                       f"run.min_trade {min_trade:g}: the run stops here (the early stop; --best walks "
                                       f"the frontier, "
                                       "docs/rewards.md)"))


def _warn_of_hacking(run: Run, state: LoopState, bus: ev.EventBus, evals: RunEvals, result: Evaluation) -> None:
    """A RewardHacking event for each eval reward flagged since the base (hacking.flagged: more than two
    paired standard errors and more than its floor, while the trained reward rose); the verdict kept
    in the loop state, for the checkpoint; `evals.hacked` says whether any was flagged."""
    base = result if result.weights == "base" else evals.base
    evals.hacked = False
    if base is None:  # resumed without its base evaluation (restore warned): nothing to judge against
        return
    action = run.config.run.hacking_action
    fell = flagged(base, result, floors(run.config, base)) if result is not base else []
    state.evaluations.append(verdict(state.iteration, base, result, fell))
    evals.hacked = bool(fell)
    change = float(result.scores.total.mean() - base.scores.total.mean())
    for f in fell:
        bus.emit(ev.RewardHacking(iteration=state.iteration, trained="+".join(run.config.reward.weights),
                                  trained_change=change,
                                  trained_se=evals.delta_se(result).get("mean", 0.0), reward=f.reward, change=f.change,
                                  se=f.se,
                                  threshold=SIGNIFICANCE, stopping=action != "warn", floor=f.floor, action=action))
