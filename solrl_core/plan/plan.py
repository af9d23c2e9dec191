"""The run's plan, resolved once at start-up (resolve.resolve_plan): what each stage of an iteration
does (from the family's row in families.py), at which precision, on which copy, and what the
machine's `auto` switches chose and why (`MachinePlan`, filled in by resolve.py and, under fsdp,
fsdp.py). The session, the loop's stages, the engine, `solrl doctor` and the start event read it;
none of them decides these again."""

from __future__ import annotations

from dataclasses import dataclass, replace

from solrl_core.config.families import family
from solrl_core.config.schema import Config


@dataclass(frozen=True)
class MemoryModes:
    """The memory modes of a run (memory_modes.py): where the copies and the VAE live between the phases
    that use them, and gradient checkpointing."""

    copies: str = "gpu"  # gpu | cpu-whole | cpu-blocks
    vae_on_cpu: bool = False
    checkpointing: bool = False

    def describe(self) -> str:
        on = [{"cpu-whole": "copies on the CPU (moved whole)", "cpu-blocks": "copies on the CPU (moved block by block)"}
              .get(self.copies, "")] + [name for name, flag in (("VAE on the CPU", self.vae_on_cpu),
                                        ("gradient checkpointing", self.checkpointing)) if flag]
        return ", ".join(n for n in on if n) or "none"


COMPILED_ANYWAY = "; compiled although explore.compile=false"  # an fp8 copy on CUDA (dropped where a copy runs eager)


@dataclass(frozen=True)
class MachinePlan:
    explore_precision: str
    explore_why: str
    explore_compile: bool
    rollout_copy: bool
    rollout_copy_why: str
    rollout_compile: bool
    checkpointing: bool
    checkpointing_why: str
    update_compile: bool = False
    # without a rollout copy, the full-precision rollouts on the policy's old adapter run through the
    # update's compiled blocks (regions.py) when the update is compiled and sampler.compile is on
    policy_rollout_compile: bool = False
    threads: str = ""  # the CPU threads torch got and the OpenMP wait policy (threads.ThreadChoice.describe)
    tf32: str = ""  # run.tf32 as set on this device (tf32.describe_tf32)
    memory: MemoryModes = MemoryModes()  # the memory modes (memory_modes.py); memory.checkpointing is `checkpointing`
    memory_why: str = ""
    memory_fits: bool = True  # False: the estimate is over this GPU even with every mode
    explore_layout: str = ""  # under fsdp, the low-precision explore copy whole or sharded (fsdp.copy_layout); "" none
    # an fp8 explore copy is compiled whatever explore.compile says (CUDA: resolve.FP8_EAGER_SLOWER)
    compiles_fp8: bool = False
    strategy: str = "replicate"  # distributed.strategy as resolved (fsdp.resolve_strategy): replicate | fsdp
    strategy_why: str = "default"

    def explore_compiled_at(self, precision: str) -> bool:
        """Whether an explore copy at `precision` is compiled: one a calibration weighs, or the one that
        replaces the run's after it (Engine.explore_copy_at). Where the run's copy is, and an fp8 one where
        `compiles_fp8`; never with the copies moved block by block (a block's moves are hooks a compiled
        block would trace: offload.py)."""
        return self.memory.copies != "cpu-blocks" and (self.explore_compile
                                                       or (self.compiles_fp8 and precision == "fp8"))

    def describe(self) -> str:
        return (f"explore {self.explore_precision} ({self.explore_why}); "
                f"rollout copy {'on' if self.rollout_copy else 'off'} ({self.rollout_copy_why}); "
                f"gradient checkpointing {'on' if self.checkpointing else 'off'} ({self.checkpointing_why}); "
                f"update {'compiled' if self.update_compile else 'eager'}; "
                f"memory mode {self.memory.describe()}" + (f" ({self.memory_why})" if self.memory_why else "")
                + ("; full-precision rollouts on the policy's compiled blocks" if self.policy_rollout_compile else "")
                + (f"; {self.tf32}" if self.tf32 else "")
                + (f"; {self.threads}" if self.threads else ""))


@dataclass(frozen=True)
class RunPlan:
    """What each stage of an iteration does, from the family's row (families.py), and, for a run,
    what the machine's `auto` switches chose (`machine`, resolve.py): resolved once at start-up."""

    family: str
    explore_seeds: int  # seeds rolled out per prompt in Stage 1
    explore_steps: int
    explore_precision: str  # what Stage 1 runs at, resolved: nvfp4-emulated | fp8 | bf16 | fp32
    keep: int  # K
    regenerate: bool  # Stage 2 regenerates the kept seeds at full precision
    full_precision: str
    full_steps: int
    machine: MachinePlan | None = None  # None: a plan for an estimate, before any machine is chosen
    # explore.calibrate: Stage 1's steps chosen from measured rank fidelity (explore_steps: the fixed setting)
    calibrated: bool = False
    # explore.calibrate=steps+precision: its precision too (explore_precision: the fixed one)
    calibrated_precision: bool = False
    low_precision: bool = False  # the family's Stage 1 runs at the explore precision (its row's copy="quantized")
    # the family rolls out on a compiled full-precision copy (copy="compiled"), kept whatever fits
    compiled_copy: bool = False

    @property
    def rollout_copy(self) -> bool:
        """Full-precision rollouts and v_old on a merged copy (else the policy's old adapter)."""
        return self.machine is not None and self.machine.rollout_copy

    @property
    def rollout_compiled(self) -> bool:
        return self.machine is not None and self.machine.rollout_copy and self.machine.rollout_compile

    @property
    def explore_compiled(self) -> bool:
        return self.machine is not None and self.machine.explore_compile

    @property
    def explores_low(self) -> bool:
        """Stage 1 runs on its own low-precision explore copy."""
        return self.explore_precision != self.full_precision

    def at(self, steps: int = 0, precision: str = "", rank_check: bool = False) -> IterationPlan:
        """Stage 1 at a calibration's choice (`steps`, `precision`: the loop state's; 0 and "" where none
        was made), else at this plan's own fixed setting (loop/stage1.py iteration_plan says which)."""
        return IterationPlan(self.explore_seeds, self.keep, steps or self.explore_steps,
                             precision or self.explore_precision, self.full_steps, self.regenerate,
                             steps_calibrated=bool(steps), precision_calibrated=bool(precision), rank_check=rank_check)

    def describe(self) -> str:
        on = (" on the compiled rollout copy" if self.rollout_compiled
              else " on the rollout copy") if self.rollout_copy else ""
        low = self.explores_low
        stage1 = (f"Stage 1: {self.explore_seeds} seeds/prompt at {self.explore_precision}"
                  f"{' (compiled)' if low and self.explore_compiled else on if not low else ''}, "
                  + (f"precision and preview steps calibrated (each low precision this machine runs x "
                     f"2-{self.full_steps} steps) by measured rank fidelity (the fixed setting: "
                     f"{self.explore_precision}@{self.explore_steps})"
                     if self.calibrated_precision else
                     f"preview steps calibrated from 2-{self.full_steps} by measured rank fidelity (the fixed setting: "
                     f"{self.explore_steps})" if self.calibrated else f"{self.explore_steps} steps"))
        if self.keep == self.explore_seeds:
            return f"{stage1} -> train on all of them"
        stage2 = (f" -> Stage 2: regenerate the kept {self.keep} at {self.full_precision}{on}, {self.full_steps} steps "
                  f"-> train"
                  if self.regenerate else f" -> train directly on the kept {self.keep}")
        return stage1 + f" -> keep {self.keep}" + stage2


@dataclass(frozen=True)
class IterationPlan:
    """What Stage 1 runs at in one iteration: the run's plan (RunPlan.at) with the last calibration's
    choice, held in the loop state, in place of its fixed setting. Made once at the top of each
    iteration (loop/stage1.py iteration_plan) and handed to explore, regenerate and the rank check."""

    seeds: int  # N: seeds rolled out per prompt in Stage 1
    keep: int  # K: seeds kept per prompt
    steps: int  # Stage 1's preview steps
    precision: str  # Stage 1's precision
    full_steps: int  # Stage 2's steps, and the rank check's reference
    regenerate: bool  # Stage 2 regenerates the kept seeds at full precision
    steps_calibrated: bool = False  # `steps` is a calibration's choice (else the plan's explore_steps)
    precision_calibrated: bool = False  # `precision` is a steps+precision calibration's choice
    rank_check: bool = False  # the in-run rank check runs after Stage 1 (explore.rank_check_every)

    def applied_to(self, plan: RunPlan) -> RunPlan:
        """`plan` with Stage 1 at this setting: what the live MFU's counts are made for (model_flops)."""
        return replace(plan, explore_steps=self.steps, explore_precision=self.precision)


def plan_stages(cfg: Config, full_precision: str, explore_precision: str,
                machine: MachinePlan | None = None) -> RunPlan:
    """The family's stages with the resolved explore precision, and the machine's choices (the copies
    it keeps) when given."""
    fam, k, full_steps = family(cfg.algorithm.family), cfg.selection.group_size, cfg.sampler.steps
    return RunPlan(fam.name, explore_seeds=cfg.explore.group_size if fam.explores_pool else k,
                   explore_steps=cfg.explore.steps if fam.preview_steps else full_steps,
                   explore_precision=explore_precision if fam.low_precision else full_precision, keep=k,
                   regenerate=fam.regenerate, full_precision=full_precision, full_steps=full_steps, machine=machine,
                   calibrated=cfg.explore.calibrate != "off" and fam.preview_steps,
                   calibrated_precision=cfg.explore.calibrate == "steps+precision" and fam.preview_steps,
                   low_precision=fam.low_precision, compiled_copy=fam.copy == "compiled")
