"""The Sol-RL training loop (arXiv 2604.06916, "FP4 Explore, BF16 Train"), one iteration at a time:

    Stage 1  explore     N seeds per prompt through the low-precision explore copy, preview steps, scored
             select      keep K of N per prompt (top K/2 and bottom K/2 by default)
    Stage 2  regenerate  the K kept seeds again at full precision and full steps, scored
             update      DiffusionNFT loss on the Stage-2 rollouts, one optimizer step
             sync        old adapter decay, EMA, explore copy refreshed and re-quantized

The other families are the same loop with stages switched off (session.plan_stages).

Many GPUs (torchrun, see distributed.py): the iteration's prompt groups are split over the ranks,
each group whole on one rank. Every random draw is made for the whole iteration on every rank and
each rank takes its slice, and the rewards are all-gathered before advantages, selection, reward
health and logged stats, so a run on W processes computes what one process would (to float
rounding). LoRA gradients are averaged over ranks before clipping; rank 0 alone writes and speaks.

Checked line by line against the official code (NVlabs/Sana train_scripts/sol_rl/train_sana.py,
train_sd3.py, train_flux1.py, train_utils.py, configs/sol_rl/): the loss, the advantages, the trained
timesteps, the selection, the ODE samplers, the sigma grids, the prompt encodings, the quantized-layer
rule, fp32 adapters under bf16 autocast, the grad clips (SD3 0.002, SANA and FLUX 1.0) and the
old-policy decay and EMA schedules (counted with the step just taken, as the official `global_step`
after its increment) are the official ones. Where this differs from it, and why:
- The explore copy is quantized with real 16-element NVFP4 block scaling (emulated exactly in torch,
  2D 16x16 weight tiles, 1D activation blocks) or real FP8 GEMMs, not the per-tensor FP8 E2M1
  `DelayedScaling` recipe the official code builds (which is not NVFP4). Its layer set is the
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
- Full-precision rollouts run, as in the official code, on a copy of base + `old` merged (refreshed
  after each step; compiled on CUDA) when the memory estimate says it fits (`sampler.rollout_copy`);
  where it does not, on the policy with its `old` adapter active (one copy of the model), said at
  start-up. The update's v_old runs on that copy too, where the official code runs it on the policy
  with `set_adapter("old")`: one forward fewer through the adapters, at the price of the merged
  weight's rounding to the run dtype (in bf16 the size of autocast's own rounding of the adapter
  path); `sampler.rollout_copy=false` gives the official v_old. Gradient checkpointing is chosen
  from the same estimate (`optimizer.checkpointing`), where the official code never checkpoints.
- The update's policy forwards (trained with its backward, reference, old without a copy) run
  through one torch.compile'd module on CUDA (`optimizer.compile`); the official code runs them
  eager. Same loss and gradient to float tolerance (tests/test_rollout_copy.py). With
  `algorithm.kl_beta = 0` the reference forward, which then has no weight in the loss, is skipped
  and the KL reported as not measured; the official code always runs it.
- torch.compile runs in its default mode (`run.compile_mode`); the official code compiles its
  inference copies with `max-autotune-no-cudagraphs` (train_sana.py, `compile_mode`), which
  autotunes every GEMM at a much longer compile. Which is faster on a given GPU is unmeasured here.
- Faults (solrl_core/faults): samples whose reward is NaN or infinite are left out of selection and
  the update (the official code would train on them), and an optimizer step whose gradient norm is
  not finite is skipped and counted (the official code zeroes non-finite losses and steps anyway),
  so one bad batch cannot poison the weights; a CUDA out-of-memory error halves that phase's batch
  and redoes the iteration instead of ending the run.
- `model.prompt_instruction` (off, as the official code) can prefix SANA prompts with the complex
  human instruction that SanaPipeline.__call__ adds by default.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from solrl_core import distributed, environment, tracking
from solrl_core import events as ev
from solrl_core.checkpoint import save_checkpoint
from solrl_core.config import Config, to_dict
from solrl_core.faults import guard, oom
from solrl_core.nft import combined_advantages, nft_loss
from solrl_core.memory import PhaseMemory
from solrl_core.models.base import Conditioning
from solrl_core.policy import OLD
from solrl_core.prompts import prompts_for_iteration, shard
from solrl_core.rollout import Draws, RolloutBatch, rollout
from solrl_core.sampler import Sampler
from solrl_core.selection import select
from solrl_core.session import EVENTS_FILE, Session, open_session
from solrl_core.tracking import samples


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its iteration, saves, and returns. With several
    processes, a flag set on any rank stops every rank after the same iteration."""

    def __init__(self) -> None:
        self.requested = False


@contextlib.contextmanager
def graceful_stop() -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: object) -> None:
        if flag.requested:  # a second Ctrl-C means now; checkpoints are atomic, so nothing is torn
            raise KeyboardInterrupt
        flag.requested = True

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(config: Config, bus: ev.EventBus, resume: bool = False, stop: StopFlag | None = None,
          checkpoint: str | None = None) -> Session:
    """Run (or continue) training to config.run.iterations; returns the final session. `checkpoint`
    (with resume) names the checkpoint to continue from; default the newest.

    Under torchrun each process calls this; it joins the process group from the environment."""
    distributed.init_from_env()
    tracking.require(config.run.log)  # a tracker that is not installed is named before anything loads
    session = open_session(config, resume=resume, from_checkpoint=checkpoint)
    log = trackers = None
    if session.rank == 0:
        log = ev.JsonlLog(session.run_dir / EVENTS_FILE)
        bus.subscribe(log)
        trackers = tracking.open_trackers(config.run.log, session.run_dir, to_dict(session.config), session.resumed, session.iteration)
        bus.subscribe(trackers)
    else:
        bus = ev.EventBus()  # rank 0 alone speaks: the other ranks' events reach no subscriber
    cfg, plan = session.config, session.plan
    described = plan.describe()
    if session.world_size > 1:
        p = cfg.run.prompts_per_iteration
        described += f"; {p} prompt groups over {session.world_size} processes, {p // session.world_size} each"
    bus.emit(ev.RunStarted(run_dir=str(session.run_dir), preset=cfg.preset, device=str(session.device),
                           dtype=session.dtype_name, explore_precision=plan.explore_precision, plan=described,
                           start_iteration=session.iteration, iterations=cfg.run.iterations, resumed=session.resumed,
                           config=to_dict(cfg), machine=session.machine.describe() if session.machine else "",
                           environment=environment.describe(cfg, session.device, session.dtype_name, plan.explore_precision,
                                                            session.machine)))
    copy_ = session.explore_copy
    if copy_ is not None and copy_.report is not None:
        bus.emit(ev.QuantizationReport(summary=copy_.report.summary(), path=str(session.run_dir / "quantization_report.json")))
    warm_up_compiled(session, bus)
    started = time.perf_counter()
    reason = "completed"
    with contextlib.ExitStack() as stack:
        flag = stop or stack.enter_context(graceful_stop())
        try:
            if session.eval_prompts and session.iteration == 0:
                _with_backoff(session, bus, lambda: _evaluate(session, bus, "base"))
            while session.iteration < cfg.run.iterations:
                _with_backoff(session, bus, lambda: run_iteration(session, bus))
                last = session.iteration == cfg.run.iterations
                if session.eval_prompts and (last or session.iteration % cfg.run.eval_every == 0):
                    _with_backoff(session, bus, lambda: _evaluate(session, bus, "ema"))
                failure = session.health.failure() or guard.failure(  # from gathered rewards: the same on every rank
                    session.faults, cfg.reward.health_patience, cfg.optimizer.max_nonfinite_steps)
                stopping = distributed.any_true(flag.requested)
                if failure or stopping or last or session.iteration % cfg.run.checkpoint_every == 0:
                    _checkpoint(session, bus)
                if failure:
                    raise failure
                if stopping and not last:
                    reason = "interrupted"
                    break
        except BaseException:
            reason = "failed"
            raise
        finally:
            hist = session.history
            bus.emit(ev.RunFinished(reason=reason, iteration=session.iteration, seconds=time.perf_counter() - started,
                                    first_reward=hist[0] if hist else None,
                                    last3_reward=float(np.mean(hist[-3:])) if hist else None))
            if log is not None:
                bus.unsubscribe(log)
                log.close()
            if trackers is not None:
                bus.unsubscribe(trackers)
                trackers.close()
            if session.lock is not None:
                session.lock.release()
    return session


def _with_backoff(session: Session, bus: ev.EventBus, work: Callable[[], None]) -> None:
    """`work()` under the out-of-memory back-off (faults/oom.py); when a phase does not fit even at
    batch size 1, the last finished iteration is saved and the run stops."""
    try:
        oom.retry(session, bus, work)
    except oom.DoesNotFit:
        _checkpoint(session, bus)
        raise


def run_iteration(session: Session, bus: ev.EventBus) -> None:
    cfg, plan = session.config, session.plan
    t_start = time.perf_counter()
    memory = PhaseMemory(session.device)
    rng = np.random.default_rng([cfg.run.seed, session.iteration])
    prompts = shard(prompts_for_iteration(session.prompts, cfg.run.prompts_per_iteration, rng), session.rank, session.world_size)
    with memory.phase("explore"):
        drafts = explore(session, prompts, rng)
    t0 = time.perf_counter()
    draft_scores = gather_scores(session, drafts)
    t_gather = time.perf_counter() - t0
    draft_screen = _screen(session, bus, draft_scores, "explore")
    _check_rewards(session, bus, _finite_only(draft_scores, draft_screen.valid))
    every = cfg.explore.rank_check_every
    if every and plan.regenerate and session.iteration % every == 0 and session.rank == 0:  # the first group is rank 0's
        _rank_check(session, bus, drafts)
    t0 = time.perf_counter()
    keep = select_seeds(session, drafts, rng, draft_scores)
    t_select = time.perf_counter() - t0 + t_gather
    with memory.phase("regenerate"):
        finals = regenerate(session, drafts.subset(keep)) if plan.regenerate else drafts.subset(keep)
    t0 = time.perf_counter()
    final_scores = gather_scores(session, finals)
    screen = _screen(session, bus, final_scores, "final")
    guard.record_rewards(session.faults, screen, list(final_scores.components), final_scores.rewards.numel())
    usable = _finite_only(final_scores, screen.valid)  # the samples every reward scored finitely
    with memory.phase("train"):
        if usable is final_scores:
            losses = update(session, finals, rng, final_scores)
        elif screen.valid.any():
            losses = update(session, finals.subset(torch.nonzero(screen.valid[final_scores.local]).flatten()), rng, usable)
        else:  # nothing to learn from: no step, and the streak above may stop the run
            losses = {"loss": math.nan, "policy": math.nan, "kl": math.nan, "nonfinite": 0, "grad_norm": math.nan,
                      "stepped": False}
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    if screen.valid.any():
        _count_step(session, bus, losses)
    with memory.phase("sync"):
        decay = sync(session) if losses["stepped"] else math.nan  # a skipped step changed nothing to sync
    t_sync = time.perf_counter() - t0
    session.iteration += 1
    session.history.append(float(usable.rewards.mean()) if usable.rewards.numel() else math.nan)
    seconds = {"explore": drafts.seconds_generate, "selection": t_select,
               "regenerate": finals.seconds_generate if plan.regenerate else 0.0,
               "reward": drafts.seconds_reward + (finals.seconds_reward if plan.regenerate else 0.0),
               "train": t_train, "sync": t_sync, "total": time.perf_counter() - t_start}
    peaks = {k: v for k, v in memory.peaks.items() if k != "regenerate" or plan.regenerate}
    if session.world_size > 1:  # each phase as long (and as large) as its slowest rank's
        slowest = distributed.all_reduce(torch.tensor([*seconds.values(), *peaks.values()], dtype=torch.float64), "max").tolist()
        seconds, peaks = dict(zip(seconds, slowest)), dict(zip(peaks, slowest[len(seconds):]))
    peaks["total"] = max(peaks.values())
    bus.emit(ev.IterationFinished(iteration=session.iteration, iterations=cfg.run.iterations, seconds=seconds,
                                  draft=_finite_stats(draft_scores, draft_screen) if plan.keep < plan.explore_seeds else None,
                                  final=_finite_stats(final_scores, screen), loss={k: losses[k] for k in ("loss", "policy", "kl")}, nonfinite_losses=int(losses["nonfinite"]),
                                  grad_norm=losses["grad_norm"], old_decay=decay, peak_memory=peaks,
                                  memory_source=memory.source))
    if samples.due(cfg.run.log, cfg.run.image_every, session.iteration, session.rank):
        bus.emit(samples.sample_grid(session.model, finals, session.run_dir, session.iteration))


def warm_up_compiled(session: Session, bus: ev.EventBus) -> None:
    """Compile each torch.compile'd module on warm-up calls before the first iteration, and report the
    time as its own event: a compile is a one-time cost, not a slow iteration.

    Each module is called at every batch size the run will give it (`warm_up_sizes`): torch.compile
    turns the batch dimension dynamic at the second size, and a graph's guards can still depend on
    the batch (on a CPU the convolution backend changes at batch 16, and SANA's feed-forward is
    convolutions), so only the sizes themselves make sure iteration 1 compiles nothing."""
    sizes = warm_up_sizes(session)
    for target, copy_ in (("explore copy", session.explore_copy), ("rollout copy", session.rollout_copy)):
        if copy_ is None or copy_.forward is copy_.module:
            continue
        bus.emit(ev.CompileStarted(target=target))
        t0 = time.perf_counter()
        for n in sizes[target]:
            cond = session.conditioning(session.prompts[:1] * n).to(session.device)
            x = torch.zeros(n, *session.model.latent_shape, device=session.device, dtype=copy_.dtype)
            with torch.no_grad():
                session.model.velocity(copy_.forward, x, torch.ones(n, device=session.device), cond)
        if session.device.type == "cuda":
            torch.cuda.synchronize(session.device)
        bus.emit(ev.CompileFinished(target=target, seconds=time.perf_counter() - t0))
    if session.policy_forward is not session.policy.transformer:
        bus.emit(ev.CompileStarted(target="update"))
        t0 = time.perf_counter()
        _warm_up_update(session, sizes["update"])
        bus.emit(ev.CompileFinished(target="update", seconds=time.perf_counter() - t0))


def warm_up_sizes(session: Session) -> dict[str, list[int]]:
    """The batch sizes each compiled module sees in an iteration on this rank, largest first: the
    rollouts' chunks of sampler.rollout_batch (Stage 1, Stage 2, the rank check), and v_old's and the
    update's micro-batches. Samples left out for a non-finite reward, or an out-of-memory back-off,
    can still bring a new size (one recompile, then)."""
    cfg, plan = session.config, session.plan
    batch, micro = cfg.sampler.rollout_batch, cfg.optimizer.micro_batch
    groups = cfg.run.prompts_per_iteration // session.world_size

    def chunks(n: int, size: int) -> set[int]:
        return {s for s in (min(n, size), n % size) if s}

    drafts, kept = groups * plan.explore_seeds, groups * plan.keep
    full = chunks(kept, batch) if plan.regenerate else set()
    if session.explore_copy is None:  # Stage 1 (every rollout of a full-precision family) on the rollout copy
        full |= chunks(drafts, batch)
    if plan.regenerate and cfg.explore.rank_check_every:
        full |= chunks(plan.explore_seeds, batch)
    out = {"explore copy": chunks(drafts, batch), "rollout copy": full | chunks(kept, micro), "update": chunks(kept, micro)}
    return {k: sorted(v, reverse=True) for k, v in out.items()}


def _warm_up_update(session: Session, sizes: list[int]) -> None:
    """Each graph of the compiled update at each micro-batch size, in the update's own states: the
    trained forward and backward under autocast, the reference (and, without a rollout copy, the old
    adapter) without gradients. The warm-up's gradients are dropped; the weights are not touched."""
    model, policy = session.model, session.policy
    states = [None] if session.config.algorithm.kl_beta != 0 else []
    if session.rollout_copy is None:
        states.append(OLD)
    for n in sizes:
        cond = session.conditioning(session.prompts[:1] * n).to(session.device)
        x = torch.zeros(n, *model.latent_shape, device=session.device)
        sigma = torch.full((n,), 0.5, device=session.device)
        with _autocast(session):
            model.velocity(session.policy_forward, x, sigma, cond).float().sum().backward()
        with torch.no_grad():
            for state in states:
                with _autocast(session), policy.use(state):
                    model.velocity(session.policy_forward, x, sigma, cond)
    for p in policy.trainable_parameters():
        p.grad = None
    if session.device.type == "cuda":
        torch.cuda.synchronize(session.device)


def explore(session: Session, prompts: list[str], rng: np.random.Generator) -> RolloutBatch:
    """Stage 1: every prompt's N seeds at the explore precision and step count, scored.

    `prompts` are this rank's groups. Seeds are drawn for every rank's groups and this rank takes its
    slice, so a prompt group gets the same seeds whatever the number of processes; group indices are
    global (rank r's first group is r * len(prompts))."""
    n = session.plan.explore_seeds
    mine = slice(session.rank * len(prompts) * n, (session.rank + 1) * len(prompts) * n)
    seeds = torch.as_tensor(rng.integers(0, 2**31 - 1, size=len(prompts) * n * session.world_size)[mine], dtype=torch.long)
    groups = session.rank * len(prompts) + torch.arange(len(prompts)).repeat_interleave(n)
    flat = [p for p in prompts for _ in range(n)]
    return _rollout(session, flat, groups, seeds, session.plan.explore_steps, explore=True)


@dataclass(frozen=True)
class GlobalScores:
    """One stage's rewards on every rank, in global sample order (rank 0's samples first)."""

    rewards: torch.Tensor  # [W * B] total reward
    components: dict[str, torch.Tensor]  # [W * B] per reward
    groups: torch.Tensor  # [W * B] global prompt-group index
    local: slice  # this rank's samples


def gather_scores(session: Session, batch: RolloutBatch) -> GlobalScores:
    """The rewards of `batch` on every rank, gathered (one process: the batch's own)."""
    n = len(batch.prompts)
    local = slice(session.rank * n, (session.rank + 1) * n)
    if session.world_size == 1:
        return GlobalScores(batch.rewards, batch.components, batch.groups, local)
    names = sorted(batch.components)
    table = distributed.all_gather_tensor(torch.stack([batch.rewards.float(), *(batch.components[k].float() for k in names)], dim=1))
    return GlobalScores(table[:, 0], {k: table[:, 1 + i] for i, k in enumerate(names)},
                        distributed.all_gather_tensor(batch.groups), local)


def select_seeds(session: Session, drafts: RolloutBatch, rng: np.random.Generator,
                 scores: GlobalScores | None = None) -> torch.Tensor:
    """Indices into `drafts` of the K seeds kept for each of this rank's prompt groups.

    Every rank selects for every group (cheap: it sorts rewards) so that a random selection mode
    draws from `rng` as one process would, then keeps its own groups' picks."""
    scores = scores if scores is not None else gather_scores(session, drafts)
    keep = []
    valid = guard.screen(scores.components, scores.groups).valid
    finite = _finite_only(scores, valid)
    ranking = _advantages(session, finite, math.inf)  # within a group, ranks like the reward the update sees
    if finite is not scores:  # a non-finite draft ranks nowhere: it is kept only to fill a group (guard.prefer_finite)
        ranking = torch.zeros(valid.numel(), dtype=ranking.dtype).index_put_((valid,), ranking)
    for g in scores.groups.unique(sorted=True):
        members = guard.prefer_finite(torch.nonzero(scores.groups == g).flatten(), valid, session.plan.keep)
        chosen = select(ranking[members], session.plan.keep, session.config.selection.mode, rng)
        keep.append(members[chosen])
    kept = torch.cat(keep)
    return kept[(kept >= scores.local.start) & (kept < scores.local.stop)] - scores.local.start


def regenerate(session: Session, kept: RolloutBatch) -> RolloutBatch:
    """Stage 2: the kept seeds again, same noise (same seeds), full precision and full steps."""
    return _rollout(session, kept.prompts, kept.groups, kept.seeds, session.plan.full_steps, explore=False)


def _rollout(session: Session, prompts: list[str], groups: torch.Tensor, seeds: torch.Tensor, steps: int,
             explore: bool) -> RolloutBatch:
    """Generate and score on the explore copy (explore=True, when there is one), else at full precision:
    on the rollout copy (base + old merged) when the run keeps one, or on the policy's old adapter."""
    sampler = session.config.sampler
    copy_ = session.explore_copy if explore and session.explore_copy is not None else session.rollout_copy
    if copy_ is not None:
        network, dtype, cast = contextlib.nullcontext(copy_.forward), copy_.dtype, contextlib.nullcontext()
    else:
        network, dtype, cast = session.policy.use(OLD), session.dtype, _autocast(session)
    with network as net, cast:
        return rollout(session.model, net, dtype, Sampler.of(sampler), steps, Draws(prompts, groups, seeds),
                       session.conditioning(prompts), session.rewards)


def update(session: Session, batch: RolloutBatch, rng: np.random.Generator, scores: GlobalScores | None = None) -> dict[str, float]:
    """One optimizer step of the DiffusionNFT loss, accumulated over micro-batches and timesteps.

    The gradient is the mean over every (sample, train timestep) pair of every rank: each rank
    weighs a micro-batch's mean loss by its share of the rank's pairs, and the ranks (which hold
    equally many samples) average their gradients. Each sample's timesteps and training noise come
    from its own generator, seeded for the global batch, so neither the split over ranks nor the
    micro-batch size changes them."""
    cfg, policy, model = session.config, session.policy, session.model
    alg = cfg.algorithm
    device = session.device
    scores = scores if scores is not None else gather_scores(session, batch)
    adv = _advantages(session, scores, alg.adv_clip_max)[scores.local].to(device)  # std over every rank's rewards
    grid = batch.sigmas[:-1]
    per_sample = max(1, int(session.plan.full_steps * alg.timestep_fraction))
    per_sample = min(per_sample, grid.numel())
    n = len(batch.prompts)
    gens = [torch.Generator().manual_seed(int(s)) for s in rng.integers(0, 2**63 - 1, size=scores.rewards.numel())[scores.local]]
    picks = torch.stack([torch.randperm(grid.numel(), generator=g)[:per_sample] for g in gens])
    cond = session.conditioning(batch.prompts)
    micro = cfg.optimizer.micro_batch
    chunks = [range(i, min(i + micro, n)) for i in range(0, n, micro)]
    pairs = n * per_sample
    params = policy.trainable_parameters()
    session.optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "policy": 0.0, "kl": 0.0}
    nonfinite = 0
    for j in range(per_sample):
        for members in chunks:
            chunk = slice(members.start, members.stop)
            x0 = batch.latents[chunk].to(device)
            sigma = grid[picks[chunk, j]].to(device)
            eps = torch.stack([torch.randn(x0.shape[1:], generator=gens[i]) for i in members]).to(device)
            s = sigma.view(-1, 1, 1, 1)
            xt = (1 - s) * x0 + s * eps
            c = cond[chunk].to(device)
            with torch.no_grad():
                v_old = _old_velocity(session, xt, sigma, c)
                v_ref = None
                if alg.kl_beta != 0:  # the reference only enters the loss through kl_beta: no forward for nothing
                    with _autocast(session), policy.use(None):
                        v_ref = model.velocity(session.policy_forward, xt, sigma, c).float()
            with _autocast(session):
                v = model.velocity(session.policy_forward, xt, sigma, c).float()
            terms = nft_loss(v, v_old, v_ref, xt, x0, sigma, adv[chunk], alg.nft_beta, alg.kl_beta, alg.adv_clip_max)
            nonfinite += terms.nonfinite
            if not torch.isfinite(terms.loss):
                nonfinite += x0.shape[0] - terms.nonfinite
                continue
            weight = len(members) / pairs  # the loss is a mean over the micro-batch's samples
            (terms.loss * weight).backward()
            sums["loss"] += float(terms.loss.detach()) * weight
            sums["policy"] += float(terms.policy) * weight
            sums["kl"] += float(terms.kl) * weight
    distributed.all_reduce_mean_grads(params)  # every rank now holds the same gradient, so takes the same step
    clip = cfg.optimizer.grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
    stepped = bool(torch.isfinite(grad_norm)) and any(p.grad is not None for p in params)  # a NaN step would poison the weights
    if stepped:
        session.optimizer.step()
    if session.world_size > 1:
        total = distributed.all_reduce(torch.tensor([sums["loss"], sums["policy"], sums["kl"], nonfinite], dtype=torch.float64))
        sums = {"loss": float(total[0]) / session.world_size, "policy": float(total[1]) / session.world_size,
                "kl": float(total[2]) / session.world_size}
        nonfinite = int(total[3])
    return {**sums, "nonfinite": nonfinite, "grad_norm": float(grad_norm), "stepped": stepped}


def _old_velocity(session: Session, xt: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """v_old: on the rollout copy (base + old merged, no adapter overhead; called outside autocast in
    its own dtype, as its rollouts are, so a compiled copy keeps its graph), else the old adapter."""
    full = session.rollout_copy
    if full is not None:
        return session.model.velocity(full.forward, xt.to(full.dtype), sigma, cond).float()
    with _autocast(session), session.policy.use(OLD):
        return session.model.velocity(session.policy_forward, xt, sigma, cond).float()


def sync(session: Session) -> float:
    """After the step: old <- d*old + (1-d)*new, EMA, rollout copies refreshed. Returns d.

    Both schedules count the optimizer step just taken (1 after the first), as the official code's
    `return_decay(global_step)` and `ema.step(params, global_step)` do after its increment."""
    alg = session.config.algorithm
    session.step += 1
    step = session.step
    decay = min(alg.old_decay_rate * step, alg.old_decay_max)
    session.policy.update_old(decay)
    session.policy.update_ema(min((1 + step) / (10 + step), alg.ema_max_decay))
    session.refresh_copies()
    return decay


def _advantages(session: Session, scores: GlobalScores, clip: float) -> torch.Tensor:
    """Advantages of every rank's samples (the std is over all of them)."""
    reward = session.config.reward
    return combined_advantages(scores.rewards, scores.components, reward.weights, scores.groups, reward.aggregation, clip)


def _rank_check(session: Session, bus: ev.EventBus, drafts: RolloutBatch) -> None:
    """Regenerate every Stage-1 seed of the first prompt at full precision and steps; log rho, tau.
    Uses no random draw, so it does not change the run it observes."""
    from solrl_core.rankcheck import group_correlation

    t0 = time.perf_counter()
    members = torch.nonzero(drafts.groups == drafts.groups[0]).flatten()
    group = drafts.subset(members)
    full = _rollout(session, group.prompts, group.groups, group.seeds, session.plan.full_steps, explore=False)
    rho, tau = group_correlation(group.rewards, full.rewards)
    bus.emit(ev.RankCheckResult(iteration=session.iteration + 1, prompt=group.prompts[0], seeds=len(members), rho=rho, tau=tau,
                                draft_mean=float(group.rewards.mean()), full_mean=float(full.rewards.mean()),
                                seconds=time.perf_counter() - t0))


def _check_rewards(session: Session, bus: ev.EventBus, scores: GlobalScores) -> None:
    """Warn about near-constant rewards (see rewards/health.py), over every rank's scores."""
    for finding in session.health.check(scores.components, scores.groups):
        bus.emit(ev.RunWarning(message=finding.message))


def _screen(session: Session, bus: ev.EventBus, scores: GlobalScores, stage: str) -> guard.Screen:
    """Which samples every reward scored finitely; a warning event when some were not."""
    found = guard.screen(scores.components, scores.groups)
    if not found.clean:
        bus.emit(ev.SamplesDropped(iteration=session.iteration + 1, stage=stage, rewards=found.nonfinite, dropped=found.dropped,
                                   samples=found.valid.numel(), groups_skipped=found.groups_without_valid, groups=found.groups))
    return found


def _finite_only(scores: GlobalScores, valid: torch.Tensor) -> GlobalScores:
    """`scores` restricted to the `valid` samples (the same object when all are)."""
    if bool(valid.all()):
        return scores
    start = int(valid[:scores.local.start].sum())
    return GlobalScores(scores.rewards[valid], {k: v[valid] for k, v in scores.components.items()}, scores.groups[valid],
                        slice(start, start + int(valid[scores.local].sum())))


def _finite_stats(scores: GlobalScores, screen: guard.Screen) -> ev.RewardStats:
    """Statistics of the finitely scored samples (of all, when none is)."""
    return _stats(_finite_only(scores, screen.valid) if screen.valid.any() else scores)


def _count_step(session: Session, bus: ev.EventBus, losses: dict[str, float]) -> None:
    in_a_row = guard.record_step(session.faults, bool(losses["stepped"]))
    if in_a_row:
        reason = "gradient norm not finite" if not math.isfinite(losses["grad_norm"]) else "no finite loss term"
        bus.emit(ev.StepSkipped(iteration=session.iteration + 1, reason=reason, in_a_row=in_a_row,
                                limit=session.config.optimizer.max_nonfinite_steps))


def _autocast(session: Session) -> contextlib.AbstractContextManager:
    """bf16 autocast around the policy's forwards when the base is bf16 (the adapters are fp32), on
    CUDA and on a CPU alike, so the bf16 path runs the same way in the CPU test suite."""
    if session.dtype == torch.bfloat16:
        return torch.autocast(session.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _stats(scores: GlobalScores) -> ev.RewardStats:
    r = scores.rewards.float()
    return ev.RewardStats(mean=float(r.mean()), std=float(r.std(unbiased=False)), best=float(r.max()), worst=float(r.min()),
                          components={k: float(v.float().mean()) for k, v in scores.components.items()})


def _evaluate(session: Session, bus: ev.EventBus, weights: str) -> None:
    """On rank 0 alone (every rank holds the same weights); the others wait."""
    from solrl_core.evaluation import evaluate

    if session.rank == 0:
        result = evaluate(session, session.eval_prompts, session.config.run.eval_seeds, weights)
        bus.emit(ev.EvalFinished(iteration=session.iteration, weights=weights, prompts=session.config.run.eval_prompts,
                                 samples=len(result.seeds), mean=result.mean,
                                 components={k: float(v.mean()) for k, v in result.scores.components.items()},
                                 extras=result.extras, seconds=result.seconds))
    distributed.barrier()


def _checkpoint(session: Session, bus: ev.EventBus) -> None:
    """Rank 0 writes (the state is replicated); the others wait, so no rank exits before it is saved."""
    if session.rank == 0:
        t0 = time.perf_counter()
        path = save_checkpoint(session.run_dir, session.iteration, session.policy, session.optimizer,
                               session.loop_state(), session.config.run.keep_checkpoints)
        bus.emit(ev.CheckpointSaved(iteration=session.iteration, path=str(path), seconds=time.perf_counter() - t0))
    distributed.barrier()

