"""Deterministic flow-matching ODE sampling with seed-addressed initial noise.

The noise of a sample is a pure function of its integer seed (a CPU generator, so it is identical
on every device), which is what lets Stage 2 regenerate exactly the seeds Stage 1 ranked.
Convention: x_sigma = (1 - sigma) * x0 + sigma * noise, velocity v = noise - x0, sigma from 1 to 0.
"""

from __future__ import annotations

from typing import Callable

import torch

from solrl_core.models.base import Conditioning

VelocityCall = Callable[[torch.Tensor, torch.Tensor, Conditioning], torch.Tensor]


def noise_for_seeds(seeds: list[int] | torch.Tensor, shape: tuple[int, ...], device: torch.device,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One standard-normal tensor of `shape` per seed, independent of batch composition and device."""
    out = []
    for seed in (seeds.tolist() if isinstance(seeds, torch.Tensor) else seeds):
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        out.append(torch.randn(shape, generator=gen, dtype=torch.float32))
    return torch.stack(out).to(device=device, dtype=dtype)


def sigma_grid(steps: int, shift: float = 1.0) -> torch.Tensor:
    """steps + 1 sigmas from 1 to 0 (linspace, optionally shifted as SD3/FLUX schedulers do)."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    if shift != 1.0:
        sigmas = shift * sigmas / (1.0 + (shift - 1.0) * sigmas)
    return sigmas.float()


@torch.no_grad()
def sample(velocity: VelocityCall, noise: torch.Tensor, cond: Conditioning, sigmas: torch.Tensor,
           solver: str = "euler") -> torch.Tensor:
    """Integrate the ODE from `noise` (sigma = 1) to sigma = 0 and return the clean latents."""
    if solver != "euler":
        raise ValueError(f"unknown solver {solver}")
    x = noise
    batch = x.shape[0]
    for i in range(len(sigmas) - 1):
        s, s_next = float(sigmas[i]), float(sigmas[i + 1])
        v = velocity(x, torch.full((batch,), s, device=x.device), cond)
        x = x + (s_next - s) * v.to(x.dtype)
    return x
