"""What this machine gets, resolved once at the start of a run from the config's `auto` switches.

- explore precision `auto`: on compute capability >= 10.0 (Blackwell) real NVFP4 (the paper's explore
  precision; torchao's kernel, its speed not yet measured, which the start-up line says) where torchao
  is installed; else on a GPU the fastest explore this version has measured there: fp8
  (compiled) on compute capability >= 8.9, where it beat compiled bf16 on an H100 (docs/BENCHMARKS.md),
  else the run dtype (no real low precision; never the NVFP4 emulation, which is slower than bf16
  on a GPU); on a CPU the exact NVFP4 emulation, the numerics the paper's explore copy has.
- `explore.compile` / `sampler.compile` `auto`: on CUDA (eager fp8 is slower than eager bf16, and
  the official baselines are compiled); off on a CPU, where a compile costs about a minute per copy.
  An fp8 explore copy on CUDA is compiled even with `explore.compile=false`, and the start-up line
  says so: eager, it is slower than bf16 (FP8_EAGER_SLOWER).
- `sampler.rollout_copy` `auto`: a merged full-precision copy of the transformer for the full-precision
  rollouts and the update's v_old when the memory estimate (footprint.py) says it fits this GPU; none
  under algorithm.loss=flow_grpo (FLOW_GRPO_NO_COPY).
- `optimizer.compile` `auto`: on CUDA, the update's policy forwards (trained with its backward, the
  reference, v_old without a rollout copy) run with the policy's blocks torch.compile'd; off on a
  CPU. Without a rollout copy, the full-precision rollouts on the policy's old adapter use the same
  compiled blocks when `sampler.compile` is on too.
- `optimizer.checkpointing` and the `memory` modes `auto`: on CUDA, the first rung of the memory-mode
  ladder whose estimate fits this GPU (memory_modes.py: VAE on the CPU, gradient checkpointing, the
  copies on the CPU); off on a CPU.

Each choice carries the reason, which the start-up line and `solrl doctor` show. `resolve_plan` is
the one place a run's plan is made: these switches, then the distributed strategy and what fsdp
keeps (fsdp.py), then the family's stages at the explore precision that leaves (plan.plan_stages).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from solrl_core.config.schema import Config
from solrl_core.plan.footprint import FIT_SHARE, estimate_memory
from solrl_core.plan.fsdp import fsdp_machine, resolve_strategy, shard_count
from solrl_core.plan.memory_modes import choose_modes
from solrl_core.plan.plan import COMPILED_ANYWAY, MachinePlan, RunPlan, plan_stages
from solrl_core.precision import fp8_attention
from solrl_core.precision.backends import speed_note

# Measured on the tiny world in bf16 at iteration 1, where the rollout and the trained adapter are one: the
# rollouts' log-probabilities on a merged copy part from the update's by up to 1.9e-4, more than Flow-GRPO's
# clip of 1e-4; on the policy's own adapter by 0 (tests/test_grpo_runs.py)
FLOW_GRPO_NO_COPY = ("flow_grpo: the trained-on rollouts on the policy's own adapter, where the update computes "
                     "their log-probabilities")
from solrl_core.precision.hardware import FP8_CC, NVFP4_CC, GpuInfo, explore_precisions, gpus
from solrl_core.runtime.tf32 import describe_tf32

# measured on an H100 (docs/BENCHMARKS.md, 2026-11-24): fp8 pays only compiled, where the input
# quantization fuses into the producer; eager, the explore copy would be slower than no fp8 at all
FP8_EAGER_SLOWER = ("eager fp8 ran slower than eager bf16 on an H100 (one step at batch 24: SANA-1.6B 299 vs 253 ms, "
                    "FLUX.1 1934 vs 1277 ms); use explore.precision=bf16 for an eager explore copy")


def gpu_of(device: torch.device) -> GpuInfo | None:
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return next((g for g in gpus() if g.index == index), None)


def auto_explore_precision(gpu: GpuInfo | None, dtype_name: str) -> tuple[str, str]:
    """(precision, why) for `explore.precision = auto`."""
    if gpu is None:
        return "nvfp4-emulated", "auto on a CPU: the exact NVFP4 emulation (no real low-precision kernel runs here)"
    cc = f"{gpu.capability[0]}.{gpu.capability[1]}"
    nvfp4_ok, nvfp4_why = explore_precisions(gpu)["nvfp4"]
    if nvfp4_ok:
        return "nvfp4", f"auto on compute capability {cc}: the paper's NVFP4 explore copy, {nvfp4_why}"
    if gpu.capability >= FP8_CC:
        not_nvfp4 = f" (nvfp4: {nvfp4_why})" if gpu.capability >= NVFP4_CC else ""
        return "fp8", (f"auto on compute capability {cc}: FP8 GEMMs, compiled, the fastest explore this version has "
                       f"measured on a GPU{not_nvfp4}")
    return dtype_name, f"auto on compute capability {cc}: no real low precision below 8.9, so the run dtype"


def _switch(value: str, auto: bool) -> bool:
    return auto if value == "auto" else value == "true"


def resolve_machine(cfg: Config, device: torch.device, dtype_name: str, gpu: GpuInfo | None = None) -> MachinePlan:
    """The auto switches of `cfg` on this device (`gpu` given for tests with made-up GPUs)."""
    gpu = gpu if gpu is not None else gpu_of(device)
    cuda = device.type == "cuda"
    if cfg.explore.precision == "auto":
        precision, why = auto_explore_precision(gpu, dtype_name)
    else:
        precision, why = cfg.explore.precision, "as configured"
    note = speed_note(precision, gpu, cfg.explore.fp8_backend)
    why += f"; {note}" if note else ""
    if cfg.explore.fp8_attention:  # a kernel nobody has timed: said so, as the speed note above
        name, what = fp8_attention.backend(gpu.capability if gpu is not None else None)
        why += f"; fp8 attention: {name or 'not here'} ({what}){', unmeasured on this GPU' if name and gpu else ''}"
    explore_compile, update_compile = _switch(cfg.explore.compile, cuda), _switch(cfg.optimizer.compile, cuda)
    if cuda and precision == "fp8" and not explore_compile:
        explore_compile = True
        why += f"{COMPILED_ANYWAY}: {FP8_EAGER_SLOWER}"
    estimate = estimate_memory(cfg, precision, dtype_name, checkpointing=True, rollout_copy=False)
    budget = gpu.memory_gib * FIT_SHARE if gpu is not None else None
    copy_needed = plan_stages(cfg, dtype_name, precision).compiled_copy  # the compile family is the compiled copy
    if cfg.sampler.rollout_copy != "auto" and not copy_needed:
        copy, copy_why = cfg.sampler.rollout_copy == "true", "as configured"
    elif copy_needed:
        copy, copy_why = True, "the compile family rolls out on a compiled copy"
    elif cfg.algorithm.loss == "flow_grpo":  # no v_old to serve, and a merged copy's rounding would move the ratio
        copy, copy_why = False, FLOW_GRPO_NO_COPY
    elif budget is None:
        copy, copy_why = True, "no GPU memory limit to respect"
    else:
        need = estimate.peak + estimate.rollout_copy_size
        copy = need <= budget
        copy_why = (f"estimated peak {need:.1f} GiB with it, {'within' if copy else 'over'} {budget:.1f} GiB "
                    f"({FIT_SHARE:.0%} of {gpu.name})") + ("" if copy else ": rollouts use the policy's old adapter")
    # gradient checkpointing and the memory modes: the first rung whose estimate fits (memory_modes.py)
    choice = choose_modes(cfg, precision, dtype_name, budget, rollout_copy=copy, compiled_update=update_compile)
    ckpt = choice.modes.checkpointing
    blocks = choice.modes.copies == "cpu-blocks"  # offload.py: a block's moves are hooks a compiled block would trace
    if blocks and explore_compile:
        explore_compile, why = False, why + "; eager: memory.copies=cpu-blocks"
    ckpt_why = "as configured" if cfg.optimizer.checkpointing != "auto" else (
        "off on a CPU" if budget is None else f"memory mode, {choice.why}")
    return MachinePlan(explore_precision=precision, explore_why=why, explore_compile=explore_compile,
                       rollout_copy=copy, rollout_copy_why=copy_why,
                       rollout_compile=copy and not blocks and (copy_needed or _switch(cfg.sampler.compile, cuda)),
                       checkpointing=ckpt, checkpointing_why=ckpt_why, update_compile=update_compile,
                       policy_rollout_compile=not copy and update_compile and _switch(cfg.sampler.compile, cuda),
                       tf32=describe_tf32(cfg.run.tf32, device), memory=choice.modes, memory_why=choice.why,
                       memory_fits=choice.fits, compiles_fp8=cuda)


def resolve_plan(cfg: Config, device: torch.device, dtype_name: str, gpu: GpuInfo | None = None, world: int = 1,
                 threads: str = "") -> RunPlan:
    """The run's plan on `device` (`gpu` given for made-up GPUs: tests, `solrl doctor`) with `world`
    processes: the auto switches (`resolve_machine`), the distributed strategy and, under fsdp, the
    copies it keeps (fsdp.py), and the family's stages at the explore precision that leaves. `threads`:
    the torch threads the session set, as the start-up line shows them. A refused setting raises here,
    before any weights load."""
    gpu = gpu if gpu is not None else gpu_of(device)
    machine = replace(resolve_machine(cfg, device, dtype_name, gpu), threads=threads)
    strategy, why = resolve_strategy(cfg, machine, dtype_name, gpu, world)
    if strategy == "fsdp":
        machine = fsdp_machine(machine, cfg, dtype_name, gpu, shard_count(world))
        why += "; one process: nothing to shard over, the whole model, no rollout copy" if world == 1 else ""
    machine = replace(machine, strategy=strategy, strategy_why=why)
    return plan_stages(cfg, dtype_name, machine.explore_precision, machine)
