"""The stages of one iteration, each a function of the run, its inputs and its outputs (trainer.py
calls them in order): explore, score, select, regenerate, train, sync, and the rank check.

Many GPUs: each rank rolls out its own prompt groups; the rewards are all-gathered (`GlobalScores`)
before advantages, selection, reward health and logged stats, so every rank decides as one process
would."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from solrl_core import events as ev
from solrl_core.config.schema import RewardConfig
from solrl_core.data.prompts import prompts_for_iteration, shard, text_keys
from solrl_core.engine.rollout import Draws, RolloutBatch, RolloutCopy
from solrl_core.faults import guard
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.nft import combined_advantages
from solrl_core.loop.selection import ranking_values, select
from solrl_core.loop.session import Run
from solrl_core.loop.update import UpdateResult, update
from solrl_core.runtime import distributed

if TYPE_CHECKING:
    from solrl_core.loop.calibration import Calibration
    from solrl_core.loop.phases import PhaseRecorder


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
        return ev.RewardStats(mean=float(r.mean()), std=float(r.std(unbiased=False)), best=float(r.max()), worst=float(r.min()),
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


def explore(run: Run, prompts: list[str], rng: np.random.Generator, steps: int | None = None) -> RolloutBatch:
    """Stage 1: every prompt's N seeds at the explore precision and `steps` preview steps (None: the
    plan's; the loop passes `explore_steps`, the calibration's choice where one was made), scored.

    `prompts` are this rank's groups. Seeds are drawn for every rank's groups and this rank takes its
    slice, so a prompt group gets the same seeds whatever the number of processes; group indices are
    global (rank r's first group is r * len(prompts))."""
    n = run.plan.explore_seeds
    mine = slice(run.rank * len(prompts) * n, (run.rank + 1) * len(prompts) * n)
    seeds = torch.as_tensor(rng.integers(0, 2**31 - 1, size=len(prompts) * n * run.world_size)[mine], dtype=torch.long)
    groups = run.rank * len(prompts) + torch.arange(len(prompts)).repeat_interleave(n)
    flat = [p for p in prompts for _ in range(n)]
    return roll_out(run, Draws(flat, groups, seeds), steps or run.plan.explore_steps, explore=True)


def explore_steps(run: Run, state: LoopState) -> int:
    """Stage 1's preview steps this iteration (`at_explore_steps`)."""
    return at_explore_steps(run, state).plan.explore_steps


def calibrate_if_due(run: Run, state: LoopState, bus: ev.EventBus, phases: PhaseRecorder) -> Calibration | None:
    """The calibration where due before this iteration's Stage 1 (calibration.due), as its own phase."""
    from solrl_core.loop.calibration import due

    if not due(run, state.iteration, state.explore_steps):
        return None
    with phases.phase("calibrate", memory=False):
        return calibrate(run, state, bus)


def calibrate(run: Run, state: LoopState, bus: ev.EventBus) -> Calibration | None:
    """Choose Stage 1's preview steps (with explore.calibrate=steps+precision, its precision too) from
    measured rank fidelity (calibration.py): on rank 0, its choice broadcast, so every rank explores
    alike; emits CalibrationDone and the live MFU's counts at the chosen setting (a calibrating run
    announces none before). Returns rank 0's calibration (its reference rollouts the rank check reuses)."""
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
    steps, precision = distributed.broadcast_object((found.chosen.steps, found.chosen.precision) if found is not None else None)
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
    bus.emit(model_flops(at_explore_steps(run, state)))
    return found


def use_explore_precision(run: Run, precision: str, built: RolloutCopy | None = None) -> None:
    """Stage 1 at `precision` from now on: the engine's explore copy becomes `built` (the calibration's
    copy of it) or one built now (the other ranks; a resumed run), unless it is at that precision already."""
    current = run.engine.explore_copy
    if current is not None and current.precision != precision:
        current.take_over(built if built is not None else run.engine.explore_copy_at(precision))


def at_explore_steps(run: Run, state: LoopState) -> Run:
    """The run with its plan at this iteration's Stage 1: the last calibration's preview steps and
    precision, else the plan's (RunPlan.calibrated_to). What Stage 1 rolls out at, the start event
    reports and the live MFU's counts (telemetry/model_flops.py) are made for."""
    return replace(run, plan=run.plan.calibrated_to(state.explore_steps, state.explore_precision))


def regenerate(run: Run, kept: RolloutBatch) -> RolloutBatch:
    """Stage 2: the kept seeds again, same noise (same seeds), full precision and full steps."""
    return roll_out(run, kept.draws, run.plan.full_steps, explore=False)


def roll_out(run: Run, draws: Draws, steps: int, explore: bool) -> RolloutBatch:
    """Generate and score on the explore copy (explore=True, when there is one), else at full precision:
    on the rollout copy (base + old merged) when the run keeps one, or on the policy's old adapter.

    On a quantized explore copy, Stage 1's batches never mix two prompt groups: it scales each call's
    activations by the call's own amax, so mixing would make a group's drafts depend on which groups
    share its rank (one process and two would keep different seeds). At full precision the batches
    are cut freely (fewer, fuller calls)."""
    engine = run.engine
    made = engine.generate(engine.conditioning(draws.prompts), draws.seeds, steps, "explore" if explore else "rollout",
                           to_cpu=False, groups=draws.groups if explore and quantized_copy(run) else None)
    t0 = time.perf_counter()
    scores = run.rewards(made.images, draws.prompts)
    return RolloutBatch(prompts=draws.prompts, groups=draws.groups, seeds=draws.seeds, latents=made.latents,
                        sigmas=made.sigmas, rewards=scores.total, components=scores.components,
                        seconds_reward=time.perf_counter() - t0)


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
    table = distributed.all_gather_tensor(torch.stack([batch.rewards.float(), *(batch.components[k].float() for k in names)], dim=1))
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
        bus.emit(ev.SamplesDropped(iteration=state.iteration + 1, stage=stage, rewards=found.nonfinite, dropped=found.dropped,
                                   samples=found.valid.numel(), groups_skipped=found.groups_without_valid, groups=found.groups))
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
    return update(run, batch, adv, rng, usable.rewards.numel(), usable.local)


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
    decay = min(alg.old_decay_rate * state.step, alg.old_decay_max)
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
    return combined_advantages(scores.rewards, scores.components, reward.weights, scores.texts, reward.aggregation, clip)


def rank_check_due(run: Run, state: LoopState) -> bool:
    every = run.config.explore.rank_check_every
    # the first group is rank 0's; sharded, every rank regenerates its own first group (each forward
    # gathers the weights from all), and rank 0's result alone is heard
    return bool(every) and run.plan.regenerate and state.iteration % every == 0 and (run.rank == 0 or run.sharded)


def rank_check(run: Run, state: LoopState, bus: ev.EventBus, drafts: RolloutBatch,
               calibrated: Calibration | None = None) -> None:
    """Regenerate every Stage-1 seed of the first prompt at full precision and steps; log rho, tau.
    Where this iteration's calibration rolled out that prompt at those seeds (its reference, before
    Stage 1 and the update, on the same weights), its rewards are used instead of regenerating them.
    Uses no random draw, so it does not change the run it observes."""
    from solrl_core.loop.rankcheck import group_correlation

    t0 = time.perf_counter()
    group = drafts.subset(torch.nonzero(drafts.groups == drafts.groups[0]).flatten())
    full = calibrated.reference_of(group.prompts[0], group.seeds) if calibrated is not None else None
    reused = full is not None
    if full is None:
        full = roll_out(run, group.draws, run.plan.full_steps, explore=False).rewards
    rho, tau = group_correlation(group.rewards, full)
    bus.emit(ev.RankCheckResult(iteration=state.iteration + 1, prompt=group.prompts[0], seeds=len(group.prompts), rho=rho, tau=tau,
                                draft_mean=float(group.rewards.mean()), full_mean=float(full.float().mean()),
                                seconds=time.perf_counter() - t0, reused=reused))
