"""The Sol-RL training loop (arXiv 2604.06916, "FP4 Explore, BF16 Train"), one iteration at a time:

    Stage 1  explore     N seeds per prompt through the low-precision explore copy, preview steps, scored
             select      keep K of N per prompt (top K/2 and bottom K/2 by default)
    Stage 2  regenerate  the K kept seeds again at full precision and full steps, scored
             update      the loss (DiffusionNFT's, AWM's or Flow-GRPO's) on the Stage-2 rollouts, one step
             sync        old adapter decay, EMA, explore copy refreshed and re-quantized

The other families are the same loop with stages switched off (one row each in families.py; the
plan in plan.py). The stages are in stages.py and update.py; what a run holds fixed is session.Run
(its engine.Engine holds the model, the policy, its copies, the sampler and the rewards, and
generates every rollout), what it advances loop_state.LoopState.

Many GPUs (torchrun, see distributed.py): the iteration's prompt groups are split over the ranks,
each group whole on one rank. Every random draw is made for the whole iteration on every rank and
each rank takes its slice, and the rewards are all-gathered before advantages, selection, reward
health and logged stats, so a run on W processes computes what one process would (to float
rounding). LoRA gradients are averaged over ranks before clipping; rank 0 alone writes and speaks.
With `distributed.strategy = fsdp` the transformer is sharded over the ranks (sharding.py).

Checked line by line against the official code (NVlabs/Sana train_scripts/sol_rl/, configs/sol_rl/):
the loss, advantages, trained timesteps, selection, samplers, sigma grids, prompt encodings, quantized-
layer rule, fp32 adapters, grad clips, decay and EMA schedules are the official ones. Where solrl
differs, each with its reason in docs/official-settings.md ("Where solrl differs from the official code"):
- explore copy: real NVFP4 blocks or FP8 E4M3 (the official "NVFP4" runs as TE's delayed-scaled
  per-tensor FP8 E5M2: explore.precision=fp8-e5m2-delayed)
- LoRA on SANA: diffusers' split q/k/v, not the official fused projections
- every random draw from (seed, iteration): a resume repeats an uninterrupted run exactly
- Stage 1 on a quantized copy batched one prompt group a call: the same drafts on 1 or N processes
- the gradient: the mean over every (sample, timestep) pair, whatever the micro-batch sizes
- Stage-1 draft rewards kept and reported
- explore.calibrate: Stage 1's preview steps (and precision) measured, not fixed at 6
- v_old on the merged rollout copy; gradient checkpointing from the memory estimate
- the update's forwards compiled on CUDA; no cuDNN fused attention; no reference forward at kl_beta 0
- copies compiled block by block in the official mode; the update's blocks in torch's default
- faults: non-finite rewards and steps left out, out-of-memory backed off, rewards retried or stopped
- stopping: SIGTERM at the next phase boundary; a stop drops an evaluation in progress
- evaluation: run.eval_rewards scored at every evaluation; reward hacking (a significant fall past a
  per-reward floor) warns, stops or rolls back (run.on_hacking); every evaluated iteration is saved
- the trade: each evaluation's gain per unit of eval reward lost since the last; run.min_trade stops a run
  where it falls short (off by default); --best takes the checkpoint the frontier walk names (frontier.py)
- fp32 timesteps into SANA's and SD3's transformers, rollouts included (official SD3 rollouts:
  sampler.integer_timesteps)
- fp32 where the official code rounds to bf16: SANA's sigma grid (sampler.grid_dtype=bf16 gives it), the
  DPM state between steps (sampler.state_dtype=run), SANA's and FLUX.1's loss inputs (algorithm.loss_dtype=bf16)
- the Euler step: fp32 from the run-dtype state, rounded once, as the official run_sampling; sampler.euler_step=run
  keeps solrl's earlier arithmetic (product and sum each in the run dtype)
- selection: ties broken by position; K = N keeps each seed once where the official can repeat one
- family defaults: the official configs' rollout copies and compile
- training precision: each official regime in its preset; autocast (fp32 adapters) elsewhere
- LoRA A gaussian (std 1/r), as every official config
- model.prompt_instruction and model.max_sequence_length: the pipelines' own prompt handling, off
- distributed.strategy = fsdp: the policy sharded, where the official code replicates it
- memory modes for one tight GPU; AdamW's moments stay fp32
- CPU lanes: on a CPU, rollout batches and update micro-steps side by side, one thread each (run.lanes)
- algorithm.loss=awm (docs/official-settings.md, "AWM"): the family's ODE rollouts on the rollout copy;
  each sample's own train timesteps (AWM's strata: algorithm.train_timesteps); anchor decay
  algorithm.old_decay_max (AWM's 0.3 by --set); no skipped first epochs; solrl's evaluation EMA;
  non-finite samples zeroed; run-dtype forwards
- algorithm.loss=flow_grpo (docs/official-settings.md, "Flow-GRPO"): the SDE for the trained-on rollouts only;
  one optimizer step per iteration unless optimizer.steps_per_iteration (its 2); old decay 0 and no merged
  rollout copy (on-policy, exact log-probabilities); step noise and window from the seed; trained steps from
  algorithm.timestep_fraction; no CFG
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable

import numpy as np

from solrl_core import events as ev
from solrl_core import tracking
from solrl_core.config import trust as run_trust
from solrl_core.config.convert import to_dict
from solrl_core.config.schema import Config
from solrl_core.engine.checkpoint import list_checkpoints, save_checkpoint
from solrl_core.engine.sharding import gather
from solrl_core.faults import guard
from solrl_core.io.rundir import EVENTS_FILE, restarts
from solrl_core.loop import backoff
from solrl_core.loop.decisions import LAST_ROLLBACK, Next, after_evaluation, checkpoint_due, evaluation_due
from solrl_core.loop.evaluation import RunEvals
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.hacking import deprecation, spared
from solrl_core.loop.phases import PhaseRecorder
from solrl_core.loop.rollback import roll_back
from solrl_core.loop.run_eval import EVALUATION, evaluate_now
from solrl_core.loop.session import Checked, Run, Session, open_session
from solrl_core.loop.stage1 import at_setting, hold_calibration, plan_iteration, rank_check
from solrl_core.loop.stages import (Scored, after_step, explore, iteration_prompts, regenerate, score_drafts,
                                    score_finals, select_seeds)
from solrl_core.loop.stages import train as train_step
from solrl_core.loop.update import UpdateResult
from solrl_core.loop.warmup import warm_up_compiled
from solrl_core.plan import environment
from solrl_core.plan.plan import IterationPlan
from solrl_core.rewards.health import raise_if_diverged
from solrl_core.rewards.watchdog import RewardFailure
from solrl_core.runtime import distributed
from solrl_core.runtime.stopping import ScoringAbandoned, StopAtBoundary, StopFlag, graceful_stop
from solrl_core.telemetry.model_flops import model_flops
from solrl_core.tracking import samples


def train(config: Config, bus: ev.EventBus, resume: bool = False, stop: StopFlag | None = None,
          checkpoint: str | None = None, checked: Checked | None = None) -> Session:
    """Run (or continue) training to config.run.iterations; returns the run and its final loop state.
    `checkpoint` (with resume) names the checkpoint to continue from; default the newest.

    Under torchrun each process calls this; it joins the process group from the environment."""
    distributed.init_from_env()
    tracking.require(config.run.log)  # a tracker that is not installed is named before anything loads
    again = bool(config.run.run_dir) and restarts(Path(config.run.run_dir))
    session = open_session(config, resume=resume, from_checkpoint=checkpoint, checked=checked)
    run, state = session.run, session.state
    stage1 = hold_calibration(run, state)  # resumed after a steps+precision calibration: Stage 1 at its choice
    reason, resumable = "completed", True
    with contextlib.ExitStack() as stack:
        bus = _subscribe_outputs(stack, run, state, bus)
        flag = stop or stack.enter_context(graceful_stop(StopFlag(), run.config.run.stop_on_sigterm))
        flag.announce = lambda f: bus.emit_from_signal(_stop_requested(run, state, f))  # acknowledged at once
        stack.callback(setattr, flag, "announce", None)
        if run.world_size == 1:  # a stop abandons a hung scoring call; with several ranks the others would wait for it
            for scorer in (run.rewards, run.held_out.rewards if run.held_out is not None else None):
                if scorer is not None:  # the eval rewards too: they score every evaluation image at once
                    scorer.stop = lambda: flag.requested
                    stack.callback(setattr, scorer, "stop", None)
        _announce(run, state, bus, stage1)
        if again:
            bus.emit(ev.RunWarning(message=f"{run.run_dir} held a run with no checkpoint (it stopped before its "
                                           f"first): starting it again from iteration "
                                           f"0{' with its saved config' if resume else ''}"))
        warm_up_compiled(run, bus)
        state.start_clock()
        evals = RunEvals.of(run)  # the base and the latest evaluation: the end summary compares them
        try:
            run = _loop(run, state, bus, flag, evals)
            reason = "completed" if state.finished(run.config.run.iterations) else "interrupted"
        except BaseException as exc:
            reason, resumable = "failed", getattr(exc, "resumable", True)
            # another process died: said plainly, not the collective's trace
            lost = distributed.lost_peer(exc, run.run_dir)
            if lost is not None:
                raise lost from exc
            raise
        finally:
            hist, took = state.history, state.session_seconds()
            last = hist[1:][-3:]  # never the first iteration: it is what the last ones are compared with
            newest = list_checkpoints(run.run_dir)
            bus.emit(ev.RunFinished(reason=reason, iteration=state.iteration, seconds=took,
                                    first_reward=hist[0] if hist else None,
                                    last3_reward=float(np.mean(last)) if last else None, last_iterations=len(last),
                                    run_dir=str(run.run_dir), checkpoint=str(newest[-1]) if newest else None,
                                    total_seconds=state.earlier_seconds + took, resumable=resumable, **evals.for_end()))
    return Session(run, state)


def _loop(run: Run, state: LoopState, bus: ev.EventBus, flag: StopFlag, base: RunEvals) -> Run:
    """Iterations to the end, a stop or a failure; evaluations and checkpoints on their schedule, and
    after each evaluation what decisions.after_evaluation says. A stop drops an evaluation in progress
    or skips one that was due (pending: a resume does it first), and always leaves the last finished
    iteration saved. Returns the run as it ended (an out-of-memory back-off may have lowered its batch sizes)."""
    cfg = run.config
    run, saved = _evaluate_pending(run, state, bus, flag, base)  # saved: the iteration of the newest checkpoint
    while state.iteration < cfg.run.iterations and not distributed.any_true(flag.requested):
        streaks, flag.iteration = state.streaks(), state.iteration + 1
        try:
            run = _with_backoff(run, state, bus, lambda r: run_iteration(r, state, bus, flag))
        # before the update: the run's weights and counters are the last finished iteration's
        except StopAtBoundary as stop:
            state.set_streaks(streaks)
            if isinstance(stop, ScoringAbandoned):
                bus.emit(ev.RunWarning(message=f"{stop.message}: iteration {flag.iteration} abandoned (redone exactly "
                                               f"on resume)"))
            break
        stopping = distributed.any_true(flag.requested)
        state.evaluation_pending = evaluation_due(cfg.run, state.iteration, bool(run.eval_prompts))
        evaluated = state.evaluation_pending and not stopping  # a stop skips it: still pending
        if evaluated:
            run = _with_backoff(run, state, bus, lambda r: evaluate_now(r, state, bus, flag, base))
            decision = after_evaluation(cfg.run, base, state.evaluation_pending)
            if decision.next is Next.ROLL_BACK and (ended := roll_back(run, state, bus, base)) is not None:
                saved = state.iteration  # the checkpoint rolled back to
                if ended:
                    state.stopped_by_rule = LAST_ROLLBACK
                    break
                continue
            stopping = decision.stops  # a rule, or a stop that dropped it: every rank stops here, with a checkpoint
            state.stopped_by_rule = decision.rule or state.stopped_by_rule
        failure = state.health.failure() or guard.failure(  # from gathered rewards: the same on every rank
            state.faults, cfg.reward.health_patience, cfg.optimizer.max_nonfinite_steps)
        if checkpoint_due(cfg.run, state.iteration, evaluated, stopping, bool(failure)):
            _checkpoint(run, state, bus)
            saved = state.iteration
        if failure:
            raise failure
        if stopping:
            break
    if state.iteration > saved:  # stopped between an iteration and its save, or at a phase boundary
        _checkpoint(run, state, bus)
    return run


def _evaluate_pending(run: Run, state: LoopState, bus: ev.EventBus, flag: StopFlag, base: RunEvals) -> tuple[Run, int]:
    """Before the first iteration of a session: the base evaluation (a new run), or the one a stop dropped
    before the checkpoint resumed from was saved; a resumed run's base evaluation read back from its folder.
    Returns the run to go on with and the iteration whose checkpoint is up to date."""
    cfg = run.config
    saved = state.iteration  # the iteration of the newest checkpoint (0: none, or the one resumed from)
    if run.eval_prompts and state.iteration > 0 and run.rank == 0:  # resumed: the base evaluation the run folder kept
        unusable = base.restore(cfg.run.eval_rewards)
        if unusable:
            bus.emit(ev.RunWarning(message=unusable))
    pending = state.evaluation_pending  # the checkpoint resumed from was saved with its evaluation dropped by a stop
    state.evaluation_pending = bool(run.eval_prompts) and (state.iteration == 0 or pending)
    if state.evaluation_pending:  # the base evaluation, or that one, first
        run = _with_backoff(run, state, bus, lambda r: evaluate_now(r, state, bus, flag, base))
        if state.iteration == 0 and not state.evaluation_pending and cfg.run.hacking_action == "rollback":
            _checkpoint(run, state, bus)  # iteration 0, evaluated: where a fall at the first evaluation rolls back to
    if pending and not state.evaluation_pending:
        saved = state.iteration - 1  # its checkpoint still says pending: saved again at the end, unless a later one is
    return run, saved


def run_iteration(run: Run, state: LoopState, bus: ev.EventBus, stop: StopFlag | None = None) -> None:
    """One iteration, top to bottom: explore, select, regenerate, update, sync (stages.py). `stop` is
    told each phase as it begins, and may abandon the iteration there (stopping.py)."""
    phases = PhaseRecorder(run.device, stop.entering if stop is not None else None)
    rng = np.random.default_rng([run.config.run.seed, state.iteration])
    prompts = iteration_prompts(run, rng)
    stage1, calibrated = plan_iteration(run, state, bus, phases)  # a calibration's draws: an identical generator's
    with phases.phase("explore"):
        drafted = explore(run, prompts, rng, stage1)
        # NaN outputs: blame the update, not the reward
        raise_if_diverged(drafted.latents, state.step, run.config.optimizer.lr)
        drafts = score_drafts(run, state, bus, drafted)
    with phases.phase("selection", memory=False):
        kept = drafts.batch.subset(select_seeds(run, drafts, rng))
    if stage1.rank_check:
        rank_check(run, state, bus, drafts.batch, stage1, calibrated)
    if stage1.regenerate:
        with phases.phase("regenerate"):
            kept = regenerate(run, kept, stage1)
    with phases.phase("train"):
        finals = score_finals(run, state, bus, kept)
        result = train_step(run, finals, rng)
    with phases.phase("sync"):
        decay = after_step(run, state, bus, result, finals)
    state.iteration += 1
    state.history.append(finals.mean_reward())
    bus.emit(_iteration_finished(run, state, phases, drafts, finals, result, decay))
    if samples.due(run.config.run.log, run.config.run.image_every, state.iteration, run.rank):
        bus.emit(samples.sample_grid(run.engine, finals.batch, run.run_dir, state.iteration))


def _iteration_finished(run: Run, state: LoopState, phases: PhaseRecorder, drafts: Scored, finals: Scored,
                        result: UpdateResult, decay: float) -> ev.IterationFinished:
    """The iteration's event. Scoring is timed apart from the rollouts that called it: `explore` and
    `regenerate` are generation and decoding, `reward` the scoring of both."""
    plan, took = run.plan, phases.seconds
    regenerated = finals.batch if plan.regenerate else None
    seconds = {"explore": took["explore"] - drafts.batch.seconds_reward, "selection": took["selection"],
               "regenerate": took["regenerate"] - regenerated.seconds_reward if regenerated else 0.0,
               "reward": drafts.batch.seconds_reward + (regenerated.seconds_reward if regenerated else 0.0),
               "train": took["train"], "sync": took["sync"], "total": phases.elapsed(),
               **({"calibrate": took["calibrate"]} if "calibrate" in took else {})}
    seconds, peaks = phases.slowest_rank(seconds, dict(phases.peaks))
    peaks["total"] = max(peaks.values())
    return ev.IterationFinished(iteration=state.iteration, iterations=run.config.run.iterations, seconds=seconds,
                                draft=drafts.stats() if plan.keep < plan.explore_seeds else None, final=finals.stats(),
                                loss=result.losses(), nonfinite_losses=result.nonfinite, grad_norm=result.grad_norm,
                                old_decay=decay, peak_memory=peaks, memory_source=phases.source)


def _subscribe_outputs(stack: contextlib.ExitStack, run: Run, state: LoopState, bus: ev.EventBus) -> ev.EventBus:
    """Rank 0: the JSONL log and the trackers on `bus`, closed (and the run's lock released) when
    `stack` closes. The other ranks speak to no one: a bus of their own."""
    if run.lock is not None:
        stack.callback(run.lock.release)
    if run.rank != 0:
        return ev.EventBus()
    # trackers first: one that cannot start (W&B without a login) undoes the start, leaving no half-made run folder
    trackers = tracking.open_trackers(run.config.run.log, run.run_dir, to_dict(run.config), state.resumed,
                                      state.iteration)
    for output in (ev.JsonlLog(run.run_dir / EVENTS_FILE), trackers):
        bus.subscribe(output)
        stack.callback(output.close)
        stack.callback(bus.unsubscribe, output)
    return bus


def _stop_requested(run: Run, state: LoopState, flag: StopFlag) -> ev.StopRequested:
    """The acknowledgement of a stop request: where the run is and what it will save."""
    newest = list_checkpoints(run.run_dir)
    running = flag.iteration > state.iteration  # begun, not finished
    return ev.StopRequested(source=flag.source, mode="phase" if flag.at_phase else "iteration",
                            iteration=flag.iteration if running else state.iteration,
                            phase=flag.phase if running or flag.phase == EVALUATION else "",
                            run_dir=str(run.run_dir), checkpoint=str(newest[-1]) if newest else None)


def _announce(run: Run, state: LoopState, bus: ev.EventBus, stage1: IterationPlan) -> None:
    """The start event, and what the run says before its first iteration. `stage1`: Stage 1 as this session
    starts it (stage1.hold_calibration: a resumed calibration's choice held)."""
    cfg, plan, now = run.config, run.plan, stage1.applied_to(run.plan)
    described = plan.describe()
    if run.world_size > 1:
        described += (f"; {(p := cfg.run.prompts_per_iteration)} prompt groups over {run.world_size} processes, "
                      f"{p // run.world_size} each")
    if run.world_size > 1 or run.layout.strategy != "replicate":
        described += f"; weights: {run.layout.describe()}"
    if plan.calibrated and stage1.steps_calibrated:
        at = f"{stage1.precision}@{stage1.steps}" if stage1.precision_calibrated else f"{stage1.steps} preview steps"
        described += f"; Stage 1 continues at the last calibration's {at} (from the checkpoint)"
    bus.emit(ev.RunStarted(run_dir=str(run.run_dir), preset=cfg.preset, device=str(run.device),
                           dtype=run.engine.dtype_name, explore_precision=now.explore_precision, plan=described,
                           explore_seeds=now.explore_seeds, explore_steps=now.explore_steps, keep=now.keep,
                           regenerate=now.regenerate, full_steps=now.full_steps,
                           start_iteration=state.iteration, iterations=cfg.run.iterations, resumed=state.resumed,
                           config=to_dict(cfg), machine=run.machine.describe(),
                           tracking=tracking.where(cfg.run.log, run.run_dir),
                           copy_layout=run.machine.explore_layout, rewards=run_trust.scored(cfg),
                           environment=environment.describe(cfg, run.device, run.engine.dtype_name,
                                                            plan.explore_precision, run.machine)))
    if run.rank == 0 and not (plan.calibrated and not stage1.steps_calibrated):  # else stage1.calibrate's
        bus.emit(model_flops(at_setting(run, stage1)))  # the live MFU's counts; the other ranks speak to no one
    copy_ = run.engine.explore_copy
    if copy_ is not None and copy_.report is not None:
        bus.emit(ev.QuantizationReport(summary=copy_.report.summary(),
                                       path=str(run.run_dir / "quantization_report.json")))
    for note in (*run.notes, deprecation(cfg)):
        if note:
            bus.emit(ev.RunWarning(message=note))


def _with_backoff(run: Run, state: LoopState, bus: ev.EventBus, work: Callable[[Run], None]) -> Run:
    """`work(run)` under the out-of-memory back-off (backoff.py); returns the run to go on with.
    When a phase does not fit even at batch size 1, or a reward hangs or keeps raising (rewards/watchdog.py),
    the last finished iteration (if any) is saved and the run stops.

    Every reward is scored before the iteration's update (explore, regenerate and the rank check
    score; `train` only reads their scores) and the evaluations score after the EMA weights are
    swapped back, so when a reward fails the weights, the optimizer and the step count are still
    those of the last finished iteration; the reward streaks the attempt advanced are put back.
    With several processes the others wait in a collective for the failed one: there the error
    ends the run without a checkpoint (torchrun stops every rank) and the previous one is intact."""
    saved = state.streaks()
    # Before the first iteration there is nothing to keep: a checkpoint of the base weights would only make the
    # folder "hold a run", refused to the same command, where a folder without one starts again (rundir.restarts).
    finished = state.iteration > 0
    try:
        return backoff.retry(run, state, bus, work)
    except backoff.DoesNotFit:
        if finished:
            _checkpoint(run, state, bus)
        raise
    except RewardFailure:
        state.set_streaks(saved)
        if run.world_size == 1 and finished:
            _checkpoint(run, state, bus)
        raise
    finally:
        for message in run.rewards.retried:
            bus.emit(ev.RunWarning(message=message))
        run.rewards.retried.clear()


def _checkpoint(run: Run, state: LoopState, bus: ev.EventBus) -> None:
    """Rank 0 writes (the state is replicated, or gathered whole from the shards by every rank); the
    others wait, so no rank exits before it is saved."""
    gathered = gather(run.engine.policy, run.optimizer) if run.sharded else None
    if run.rank == 0:
        t0 = time.perf_counter()
        path = save_checkpoint(run.run_dir, state.iteration, run.engine.policy, run.optimizer, state.to_dict(),
                               run.config.run.keep_checkpoints, gathered=gathered,
                               spare=spared(state.evaluations, run.config.run.min_trade), folder_pin=run.checkpoints)
        bus.emit(ev.CheckpointSaved(iteration=state.iteration, path=str(path), seconds=time.perf_counter() - t0))
    distributed.barrier()
