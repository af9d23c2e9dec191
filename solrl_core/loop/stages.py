"""The stages of one iteration, each a function of the run, its inputs and its outputs (trainer.py
calls them in order): explore, score, select, regenerate, train and sync. What Stage 1 runs at, the
calibration that chooses it and the in-run rank check are stage1.py's.

Many GPUs: each rank rolls out its own prompt groups; the rewards are all-gathered (`GlobalScores`)
before advantages, selection, reward health and logged stats, so every rank decides as one process
would."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from solrl_core import events as ev
from solrl_core.config.schema import AlgorithmConfig, RewardConfig
from solrl_core.data.prompts import prompts_for_iteration, shard, text_keys
from solrl_core.engine.rollout import Draws, RolloutBatch
from solrl_core.engine.sde import SdeSetting
from solrl_core.faults import guard
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.nft import combined_advantages
from solrl_core.loop.selection import ranking_values, select
from solrl_core.loop.session import Run
from solrl_core.loop.update import UpdateResult, update
from solrl_core.plan.plan import IterationPlan
from solrl_core.runtime import distributed


@dataclass(frozen=True)
class GlobalScores:
    """One stage's rewards on every rank, in global sample order (rank 0's samples first)."""

    rewards: torch.Tensor  # [W * B] total reward
    components: dict[str, torch.Tensor]  # [W * B] per reward
    groups: torch.Tensor  # [W * B] global prompt-group index
    local: slice  # this rank's samples
    texts: torch.Tensor  # [W * B] key of each sample's prompt text (prompts.text_keys): advantages pool by it

    def only(self, valid: torch.Tensor) -> "GlobalScores":
        """Restricted to the `valid` samples (the same object when all are)."""
        if bool(valid.all()):
            return self
        start = int(valid[:self.local.start].sum())
        return GlobalScores(self.rewards[valid], {k: v[valid] for k, v in self.components.items()}, self.groups[valid],
                            slice(start, start + int(valid[self.local].sum())), self.texts[valid])

    def stats(self) -> ev.RewardStats:
        r = self.rewards.float()
        return ev.RewardStats(mean=float(r.mean()), std=float(r.std(unbiased=False)), best=float(r.max()),
                              worst=float(r.min()),
                              components={k: float(v.float().mean()) for k, v in self.components.items()})


@dataclass(frozen=True)
class Scored:
    """A stage's rollouts with every rank's scores, and which of them every reward scored finitely."""

    batch: RolloutBatch  # this rank's
    scores: GlobalScores
    screen: guard.Screen

    @property
    def usable(self) -> GlobalScores:
        return self.scores.only(self.screen.valid)

    def stats(self) -> ev.RewardStats:
        """Statistics of the finitely scored samples (of all, when none is)."""
        return (self.usable if self.screen.valid.any() else self.scores).stats()

    def mean_reward(self) -> float:
        usable = self.usable
        return float(usable.rewards.mean()) if usable.rewards.numel() else math.nan


def iteration_prompts(run: Run, rng: np.random.Generator) -> list[str]:
    """This rank's prompt groups of the iteration (drawn for every rank, then sharded)."""
    drawn = prompts_for_iteration(run.prompts, run.config.run.prompts_per_iteration, rng)
    return shard(drawn, run.rank, run.world_size)


def explore(run: Run, prompts: list[str], rng: np.random.Generator,
            setting: IterationPlan | None = None) -> RolloutBatch:
    """Stage 1: every prompt's N seeds at the explore precision and preview steps of `setting` (the
    iteration's plan, stage1.iteration_plan: a calibration's choice where one was made; None: the
    plan's fixed setting), scored.

    `prompts` are this rank's groups. Seeds are drawn for every rank's groups and this rank takes its
    slice, so a prompt group gets the same seeds whatever the number of processes; group indices are
    global (rank r's first group is r * len(prompts))."""
    setting = setting or run.plan.at()
    n = setting.seeds
    mine = slice(run.rank * len(prompts) * n, (run.rank + 1) * len(prompts) * n)
    seeds = torch.as_tensor(rng.integers(0, 2**31 - 1, size=len(prompts) * n * run.world_size)[mine], dtype=torch.long)
    groups = run.rank * len(prompts) + torch.arange(len(prompts)).repeat_interleave(n)
    flat = [p for p in prompts for _ in range(n)]
    # a family that trains on its drafts (no regeneration) rolls them out with the loss's sampler
    return roll_out(run, Draws(flat, groups, seeds), setting.steps, explore=True, trained=not run.plan.regenerate)


def regenerate(run: Run, kept: RolloutBatch, setting: IterationPlan | None = None) -> RolloutBatch:
    """Stage 2: the kept seeds again, same noise (same seeds), full precision and full steps (`setting`'s;
    None: the plan's)."""
    return roll_out(run, kept.draws, (setting or run.plan.at()).full_steps, explore=False, trained=True)


def roll_out(run: Run, draws: Draws, steps: int, explore: bool, trained: bool = False) -> RolloutBatch:
    """Generate and score on the explore copy (explore=True, when there is one), else at full precision:
    on the rollout copy (base + old merged) when the run keeps one, or on the policy's old adapter.
    `trained`: the update trains on these samples, so they are sampled as the loss needs (`rollout_sde`:
    flow_grpo's SDE, its path kept); any other rollout samples the ODE (the explore ranking, the rank check).

    On a quantized explore copy, Stage 1's batches never mix two prompt groups: it scales each call's
    activations by the call's own amax, so mixing would make a group's drafts depend on which groups
    share its rank (one process and two would keep different seeds). At full precision the batches
    are cut freely (fewer, fuller calls)."""
    engine = run.engine
    made = engine.generate(engine.conditioning(draws.prompts), draws.seeds, steps, "explore" if explore else "rollout",
                           to_cpu=False, groups=draws.groups if explore and quantized_copy(run) else None,
                           sde=rollout_sde(run.config.algorithm) if trained else None)
    t0 = time.perf_counter()
    scores = run.rewards(made.images, draws.prompts)
    return RolloutBatch(prompts=draws.prompts, groups=draws.groups, seeds=draws.seeds, latents=made.latents,
                        sigmas=made.sigmas, rewards=scores.total, components=scores.components,
                        seconds_reward=time.perf_counter() - t0, trajectory=made.trajectory)


def rollout_sde(alg: AlgorithmConfig) -> SdeSetting | None:
    """The sampler of the samples the loss trains on: flow_grpo's SDE (it trains on the path's
    log-probabilities, sampled at sample.noise_level: train_sd3.py:643-656 at 879042c); None, the run's
    ODE solver, for nft and awm, which train on the final latents alone."""
    return SdeSetting(alg.sde_eta, alg.sde_kind, alg.sde_window) if alg.loss == "flow_grpo" else None


def quantized_copy(run: Run) -> bool:
    """Stage 1 runs on a quantized explore copy (its activation scale is per call)."""
    from solrl_core.precision.backends import QUANTIZED

    return run.engine.explore_copy is not None and run.engine.explore_copy.precision in QUANTIZED


def gather_scores(run: Run, batch: RolloutBatch) -> GlobalScores:
    """The rewards of `batch` on every rank, gathered (one process: the batch's own)."""
    n = len(batch.prompts)
    local = slice(run.rank * n, (run.rank + 1) * n)
    texts = torch.tensor(text_keys(batch.prompts), dtype=torch.long)
    if run.world_size == 1:
        return GlobalScores(batch.rewards, batch.components, batch.groups, local, texts)
    names = sorted(batch.components)
    table = distributed.all_gather_tensor(torch.stack([batch.rewards.float(),
                                                       *(batch.components[k].float() for k in names)], dim=1))
    return GlobalScores(table[:, 0], {k: table[:, 1 + i] for i, k in enumerate(names)},
                        distributed.all_gather_tensor(batch.groups), local, distributed.all_gather_tensor(texts))


def score_drafts(run: Run, state: LoopState, bus: ev.EventBus, drafts: RolloutBatch) -> Scored:
    """Stage 1's scores on every rank, screened for non-finite ones and checked for near-constant rewards."""
    scored = _screened(run, state, bus, drafts, "explore")
    for finding in state.health.check(scored.usable.components, scored.usable.groups):  # see rewards/health.py
        bus.emit(ev.RunWarning(message=finding.message))
    return scored


def score_finals(run: Run, state: LoopState, bus: ev.EventBus, finals: RolloutBatch) -> Scored:
    """The trained-on samples' scores on every rank; a reward with no finite score counts to a stop."""
    scored = _screened(run, state, bus, finals, "final")
    guard.record_rewards(state.faults, scored.screen, list(scored.scores.components), scored.scores.rewards.numel())
    return scored


def _screened(run: Run, state: LoopState, bus: ev.EventBus, batch: RolloutBatch, stage: str) -> Scored:
    scores = gather_scores(run, batch)
    found = guard.screen(scores.components, scores.groups)
    if not found.clean:
        bus.emit(ev.SamplesDropped(iteration=state.iteration + 1, stage=stage, rewards=found.nonfinite,
                                   dropped=found.dropped,
                                   samples=found.valid.numel(), groups_skipped=found.groups_without_valid,
                                   groups=found.groups))
    return Scored(batch, scores, found)


def select_seeds(run: Run, drafts: Scored, rng: np.random.Generator) -> torch.Tensor:
    """Indices into this rank's drafts of the K seeds kept for each of its prompt groups.

    Every rank selects for every group (cheap: it sorts rewards) so that a random selection mode
    draws from `rng` as one process would, then keeps its own groups' picks."""
    kept = keep_seeds(drafts, run.config.reward, run.plan.keep, run.config.selection.mode, rng)
    local = drafts.scores.local
    return kept[(kept >= local.start) & (kept < local.stop)] - local.start


def keep_seeds(drafts: Scored, reward: RewardConfig, keep: int, mode: str, rng: np.random.Generator) -> torch.Tensor:
    """Global indices of the `keep` seeds kept in each prompt group, group by group: ranked by the
    advantage the update sees (selection.ranking_values), a non-finite draft ranking nowhere (kept
    only to fill a group: guard.prefer_finite). Training and `solrl explore` both select here."""
    scores, valid = drafts.scores, drafts.screen.valid
    ranking = draft_ranking(drafts, reward)
    chosen = []
    for g in scores.groups.unique(sorted=True):
        members = guard.prefer_finite(torch.nonzero(scores.groups == g).flatten(), valid, keep)
        chosen.append(members[select(ranking[members], keep, mode, rng)])
    return torch.cat(chosen)


def draft_ranking(drafts: Scored, reward: RewardConfig) -> torch.Tensor:
    """What every draft is ranked by (selection.ranking_values over the finitely scored ones; 0 for
    the others, which guard.prefer_finite keeps last). `keep_seeds` and `solrl explore` rank by it."""
    valid, usable = drafts.screen.valid, drafts.usable
    ranking = ranking_values(usable.rewards, usable.components, reward.weights, usable.texts, reward.aggregation)
    if not bool(valid.all()):
        ranking = torch.zeros(valid.numel(), dtype=ranking.dtype).index_put_((valid,), ranking)
    return ranking


def train(run: Run, finals: Scored, rng: np.random.Generator) -> UpdateResult:
    """The update on the finitely scored final samples (no step when there is none)."""
    if not finals.screen.valid.any():  # nothing to learn from: no step, and the streak may stop the run
        return UpdateResult.skipped()
    usable = finals.usable
    batch = finals.batch
    if usable is not finals.scores:
        batch = batch.subset(torch.nonzero(finals.screen.valid[finals.scores.local]).flatten())
    adv = advantages(run, usable, run.config.algorithm.adv_clip_max)[usable.local]  # std over every rank's rewards
    steps, n = run.config.optimizer.steps_per_iteration, len(batch.prompts)
    if steps == 1:
        return update(run, batch, adv, rng, usable.rewards.numel(), usable.local)
    # several steps, each on its share of this rank's samples in order, as Flow-GRPO splits each GPU's epoch
    # (config/grpo.py:98, :102): the later steps' ratios depart from 1, so its clip acts
    cuts = [s * n // steps for s in range(steps + 1)]
    parts = [update(run, batch.subset(torch.arange(lo, hi)), adv[lo:hi], rng, usable.rewards.numel(),
                    slice(usable.local.start + lo, usable.local.start + hi)) for lo, hi in zip(cuts, cuts[1:])]
    return UpdateResult.combined(parts, [hi - lo for lo, hi in zip(cuts, cuts[1:])])


def after_step(run: Run, state: LoopState, bus: ev.EventBus, result: UpdateResult, finals: Scored) -> float:
    """Count a skipped step toward a stop; sync a taken one. Returns the old-policy decay (NaN when
    the step was skipped: nothing changed to sync)."""
    if finals.screen.valid.any():
        _count_step(run, state, bus, result)
    return sync(run, state) if result.stepped else math.nan


def sync(run: Run, state: LoopState) -> float:
    """After a step: old <- d*old + (1-d)*new, EMA, rollout copies refreshed. Returns d.

    Both schedules count the optimizer step just taken (1 after the first), as the official code's
    `return_decay(global_step)` and `ema.step(params, global_step)` do after its increment."""
    alg = run.config.algorithm
    state.step += 1
    # flow_grpo rolls out on the policy being trained (train_sd3.py:643 samples with the trained transformer):
    # the old adapter, which the rollouts run on, becomes the new one whole
    decay = 0.0 if alg.loss == "flow_grpo" else min(alg.old_decay_rate * state.step, alg.old_decay_max)
    run.engine.policy.update_old(decay)
    run.engine.policy.update_ema(min((1 + state.step) / (10 + state.step), alg.ema_max_decay))
    run.engine.refresh_copies()
    return decay


def _count_step(run: Run, state: LoopState, bus: ev.EventBus, result: UpdateResult) -> None:
    in_a_row = guard.record_step(state.faults, result.stepped)
    if in_a_row:
        reason = "gradient norm not finite" if not math.isfinite(result.grad_norm) else "no finite loss term"
        bus.emit(ev.StepSkipped(iteration=state.iteration + 1, reason=reason, in_a_row=in_a_row,
                                limit=run.config.optimizer.max_nonfinite_steps))


def advantages(run: Run, scores: GlobalScores, clip: float) -> torch.Tensor:
    """Advantages of every rank's samples (the std is over all of them). The mean is per prompt text, not
    per group: groups that drew the same text (a set smaller than an iteration, or repeated lines) share
    one mean, on whichever ranks they ran, as the official PerPromptStatTracker does on the gathered
    prompts (NVlabs/DiffusionNFT flow_grpo/stat_tracking.py:15-31, scripts/train_nft_sd3.py:744-750).
    Within one group this shifts every sample alike, so the K-of-N ranking is unchanged."""
    reward = run.config.reward
    return combined_advantages(scores.rewards, scores.components, reward.weights, scores.texts, reward.aggregation,
                               clip)
