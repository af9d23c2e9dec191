"""Before `solrl bench --size real` builds anything: does each family fit this GPU, by the doctor's
memory estimate (footprint.py, the figure `solrl doctor` prints)? Building a 12B transformer and
compiling it takes minutes; a family that cannot fit is refused first, with the setting to lower.

The estimate is APPROXIMATE (footprint.py says how it is made) and counts the policy, the explore and
rollout copies, the VAE, the update's activations (the micro-batch) and an overhead. N, K and the
rollout batch do not enter it (the rollouts run without gradients, in batches of the rollout batch;
the update in micro-batches), so the settings it can name are the micro-batch, the rollout copy and
the explore precision. `--skip-memory-check` builds anyway: the trainer's out-of-memory back-off
then names what ran out (run.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from solrl_core.errors import SolrlError
from solrl_core.precision.hardware import GpuInfo


def estimate(cfg: Any, device: torch.device, gpu: GpuInfo) -> tuple[float, Any, Any]:
    """(peak GiB, the estimate by part, the machine plan) for `cfg` on `gpu`, as `solrl doctor` makes it."""
    from solrl_core.plan.footprint import estimate_memory
    from solrl_core.plan.resolve import resolve_machine

    dtype_name = "bf16" if cfg.run.dtype == "auto" else cfg.run.dtype
    machine = resolve_machine(cfg, device, dtype_name, gpu=gpu)
    est = estimate_memory(cfg, machine.explore_precision, dtype_name, machine.checkpointing, machine.rollout_copy,
                          machine.update_compile)
    return est.peak, est, machine


def check_fits(configs: dict[str, Any], device: torch.device, gpu: GpuInfo | None) -> None:
    """Raise SolrlError for the first family whose estimate is over the GPU's memory, naming what
    would bring it under (lower micro-batch, no rollout copy, an fp8 explore copy) or, when nothing
    does, that the model needs a larger GPU. `gpu` None (no CUDA device found): nothing to check."""
    if gpu is None:
        return
    for family, cfg in configs.items():
        peak, est, machine = estimate(cfg, device, gpu)
        if peak <= gpu.memory_gib:
            continue
        parts = (f"policy {est.policy:.1f} + explore copy {est.explore_copy:.1f} ({machine.explore_precision}) + "
                 f"rollout copy {est.rollout_copy:.1f} + vae {est.vae:.1f} + max(text encoders "
                 f"{est.text_encoders:.1f}, activations {est.activations:.1f} at micro-batch "
                 f"{cfg.optimizer.micro_batch}) + {est.overhead:.1f} overhead")
        raise SolrlError(f"{family} does not fit on {gpu.describe()} by the doctor's estimate: {peak:.1f} GiB "
                         f"(approximate: {parts}); not building", _fix(cfg, device, gpu, machine, peak))


def _fix(cfg: Any, device: torch.device, gpu: GpuInfo, machine: Any, current: float) -> str:
    """Each single change that brings the estimate (`current` GiB) under the GPU's memory, in the
    bench's own options; the largest micro-batch that fits."""
    from solrl_core.precision import hardware

    cap = gpu.memory_gib
    found = []
    for micro in range(cfg.optimizer.micro_batch - 1, 0, -1):
        peak = estimate(_with(cfg, "optimizer", micro_batch=micro), device, gpu)[0]
        if peak <= cap:
            found.append(f"--micro-batch {micro} (estimate {peak:.1f} GiB)")
            break
    if machine.rollout_copy:
        lean = _with(cfg, "sampler", rollout_copy="false")
        peak, _, plan = estimate(lean, device, gpu)
        if not plan.rollout_copy and peak <= cap:
            found.append(f"no rollout copy: --set sampler.rollout_copy=false (estimate {peak:.1f} GiB)")
    usable = [p for p in hardware.supported(hardware.explore_precisions(gpu)) if p in hardware.IMPLEMENTED_EXPLORE]
    smaller = sorted((estimate(_with(cfg, "explore", precision=p), device, gpu)[0], p) for p in usable
                     if p != machine.explore_precision)
    peak, precision = smaller[0] if smaller else (current, "")
    if peak < current and peak <= cap:
        same = " (no separate copy: Stage 1 at full precision)" if precision in ("bf16", "fp32") else ""
        found.append(f"a smaller explore copy: --set explore.precision={precision}{same} (estimate {peak:.1f} GiB)")
    if not found:
        floor = estimate(_with(_with(cfg, "optimizer", micro_batch=1), "sampler", rollout_copy="false"), device, gpu)[0]
        return (f"no single setting the bench can lower brings it under {cap:.0f} GiB (at micro-batch 1 without a "
                f"rollout copy: {floor:.1f} GiB): use a GPU with more memory, a smaller --model, or --size tiny to run "
                f"the code "
                "path; --skip-memory-check builds anyway")
    return "lower one: " + "; or ".join(found) + "; --skip-memory-check builds anyway (the estimate is approximate)"


def _with(cfg: Any, section: str, **changes: Any) -> Any:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **changes)})
