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

Where this differs from the official NVlabs/Sana sol_rl code, and why:
- The explore copy is quantized with real 16-element NVFP4 block scaling (emulated exactly in torch,
  2D 16x16 weight tiles, 1D activation blocks), not the per-tensor FP8 E2M1 `DelayedScaling`
  recipe the official code builds; SANA's 1x1-conv feed-forward is quantized too.
- Every random draw (prompts, noise seeds, selection, train timesteps, training noise) derives from
  (run seed, iteration), so a resumed run repeats an uninterrupted one exactly, on any number of GPUs.
- The update's gradient is the mean over every (sample, train timestep) pair of the iteration; with
  micro-batches of unequal size it does not over-weight the samples of the last, smaller one.
- Stage-1 draft rewards are kept and reported next to Stage-2 rewards; the official code drops them.
- Full-precision rollouts run on the policy with its `old` adapter active rather than a merged
  copy (one copy of a large model in memory); only the explore and compiled copies are separate.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from solrl_core import distributed, environment, tracking
from solrl_core import events as ev
from solrl_core.checkpoint import save_checkpoint
from solrl_core.config import Config, to_dict
from solrl_core.nft import combined_advantages, nft_loss
from solrl_core.policy import OLD
from solrl_core.prompts import prompts_for_iteration, shard
from solrl_core.rollout import RolloutBatch, rollout
from solrl_core.sampler import sigma_grid
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


def train(config: Config, bus: ev.EventBus, resume: bool = False, stop: StopFlag | None = None) -> Session:
    """Run (or continue) training to config.run.iterations; returns the final session.

    Under torchrun each process calls this; it joins the process group from the environment."""
    distributed.init_from_env()
    tracking.require(config.run.log)  # a tracker that is not installed is named before anything loads
    session = open_session(config, resume=resume)
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
                           config=to_dict(cfg),
                           environment=environment.describe(cfg, session.device, session.dtype_name, plan.explore_precision)))
    copy_ = session.explore_copy
    if copy_ is not None and copy_.report is not None:
        bus.emit(ev.QuantizationReport(summary=copy_.report.summary(), path=str(session.run_dir / "quantization_report.json")))
    started = time.perf_counter()
    reason = "completed"
    with contextlib.ExitStack() as stack:
        flag = stop or stack.enter_context(graceful_stop())
        try:
            if session.eval_prompts and session.iteration == 0:
                _evaluate(session, bus, "base")
            while session.iteration < cfg.run.iterations:
                run_iteration(session, bus)
                last = session.iteration == cfg.run.iterations
                if session.eval_prompts and (last or session.iteration % cfg.run.eval_every == 0):
                    _evaluate(session, bus, "ema")
                failure = session.health.failure()  # from gathered rewards: the same on every rank
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
    return session


def run_iteration(session: Session, bus: ev.EventBus) -> None:
    cfg, plan = session.config, session.plan
    t_start = time.perf_counter()
    rng = np.random.default_rng([cfg.run.seed, session.iteration])
    prompts = shard(prompts_for_iteration(session.prompts, cfg.run.prompts_per_iteration, rng), session.rank, session.world_size)
    drafts = explore(session, prompts, rng)
    t0 = time.perf_counter()
    draft_scores = gather_scores(session, drafts)
    t_gather = time.perf_counter() - t0
    _check_rewards(session, bus, draft_scores)
    every = cfg.explore.rank_check_every
    if every and plan.regenerate and session.iteration % every == 0 and session.rank == 0:  # the first group is rank 0's
        _rank_check(session, bus, drafts)
    t0 = time.perf_counter()
    keep = select_seeds(session, drafts, rng, draft_scores)
    t_select = time.perf_counter() - t0 + t_gather
    finals = regenerate(session, drafts.subset(keep)) if plan.regenerate else drafts.subset(keep)
    t0 = time.perf_counter()
    final_scores = gather_scores(session, finals)
    losses = update(session, finals, rng, final_scores)
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    decay = sync(session)
    t_sync = time.perf_counter() - t0
    session.iteration += 1
    session.history.append(float(final_scores.rewards.mean()))
    seconds = {"explore": drafts.seconds_generate, "selection": t_select,
               "regenerate": finals.seconds_generate if plan.regenerate else 0.0,
               "reward": drafts.seconds_reward + (finals.seconds_reward if plan.regenerate else 0.0),
               "train": t_train, "sync": t_sync, "total": time.perf_counter() - t_start}
    if session.world_size > 1:  # each phase as long as its slowest rank
        slowest = distributed.all_reduce(torch.tensor(list(seconds.values()), dtype=torch.float64), "max")
        seconds = dict(zip(seconds, slowest.tolist()))
    bus.emit(ev.IterationFinished(iteration=session.iteration, iterations=cfg.run.iterations, seconds=seconds,
                                  draft=_stats(draft_scores) if plan.keep < plan.explore_seeds else None,
                                  final=_stats(final_scores), loss={k: losses[k] for k in ("loss", "policy", "kl")}, nonfinite_losses=int(losses["nonfinite"]),
                                  grad_norm=losses["grad_norm"], old_decay=decay))
    if samples.due(cfg.run.log, cfg.run.image_every, session.iteration, session.rank):
        bus.emit(samples.sample_grid(session.model, finals, session.run_dir, session.iteration))


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
    ranking = _advantages(session, scores, math.inf)  # within a group, ranks like the reward the update sees
    for g in scores.groups.unique(sorted=True):
        members = torch.nonzero(scores.groups == g).flatten()
        chosen = select(ranking[members], session.plan.keep, session.config.selection.mode, rng)
        keep.append(members[chosen])
    kept = torch.cat(keep)
    return kept[(kept >= scores.local.start) & (kept < scores.local.stop)] - scores.local.start


def regenerate(session: Session, kept: RolloutBatch) -> RolloutBatch:
    """Stage 2: the kept seeds again, same noise (same seeds), full precision and full steps."""
    return _rollout(session, kept.prompts, kept.groups, kept.seeds, session.plan.full_steps, explore=False)


def _rollout(session: Session, prompts: list[str], groups: torch.Tensor, seeds: torch.Tensor, steps: int,
             explore: bool) -> RolloutBatch:
    """Generate and score on the explore copy (explore=True, when there is one) or the old adapter."""
    sampler = session.config.sampler
    copy_ = session.explore_copy
    if explore and copy_ is not None:
        network, dtype = contextlib.nullcontext(copy_.forward), copy_.dtype
    else:
        network, dtype = session.policy.use(OLD), session.dtype
    with network as net:
        return rollout(session.model, net, prompts, groups, seeds, session.conditioning(prompts),
                       sigma_grid(steps, sampler.shift), session.rewards, sampler.rollout_batch, sampler.solver, dtype)


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
    gens = [torch.Generator().manual_seed(int(s)) for s in rng.integers(0, 2**63 - 1, size=n * session.world_size)[scores.local]]
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
            with torch.no_grad(), _autocast(session):
                with policy.use(OLD) as net:
                    v_old = model.velocity(net, xt, sigma, c).float()
                with policy.use(None) as net:
                    v_ref = model.velocity(net, xt, sigma, c).float()
            with _autocast(session):
                v = model.velocity(policy.transformer, xt, sigma, c).float()
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
    session.optimizer.step()
    if session.world_size > 1:
        total = distributed.all_reduce(torch.tensor([sums["loss"], sums["policy"], sums["kl"], nonfinite], dtype=torch.float64))
        sums = {"loss": float(total[0]) / session.world_size, "policy": float(total[1]) / session.world_size,
                "kl": float(total[2]) / session.world_size}
        nonfinite = int(total[3])
    return {**sums, "nonfinite": nonfinite, "grad_norm": float(grad_norm)}


def sync(session: Session) -> float:
    """After the step: old <- d*old + (1-d)*new, EMA, explore copy refreshed. Returns d."""
    alg = session.config.algorithm
    step = session.step
    decay = min(alg.old_decay_rate * step, alg.old_decay_max)
    session.policy.update_old(decay)
    session.policy.update_ema(min((1 + step) / (10 + step), alg.ema_max_decay))
    if session.explore_copy is not None:
        session.explore_copy.refresh(session.policy.merged_weights(OLD))
    session.step += 1
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


def _autocast(session: Session) -> contextlib.AbstractContextManager:
    if session.device.type == "cuda" and session.dtype == torch.bfloat16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
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

