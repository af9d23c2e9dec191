"""Flow-GRPO's stochastic sampler step and the log-probability of its Gaussian transition.

Read line for line from yifan123/flow_grpo at 879042cf5707f8b90daa98d147d7deac2317c5da,
flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:11-93 `sde_step_with_logprob` (FLUX, Qwen-Image,
Wan and the `_fast` pipelines import the same function); the grid form `flow_grpo_step` of
flow_grpo/diffusers_patch/solver.py:78-121 (at 54809b5), which NVlabs/Sana's post-training rollouts
call, is the same arithmetic. Convention as in sampler.py: x_sigma = (1 - sigma) x0 + sigma noise,
v = noise - x0, sigma from 1 down to 0; `sigmas` is the run's grid (steps + 1 values ending in 0).

With sigma = sigmas[index], sigma_next = sigmas[index + 1], dt = sigma_next - sigma < 0:

    x, v, prev cast to fp32 first ("bf16 can overflow", :36-40); sigma_max = sigmas[1] (:46); dt (:47)
    'sde' (Flow-GRPO's own SDE, :49-68):
        std_dev_t = eta * sqrt(sigma / (1 - (sigma_max if sigma == 1 else sigma)))                (:50)
        mean      = x (1 + std_dev_t^2 / (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt   (:53)
        prev      = mean + std_dev_t sqrt(-dt) noise                   (only when prev is not given, :55-62)
        log_prob  = -(prev.detach() - mean)^2 / (2 (std_dev_t sqrt(-dt))^2)
                    - log(std_dev_t sqrt(-dt)) - log(sqrt(2 pi))                                    (:64-68)
    'cps' (coefficients-preserving sampling, :70-86):
        std_dev_t = sigma_next sin(eta pi / 2)                                                     (:71)
        mean      = (x - sigma v)(1 - sigma_next) + (x + (1 - sigma) v) sqrt(sigma_next^2 - std_dev_t^2)   (:72-74)
        prev      = mean + std_dev_t noise                                                         (:76-83)
        log_prob  = -(prev.detach() - mean)^2            (the reference drops every constant, :85-86)
    log_prob is then the per-sample MEAN over the latent's elements, not their sum (:88-89).

Only the mean carries a gradient into the log-probability (prev is detached): the update differentiates
it through v. At sigma = 1 (the first step) the 'sde' denominator is 1 - sigmas[1], not 0. At eta 0 the
'sde' mean is exactly the Euler step x + dt v in fp32 (sampler.sample with euler_step="fp32", whose
rounding to the state's dtype is the caller's), and the log-prob is NaN (0/0): the reference evaluates
that way (scripts/train_sd3.py:258, noise_level=0) and never reads it. The last step (sigma_next = 0)
has a finite 'sde' log-prob; the reference never trains it (timestep_fraction 0.99, train_sd3.py:345).
Under 'cps' that step is deterministic (std_dev_t = 0), its log-prob 0.

Departure, named: the reference draws the noise with diffusers' randn_tensor on the device from one
generator for the batch (:56-61). Here a sample's noise at a step comes from its own CPU
torch.Generator, seeded by numpy's SeedSequence([sample seed, grid index, SDE_NOISE_TAG]), like the
initial noise of sampler.noise_for_seeds: a sample's draw does not depend on the batch it runs in, on
the device, on the number of processes, and it is redrawn exactly on resume. The tag keeps it apart
from the initial noise, which seeds a CPU generator with the sample seed itself.

`sample_sde` rolls a batch out with these steps, as the reference's pipeline_with_logprob does
(sd3_pipeline_with_logprob.py:133-175 at 879042c): the state stays fp32 from step to step (the cast back
to the latents' dtype is commented out there, :174-175), the network sees it in its own dtype, and every
state and per-step log-probability is kept (train_sd3.py:658-685 stores them as latents[:, :-1],
next_latents = latents[:, 1:] and log_probs), for the update to read back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

SDE_KINDS = ("sde", "cps")
SDE_NOISE_TAG = 0x5DE  # third word of a step noise's SeedSequence: distinct from the initial noise's stream
SDE_WINDOW_TAG = 0x5DF  # second word of a window's SeedSequence (sde_windows)


@dataclass(frozen=True)
class SdeStep:
    """One stochastic step, as the reference returns it (sd3_sde_with_logprob.py:91-93), all fp32."""

    prev_sample: torch.Tensor  # [B, *latent] the next state (the given `prev`, cast to fp32, when one was given)
    log_prob: torch.Tensor  # [B] per-element log-density of prev_sample, averaged ('cps': -(prev - mean)^2, averaged)
    mean: torch.Tensor  # [B, *latent] the transition's mean, differentiable in x and v
    std_dev_t: torch.Tensor  # [B, 1, ...] 'sde': eta sqrt(sigma / (1 - sigma)); 'cps': sigma_next sin(eta pi / 2)


def sde_noise(seeds: list[int] | torch.Tensor, steps: list[int] | torch.Tensor, shape: tuple[int, ...],
              device: torch.device | str = "cpu") -> torch.Tensor:
    """One standard-normal fp32 tensor of `shape` per (seed, grid step index) pair, drawn on the CPU from a
    generator seeded by SeedSequence([seed, step, SDE_NOISE_TAG]): a function of the pair alone."""
    seeds = seeds.tolist() if isinstance(seeds, torch.Tensor) else list(seeds)
    steps = steps.tolist() if isinstance(steps, torch.Tensor) else list(steps)
    if len(seeds) != len(steps):
        raise ValueError(f"{len(seeds)} seeds for {len(steps)} step indices")
    out = []
    for seed, step in zip(seeds, steps):
        state = np.random.SeedSequence([int(seed), int(step), SDE_NOISE_TAG]).generate_state(1, np.uint64)[0]
        gen = torch.Generator(device="cpu").manual_seed(int(state))
        out.append(torch.randn(shape, generator=gen, dtype=torch.float32))
    return torch.stack(out).to(device)


def sde_step(x: torch.Tensor, v: torch.Tensor, sigmas: torch.Tensor, index: int | torch.Tensor, eta: float, *,
             kind: str = "sde", noise: torch.Tensor | None = None, prev: torch.Tensor | None = None,
             seeds: list[int] | torch.Tensor | None = None) -> SdeStep:
    """The step from sigmas[index] to sigmas[index + 1] (`index` an int, or one grid index per sample) with
    noise level `eta`, and the log-probability of its result (the module docstring has the formulas).

    `prev` given (the update): the log-probability of that stored next state under this (x, v); no noise
    is drawn. Otherwise (the rollout) prev = mean + std noise, `noise` given or, when None, drawn by
    `sde_noise(seeds, index)` (then `seeds` is needed)."""
    if kind not in SDE_KINDS:
        raise ValueError(f"unknown SDE kind {kind!r}: one of {', '.join(SDE_KINDS)}")
    x = x.float()  # sd3_sde_with_logprob.py:36-40
    v = v.float()
    if prev is not None:
        prev = prev.float()
    batch = x.shape[0]
    index = torch.as_tensor(index, dtype=torch.long).reshape(-1).expand(batch)
    sigmas = sigmas.to(x.device)
    view = (-1, *([1] * (x.dim() - 1)))
    sigma = sigmas[index.to(x.device)].view(*view)  # :42-44
    sigma_next = sigmas[index.to(x.device) + 1].view(*view)  # :43, :45
    sigma_max = sigmas[1].item()  # :46
    dt = sigma_next - sigma  # :47
    if prev is None and noise is None:
        if seeds is None:
            raise ValueError("sde_step draws its noise from the samples' seeds: pass `seeds` (or `noise`, or `prev`)")
        noise = sde_noise(seeds, index, tuple(x.shape[1:]), x.device)
    if kind == "sde":
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * eta  # :50
        mean = (x * (1 + std_dev_t**2 / (2 * sigma) * dt)  # :53
                + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt)
        if prev is None:
            prev = mean + std_dev_t * torch.sqrt(-1 * dt) * noise.float()  # :62
        log_prob = (-((prev.detach() - mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))  # :64-68
                    - torch.log(std_dev_t * torch.sqrt(-1 * dt))
                    - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi))))
    else:
        std_dev_t = sigma_next * math.sin(eta * math.pi / 2)  # :71
        x0 = x - sigma * v  # :72
        x1 = x + v * (1 - sigma)  # :73
        mean = x0 * (1 - sigma_next) + x1 * torch.sqrt(sigma_next**2 - std_dev_t**2)  # :74
        if prev is None:
            prev = mean + std_dev_t * noise.float()  # :83
        log_prob = -((prev.detach() - mean) ** 2)  # :86
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))  # :89
    return SdeStep(prev_sample=prev, log_prob=log_prob, mean=mean, std_dev_t=std_dev_t)


@dataclass(frozen=True)
class SdeSetting:
    """The stochastic rollout sampler of a loss that trains on log-probabilities (algorithm.loss=flow_grpo):
    its noise level eta (the reference's sample.noise_level), kind (sde or cps) and window: 0, the SDE at
    every step (Flow-GRPO); W > 0, at W consecutive steps only, the ODE elsewhere (Flow-GRPO-Fast:
    `sde_windows`)."""

    eta: float
    kind: str = "sde"
    window: int = 0


def sde_windows(seeds: list[int] | torch.Tensor, steps: int, size: int) -> torch.Tensor:
    """[B] each sample's first SDE step of `steps`: 0 where `size` is 0 (every step); else uniform over
    [0, steps // 2 - size], as Flow-GRPO-Fast draws its window (random.randint(range[0], range[1] - size),
    sd3_pipeline_with_logprob_fast.py:136-139, with sde_window_range (0, num_steps // 2) as its configs set
    it, config/grpo.py:190), here from the sample's own generator, SeedSequence([seed, SDE_WINDOW_TAG])."""
    seeds = seeds.tolist() if isinstance(seeds, torch.Tensor) else list(seeds)
    if size == 0:
        return torch.zeros(len(seeds), dtype=torch.long)
    if size > steps // 2:
        raise ValueError(f"an SDE window of {size} steps does not fit the first half of {steps} steps")
    return torch.tensor([int(np.random.default_rng([int(s), SDE_WINDOW_TAG]).integers(0, steps // 2 - size + 1))
                         for s in seeds], dtype=torch.long)


@dataclass(frozen=True)
class Trajectory:
    """A batch's SDE path, what Flow-GRPO's update reads back (train_sd3.py:658-685 at 879042c)."""

    states: torch.Tensor  # [B, T + 1, *latent] fp32: the initial noise, then each step's result
    log_probs: torch.Tensor  # [B, T] fp32: each step's log-probability under the network that rolled out (NaN: ODE)
    start: torch.Tensor  # [B] the first SDE step of each sample (`sde_windows`; 0 with no window)
    window: int = 0  # SdeSetting.window: the SDE steps from `start`, 0: every step

    def subset(self, index: torch.Tensor) -> "Trajectory":
        at = index.to(self.states.device)
        return Trajectory(self.states[at], self.log_probs[at], self.start[index.to(self.start.device)], self.window)

    @staticmethod
    def cat(parts: Sequence["Trajectory"]) -> "Trajectory":
        return Trajectory(torch.cat([p.states for p in parts]), torch.cat([p.log_probs for p in parts]),
                          torch.cat([p.start for p in parts]), parts[0].window)

    def trained_steps(self, span: int) -> torch.Tensor:
        """[B, steps] the grid indices the update trains of each sample: its window, or with none the
        first `span` in order (Flow-GRPO's range(num_train_timesteps), train_sd3.py:345, :869)."""
        if self.window:
            return self.start[:, None] + torch.arange(self.window)
        return torch.arange(span).repeat(self.start.numel(), 1)


@torch.no_grad()
def sample_sde(velocity: Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor], noise: torch.Tensor, cond: Any,
               sigmas: torch.Tensor, seeds: list[int] | torch.Tensor,
               setting: SdeSetting) -> tuple[torch.Tensor, Trajectory]:
    """Integrate from `noise` (sigma = 1) to sigma = 0 with `sde_step` at each sample's SDE steps (every step,
    or its window: `sde_windows`), each sample's step noise drawn from its seed (`sde_noise`), and at the
    others the reference's step at noise level 0, the Euler step x + dt v in fp32 (its log-probability NaN,
    never trained; sd3_pipeline_with_logprob_fast.py:152-160). Returns the final latents in `noise`'s dtype
    and the path. The network is called on the fp32 state cast to `noise`'s dtype (the run's)."""
    seeds = torch.as_tensor(seeds.tolist() if isinstance(seeds, torch.Tensor) else list(seeds), dtype=torch.long)
    steps = len(sigmas) - 1
    start = sde_windows(seeds, steps, setting.window)
    dtype = noise.dtype
    x = noise.float()
    states, log_probs = [x], []
    for i in range(steps):
        v = velocity(x.to(dtype), torch.full((x.shape[0],), float(sigmas[i]), device=x.device), cond).float()
        on = (start <= i) & (i < start + setting.window) if setting.window else torch.ones_like(start, dtype=torch.bool)
        if bool(on.all()):
            step = sde_step(x, v, sigmas, i, setting.eta, kind=setting.kind, seeds=seeds)
            x, log_prob = step.prev_sample, step.log_prob
        else:
            rows = torch.nonzero(on).flatten()
            nxt = x + (sigmas[i + 1] - sigmas[i]).to(x.device) * v
            log_prob = torch.full((x.shape[0],), float("nan"), device=x.device)
            if rows.numel():
                at = rows.to(x.device)
                step = sde_step(x[at], v[at], sigmas, i, setting.eta, kind=setting.kind, seeds=seeds[rows])
                nxt[at], log_prob[at] = step.prev_sample, step.log_prob
            x = nxt
        states.append(x)
        log_probs.append(log_prob)
    return x.to(dtype), Trajectory(torch.stack(states, dim=1), torch.stack(log_probs, dim=1), start, setting.window)
