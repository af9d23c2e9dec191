"""Deterministic flow-matching ODE sampling with seed-addressed initial noise.

The noise of a sample is a pure function of its integer seed (a CPU generator, so it is identical
on every device), which is what lets Stage 2 regenerate exactly the seeds Stage 1 ranked.
Convention: x_sigma = (1 - sigma) * x0 + sigma * noise, velocity v = noise - x0, sigma from 1 to 0.

Solvers: `euler` (the official SANA sampler; its step in fp32 from the run-dtype state, rounded once,
as the official `run_sampling` hands `flow_grpo_step` `pred.float()` and `z.float()`) and `dpm2`, the deterministic
2nd-order multistep
DPM-Solver++(2M) in data-prediction form (the official SD3/FLUX sampler), written for flow matching
as diffusers' DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction",
solver_order=2, final_sigmas_type="zero") steps it; its first order is exactly Euler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from solrl_core.config.schema import SamplerConfig
from solrl_core.engine.sde import SdeSetting, Trajectory, sample_sde
from solrl_core.models.base import Conditioning, DiffusionModel
from solrl_core.runtime.lanes import map_in_lanes

VelocityCall = Callable[[torch.Tensor, torch.Tensor, Conditioning], torch.Tensor]


def noise_for_seeds(seeds: list[int] | torch.Tensor, shape: tuple[int, ...], device: torch.device,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One standard-normal tensor of `shape` per seed, independent of batch composition and device."""
    out = []
    for seed in (seeds.tolist() if isinstance(seeds, torch.Tensor) else seeds):
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        out.append(torch.randn(shape, generator=gen, dtype=torch.float32))
    return torch.stack(out).to(device=device, dtype=dtype)


NUM_TRAIN_TIMESTEPS = 1000  # diffusers' FlowMatchEulerDiscreteScheduler default, as SD3/3.5 ship it
QWEN_IMAGE_SHIFT_TERMINAL = 0.02  # Qwen/Qwen-Image scheduler/scheduler_config.json: shift_terminal


def _shifted(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    return sigmas if shift == 1.0 else shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def sigma_grid(steps: int, shift: float = 1.0, kind: str = "linspace") -> torch.Tensor:
    """steps + 1 sigmas from 1 to 0, built the way the model's diffusers pipeline builds them.

    linspace   linspace(1, 1/steps, steps), shifted, then 0: SanaPipeline (shift 1) and FluxPipeline
               (which passes these sigmas and shifts them by exp(mu)).
    scheduler  FlowMatchEulerDiscreteScheduler(shift).set_timesteps(steps), as StableDiffusion3Pipeline
               calls it: linspace(1, sigma_min, steps) with sigma_min = shift(1/1000) (the shifted
               training grid's smallest sigma), shifted again, then 0. At shift 3 its last non-zero
               sigma is 0.0089 for any step count, where linspace ends at shift(1/steps) (0.25 at 10).
    qwen_image linspace(1, 1/steps, steps), shifted, then stretched so that its last non-zero sigma is
               QWEN_IMAGE_SHIFT_TERMINAL (FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal),
               then 0: QwenImagePipeline with Qwen-Image's scheduler, whose exponential time shift
               by mu is the shift exp(mu) here.
    """
    if kind == "linspace":
        sigmas = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
        return _shifted(sigmas, shift).float()
    if kind == "qwen_image":
        # the stretch divides 1 - sigma_last = 0 by itself (NaN, in diffusers' scheduler too): one step, 1 -> 0
        if steps == 1:
            return torch.tensor([1.0, 0.0])
        sigmas = _shifted(torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float64), shift)
        one_minus = 1.0 - sigmas
        sigmas = 1.0 - one_minus / (one_minus[-1] / (1.0 - QWEN_IMAGE_SHIFT_TERMINAL))
        return torch.cat([sigmas, sigmas.new_zeros(1)]).float()
    if kind != "scheduler":
        raise ValueError(f"unknown sigma grid {kind!r}")
    sigma_min = float(_shifted(torch.tensor(1.0 / NUM_TRAIN_TIMESTEPS, dtype=torch.float64), shift))
    sigmas = _shifted(torch.linspace(1.0, sigma_min, steps, dtype=torch.float64), shift)
    return torch.cat([sigmas, sigmas.new_zeros(1)]).float()


@torch.no_grad()
def sample(velocity: VelocityCall, noise: torch.Tensor, cond: Conditioning, sigmas: torch.Tensor,
           solver: str = "euler", round_state: bool = False, euler_step: str = "fp32") -> torch.Tensor:
    """Integrate the ODE from `noise` (sigma = 1) to sigma = 0 and return the clean latents.
    `round_state`: dpm2's fp32 state rounded to `noise`'s dtype after every step (the official rollouts).
    `euler_step`: fp32 (each Euler step x + dt * v computed in fp32 from the state and the velocity, then
    rounded once to `noise`'s dtype: the official flow step) or run (the product and the sum each in
    `noise`'s dtype, rounded twice). The same in an fp32 run."""
    if solver == "dpm2":
        return _dpm2(velocity, noise, cond, sigmas, round_state)
    if solver != "euler":
        raise ValueError(f"unknown solver {solver}")
    if euler_step not in ("fp32", "run"):
        raise ValueError(f"unknown euler_step {euler_step!r}")
    x = noise
    batch = x.shape[0]
    for i in range(len(sigmas) - 1):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        v = velocity(x, torch.full((batch,), s, device=x.device), cond)
        if euler_step == "fp32":
            x = (x.float() + (s_next - s) * v.float()).to(x.dtype)
        else:
            x = x + (s_next - s) * v.to(x.dtype)
    return x


def _log_snr(sigma: float) -> float:
    """lambda = log(alpha / sigma) with alpha = 1 - sigma; -inf at pure noise, +inf at clean data."""
    if sigma >= 1.0:
        return -math.inf
    if sigma <= 0.0:
        return math.inf
    return math.log((1.0 - sigma) / sigma)


def _dpm2(velocity: VelocityCall, noise: torch.Tensor, cond: Conditioning, sigmas: torch.Tensor,
          round_state: bool = False) -> torch.Tensor:
    """DPM-Solver++(2M), midpoint form. With x0 = x - sigma * v the data prediction at each point,
    a step from s to t is  x_t = (sigma_t / sigma_s) x_s + (1 - sigma_t / sigma_s) D, where
    D = x0_s (first order, = Euler) or x0_s + (h / 2 h_prev) (x0_s - x0_prev) (second order, h the
    step in lambda). The first step, and a step after one started at sigma = 1 (h_prev infinite), are
    first order; the last step, to sigma = 0, is D = x0. The state is kept in float32."""
    dtype = noise.dtype
    x = noise.float()
    batch = x.shape[0]
    prev_x0: torch.Tensor | None = None
    prev_lam = -math.inf
    for i in range(len(sigmas) - 1):
        s, t = float(sigmas[i]), float(sigmas[i + 1])
        v = velocity(x.to(dtype), torch.full((batch,), s, device=x.device), cond).float()
        x0 = x - s * v
        lam = _log_snr(s)
        if t <= 0.0:
            x = x0
        else:
            d = x0
            if prev_x0 is not None:
                h, h_prev = _log_snr(t) - lam, lam - prev_lam
                d = x0 + (0.5 * h / h_prev) * (x0 - prev_x0)
            ratio = t / s
            x = ratio * x + (1.0 - ratio) * d
        if round_state:  # diffusers' step hands back prev_sample in the model output's dtype
            x = x.to(dtype).float()
        prev_x0, prev_lam = x0, lam
    return x.to(dtype)


@dataclass(frozen=True)
class Sampler:
    """The run's ODE sampler, built once from `config.sampler`: its sigma grid, its solver, and how
    many samples go through the network at a time. Every rollout (training, evaluation, inference,
    explore, the rank check) generates through `generate`."""

    solver: str = "euler"
    shift: float = 1.0
    grid: str = "linspace"
    batch_size: int = 24
    grid_dtype: str = "fp32"
    state_dtype: str = "fp32"
    euler_step: str = "fp32"
    integer_timesteps: bool = False
    lanes: int = 1  # batches run side by side on a CPU, one torch thread each (runtime/lanes.py)

    @classmethod
    def of(cls, cfg: SamplerConfig) -> "Sampler":
        return cls(solver=cfg.solver, shift=cfg.shift, grid=cfg.sigma_grid, batch_size=cfg.rollout_batch,
                   grid_dtype=cfg.grid_dtype, state_dtype=cfg.state_dtype, integer_timesteps=cfg.integer_timesteps,
                   euler_step=cfg.euler_step)

    def sigmas(self, steps: int) -> torch.Tensor:
        grid = sigma_grid(steps, self.shift, self.grid)
        # The official SANA pipeline: linspace(..., dtype=latents.dtype), i.e. each sigma rounded to bf16
        return grid.to(torch.bfloat16).float() if self.grid_dtype == "bf16" else grid

    def generate(self, model: DiffusionModel, network: nn.Module, cond: Conditioning, seeds: torch.Tensor, steps: int,
                 dtype: torch.dtype, groups: Sequence[int] | None = None) -> torch.Tensor:
        """Final latents of one seed per row of `cond`, `steps` solver steps, `batch_size` at a time.

        `groups` (the lengths of consecutive row groups, e.g. each prompt's seeds): no batch holds rows
        of two groups, so a row's result does not depend on which other groups share the call. That
        matters where a call's numerics depend on the whole batch (a quantized explore copy scales its
        activations per call): the same group gives the same images whatever the number of processes
        its iteration is split over, and whatever the groups beside it. On a CPU the batches run in
        `lanes` (runtime/lanes.py)."""
        device = next(network.parameters()).device
        sigmas = self.sigmas(steps)

        def one(chunk: slice) -> torch.Tensor:
            noise = noise_for_seeds(seeds[chunk], model.latent_shape, device, dtype)
            return sample(self.model_call(model, network), noise, cond[chunk].to(device), sigmas, self.solver,
                          self.state_dtype == "run", self.euler_step).float()

        return torch.cat(map_in_lanes(one, batch_slices(seeds.numel(), self.batch_size, groups), self.lanes))

    def generate_sde(self, model: DiffusionModel, network: nn.Module, cond: Conditioning, seeds: torch.Tensor,
                     steps: int, dtype: torch.dtype, *, setting: SdeSetting,
                     groups: Sequence[int] | None = None) -> tuple[torch.Tensor, Trajectory]:
        """`generate` with the SDE sampler of `setting` in place of the solver (sde.sample_sde): the final
        latents and each sample's path. A sample's step noise is a function of its seed and the step, so
        neither the batches nor the lanes change it."""
        device = next(network.parameters()).device
        sigmas = self.sigmas(steps)

        def one(chunk: slice) -> tuple[torch.Tensor, Trajectory]:
            noise = noise_for_seeds(seeds[chunk], model.latent_shape, device, dtype)
            latents, path = sample_sde(self.model_call(model, network), noise, cond[chunk].to(device), sigmas,
                                       seeds[chunk], setting)
            return latents.float(), path

        made = map_in_lanes(one, batch_slices(seeds.numel(), self.batch_size, groups), self.lanes)
        return torch.cat([latents for latents, _ in made]), Trajectory.cat([path for _, path in made])

    def model_call(self, model: DiffusionModel, network: nn.Module) -> VelocityCall:
        """The velocity the solver calls. `integer_timesteps`: the model sees trunc(sigma x 1000) / 1000,
        the official SD3 rollouts' whole-number timesteps (pipeline_with_logprob.py:158, dtype=torch.long;
        a wrapper's sigma x 1000 in fp32 is then that whole number to within one fp32 ulp)."""
        if not self.integer_timesteps:
            return lambda x, s, c: model.velocity(network, x, s, c)
        return lambda x, s, c: model.velocity(network, x, self.seen_sigma(s), c)

    def seen_sigma(self, sigma: torch.Tensor) -> torch.Tensor:
        """The sigma the network is handed (`model_call`): trunc(sigma x 1000) / 1000 with integer_timesteps."""
        return (torch.floor(sigma.double() * 1000) / 1000).to(sigma.dtype) if self.integer_timesteps else sigma


def batch_slices(total: int, batch: int, groups: Sequence[int] | None = None) -> list[slice]:
    """Rows [0, total) in slices of at most `batch`; with `groups` (lengths summing to `total`), cut
    within each group, never across two."""
    sizes = [total] if groups is None else list(groups)
    if sum(sizes) != total:
        raise ValueError(f"group lengths {sizes} do not add up to {total} rows")
    slices, start = [], 0
    for size in sizes:
        slices += [slice(s, min(s + batch, start + size)) for s in range(start, start + size, batch)]
        start += size
    return slices
