"""The official rollouts' rounding, behind switches whose defaults keep fp32: SANA's bf16 sigma grid
(`sampler.grid_dtype`) and the DPM state rounded to the run dtype after every step (`sampler.state_dtype`)."""

from __future__ import annotations

import pytest
import torch

from solrl_core.config.presets import resolve_config
from solrl_core.config.schema import SamplerConfig
from solrl_core.engine.sampler import Sampler, sample
from solrl_core.errors import SolrlError
from solrl_core.models.base import Conditioning

COND = Conditioning(embeds=torch.zeros(2, 3, 8), mask=torch.ones(2, 3), pooled=torch.zeros(2, 8))


def test_the_bf16_grid_is_the_official_sana_grid():
    # pipeline_with_logprob.py:385 with bf16 latents
    official = torch.linspace(1.0, 0.0, 11, dtype=torch.bfloat16).float()
    got = Sampler.of(SamplerConfig(grid_dtype="bf16")).sigmas(10)
    assert torch.equal(got, official) and got[1].item() == 0.8984375 and got[9].item() == 0.10009765625
    assert Sampler.of(SamplerConfig()).sigmas(10)[1].item() == pytest.approx(0.9, abs=1e-7)  # the default: fp32


def _velocity(x: torch.Tensor, s: torch.Tensor, c: Conditioning) -> torch.Tensor:
    return (0.731 * x + 0.1 * s[:, None, None, None]).to(x.dtype)


def test_the_official_dpm_state_is_rounded_to_the_run_dtype_after_every_step():
    sigmas = Sampler.of(SamplerConfig(solver="dpm2", sigma_grid="scheduler", shift=3.0)).sigmas(8)
    noise = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    bf16 = noise.to(torch.bfloat16)
    kept = sample(_velocity, bf16, COND, sigmas, "dpm2")
    rounded = sample(_velocity, bf16, COND, sigmas, "dpm2", round_state=True)
    assert not torch.equal(kept, rounded)  # fp32 state between steps vs bf16
    # The rounding is exactly "to the run dtype after each step": redo it by hand, step by step.
    x, prev = bf16.float(), None
    for i in range(len(sigmas) - 1):
        s, t = float(sigmas[i]), float(sigmas[i + 1])
        x0 = x - s * _velocity(x.to(torch.bfloat16), torch.full((2,), s), COND).float()
        if t <= 0.0:
            x = x0
        else:
            d = x0 if prev is None else x0 + (0.5 * (_lam(t) - _lam(s)) / (_lam(s) - prev[1])) * (x0 - prev[0])
            x = (t / s) * x + (1.0 - t / s) * d
            x = x.to(torch.bfloat16).float()
        prev = (x0, _lam(s))
    assert torch.equal(rounded, x.to(torch.bfloat16))
    assert torch.equal(sample(_velocity, noise, COND, sigmas, "dpm2"),  # an fp32 run: nothing to round
                       sample(_velocity, noise, COND, sigmas, "dpm2", round_state=True))


def _lam(sigma: float) -> float:
    import math

    return -math.inf if sigma >= 1.0 else math.log((1.0 - sigma) / sigma)


def test_the_sampler_takes_both_switches_from_the_config():
    cfg = resolve_config("tiny", "sol_rl",
                         sets=["sampler.grid_dtype=bf16", "sampler.state_dtype=run", "algorithm.loss_dtype=bf16"])
    sampler = Sampler.of(cfg.sampler)
    assert (sampler.grid_dtype, sampler.state_dtype, cfg.algorithm.loss_dtype) == ("bf16", "run", "bf16")
    with pytest.raises(SolrlError) as err:
        resolve_config("tiny", "sol_rl", sets=["sampler.grid_dtype=fp16"])
    assert "sampler.grid_dtype" in err.value.message


def test_the_official_loss_inputs_are_rounded_to_bf16():
    from solrl_core.loop.update import loss_inputs

    gen = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(3, 4, 2, 2, generator=gen), torch.randn(3, 4, 2, 2, generator=gen)
    sigma = torch.tensor([0.9, 0.6013, 0.1])
    s32, xt32 = loss_inputs(x0, sigma, eps)
    assert torch.equal(s32,
                       sigma) and torch.equal(xt32, (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * eps)
    s16, xt16 = loss_inputs(x0, sigma, eps, "bf16")
    assert s16.tolist() == [0.8984375, 0.6015625, 0.10009765625]
    b = s16.view(-1, 1, 1, 1)
    assert torch.equal(xt16, ((1 - b) * x0 + b * eps.to(torch.bfloat16).float()).to(torch.bfloat16).float())
    assert not torch.equal(xt16, xt32)


def test_integer_timesteps_reach_the_model_in_rollouts_only_as_whole_numbers():
    seen: list[torch.Tensor] = []

    class Model:
        def velocity(self, network, x, sigma, cond):  # type: ignore[no-untyped-def]
            seen.append(sigma.float() * 1000.0)  # as the SANA / SD3 wrappers turn a sigma into a timestep
            return torch.zeros_like(x)

    sampler = Sampler.of(SamplerConfig(solver="dpm2", sigma_grid="scheduler", shift=3.0, integer_timesteps=True))
    noise = torch.randn(2, 4, 3, 3)
    sample(sampler.model_call(Model(), torch.nn.Identity()), noise, COND, sampler.sigmas(10), "dpm2")
    got = torch.stack([t[0] for t in seen]).double()
    want = torch.floor(sampler.sigmas(10)[:-1].double() * 1000)
    assert want[:3].tolist() == [1000.0, 960.0, 913.0]  # the official SD3 rollout's timesteps
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    seen.clear()
    plain = Sampler.of(SamplerConfig(solver="dpm2", sigma_grid="scheduler", shift=3.0))
    sample(plain.model_call(Model(), torch.nn.Identity()), noise, COND, plain.sigmas(10), "dpm2")
    assert seen[1][0].item() == pytest.approx(960.129, abs=1e-3)  # the default: the grid's own timesteps


def test_the_euler_step_is_fp32_from_the_bf16_state_rounded_once_as_the_official():
    """The official run_sampling hands flow_grpo_step pred.float() and z.float() (deterministic: z + dt * pred
    in fp32), then z.to(bf16): one rounding a step. sampler.euler_step=run rounds the product and the sum."""
    sigmas = Sampler.of(SamplerConfig(grid_dtype="bf16")).sigmas(10)
    noise = torch.randn(2, 4, 3, 3, generator=torch.Generator().manual_seed(0))
    bf16 = noise.to(torch.bfloat16)
    official, twice = bf16, bf16
    for i in range(len(sigmas) - 1):
        dt = float(sigmas[i + 1]) - float(sigmas[i])
        pred = _velocity(official, torch.full((2,), float(sigmas[i])), COND)
        official = (official.float() + dt * pred.float()).to(torch.bfloat16)
        twice = twice + dt * _velocity(twice, torch.full((2,), float(sigmas[i])), COND)
    got, run = sample(_velocity, bf16, COND, sigmas), sample(_velocity, bf16, COND, sigmas, euler_step="run")
    assert torch.equal(got, official) and torch.equal(run, twice)
    assert (got.float() - run.float()).abs().max().item() > 0  # bf16: the two roundings part
    assert torch.equal(sample(_velocity, noise, COND, sigmas), sample(_velocity, noise, COND, sigmas, euler_step="run"))
    assert Sampler.of(resolve_config("tiny", "sol_rl", sets=["sampler.euler_step=run"]).sampler).euler_step == "run"
    assert Sampler.of(SamplerConfig()).euler_step == "fp32"
    with pytest.raises(SolrlError) as err:
        resolve_config("tiny", "sol_rl", sets=["sampler.euler_step=bf16"])
    assert "sampler.euler_step" in err.value.message
