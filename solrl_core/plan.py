"""What each stage of an iteration does: derived from the config's family alone, with the
precision and copies that resolve.py chose for the machine passed in."""

from __future__ import annotations

from dataclasses import dataclass

from solrl_core.config import Config


@dataclass(frozen=True)
class StagePlan:
    """What each stage of an iteration does, derived from the family and the machine (resolve.py)."""

    family: str
    explore_seeds: int  # seeds rolled out per prompt in Stage 1
    explore_steps: int
    explore_precision: str  # resolved: nvfp4-emulated | fp8 | bf16 | fp32
    keep: int  # K
    regenerate: bool  # Stage 2 regenerates the kept seeds at full precision
    full_precision: str
    full_steps: int
    rollout_copy: bool = False  # full-precision rollouts and v_old on a merged copy (else the policy's old adapter)
    rollout_compiled: bool = False
    explore_compiled: bool = False

    @property
    def explores_low(self) -> bool:
        """Stage 1 runs on its own low-precision explore copy."""
        return self.explore_precision != self.full_precision

    def describe(self) -> str:
        on = (" on the compiled rollout copy" if self.rollout_compiled else " on the rollout copy") if self.rollout_copy else ""
        low = self.explores_low
        stage1 = (f"Stage 1: {self.explore_seeds} seeds/prompt at {self.explore_precision}"
                  f"{' (compiled)' if low and self.explore_compiled else on if not low else ''}, {self.explore_steps} steps")
        if self.keep == self.explore_seeds:
            return f"{stage1} -> train on all of them"
        stage2 = (f" -> Stage 2: regenerate the kept {self.keep} at {self.full_precision}{on}, {self.full_steps} steps -> train"
                  if self.regenerate else f" -> train directly on the kept {self.keep}")
        return stage1 + f" -> keep {self.keep}" + stage2


def plan_stages(cfg: Config, full_precision: str, explore_precision: str, *, rollout_copy: bool = False,
                rollout_compiled: bool = False, explore_compiled: bool = False) -> StagePlan:
    """The family's stages with the resolved explore precision and the copies the machine keeps."""
    family, k = cfg.algorithm.family, cfg.selection.group_size
    full_steps = cfg.sampler.steps
    copies = dict(rollout_copy=rollout_copy, rollout_compiled=rollout_compiled, explore_compiled=explore_compiled)
    if family == "sol_rl":
        return StagePlan(family, cfg.explore.group_size, cfg.explore.steps, explore_precision, k, True, full_precision,
                         full_steps, **copies)
    if family == "naive_quant":
        return StagePlan(family, cfg.explore.group_size, full_steps, explore_precision, k, False, full_precision, full_steps,
                         **copies)
    if family == "diffusionnft":
        return StagePlan(family, k, full_steps, full_precision, k, False, full_precision, full_steps, **copies)
    return StagePlan(family, cfg.explore.group_size, full_steps, full_precision, k, False, full_precision, full_steps, **copies)
