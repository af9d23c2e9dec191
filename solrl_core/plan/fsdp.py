"""The planning half of `distributed.strategy = fsdp` (engine/sharding.py shards the policy): which
strategy a run takes, and under fsdp which copies it keeps, how they are laid out and what each process
is estimated to hold. Resolved once, with the rest of the plan (resolve.resolve_plan); the session,
the engine and `solrl doctor` read what it chose.

- `distributed.strategy = auto`: replicate while one replica fits the GPU by the memory ESTIMATE (or
  with one process: nothing to shard over), else fsdp (`resolve_strategy`).
- The low-precision explore copy under fsdp is built from the shards (engine/sharded_copy.py), kept
  whole on every process, or sharded like the policy where a whole one does not fit by the memory
  ESTIMATE (`distributed.copy_layout`, `copy_layout`): then each process holds 1/S of it, gathered
  block by block for Stage 1, eager. Where neither fits, explore.precision=auto explores at the run
  dtype; an explicit precision is refused. A full-precision rollout copy only with
  `sampler.rollout_copy=true`, or with auto where the estimate with it fits, sharded like the policy,
  eager; otherwise the full-precision rollouts and v_old run on the policy's `old` adapter.
- Refused under fsdp: the compile family and compiling either sharded copy, a compiled update,
  explore.calibrate (it measures on one process) and the memory modes that park the copies on the CPU.

With one process, fsdp shards nothing (the whole model, as replicate) but keeps the fsdp plan: a
rollout copy only when asked for, whole, and an explore copy as a replica's.
"""

from __future__ import annotations

import os
from dataclasses import replace

from solrl_core.config.schema import Config
from solrl_core.errors import SolrlError
from solrl_core.plan.footprint import FIT_SHARE, MemoryEstimate, estimate_memory
from solrl_core.plan.plan import COMPILED_ANYWAY, MachinePlan, plan_stages
from solrl_core.precision.hardware import GpuInfo

# A sharded GPU holds, besides its 1/S of the weights, the blocks gathered whole for the forward in
# flight and the one prefetched: 2 of SANA's 20 blocks, fewer of the other models' (FLUX.1 57,
# SD3.5-L 38, Qwen-Image 60). An APPROXIMATE upper share of the full weights, for estimates only.
GATHERED_SHARE = 0.1
LAYOUTS = ("whole", "sharded")  # of the explore copy under fsdp, in the order auto tries them

def replica_fits(cfg: Config, explore_precision: str, dtype_name: str, gpu: GpuInfo | None) -> tuple[bool, str]:
    """Whether one full replica (gradient checkpointing on, no rollout copy: its smallest) fits `gpu` by
    the memory ESTIMATE, and the figures."""
    if gpu is None:
        return True, "a CPU: no GPU memory limit"
    peak = estimate_memory(cfg, explore_precision, dtype_name, checkpointing=True, rollout_copy=False).peak
    budget = gpu.memory_gib * FIT_SHARE
    fits = peak <= budget
    return fits, f"one replica's estimated peak {peak:.1f} GiB, {'within' if fits else 'over'} {budget:.1f} GiB"


def resolve_strategy(cfg: Config, machine: MachinePlan, dtype_name: str, gpu: GpuInfo | None,
                     world: int) -> tuple[str, str]:
    """(strategy, why) for `distributed.strategy`; auto: replicate while one replica fits (or with one
    process: nothing to shard over), else fsdp."""
    asked = cfg.distributed.strategy
    if asked != "auto":
        return asked, "as configured"
    if world == 1:
        return "replicate", "auto with one process: nothing to shard over"
    fits, figures = replica_fits(cfg, machine.explore_precision, dtype_name, gpu)
    return ("replicate" if fits else "fsdp"), f"auto: {figures}"


def fsdp_machine(machine: MachinePlan, cfg: Config, dtype_name: str, gpu: GpuInfo | None = None,
                 shard: int = 1) -> MachinePlan:
    """`machine` under fsdp over `shard` processes per node: the explore copy built from the shards
    (sharded_copy.py), whole on every process or sharded like the policy as `distributed.copy_layout`
    and the memory ESTIMATE say (`explore_layout`; where neither fits `gpu`, with explore.precision=auto,
    Stage 1 at the run dtype; an explicit precision is refused), a full-precision rollout copy sharded
    like the policy only with sampler.rollout_copy=true; a setting fsdp cannot run is refused."""
    fix = "set distributed.strategy=replicate (a full replica per GPU), or drop the setting"
    stages = plan_stages(cfg, dtype_name, machine.explore_precision)
    if stages.compiled_copy:
        raise SolrlError(f"the {stages.family} family rolls out on a compiled full-precision copy of the model; under "
                         "distributed.strategy=fsdp the rollout copy is sharded and eager (not run compiled in this "
                         "version)",
                         "set distributed.strategy=replicate, or use naive_scaling with sampler.rollout_copy=true")
    rollout = cfg.sampler.rollout_copy == "true"
    if rollout and shard > 1 and cfg.sampler.compile == "true":
        raise SolrlError("sampler.compile=true compiles the rollout copy, which under distributed.strategy=fsdp is "
                         "sharded like the policy and eager (not run compiled in this version)",
                         "set sampler.compile=auto, or distributed.strategy=replicate")
    if cfg.optimizer.compile == "true":
        raise SolrlError("optimizer.compile=true is not available with distributed.strategy=fsdp in this version "
                         "(a compiled update is not run sharded)", fix)
    if cfg.explore.calibrate != "off":  # calibration.py measures on rank 0 alone; a sharded forward needs every rank
        raise SolrlError("explore.calibrate measures on one process, and under distributed.strategy=fsdp every "
                         "full-precision forward needs all of them (not available in this version)", fix)
    if cfg.memory.copies.startswith("cpu-"):
        raise SolrlError(f"memory.copies={cfg.memory.copies} is not available with distributed.strategy=fsdp in this "
                         "version (the sharded explore copy is filled from the shards on the GPU)", fix)
    layout, why = copy_layout(machine, cfg, dtype_name, gpu, shard, rollout) if stages.explores_low else ("", "")
    rollout, auto_why = _auto_rollout_copy(cfg, dtype_name, gpu, shard, machine.explore_precision if layout else None,
                                           layout or "whole", rollout)
    if layout == "sharded" and cfg.explore.compile == "true":
        raise SolrlError(f"explore.compile=true compiles the explore copy, which under distributed.strategy=fsdp is "
                         f"sharded like the policy here ({why}) and eager (not run compiled in this version)",
                         "set explore.compile=auto, or distributed.copy_layout=whole where a whole copy fits")
    precision, built = (machine.explore_precision, "built and refreshed one gathered block at a time from the sharded "
                                                   "policy")
    if layout == "whole":
        explore_why = (f"{machine.explore_why}; under fsdp a whole {precision} copy on each process ({why}), {built}, "
                       "without its high-precision weights")
    elif layout == "sharded":
        eager_why = machine.explore_why.split(COMPILED_ANYWAY)[0]  # a sharded copy runs eager whatever the precision
        explore_why = (f"{eager_why}; under fsdp a {precision} copy sharded like the policy, 1/{shard} on each "
                       f"process and gathered block by block for Stage 1's forwards, eager ({why}), {built}")
    else:
        explore_why = (f"auto: {why}, so " if why else "") + "Stage 1 at the run dtype on the policy's old adapter"
    if not rollout:
        rollout_why = (f"{'as configured' if cfg.sampler.rollout_copy == 'false' else auto_why}: "
                       "rollouts and v_old on the policy's old adapter (sampler.rollout_copy=true keeps one sharded "
                       "like the policy)")
    elif shard == 1:
        rollout_why = f"{auto_why or 'as configured'}; one process: a whole copy, eager"
    else:
        rollout_why = (f"{auto_why or 'as configured'}; under fsdp sharded like the policy, 1/{shard} on each process "
                       f"and gathered block by block for Stage 2's forwards and v_old's, eager, {built}")
    return replace(machine, explore_precision=precision if layout else dtype_name, explore_layout=layout,
                   explore_compile=machine.explore_compile and layout == "whole", rollout_copy=rollout,
                   rollout_compile=False,
                   update_compile=False, policy_rollout_compile=False, explore_why=explore_why, memory_fits=True,
                   memory=replace(machine.memory, copies="gpu"),
                   memory_why="under fsdp the copies stay on the GPU; the VAE and gradient "
                              "checkpointing as chosen for one replica", rollout_copy_why=rollout_why)


def _auto_rollout_copy(cfg: Config, dtype_name: str, gpu: GpuInfo | None, shard: int, explore_precision: str | None,
                       layout: str, asked: bool) -> tuple[bool, str]:
    """(keep, why) of the full-precision rollout copy under fsdp: as configured, or with
    sampler.rollout_copy=auto, kept sharded like the policy where the memory ESTIMATE with it (and the
    explore copy as laid out) fits `gpu`. Without a GPU (a CPU) or with sampler.compile=true (a sharded
    copy is not compiled in this version), auto keeps none."""
    if cfg.sampler.rollout_copy != "auto":
        return asked, ""
    if gpu is None:
        return False, "auto under fsdp keeps none without a GPU memory limit to decide by"
    if cfg.sampler.compile == "true":
        return False, "auto under fsdp keeps none with sampler.compile=true (a sharded copy runs eager)"
    budget = gpu.memory_gib * FIT_SHARE
    peak = sharded_estimate(cfg, dtype_name, shard, explore_precision=explore_precision, copy_layout=layout,
                            rollout_copy=True).peak
    fits = peak <= budget
    return fits, f"auto: estimated peak {peak:.1f} GiB with it, {'within' if fits else 'over'} {budget:.1f} GiB"


def copy_layout(machine: MachinePlan, cfg: Config, dtype_name: str, gpu: GpuInfo | None, shard: int,
                rollout_copy: bool = False) -> tuple[str, str]:
    """(layout, why) of the low-precision explore copy under fsdp: `distributed.copy_layout`, auto taking
    the first of whole and sharded that fits `gpu` by the memory ESTIMATE (`sharded_estimate`, with the
    sharded rollout copy where one is kept); with one process, whole (nothing to shard over).
    ("", figures) where none fits and explore.precision is auto (Stage 1 then at the run dtype); an
    explicit precision is refused with the figures."""
    asked = cfg.distributed.copy_layout
    if shard == 1:
        return "whole", "one process: nothing to shard the copy over"
    if gpu is None:
        return ("whole" if asked == "auto" else asked), ("auto: " if asked == "auto" else "as configured; ") + \
            "a CPU, no GPU memory limit"
    precision, budget = machine.explore_precision, gpu.memory_gib * FIT_SHARE
    peaks = layout_peaks(cfg, dtype_name, shard, precision, rollout_copy)
    layout = fitting_layout(asked, peaks, budget)
    if layout:
        head = "as configured; " if asked != "auto" else "auto: " if layout == "whole" else \
            f"auto: a whole copy's {peaks['whole']:.1f} GiB over {budget:.1f}; "
        return layout, f"{head}estimated peak {peaks[layout]:.1f} GiB within {budget:.1f} GiB"
    peaks = {name: peak for name, peak in peaks.items() if asked in ("auto", name)}
    without = sharded_estimate(cfg, dtype_name, shard, rollout_copy=rollout_copy).peak
    (first, peak), *rest = peaks.items()
    figures = (f"a {first} {precision} explore copy per GPU takes the estimated peak under fsdp over {shard} to "
               f"{peak:.1f} GiB"
               + "".join(f", a {layout} one to {p:.1f} GiB" for layout, p in rest)
               + f", over {budget:.1f} GiB ({without:.1f} GiB without it)")
    if cfg.explore.precision != "auto":
        raise SolrlError(figures, "set explore.precision=auto (Stage 1 then at the run dtype where the copy does not "
                                  "fit), distributed.copy_layout=auto, more processes per node, or a GPU with more "
                                  "memory")
    return "", figures


def layout_peaks(cfg: Config, dtype_name: str, shard: int, explore_precision: str,
                 rollout_copy: bool = False) -> dict[str, float]:
    """The estimated peak per process (`sharded_estimate`) with an explore copy at `explore_precision` in
    each of `LAYOUTS`, GiB."""
    return {layout: sharded_estimate(cfg, dtype_name, shard, explore_precision=explore_precision, copy_layout=layout,
                                     rollout_copy=rollout_copy).peak for layout in LAYOUTS}


def fitting_layout(asked: str, peaks: dict[str, float], budget: float | None) -> str:
    """The explore copy's layout `distributed.copy_layout` (`asked`) takes given each layout's peak: the
    asked one, or with auto the first of `LAYOUTS` within `budget` GiB (None: no GPU, whole); "" where
    none is within it."""
    if budget is None:
        return "whole" if asked == "auto" else asked
    return next((layout for layout in LAYOUTS if asked in ("auto", layout) and peaks[layout] <= budget), "")


def shard_count(world: int) -> int:
    """Processes sharing one copy of the weights: one node's (torchrun's LOCAL_WORLD_SIZE) where the
    mesh is 2-D (`device_mesh`), else all of them."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world if per_node <= 1 or per_node >= world or world % per_node else per_node


def sharded_estimate(cfg: Config, dtype_name: str, shard: int, checkpointing: bool = True,
                     explore_precision: str | None = None, copy_layout: str = "whole",
                     rollout_copy: bool = False) -> MemoryEstimate:
    """Peak GPU memory ESTIMATE per process under fsdp with `shard` processes per shard group (a node):
    a replica's estimate (footprint.py), its policy weights divided by `shard` plus the gathered blocks
    (GATHERED_SHARE of the weights, when sharded), and, where the family explores at
    `explore_precision` (None: at the run dtype), an explore copy without its high-precision weights
    (footprint.copy_bytes): whole as a replica's (`copy_layout` whole), or sharded like the policy
    (1/shard of it plus its gathered blocks, the same share). A full-precision `rollout_copy` is
    always sharded like the policy (a run-dtype copy, 1/shard plus its gathered share). Each copy's
    gathered blocks are counted beside the policy's although they are gathered in different phases:
    an upper estimate. APPROXIMATE."""
    explore = explore_precision or dtype_name
    est = estimate_memory(cfg, explore, dtype_name, checkpointing, rollout_copy=False)
    gathered = GATHERED_SHARE if shard > 1 else 0.0
    policy = est.policy / shard + est.policy * gathered
    copy = est.explore_copy / shard + est.explore_copy * gathered if copy_layout == "sharded" else est.explore_copy
    full = est.rollout_copy_size / shard + est.rollout_copy_size * gathered if rollout_copy else 0.0
    return replace(est, policy=policy, explore_copy=copy, rollout_copy=full)
