"""Memory modes for one tight GPU, chosen from the memory ESTIMATE (footprint.py) and overridable.

The modes, each with its bytes in the estimate (`footprint.MemoryModes`, `MemoryEstimate.peak`):

- `memory.vae_on_cpu`: the VAE on the CPU, moved to the GPU for each rollout's or evaluation's
  decode (offload.py). The real models' text encoders already visit the GPU only while they encode
  (models/diffusers_models.py), in every mode: the estimate counts them in that phase alone.
- `optimizer.checkpointing`: gradient checkpointing of the trained forward (recomputed in the backward).
- `memory.copies`: the explore and rollout copies on the CPU between the phases that run on them,
  moved to the GPU whole (cpu-whole) or one transformer block at a time (cpu-blocks) (offload.py).

`auto` walks `LADDER`, in the order of the cost each mode is expected to add (a small move per
rollout, a recomputed forward, a copy crossing twice per phase, a copy crossing every
sampler step: reasoned, not measured), and takes the first rung whose estimate fits the GPU; a mode
set explicitly keeps its setting on every rung. On a CPU (no GPU memory to fit) auto is off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.plan.footprint import FIT_SHARE, estimate_memory
from solrl_core.plan.plan import MachinePlan, MemoryModes, plan_stages

GPU_SIZES = (24, 48, 80, 141)  # GB, the sizes `solrl doctor` shows and a refusal names
LADDER: tuple[MemoryModes, ...] = (  # each rung adds one mode (the last two: the copies moved whole, then by blocks)
    MemoryModes(),
    MemoryModes(vae_on_cpu=True),
    MemoryModes(vae_on_cpu=True, checkpointing=True),
    MemoryModes("cpu-whole", True, True),
    MemoryModes("cpu-blocks", True, True),
)


@dataclass(frozen=True)
class ModeChoice:
    """The memory modes a run takes, why, and whether its estimate fits the GPU."""

    modes: MemoryModes
    why: str
    fits: bool = True
    peak: float = 0.0  # the estimate with these modes, GiB (0: no GPU)


def with_settings(cfg: Config, rung: MemoryModes) -> MemoryModes:
    """`rung` with every mode the config sets explicitly (not auto) taken from the config."""
    mem, ckpt = cfg.memory, cfg.optimizer.checkpointing
    return MemoryModes(copies=rung.copies if mem.copies == "auto" else mem.copies,
                       vae_on_cpu=rung.vae_on_cpu if mem.vae_on_cpu == "auto" else mem.vae_on_cpu == "true",
                       checkpointing=rung.checkpointing if ckpt == "auto" else ckpt == "true")


def choose_modes(cfg: Config, explore_precision: str, dtype_name: str, budget_gib: float | None,
                 rollout_copy: bool = False,
                 compiled_update: bool = False) -> ModeChoice:
    """The first rung of `LADDER` (with the explicit settings) whose estimate is within `budget_gib`
    (None: a CPU, every auto mode off); when none is, the last rung with fits=False."""
    if budget_gib is None:
        return ModeChoice(with_settings(cfg, MemoryModes()), "auto: off on a CPU")

    def peak(modes: MemoryModes) -> float:
        return estimate_memory(cfg, explore_precision, dtype_name, rollout_copy=rollout_copy,
                               compiled_update=compiled_update, modes=modes).peak

    seen: list[MemoryModes] = []
    for rung in LADDER:
        modes = with_settings(cfg, rung)
        if modes in seen:
            continue
        seen.append(modes)
        need = peak(modes)
        if need <= budget_gib:
            return ModeChoice(modes, f"estimated peak {need:.1f} GiB, within {budget_gib:.1f} GiB", True, need)
    return ModeChoice(seen[-1], f"estimated peak {need:.1f} GiB even with {seen[-1].describe()}, over {budget_gib:.1f} "
                                f"GiB",
                      False, need)


def rung_needed(cfg: Config, explore_precision: str, dtype_name: str, gpu_gb: float) -> MemoryModes | None:
    """The first rung (auto settings) whose estimate fits a GPU of `gpu_gb` GB, rollout copy
    off (as auto drops it where it does not fit; the compile family keeps its copy); None: none fits."""
    auto = replace(cfg, memory=replace(cfg.memory, copies="auto", vae_on_cpu="auto"),
                   optimizer=replace(cfg.optimizer, checkpointing="auto"))
    keeps_copy = plan_stages(cfg, dtype_name, explore_precision).compiled_copy
    for rung in LADDER:
        if estimate_memory(auto, explore_precision, dtype_name, rollout_copy=keeps_copy,
                           modes=rung).peak <= gpu_gb * FIT_SHARE:
            return rung
    return None


def smallest_gpu(cfg: Config, explore_precision: str, dtype_name: str) -> int | None:
    """The smallest of `GPU_SIZES` on which some rung fits by the estimate (None: none of them)."""
    return next((gb for gb in GPU_SIZES if rung_needed(cfg, explore_precision, dtype_name, gb) is not None), None)


def too_small(cfg: Config, machine: MachinePlan, dtype_name: str, where: str) -> SolrlError:
    """The refusal of a run whose estimate is over its GPU even with every memory mode (said before any
    weights load) on the GPU `where` describes, naming the smallest GPU size on which the estimate fits."""
    smallest = smallest_gpu(cfg, machine.explore_precision, dtype_name)
    fix = (f"use a GPU of {smallest} GB or more (the smallest of {', '.join(map(str, GPU_SIZES))} GB that fits by the "
           "estimate, `solrl doctor` shows the mode each needs)" if smallest is not None
           else f"none of {', '.join(map(str, GPU_SIZES))} GB fits by the estimate: shard over several GPUs "
                "(--nproc-per-node N, distributed.strategy=fsdp)")
    return SolrlError(f"{cfg.model.name or cfg.model.loader} does not fit {where} by the memory ESTIMATE in any memory "
                      f"mode: {machine.memory_why}", fix + "; or lower optimizer.micro_batch")
