"""The Sol-RL training loop (arXiv 2604.06916, "FP4 Explore, BF16 Train"), one iteration at a time:

    Stage 1  explore     N seeds per prompt through the low-precision explore copy, preview steps, scored
             select      keep K of N per prompt (top K/2 and bottom K/2 by default)
    Stage 2  regenerate  the K kept seeds again at full precision and full steps, scored
             update      DiffusionNFT loss on the Stage-2 rollouts, one optimizer step
             sync        old adapter decay, EMA, explore copy refreshed and re-quantized

The other families are the same loop with stages switched off (session.plan_stages).

Where this differs from the official NVlabs/Sana sol_rl code, and why:
- The explore copy is quantized with real 16-element NVFP4 block scaling (emulated exactly in torch,
  2D 16x16 weight tiles, 1D activation blocks), not the per-tensor FP8 E2M1 `DelayedScaling`
  recipe the official code builds; SANA's 1x1-conv feed-forward is quantized too.
- Every random draw (prompts, noise seeds, selection, train timesteps, training noise) derives from
  (run seed, iteration), so a resumed run repeats an uninterrupted one exactly.
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
from typing import Iterator

import numpy as np
import torch

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


class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes its iteration, saves, and returns."""

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
    """Run (or continue) training to config.run.iterations; returns the final session."""
    session = open_session(config, resume=resume)
    log = ev.JsonlLog(session.run_dir / EVENTS_FILE)
    bus.subscribe(log)
    cfg, plan = session.config, session.plan
    bus.emit(ev.RunStarted(run_dir=str(session.run_dir), preset=cfg.preset, device=str(session.device),
                           dtype=session.dtype_name, explore_precision=plan.explore_precision, plan=plan.describe(),
                           start_iteration=session.iteration, iterations=cfg.run.iterations, resumed=session.resumed,
                           config=to_dict(cfg)))
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
                failure = session.health.failure()
                if failure or flag.requested or last or session.iteration % cfg.run.checkpoint_every == 0:
                    _checkpoint(session, bus)
                if failure:
                    raise failure
                if flag.requested and not last:
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
            bus.unsubscribe(log)
            log.close()
    return session


def run_iteration(session: Session, bus: ev.EventBus) -> None:
    cfg, plan = session.config, session.plan
    t_start = time.perf_counter()
    rng = np.random.default_rng([cfg.run.seed, session.iteration])
    prompts = shard(prompts_for_iteration(session.prompts, cfg.run.prompts_per_iteration, rng), session.rank, session.world_size)
    drafts = explore(session, prompts, rng)
    _check_rewards(session, bus, drafts)
    every = cfg.explore.rank_check_every
    if every and plan.regenerate and session.iteration % every == 0:
        _rank_check(session, bus, drafts)
    t0 = time.perf_counter()
    keep = select_seeds(session, drafts, rng)
    t_select = time.perf_counter() - t0
    finals = regenerate(session, drafts.subset(keep)) if plan.regenerate else drafts.subset(keep)
    t0 = time.perf_counter()
    losses = update(session, finals, rng)
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    decay = sync(session)
    t_sync = time.perf_counter() - t0
    session.iteration += 1
    session.history.append(float(finals.rewards.mean()))
    seconds = {"explore": drafts.seconds_generate, "selection": t_select,
               "regenerate": finals.seconds_generate if plan.regenerate else 0.0,
               "reward": drafts.seconds_reward + (finals.seconds_reward if plan.regenerate else 0.0),
               "train": t_train, "sync": t_sync, "total": time.perf_counter() - t_start}
    bus.emit(ev.IterationFinished(iteration=session.iteration, iterations=cfg.run.iterations, seconds=seconds,
                                  draft=_stats(drafts) if plan.keep < plan.explore_seeds else None,
                                  final=_stats(finals), loss={k: losses[k] for k in ("loss", "policy", "kl")}, nonfinite_losses=int(losses["nonfinite"]),
                                  grad_norm=losses["grad_norm"], old_decay=decay))


def explore(session: Session, prompts: list[str], rng: np.random.Generator) -> RolloutBatch:
    """Stage 1: every prompt's N seeds at the explore precision and step count, scored."""
    n = session.plan.explore_seeds
    seeds = torch.as_tensor(rng.integers(0, 2**31 - 1, size=len(prompts) * n), dtype=torch.long)
    groups = torch.arange(len(prompts)).repeat_interleave(n)
    flat = [p for p in prompts for _ in range(n)]
    return _rollout(session, flat, groups, seeds, session.plan.explore_steps, explore=True)


def select_seeds(session: Session, drafts: RolloutBatch, rng: np.random.Generator) -> torch.Tensor:
    """Indices into `drafts` of the K seeds kept for each prompt group."""
    keep = []
    ranking = _advantages(session, drafts, math.inf)  # within a group, ranks like the reward the update sees
    for g in drafts.groups.unique(sorted=True):
        members = torch.nonzero(drafts.groups == g).flatten()
        chosen = select(ranking[members], session.plan.keep, session.config.selection.mode, rng)
        keep.append(members[chosen])
    return torch.cat(keep)


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


def update(session: Session, batch: RolloutBatch, rng: np.random.Generator) -> dict[str, float]:
    """One optimizer step of the DiffusionNFT loss, accumulated over micro-batches and timesteps."""
    cfg, policy, model = session.config, session.policy, session.model
    alg = cfg.algorithm
    device = session.device
    adv = _advantages(session, batch, alg.adv_clip_max).to(device)
    grid = batch.sigmas[:-1]
    per_sample = max(1, int(session.plan.full_steps * alg.timestep_fraction))
    per_sample = min(per_sample, grid.numel())
    gen = torch.Generator().manual_seed(int(rng.integers(0, 2**63 - 1)))
    picks = torch.stack([torch.randperm(grid.numel(), generator=gen)[:per_sample] for _ in range(len(batch.prompts))])
    cond = session.conditioning(batch.prompts)
    micro = cfg.optimizer.micro_batch
    chunks = [slice(i, i + micro) for i in range(0, len(batch.prompts), micro)]
    total_parts = per_sample * len(chunks)
    params = policy.trainable_parameters()
    session.optimizer.zero_grad(set_to_none=True)
    sums = {"loss": 0.0, "policy": 0.0, "kl": 0.0}
    nonfinite = 0
    for j in range(per_sample):
        for chunk in chunks:
            x0 = batch.latents[chunk].to(device)
            sigma = grid[picks[chunk, j]].to(device)
            eps = torch.randn(x0.shape, generator=gen).to(device)
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
            (terms.loss / total_parts).backward()
            sums["loss"] += float(terms.loss.detach()) / total_parts
            sums["policy"] += float(terms.policy) / total_parts
            sums["kl"] += float(terms.kl) / total_parts
    clip = cfg.optimizer.grad_clip
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
    session.optimizer.step()
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


def _advantages(session: Session, batch: RolloutBatch, clip: float) -> torch.Tensor:
    reward = session.config.reward
    return combined_advantages(batch.rewards, batch.components, reward.weights, batch.groups, reward.aggregation, clip)


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


def _check_rewards(session: Session, bus: ev.EventBus, batch: RolloutBatch) -> None:
    """Warn about near-constant rewards (see rewards/health.py)."""
    for finding in session.health.check(batch.components, batch.groups):
        bus.emit(ev.RunWarning(message=finding.message))


def _autocast(session: Session) -> contextlib.AbstractContextManager:
    if session.device.type == "cuda" and session.dtype == torch.bfloat16:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _stats(batch: RolloutBatch) -> ev.RewardStats:
    r = batch.rewards.float()
    return ev.RewardStats(mean=float(r.mean()), std=float(r.std(unbiased=False)), best=float(r.max()), worst=float(r.min()),
                          components={k: float(v.float().mean()) for k, v in batch.components.items()})


def _evaluate(session: Session, bus: ev.EventBus, weights: str) -> None:
    from solrl_core.evaluation import evaluate

    result = evaluate(session, session.eval_prompts, session.config.run.eval_seeds, weights)
    bus.emit(ev.EvalFinished(iteration=session.iteration, weights=weights, prompts=session.config.run.eval_prompts,
                             samples=len(result.seeds), mean=result.mean,
                             components={k: float(v.mean()) for k, v in result.scores.components.items()},
                             extras=result.extras, seconds=result.seconds))


def _checkpoint(session: Session, bus: ev.EventBus) -> None:
    t0 = time.perf_counter()
    path = save_checkpoint(session.run_dir, session.iteration, session.policy, session.optimizer,
                           session.loop_state(), session.config.run.keep_checkpoints)
    bus.emit(ev.CheckpointSaved(iteration=session.iteration, path=str(path), seconds=time.perf_counter() - t0))

