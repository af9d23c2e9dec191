"""The model FLOPs a training run announces as it starts, for its live MFU (mfu.py): the figure
`solrl bench` prints, per iteration, in the terminal, the TUI and `solrl monitor`.

Counted once by FlopCounterMode on a copy of the run's transformer built on the meta device from its
config (no memory, no time; the LoRA adapters' own products are left out, as in bench/flops.py), called
through the model's own velocity function with one prompt's conditioning at batch 1: one forward (a
sample-step) and one forward + backward with the base weights frozen. The phases' FLOPs follow from
the stage plan (phase_flops, which `solrl bench` uses too). Peaks are peaks.py's: a datasheet figure for a listed GPU,
else a
GEMM rate measured here once as the run starts (about 0.1 s on a CPU: a 1024 fp32 matmul, best of a
few calls; half a second on an unlisted GPU). fp8 on a device with no portable fp8 matmul (a CPU) has
no peak: its MFU is shown as unmeasured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from solrl_core import events as ev
from solrl_core.telemetry import peaks as pk

CPU_MEASURE_SECONDS = 0.1  # at every run start on a CPU: kept short (the tests start many runs)


@dataclass(frozen=True)
class SampleFlops:
    """Model FLOPs per sample: one forward, and one forward + backward with the base weights frozen."""

    forward: float
    forward_backward: float


def phase_flops(plan: Any, cfg: Any, per_sample: SampleFlops, prompts: int) -> dict[str, float]:
    """Model FLOPs of each phase of one iteration of `plan` (plan.py's RunPlan) on `prompts` groups.

        explore     prompts x explore seeds x explore steps x forward
        regenerate  prompts x K x full steps x forward                 (when Stage 2 regenerates)
        train       prompts x K x train timesteps x (forward + backward, + old forward, + reference forward if KL)
    """
    steps = min(max(1, int(plan.full_steps * cfg.algorithm.timestep_fraction)), plan.full_steps)  # update.py
    pair = per_sample.forward_backward + per_sample.forward * (2 if cfg.algorithm.kl_beta != 0 else 1)
    flops = {"explore": prompts * plan.explore_seeds * plan.explore_steps * per_sample.forward,
             "regenerate": prompts * plan.keep * plan.full_steps * per_sample.forward if plan.regenerate else 0.0,
             "train": prompts * plan.keep * steps * pair}
    return {**flops, "total": sum(flops.values())}


GEMM_PRECISIONS = ("fp8", "nvfp4", "bf16", "fp32")  # explore precisions whose GEMMs run at that precision


def phase_precisions(plan: Any) -> dict[str, str]:
    """The GEMM precision each phase's model FLOPs run at: fp8 in fp8; an emulated copy (nvfp4-emulated,
    fp8-e5m2-tensor) multiplies dequantized weights in the run dtype, fp8-e5m2-delayed its E5M2 codes in fp32."""
    explore = plan.explore_precision if plan.explore_precision in GEMM_PRECISIONS else plan.full_precision
    if plan.explore_precision == "fp8-e5m2-delayed":
        explore = "fp32"
    return {"explore": explore, "regenerate": plan.full_precision, "train": plan.full_precision}


def model_flops(run: Any) -> ev.ModelFlops:
    """The run's ModelFlops event (session.Run); counting that fails says why, and the run goes on."""
    label = pk.device_label(run.device)
    try:
        per_sample = count_velocity_flops(run.engine.model, run.engine.conditioning(run.prompts[:1]), run.engine.dtype)
    except Exception as exc:  # noqa: BLE001 - a model the meta device cannot run: no MFU, not a failed run
        return ev.ModelFlops(forward=None, train_pair=None, phases={}, precisions={}, peaks={}, peak_sources={},
                             devices=run.world_size, device=label,
                             note=f"the meta-device count failed: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0][:200]}")
    cfg, plan = run.config, run.plan
    phases = phase_flops(plan, cfg, per_sample, cfg.run.prompts_per_iteration)
    precisions = {p: v for p, v in phase_precisions(plan).items() if phases.get(p)}
    peaks, sources = {}, {}
    for precision in sorted(set(precisions.values())):
        try:
            peak = device_peak(run.device, precision)
        # a GEMM that does not fit beside the loaded model: no MFU, not a failed run
        except Exception as exc:  # noqa: BLE001
            sources[precision] = f"unmeasured: the {precision} GEMM measurement failed ({type(exc).__name__})"
            continue
        if peak is None:
            sources[precision] = (f"unmeasured: no {precision} figure for this device and no portable {precision} "
                                  f"matmul to measure")
        else:
            peaks[precision], sources[precision] = peak.flops, peak.source
    pair = per_sample.forward_backward + per_sample.forward * (2 if cfg.algorithm.kl_beta != 0 else 1)
    return ev.ModelFlops(forward=per_sample.forward, train_pair=pair, phases=phases, precisions=precisions, peaks=peaks,
                         peak_sources=sources, devices=run.world_size, device=label)


def device_peak(device: torch.device, precision: str) -> pk.Peak | None:
    """peaks.device_peak, with a shorter measurement on a CPU (the bench's own takes half a second)."""
    if device.type == "cuda":
        return pk.device_peak(device, precision)
    return pk.measure_gemm(device, precision, seconds=CPU_MEASURE_SECONDS)


def count_velocity_flops(model: Any, cond: Any, dtype: torch.dtype) -> SampleFlops:
    """FlopCounterMode over `model.velocity` (models/base.py) on a meta copy of its transformer, batch 1."""
    from torch.utils.flop_counter import FlopCounterMode

    net = meta_copy(model.transformer, dtype).requires_grad_(False)
    cond = cond.to("meta")
    sigmas = torch.full((1,), 0.5, device="meta")

    def latents() -> torch.Tensor:
        return torch.zeros(1, *model.latent_shape, device="meta", dtype=dtype)

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.velocity(net, latents(), sigmas, cond)
    forward = counter.get_total_flops()
    x = latents().requires_grad_(True)  # gradients flow back through every block, as to the LoRA layers
    with FlopCounterMode(display=False) as counter:
        model.velocity(net, x, sigmas, cond).float().sum().backward()
    return SampleFlops(float(forward), float(counter.get_total_flops()))


def meta_copy(transformer: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The transformer's architecture on the meta device, from its diffusers config (no weights, no
    adapters): the class it was built as, past any wrapper class FSDP made of it."""
    cls = next(c for c in type(transformer).__mro__ if not c.__name__.startswith("FSDP"))
    config = dict(transformer.config)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            return cls.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)

