"""Stage 1's preview setting chosen from measured rank fidelity (`explore.calibrate = steps`, or
`steps+precision` to choose the explore precision too).

Stage 1 only has to rank a prompt's seeds, not draw them well, so its cost need not be fixed by
hand. A calibration rolls the same (prompt, seed) pairs out at full precision and full steps (the
reference: what Stage 2 would give) and at every candidate preview setting (the explore network at
2 ... sampler.steps steps; with steps+precision, on an explore copy at each low precision this
machine runs as well: hardware.runnable_low_precisions), and measures, per candidate, how well its
best_worst selection recovers the reference's: the recall |kept by the candidate & kept by the
reference| / K (the mean of fidelity's top-K/2 and bottom-K/2 hit rates), Spearman rho and Kendall
tau. It picks the cheapest (precision, steps) candidate, by the seconds measured here, whose recall
reaches `explore.min_recall` (auto: the fixed setting's own recall, the run's explore precision at
explore.steps, less its standard error over the calibration prompts). Within one precision a
candidate with more steps is never counted cheaper than one with fewer (its measured seconds are a
running maximum over steps): more denoising steps cannot cost less, and a measurement saying so is
noise that must not change the choice.

A precision other than the run's is measured on an explore copy built for the calibration alone
(Engine.explore_copy_at: as the run's own is built), one at a time, and freed after its candidates
are measured unless it holds the cheapest candidate so far; the chosen one replaces the run's explore
copy (stage1.calibrate). In a training run such a precision is measured upward from 2 steps only
until a candidate reaches the floor or costs more than the cheapest that has: a step count above
either could not be chosen. (`solrl rank-check --candidates` measures the whole curve.)

The calibration runs before the first iteration's Stage 1 and again every `explore.recalibrate_every`
iterations, on rank 0 (its choice broadcast to every rank), on the iteration's first
`explore.calibrate_prompts` prompt groups with their own Stage-1 seeds (both the draws the iteration
makes, from an identical generator): it consumes none of the iteration's draws, a resumed run
recalibrates where an uninterrupted one does, with the same weights and draws, and its reference
rollouts of the first group are the ones the in-run rank check (explore.rank_check_every) would
regenerate, which it then reuses (stage1.rank_check). In between, the choice is kept in the
checkpoint (LoopState).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from solrl_core.data.prompts import prompts_for_iteration
from solrl_core.loop.fidelity import Arm, RankCheck, compare_arms, roll_arm

if TYPE_CHECKING:
    from solrl_core.engine.engine import Engine
    from solrl_core.engine.rollout import RolloutCopy
    from solrl_core.loop.session import Run

MIN_STEPS = 2  # one Euler step lands on the mean image: it cannot rank seeds
REFERENCE = "reference"  # the full-precision, full-steps arm


@dataclass(frozen=True)
class Measured:
    """One candidate preview setting against the reference."""

    name: str  # precision@steps
    precision: str
    steps: int
    recall: float  # mean over prompts of |kept by this & kept by the reference| / K
    recall_se: float  # its standard error over prompts (0 with one prompt)
    rho: float | None  # mean Spearman over prompts where both sides vary (None: none did)
    tau: float | None
    seconds: float  # generate + decode + reward of the calibration's samples, measured
    cost: float  # seconds, made non-decreasing in steps within a precision


@dataclass(frozen=True)
class Calibration:
    candidates: list[Measured]
    chosen: Measured
    min_recall: float  # the threshold used
    why: str  # how the threshold was set and what reached it
    reference: str  # precision@steps of the reference rollouts
    reference_seconds: float
    prompts: int
    seeds: int  # per prompt
    seconds: float  # the whole calibration
    fixed: str = ""  # precision@steps of the fixed setting (the run's explore precision at explore.steps)
    texts: list[str] = field(default_factory=list)  # the prompts measured
    seed_table: torch.Tensor | None = None  # [P, S] their seeds
    reference_rewards: np.ndarray | None = None  # [P, S] total reward of the reference rollouts
    # the explore copy of the chosen precision, built for the calibration, when that is not the engine's own
    copy: RolloutCopy | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> list[dict]:
        return [{k: getattr(m, k) for k in Measured.__dataclass_fields__} for m in self.candidates]

    def reference_of(self, prompt: str, seeds: torch.Tensor) -> torch.Tensor | None:
        """The reference rewards of `prompt` at exactly `seeds`, when this calibration rolled them out."""
        if self.seed_table is None or self.reference_rewards is None:
            return None
        for i, text in enumerate(self.texts):
            if text == prompt and torch.equal(self.seed_table[i], seeds.cpu()):
                return torch.as_tensor(self.reference_rewards[i])
        return None


def candidate_arms(precision: str, network: str, full_steps: int) -> list[Arm]:
    """The candidate preview settings on one network: 2 ... full_steps steps (fewer when full_steps is)."""
    return [Arm(f"{precision}@{s}", network, s) for s in range(min(MIN_STEPS, full_steps), full_steps + 1)]


def measure(result: RankCheck, arms: list[Arm], keep: int) -> list[Measured]:
    """Each candidate arm of a rank check (the reference last) as a Measured: recall of its
    best_worst selection, correlations, and its seconds made non-decreasing in steps per precision."""
    h = keep // 2
    out, worst_so_far = [], {}
    for arm in sorted(arms[:-1], key=lambda a: (a.name.rpartition("@")[0], a.steps)):
        rows = result.per_prompt[arm.name]
        recall = np.array([(r[f"top{h}"] + r[f"bottom{h}"]) / 2 for r in rows])
        se = float(recall.std(ddof=1) / math.sqrt(len(recall))) if len(recall) > 1 else 0.0
        precision = arm.name.rpartition("@")[0]
        cost = max(result.seconds[arm.name], worst_so_far.get(precision, 0.0))
        worst_so_far[precision] = cost
        overall = result.overall[arm.name]
        out.append(Measured(arm.name, precision, arm.steps, float(recall.mean()), se, overall["rho"], overall["tau"],
                            result.seconds[arm.name], cost))
    return out


def choose(measured: list[Measured], min_recall: float, fixed: Measured) -> tuple[Measured, float, str]:
    """The cheapest candidate whose recall reaches the threshold: `min_recall`, or with 0 (auto) the
    fixed setting's recall less its standard error. Returns it, the threshold and why; when none
    reaches an explicit threshold, the fixed setting, said so."""
    if min_recall > 0:
        threshold, source = min_recall, f"explore.min_recall {min_recall:.3f}"
    else:
        threshold = fixed.recall - fixed.recall_se
        source = f"{fixed.name}'s recall {fixed.recall:.3f} - s.e. {fixed.recall_se:.3f} = {threshold:.3f}"
    reached = [m for m in measured if m.recall >= threshold - 1e-9]
    if not reached:
        return fixed, threshold, f"no candidate reached {source}: kept the fixed {fixed.name}"
    best = min(reached, key=lambda m: (m.cost, m.steps))
    return best, threshold, (f"cheapest ({best.cost:.2f}s) with recall {best.recall:.3f} >= {source}"
                             + (f"; {fixed.name} took {fixed.cost:.2f}s" if best is not fixed else ""))


def calibrate_engine(engine: Engine, prompts: list[str], seeds: torch.Tensor, *, keep: int, fixed_steps: int,
                     min_recall: float, precisions: list[str] | None = None, whole_curve: bool = True,
                     progress: Callable[[str, float], None] | None = None) -> Calibration:
    """Every candidate preview step count on `engine`'s explore network (its explore copy, else the
    full-precision rollout network), and on an explore copy at each of `precisions` besides, against
    the rollout network at full steps, on `prompts` x `seeds` ([P, S]), scored with the engine's
    rewards; the choice as `choose` makes it (the fixed setting: the engine's precision at `fixed_steps`).

    `whole_curve=False` (a training run) with the auto floor (min_recall 0) measures the engine's
    precision only up to the fixed steps (it reaches its own floor, and more steps never count as
    cheaper), and another precision only until a candidate reaches the floor or costs more than the
    cheapest that has (module docstring)."""
    t0 = time.perf_counter()
    full_steps = engine.config.sampler.steps
    fixed_steps = min(max(fixed_steps, MIN_STEPS), full_steps)
    current = engine.explore_copy.precision if engine.explore_copy is not None else engine.dtype_name
    order = [current, *(p for p in dict.fromkeys(precisions or ()) if p != current)]
    upto = full_steps if whole_curve or min_recall > 0 else fixed_steps
    flat = [p for p in prompts for _ in range(seeds.shape[1])]
    shape = (seeds.shape[0], seeds.shape[1])
    assert engine.rewards is not None  # a training engine holds its rewards
    score = lambda x: engine.rewards(x, flat).total  # noqa: E731

    def on(eng: Engine) -> Callable[[str, int], torch.Tensor]:
        return lambda network, steps: eng.images(flat, seeds.flatten(), steps, network)

    def warm(eng: Engine, network: str) -> None:  # a first call at a batch shape pays one-time costs: not a rollout's
        batch = min(eng.sampler.batch_size, len(flat))
        eng.images(flat[:batch], seeds.flatten()[:batch], 1, network)

    reference = Arm(REFERENCE, "rollout", full_steps)
    warm(engine, "rollout")
    rewards, seconds = {}, {}
    rewards[REFERENCE], seconds[REFERENCE] = roll_arm(reference, on(engine), score, shape)
    if progress:
        progress(REFERENCE, seconds[REFERENCE])
    arms: list[Arm] = []
    measured: list[Measured] = []
    fixed: Measured | None = None
    kept: RolloutCopy | None = None
    for precision in order:
        built = None if precision == current else engine.explore_copy_at(precision)
        eng = engine if built is None else replace(engine, explore_copy=built)
        mine = candidate_arms(precision, "explore", upto if built is None else full_steps)
        if built is not None and built.compiled is not None:  # compiled at the calibration's batch shapes
            roll_arm(mine[0], on(eng), score, shape)
        else:
            warm(eng, "explore")
        for arm in mine:
            rewards[arm.name], seconds[arm.name] = roll_arm(arm, on(eng), score, shape)
            if progress:
                progress(arm.name, seconds[arm.name])
            arms.append(arm)
            measured = measure(compare_arms([*arms, reference], rewards, seconds, prompts, seeds, [keep // 2], keep),
                               [*arms, reference], keep)
            if built is not None and not whole_curve:
                this = next(m for m in measured if m.name == arm.name)
                best, floor, _ = choose(measured, min_recall, fixed) if fixed is not None else (None, 0.0, "")
                if best is not None and (best is this or (best.recall >= floor - 1e-9 and this.cost >= best.cost)):
                    break  # more steps at this precision could not be chosen
        if fixed is None:
            fixed = next(m for m in measured if m.precision == current and m.steps == fixed_steps)
        chosen = choose(measured, min_recall, fixed)[0]
        if built is not None and chosen.precision == precision:
            kept = built  # the copy held before (if any) is freed with its last reference
        elif chosen.precision == current:
            kept = None
        del built, eng
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()
    assert fixed is not None
    chosen, threshold, why = choose(measured, min_recall, fixed)
    return Calibration(measured, chosen, threshold, why, f"{engine.dtype_name}@{full_steps}", seconds[REFERENCE],
                       len(prompts), int(seeds.shape[1]), time.perf_counter() - t0, fixed.name, list(prompts),
                       seeds.cpu(),
                       rewards[REFERENCE], kept if chosen.precision != current else None)


def calibration_inputs(run: Run, iteration: int) -> tuple[list[str], torch.Tensor]:
    """The iteration's first `explore.calibrate_prompts` prompt groups and their N Stage-1 seeds each:
    the draws trainer.run_iteration and stages.explore make, from an identical generator."""
    cfg = run.config
    count = min(cfg.explore.calibrate_prompts, cfg.run.prompts_per_iteration)
    rng = np.random.default_rng([cfg.run.seed, iteration])
    drawn = prompts_for_iteration(run.prompts, cfg.run.prompts_per_iteration, rng)
    n = run.plan.explore_seeds
    seeds = rng.integers(0, 2**31 - 1, size=cfg.run.prompts_per_iteration * n)[:count * n]  # stages.explore's draw
    return drawn[:count], torch.as_tensor(seeds, dtype=torch.long).view(count, n)


def steps_only(found: Calibration, min_recall: float) -> Measured:
    """What explore.calibrate=steps would pick from `found`: the cheapest at the fixed setting's precision."""
    fixed = next(m for m in found.candidates if m.name == found.fixed)
    return choose([m for m in found.candidates if m.precision == fixed.precision], min_recall, fixed)[0]


def calibrate_to_folder(engine: Engine, prompts: list[str], out_dir: Path, *, per_prompt: int, seed_base: int,
                        keep: int,
                        precisions: list[str] | None = None,
                        progress: Callable[[str, float], None] | None = None) -> tuple[Calibration, Measured]:
    """`solrl rank-check --candidates`: the calibration a training run with explore.calibrate would
    make, on `prompts` with seeds seed_base + i*S ... for prompt i (the config's explore.steps at the
    explore copy's precision the fixed setting, explore.min_recall the floor), over the explore
    copy's precision and `precisions`, whole curves, written to `out_dir`/calibration.json. Returns it
    and what explore.calibrate=steps would pick (the cheapest at the explore copy's precision)."""
    import json

    from solrl_core.io.atomic import write_atomic

    cfg = engine.config
    seeds = seed_base + torch.arange(len(prompts) * per_prompt, dtype=torch.long).view(len(prompts), per_prompt)
    found = calibrate_engine(engine, prompts, seeds, keep=keep, fixed_steps=cfg.explore.steps,
                             min_recall=cfg.explore.min_recall, precisions=precisions, progress=progress)
    by_steps = steps_only(found, cfg.explore.min_recall)
    meta = {"device": str(engine.device), "model": engine.model.description,
            "checkpoint": str(engine.checkpoint) if engine.checkpoint else None, "rewards": cfg.reward.weights,
            "keep": keep, "fixed_steps": cfg.explore.steps, "fixed": found.fixed}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "calibration.json", json.dumps(
        {"meta": meta, "prompts": prompts, "seeds": seeds.tolist(), "reference": found.reference,
         "reference_seconds": found.reference_seconds, "candidates": found.to_dict(), "chosen": found.chosen.name,
         "chosen_steps_only": by_steps.name, "min_recall": found.min_recall, "why": found.why,
         "seconds": found.seconds}, indent=2))
    return found, by_steps
