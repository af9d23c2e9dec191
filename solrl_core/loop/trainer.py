"""The Sol-RL training loop (arXiv 2604.06916, "FP4 Explore, BF16 Train"), one iteration at a time:

    Stage 1  explore     N seeds per prompt through the low-precision explore copy, preview steps, scored
             select      keep K of N per prompt (top K/2 and bottom K/2 by default)
    Stage 2  regenerate  the K kept seeds again at full precision and full steps, scored
             update      DiffusionNFT loss on the Stage-2 rollouts, one optimizer step
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

Checked line by line against the official code (NVlabs/Sana train_scripts/sol_rl/train_sana.py,
train_sd3.py, train_flux1.py, train_utils.py, configs/sol_rl/): the loss, the advantages, the trained
timesteps, the selection, the ODE samplers, the sigma grids, the prompt encodings, the quantized-layer
rule, fp32 adapters, the grad clips (SD3 0.002, SANA and FLUX 1.0) and the
old-policy decay and EMA schedules (counted with the step just taken, as the official `global_step`
after its increment) are the official ones. Where this differs from it, and why:
- The explore copy is quantized with real 16-element NVFP4 block scaling (emulated exactly in torch,
  2D 16x16 weight tiles, 1D activation blocks) or real FP8 E4M3 GEMMs. The official code's "NVFP4"
  recipe is `DelayedScaling(fp8_format=Format.E2M1)` (train_utils.py:27-31), which Transformer
  Engine builds as per-tensor, delayed-scaled FP8 **E5M2** (E2M1 is not a DelayedScaling format;
  `get_fp8_te_dtype` gives E5M2 to anything but E4M3/HYBRID), not NVFP4. `explore.precision =
  fp8-e5m2-tensor` reproduces those numerics, emulated (scaled by each tensor's own amax where TE
  uses a 16-call amax history). Its layer set is the
  official one (name skips, then max(in, out) <= nvfp4_min_dim). The official SANA is a native
  checkpoint with a Linear feed-forward and fused projections; diffusers' SANA has a 1x1-conv
  feed-forward (quantized as the linear it is) and split q/k/v: the size rule is applied to the
  official fused shape (`model.quant_fused`), so the same layers are quantized.
- LoRA on SANA adapts diffusers' split attn1.to_q/to_k/to_v and attn2.to_k/to_v, where the official
  code puts one adapter on the fused attn.qkv and cross_attn.kv_linear (about 1.5x the adapter
  parameters here, and a different low-rank parametrization). diffusers' SANA has no fused-projection
  path (its linear-attention processor reads the split layers), and the saved LoRA must load through
  `SanaPipeline.load_lora_weights`. SD3 and FLUX are diffusers models in the official code too: same
  targets there.
- Every random draw (prompts, noise seeds, selection, train timesteps, training noise) derives from
  (run seed, iteration), so a resumed run repeats an uninterrupted one exactly, on any number of GPUs.
- The update's gradient is the mean over every (sample, train timestep) pair of the iteration; with
  micro-batches of unequal size it does not over-weight the samples of the last, smaller one.
- Stage-1 draft rewards are kept and reported next to Stage-2 rewards; the official code drops them.
- `explore.calibrate = steps` (off by default; calibration.py) chooses Stage 1's preview steps, before
  the first iteration and every `explore.recalibrate_every`, as the cheapest measured here whose
  selection recovers the full-precision one as well as the fixed explore.steps does; the official
  code fixes 6. `steps+precision` chooses the explore precision too, among the low ones this machine
  runs (the official code fixes its E5M2 copy). Its seconds count in the iteration's time; it draws
  nothing from the iteration's rng (it measures the first groups' Stage-1 seeds on an identical
  generator), and the rank check reuses its full-precision rollouts in the same iteration.
- Full-precision rollouts run, as in the official code, on a copy of base + `old` merged (refreshed
  after each step; compiled on CUDA) when the memory estimate says it fits (`sampler.rollout_copy`);
  where it does not, on the policy with its `old` adapter active (one copy of the model), said at
  start-up. The update's v_old runs on that copy too, where the official code runs it on the policy
  with `set_adapter("old")`: one forward fewer through the adapters, at the price of the merged
  weight's rounding to the run dtype (in bf16 the size of autocast's own rounding of the adapter
  path); `sampler.rollout_copy=false` gives the official v_old. Gradient checkpointing is chosen
  from the same estimate (`optimizer.checkpointing`), where the official code never checkpoints.
- The update's policy forwards (trained with its backward, reference, old without a copy) run with
  the policy's transformer blocks torch.compile'd on CUDA (`optimizer.compile`, regions.py); the
  official code runs them eager. Same loss and gradient to float tolerance
  (tests/test_rollout_copy.py). Without a rollout copy, the full-precision rollouts on the `old`
  adapter use those compiled blocks too when `sampler.compile` is on; the official naive_scaling and
  diffusionnft roll out eagerly, which `sampler.compile=false` keeps. The update's attention leaves
  out cuDNN's fused kernel, whose backward failed on an H100 at FLUX.1's shapes (attention.py); the
  official code leaves the choice to PyTorch. Flash and memory-efficient attention compute the same
  function. With
  `algorithm.kl_beta = 0` the reference forward, which then has no weight in the loss, is skipped
  and the KL reported as not measured; the official code always runs it.
- The explore and rollout copies compile in the official mode, `max-autotune-no-cudagraphs`
  (`run.compile_mode`, configs/sol_rl/base.py:112), but block by block (regions.py) where the official
  code compiles each copy whole; the update's compiled blocks, which the official code does not have
  (it runs the update eager), compile in torch's default mode, as does everything on a CPU, where
  Inductor's max-autotune failed on the tiny model (regions.compile_mode_for). The fp8 explore copy
  (solrl's; the official copy is NVFP4 through Transformer Engine) leaves its GEMMs out of the
  autotuning: on an H100 each fp8 GEMM shape of FLUX.1 autotuned for about a minute and cuBLAS's
  kernel won five of six (regions.NO_GEMM_AUTOTUNE). Whether the official mode is faster than the
  default on a given GPU is unmeasured: `solrl bench --compile-mode default
  --compile-mode max-autotune-no-cudagraphs` times both. TF32 is on for fp32 matmuls and
  convolutions on CUDA, as in the official code (`run.tf32`, tf32.py).
- Faults (solrl_core/faults): samples whose reward is NaN or infinite are left out of selection and
  the update (the official code would train on them), and an optimizer step whose gradient norm is
  not finite is skipped and counted (the official code zeroes non-finite losses and steps anyway),
  so one bad batch cannot poison the weights; a CUDA out-of-memory error halves that phase's batch
  and redoes the iteration instead of ending the run; a reward that raises is retried
  (`reward.retries`) and one that hangs past `reward.timeout_s` stops the run with a checkpoint of
  the last finished iteration. None of these changes a run in which they do not occur.
- Stopping (stopping.py): a first SIGTERM stops at the next phase boundary, abandoning an iteration
  whose update has not begun (redone exactly on resume), and a stop drops an evaluation in progress
  between two of its batches, or skips one that was due (done first on resume: run_eval.py); the
  official scripts have no stop handling. Neither changes a run that is not stopped.
- Evaluation: the official runs score the EMA weights on the PickScore test set with the trained
  reward during training; ImageReward, CLIPScore, PickScore and HPSv2 appear only in the paper's
  tables, scored afterwards. solrl scores `run.eval_rewards` (those four in the real-model presets,
  `tinyworld_fidelity` in the tiny one) at every evaluation on the same images, never trained on,
  each base -> now with its paired standard error, and warns (RewardHacking) when the trained reward
  rose while one of them fell by more than two standard errors; `run.stop_on_hacking` stops the run
  there with a checkpoint. The trained numbers are those of a run without them (benchmarks/same_run.py).
- The update's three forwards (old, trained, reference) get one input, xt in the run dtype, and the
  same timesteps, as the official code's (train_sana.py:878-889). The SANA and SD3 wrappers hand the
  transformer fp32 timesteps, in rollouts too (a bf16 sigma moved SD3's by up to 2/1000); FLUX's
  transformer rounds them to its input dtype itself, alike for all three.
- Family defaults follow the official configs (NVlabs/Sana 4b72423 configs/sol_rl/*.py):
  naive_scaling and diffusionnft roll out on the policy's `old` adapter, eager (fullrollout_model =
  peft); compile, naive_quant and sol_rl on merged compiled copies. (An earlier configs/sol_rl/sana.py
  compiled SANA's naive_scaling: `--set sampler.rollout_copy=auto --set sampler.compile=auto`.)
- Training precision (`model.train_precision`): the sana, sd3 and flux1 presets run each official
  regime (SANA a bf16 base without autocast, SD3 an fp32 base under bf16 autocast, FLUX a bf16 base
  under bf16 autocast); the default for every other model is the FLUX one, `autocast`: one bf16
  base (half an fp32 base's memory) with every adapter in fp32, so no update is lost to bf16
  rounding. The loss is fp32 in all: the official code's x0 errors are fp32 too (bf16 predictions
  times an fp32 sigma) and divided by an fp64 weight factor where ours is fp32 (rounding only).
- LoRA's A starts gaussian (std 1/r) for every model, as each official config sets
  (`lora_init_mode`; sana.py:32, flux1.py:22, sd3.py:29); `model.lora_init=kaiming` gives peft's default.
- `model.prompt_instruction` (off, as the official code) can prefix SANA prompts with the complex
  human instruction that SanaPipeline.__call__ adds by default; `model.max_sequence_length` (128 in
  the flux1 and sd3 presets, as train_flux1.py:94 and train_sd3.py:81) can give T5 the pipelines'
  own 512 / 256 tokens.
- `distributed.strategy = fsdp` (sharding.py; auto picks it with several processes when one replica
  does not fit a GPU by the memory estimate) shards the policy with FSDP2, where the official code
  holds a full replica per GPU. Stage 1 still explores at the explore precision, on a low-precision copy built and
  refreshed one gathered block at a time from the shards (sharded_copy.py), whole per process or sharded like the
  policy (`distributed.copy_layout`; sharded, it runs eager where the official copies are compiled); a full-precision
  rollout copy sharded like the policy, eager, where the estimate fits it, else Stage 2 and v_old on the `old` adapter. A micro-batch whose loss is not finite skips the whole step there (its
  backward must run on every rank) where a replica drops that micro-batch alone. Unchanged for a
  replicated run, the default wherever a replica fits.
- Memory modes for one tight GPU (memory_modes.py; the official code has none): `auto` picks them by
  the memory estimate only where the GPU needs them. Parking the VAE or the copies on the CPU
  (offload.py) and gradient checkpointing change no number. AdamW's moments stay fp32, as the official
  ones: torchao's 8-bit AdamW was left out (its block-wise rounding of the second moment zeroes the
  small entries of a block, and their steps grow to m/eps: over 1000 learning-rate-sized steps).
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
from solrl_core.loop.evaluation import RunEvals
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.phases import PhaseRecorder
from solrl_core.loop.run_eval import EVALUATION, evaluate_now
from solrl_core.loop.session import Run, Session, open_session
from solrl_core.loop.stages import (
    Scored,
    after_step,
    at_explore_steps,
    calibrate_if_due,
    explore,
    explore_steps,
    iteration_prompts,
    rank_check,
    rank_check_due,
    regenerate,
    score_drafts,
    score_finals,
    select_seeds,
    use_explore_precision,
)
from solrl_core.loop.stages import train as train_step
from solrl_core.loop.update import UpdateResult
from solrl_core.loop.warmup import warm_up_compiled
from solrl_core.plan import environment
from solrl_core.rewards.health import raise_if_diverged
from solrl_core.rewards.watchdog import RewardFailure
from solrl_core.runtime import distributed
from solrl_core.runtime.stopping import ScoringAbandoned, StopAtBoundary, StopFlag, graceful_stop
from solrl_core.telemetry.model_flops import model_flops
from solrl_core.tracking import samples


def train(config: Config, bus: ev.EventBus, resume: bool = False, stop: StopFlag | None = None,
          checkpoint: str | None = None) -> Session:
    """Run (or continue) training to config.run.iterations; returns the run and its final loop state.
    `checkpoint` (with resume) names the checkpoint to continue from; default the newest.

    Under torchrun each process calls this; it joins the process group from the environment."""
    distributed.init_from_env()
    tracking.require(config.run.log)  # a tracker that is not installed is named before anything loads
    again = bool(config.run.run_dir) and restarts(Path(config.run.run_dir))
    session = open_session(config, resume=resume, from_checkpoint=checkpoint)
    run, state = session.run, session.state
    if state.explore_precision:  # resumed after a steps+precision calibration: Stage 1 at its choice
        use_explore_precision(run, state.explore_precision)
    reason = "completed"
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
        _announce(run, state, bus)
        if again:
            bus.emit(ev.RunWarning(message=f"{run.run_dir} held a run with no checkpoint (it stopped before its first): "
                                           f"starting it again from iteration 0{' with its saved config' if resume else ''}"))
        warm_up_compiled(run, bus)
        state.start_clock()
        evals = RunEvals.of(run)  # the base and the latest evaluation: the end summary compares them
        try:
            run = _loop(run, state, bus, flag, evals)
            reason = "completed" if state.finished(run.config.run.iterations) else "interrupted"
        except BaseException as exc:
            reason = "failed"
            lost = distributed.lost_peer(exc, run.run_dir)  # another process died: said plainly, not the collective's trace
            if lost is not None:
                raise lost from exc
            raise
        finally:
            hist, took = state.history, state.session_seconds()
            newest = list_checkpoints(run.run_dir)
            bus.emit(ev.RunFinished(reason=reason, iteration=state.iteration, seconds=took,
                                    first_reward=hist[0] if hist else None,
                                    last3_reward=float(np.mean(hist[-3:])) if hist else None,
                                    run_dir=str(run.run_dir), checkpoint=str(newest[-1]) if newest else None,
                                    total_seconds=state.earlier_seconds + took, **evals.for_end()))
    return Session(run, state)


def _loop(run: Run, state: LoopState, bus: ev.EventBus, flag: StopFlag, base: RunEvals) -> Run:
    """Iterations to the end, a stop or a failure; evaluations and checkpoints on their schedule. A
    stop drops an evaluation in progress or skips one that was due (pending: a resume does it first),
    and always leaves the last finished iteration saved. Returns the run as it ended (an
    out-of-memory back-off may have lowered its batch sizes)."""
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
    if pending and not state.evaluation_pending:
        saved = state.iteration - 1  # its checkpoint still says pending: saved again below, unless a later one is
    while state.iteration < cfg.run.iterations and not distributed.any_true(flag.requested):
        streaks, flag.iteration = state.streaks(), state.iteration + 1
        try:
            run = _with_backoff(run, state, bus, lambda r: run_iteration(r, state, bus, flag))
        except StopAtBoundary as stop:  # before the update: the run's weights and counters are the last finished iteration's
            state.set_streaks(streaks)
            if isinstance(stop, ScoringAbandoned):
                bus.emit(ev.RunWarning(message=f"{stop.message}: iteration {flag.iteration} abandoned (redone exactly on resume)"))
            break
        last = state.iteration == cfg.run.iterations
        stopping = distributed.any_true(flag.requested)
        state.evaluation_pending = bool(run.eval_prompts) and (last or state.iteration % cfg.run.eval_every == 0)
        if state.evaluation_pending and not stopping:  # a stop skips it: still pending
            run = _with_backoff(run, state, bus, lambda r: evaluate_now(r, state, bus, flag, base))
            # dropped by a stop, or run.stop_on_hacking: every rank stops here, with a checkpoint of this iteration (below)
            stopping = state.evaluation_pending or (cfg.run.stop_on_hacking and distributed.any_true(base.hacked))
        failure = state.health.failure() or guard.failure(  # from gathered rewards: the same on every rank
            state.faults, cfg.reward.health_patience, cfg.optimizer.max_nonfinite_steps)
        if failure or stopping or last or state.iteration % cfg.run.checkpoint_every == 0:
            _checkpoint(run, state, bus)
            saved = state.iteration
        if failure:
            raise failure
        if stopping:
            break
    if state.iteration > saved:  # stopped between an iteration and its save, or at a phase boundary
        _checkpoint(run, state, bus)
    return run


def run_iteration(run: Run, state: LoopState, bus: ev.EventBus, stop: StopFlag | None = None) -> None:
    """One iteration, top to bottom: explore, select, regenerate, update, sync (stages.py). `stop` is
    told each phase as it begins, and may abandon the iteration there (stopping.py)."""
    phases = PhaseRecorder(run.device, stop.entering if stop is not None else None)
    rng = np.random.default_rng([run.config.run.seed, state.iteration])
    prompts = iteration_prompts(run, rng)
    calibrated = calibrate_if_due(run, state, bus, phases)  # its draws on an identical generator: rng is untouched
    with phases.phase("explore"):
        drafted = explore(run, prompts, rng, explore_steps(run, state))
        raise_if_diverged(drafted.latents, state.step, run.config.optimizer.lr)  # NaN outputs: blame the update, not the reward
        drafts = score_drafts(run, state, bus, drafted)
    with phases.phase("selection", memory=False):
        kept = drafts.batch.subset(select_seeds(run, drafts, rng))
    if rank_check_due(run, state):
        rank_check(run, state, bus, drafts.batch, calibrated)
    if run.plan.regenerate:
        with phases.phase("regenerate"):
            kept = regenerate(run, kept)
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
    trackers = tracking.open_trackers(run.config.run.log, run.run_dir, to_dict(run.config), state.resumed, state.iteration)
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


def _announce(run: Run, state: LoopState, bus: ev.EventBus) -> None:
    cfg, plan, now = run.config, run.plan, at_explore_steps(run, state).plan  # now: Stage 1 as this session starts it
    described = plan.describe()
    if run.world_size > 1:
        described += f"; {(p := cfg.run.prompts_per_iteration)} prompt groups over {run.world_size} processes, {p // run.world_size} each"
    if run.world_size > 1 or run.layout.strategy != "replicate":
        described += f"; weights: {run.layout.describe()}"
    if plan.calibrated and state.explore_steps:
        at = f"{state.explore_precision}@{state.explore_steps}" if state.explore_precision else f"{state.explore_steps} preview steps"
        described += f"; Stage 1 continues at the last calibration's {at} (from the checkpoint)"
    bus.emit(ev.RunStarted(run_dir=str(run.run_dir), preset=cfg.preset, device=str(run.device),
                           dtype=run.engine.dtype_name, explore_precision=now.explore_precision, plan=described,
                           explore_seeds=now.explore_seeds, explore_steps=now.explore_steps, keep=now.keep,
                           regenerate=now.regenerate, full_steps=now.full_steps,
                           start_iteration=state.iteration, iterations=cfg.run.iterations, resumed=state.resumed,
                           config=to_dict(cfg), machine=run.machine.describe(), tracking=tracking.where(cfg.run.log, run.run_dir),
                           copy_layout=run.machine.explore_layout, rewards=run_trust.scored(cfg),
                           environment=environment.describe(cfg, run.device, run.engine.dtype_name, plan.explore_precision, run.machine)))
    if run.rank == 0 and not (plan.calibrated and not state.explore_steps):  # else the calibration's (stages.calibrate)
        bus.emit(model_flops(at_explore_steps(run, state)))  # the live MFU's counts; the other ranks speak to no one
    copy_ = run.engine.explore_copy
    if copy_ is not None and copy_.report is not None:
        bus.emit(ev.QuantizationReport(summary=copy_.report.summary(), path=str(run.run_dir / "quantization_report.json")))
    for note in run.notes:
        bus.emit(ev.RunWarning(message=note))


def _with_backoff(run: Run, state: LoopState, bus: ev.EventBus, work: Callable[[Run], None]) -> Run:
    """`work(run)` under the out-of-memory back-off (backoff.py); returns the run to go on with.
    When a phase does not fit even at batch size 1, or a reward hangs or keeps raising (rewards/watchdog.py),
    the last finished iteration is saved and the run stops.

    Every reward is scored before the iteration's update (explore, regenerate and the rank check
    score; `train` only reads their scores) and the evaluations score after the EMA weights are
    swapped back, so when a reward fails the weights, the optimizer and the step count are still
    those of the last finished iteration; the reward streaks the attempt advanced are put back.
    With several processes the others wait in a collective for the failed one: there the error
    ends the run without a checkpoint (torchrun stops every rank) and the previous one is intact."""
    saved = state.streaks()
    try:
        return backoff.retry(run, state, bus, work)
    except backoff.DoesNotFit:
        _checkpoint(run, state, bus)
        raise
    except RewardFailure:
        state.set_streaks(saved)
        if run.world_size == 1:
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
                               run.config.run.keep_checkpoints, gathered=gathered)
        bus.emit(ev.CheckpointSaved(iteration=state.iteration, path=str(path), seconds=time.perf_counter() - t0))
    distributed.barrier()
