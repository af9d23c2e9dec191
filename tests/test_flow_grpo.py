"""Flow-GRPO's SDE step (engine/sde.py), loss and advantages (loop/grpo.py) against plain transcriptions of
the reference functions on the same inputs, values and gradients; each agreement shown to break when the
solrl function is perturbed (its own source, one edit at a time); the eta-0 step equal to solrl's Euler
step; the step noise a function of (seed, step) alone; the advantages equal to solrl's own.

The transcriptions below are copied from yifan123/flow_grpo, read at 879042cf5707f8b90daa98d147d7deac2317c5da
(FG) and flow_grpo/diffusers_patch/solver.py at 54809b5fcf4d3930d2a17fa553928704bd0b719e (FGs). They keep the
reference's arithmetic and operation order; where the reference reads a diffusers scheduler or draws its own
noise, they take the sigma grid, the step indices and the noise as arguments.
"""

from __future__ import annotations

import inspect
import math
import sys
import types
from typing import Sequence

import pytest
import torch

from solrl_core.data.prompts import text_keys
from solrl_core.engine import sde as sde_module
from solrl_core.engine.sampler import noise_for_seeds, sample, sigma_grid
from solrl_core.engine.sde import sde_noise, sde_step
from solrl_core.loop import grpo as grpo_module
from solrl_core.loop.grpo import grpo_loss, prompt_advantages
from solrl_core.loop.nft import combined_advantages, group_advantages


# ------------------------------------------------------------------------------------------------------------
# The reference, transcribed
# ------------------------------------------------------------------------------------------------------------

def ref_sde_step_with_logprob(model_output, sample, sigmas, step_index, noise_level=0.7, prev_sample=None,
                              variance_noise=None, sde_type="sde"):
    """FG flow_grpo/diffusers_patch/sd3_sde_with_logprob.py:11-93 `sde_step_with_logprob`: `sigmas` (the
    scheduler's grid) and `step_index` (int or LongTensor [B]) replace self + timestep (:42-46);
    `variance_noise` replaces randn_tensor(..., generator) (:56-61, :77-82)."""
    model_output = model_output.float()
    sample = sample.float()
    if prev_sample is not None:
        prev_sample = prev_sample.float()

    sigmas = sigmas.to(sample.device)
    if isinstance(step_index, int):
        step_index = torch.full((sample.shape[0],), step_index, dtype=torch.long, device=sample.device)
    step_index = torch.as_tensor(step_index, dtype=torch.long, device=sample.device).reshape(-1)
    view = (-1, *([1] * (len(sample.shape) - 1)))
    sigma = sigmas[step_index].view(*view)
    sigma_prev = sigmas[step_index + 1].view(*view)
    sigma_max = sigmas[1].item()
    dt = sigma_prev - sigma

    if sde_type == "sde":
        std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * noise_level
        prev_sample_mean = (sample * (1 + std_dev_t**2 / (2 * sigma) * dt)
                            + model_output * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt)
        if prev_sample is None:
            prev_sample = prev_sample_mean + std_dev_t * torch.sqrt(-1 * dt) * variance_noise.to(model_output.dtype)
        log_prob = (
            -((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))
            - torch.log(std_dev_t * torch.sqrt(-1 * dt))
            - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
        )
    elif sde_type == "cps":
        std_dev_t = sigma_prev * math.sin(noise_level * math.pi / 2)
        pred_original_sample = sample - sigma * model_output
        noise_estimate = sample + model_output * (1 - sigma)
        prev_sample_mean = (pred_original_sample * (1 - sigma_prev)
                            + noise_estimate * torch.sqrt(sigma_prev**2 - std_dev_t**2))
        if prev_sample is None:
            prev_sample = prev_sample_mean + std_dev_t * variance_noise.to(model_output.dtype)
        log_prob = -((prev_sample.detach() - prev_sample_mean) ** 2)
    else:
        raise ValueError(f"unknown sde_type {sde_type!r}")

    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    return prev_sample, log_prob, prev_sample_mean, std_dev_t


def ref_flow_grpo_step(model_output, latents, eta, sigmas, index, prev_sample=None, variance_noise=None):
    """FGs flow_grpo/diffusers_patch/solver.py:78-121 `flow_grpo_step`, the grid form NVlabs/Sana's rollouts
    call through run_sampling (:14-75, with pred.float() and z.float()); `variance_noise` replaces
    randn_tensor(..., generator) (:108-110). Returns (prev_sample, x - sigma v, log_prob) (:121)."""
    device = model_output.device
    sigma = sigmas[index].to(device)
    sigma_prev = sigmas[index + 1].to(device)
    sigma_max = sigmas[1].item()
    dt = sigma_prev - sigma
    pred_original_sample = latents - sigma * model_output
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * eta
    prev_sample_mean = (
        latents * (1 + std_dev_t**2 / (2 * sigma) * dt)
        + model_output * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    )
    if prev_sample is None:
        prev_sample = prev_sample_mean + std_dev_t * torch.sqrt(-1 * dt) * variance_noise
    log_prob = (
        -((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))
        - torch.log(std_dev_t * torch.sqrt(-1 * dt))
        - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
    )
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    return prev_sample, pred_original_sample, log_prob


def ref_per_prompt_advantages(prompts: Sequence[str], rewards: torch.Tensor, global_std: bool = True):
    """FG flow_grpo/stat_tracking.py:11-31 `PerPromptStatTracker.update` (type 'grpo'), numpy float64 there,
    float64 torch here: (r - mean of the prompt's rewards) / (population std of all rewards (global_std,
    :26-27) or of the prompt's (:28-29) + 1e-4)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    adv = torch.zeros_like(r)
    keys = list(prompts)
    for p in sorted(set(keys)):
        idx = torch.tensor([i for i, k in enumerate(keys) if k == p])
        mean = r[idx].mean()
        std = (r.std(unbiased=False) if global_std else r[idx].std(unbiased=False)) + 1e-4
        adv[idx] = (r[idx] - mean) / std
    return adv


def ref_flow_grpo_loss(log_prob, old_log_prob, advantages, clip_range=1e-4, adv_clip_max=5.0, beta=0.0,
                       prev_sample_mean=None, prev_sample_mean_ref=None, std_dev_t=None) -> dict:
    """FG scripts/train_sd3.py:886-930, one train timestep j of one micro-batch (the KL's mean over
    dims (1, 2, 3) written as every dim but the batch one)."""
    adv = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    out = {"policy_loss": policy_loss}
    if beta > 0:
        dims = tuple(range(1, prev_sample_mean.ndim))
        kl_loss = ((prev_sample_mean - prev_sample_mean_ref) ** 2).mean(dim=dims, keepdim=True) / (2 * std_dev_t**2)
        kl_loss = torch.mean(kl_loss)
        out["kl_loss"] = kl_loss
        out["loss"] = policy_loss + beta * kl_loss
    else:
        out["loss"] = policy_loss
    out["approx_kl"] = 0.5 * torch.mean((log_prob - old_log_prob) ** 2).detach()
    out["clipfrac"] = torch.mean((torch.abs(ratio - 1.0) > clip_range).float()).detach()
    out["clipfrac_gt_one"] = torch.mean((ratio - 1.0 > clip_range).float()).detach()  # :917-923
    out["clipfrac_lt_one"] = torch.mean((1.0 - ratio > clip_range).float()).detach()  # :924-930
    return out


# ------------------------------------------------------------------------------------------------------------
# How agreement is measured, and the perturbed solrl functions
# ------------------------------------------------------------------------------------------------------------

def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=1e-6, atol=0, equal_nan=True)


def _mutant(module: types.ModuleType, old: str, new: str) -> types.ModuleType:
    """`module` rebuilt from its own source with `old` (found exactly once) replaced by `new`."""
    source = inspect.getsource(module)
    assert source.count(old) == 1, f"{old!r} is not once in {module.__name__}"
    mutated = types.ModuleType(module.__name__ + "_perturbed")
    sys.modules[mutated.__name__] = mutated  # dataclasses reads a class's module there
    try:
        exec(compile(source.replace(old, new), module.__file__, "exec"), mutated.__dict__)
    finally:
        del sys.modules[mutated.__name__]
    return mutated


SIGMAS = sigma_grid(10)  # SANA's grid: linspace(1, 0, 11)
SD3_SIGMAS = sigma_grid(10, shift=3.0, kind="scheduler")  # StableDiffusion3Pipeline's, shifted by 3
LAST = len(SIGMAS) - 2

# (name, kind, sigmas, index, shape, dtype, eta, prev given)
STEP_CASES = [
    ("sde at sigma 1, drawn", "sde", SIGMAS, 0, (3, 4, 5, 5), torch.float32, 0.7, False),
    ("sde at sigma 1, given", "sde", SIGMAS, 0, (3, 4, 5, 5), torch.float32, 0.7, True),
    ("sde mid, given", "sde", SIGMAS, 4, (3, 4, 5, 5), torch.float32, 0.9, True),
    ("sde mid, drawn, bf16", "sde", SIGMAS, 4, (3, 4, 5, 5), torch.bfloat16, 0.7, False),
    ("sde last step, drawn", "sde", SIGMAS, LAST, (3, 4, 5, 5), torch.float32, 0.7, False),
    ("sde last step, given", "sde", SIGMAS, LAST, (3, 4, 5, 5), torch.float32, 0.7, True),
    ("sde per-sample steps, sd3 grid", "sde", SD3_SIGMAS, [0, 3, 9, 5], (4, 4, 5, 5), torch.float32, 0.7, True),
    ("sde packed latents", "sde", SD3_SIGMAS, 2, (2, 16, 8), torch.float32, 0.7, False),
    ("cps at sigma 1, drawn", "cps", SIGMAS, 0, (3, 4, 5, 5), torch.float32, 0.8, False),
    ("cps mid, given", "cps", SIGMAS, 5, (3, 4, 5, 5), torch.float32, 0.8, True),
    ("cps last step, given", "cps", SIGMAS, LAST, (3, 4, 5, 5), torch.float32, 0.8, True),
    ("cps per-sample steps, sd3 grid", "cps", SD3_SIGMAS, [1, 8, 0, 9], (4, 4, 5, 5), torch.float32, 0.8, False),
]


def _step_inputs(case, seed: int = 0):
    _, _, sigmas, index, shape, dtype, _, given = case
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    noise = torch.randn(shape, generator=gen)
    prev = (x.float() + 0.3 * torch.randn(shape, generator=gen)).to(dtype) if given else None
    weights = torch.randn(shape[0], generator=gen), torch.randn(shape, generator=gen)
    return x, v, noise, prev, weights


def _step_disagreement(step_fn, case) -> list[str]:
    """What differs between `step_fn` (sde_step's signature) and the reference on `case`: values of the four
    outputs, and the gradients in x and v of a weighted sum of the log-probabilities and of the mean."""
    _, kind, sigmas, index, _, _, eta, _ = case
    x, v, noise, prev, (w_lp, w_mean) = _step_inputs(case)
    results = []
    for call in ("solrl", "reference"):
        xg, vg = x.clone().requires_grad_(True), v.clone().requires_grad_(True)
        if call == "solrl":
            out = step_fn(xg, vg, sigmas, torch.tensor(index), eta, kind=kind, noise=noise, prev=prev)
            values = (out.prev_sample, out.log_prob, out.mean, out.std_dev_t)
        else:
            values = ref_sde_step_with_logprob(vg, xg, sigmas, index, eta, prev, noise, kind)
        ((values[1] * w_lp).sum() + (values[2] * w_mean).sum()).backward()
        results.append([t.detach() for t in values] + [xg.grad, vg.grad])
    names = ("prev_sample", "log_prob", "mean", "std_dev_t", "grad x", "grad v")
    return [n for n, a, b in zip(names, *results) if not _close(a, b)]


# ------------------------------------------------------------------------------------------------------------
# The SDE step
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_sde_step_agrees_with_the_reference(case):
    assert _step_disagreement(sde_step, case) == []
    x, v, noise, prev, _ = _step_inputs(case)
    out = sde_step(x, v, case[2], case[3], case[6], kind=case[1], noise=noise, prev=prev)
    assert out.prev_sample.dtype == out.log_prob.dtype == out.mean.dtype == torch.float32  # fp32, as :36-40
    assert torch.isfinite(out.log_prob).all() and out.log_prob.shape == (x.shape[0],)


STEP_PERTURBATIONS = {
    "sqrt(-dt) dropped from the variance": ("(2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))",
                                            "(2 * ((std_dev_t * (-1 * dt)) ** 2))"),
    "sqrt(-dt) dropped from the noise": ("mean + std_dev_t * torch.sqrt(-1 * dt) * noise.float()",
                                         "mean + std_dev_t * noise.float()"),
    "log-prob summed, not averaged": ("log_prob = log_prob.mean(dim=", "log_prob = log_prob.sum(dim="),
    "log-normaliser dropped": ("- torch.log(std_dev_t * torch.sqrt(-1 * dt))", "- 0"),
    "sigma = 1 guard on sigmas[0]": ("sigma_max = sigmas[1].item()", "sigma_max = sigmas[2].item()"),
    "score correction without the 2": ("x * (1 + std_dev_t**2 / (2 * sigma) * dt)",
                                       "x * (1 + std_dev_t**2 / sigma * dt)"),
    "next state not detached": ("log_prob = (-((prev.detach() - mean) ** 2)", "log_prob = (-((prev - mean) ** 2)"),
    "cps noise level by cos": ("sigma_next * math.sin(eta * math.pi / 2)", "sigma_next * math.cos(eta * math.pi / 2)"),
    "cps x1 coefficient sigma_next": ("x1 * torch.sqrt(sigma_next**2 - std_dev_t**2)", "x1 * sigma_next"),
    "cps log-prob halved": ("log_prob = -((prev.detach() - mean) ** 2)  # :86",
                            "log_prob = -((prev.detach() - mean) ** 2) / 2"),
}


@pytest.mark.parametrize("perturbation", list(STEP_PERTURBATIONS))
def test_a_perturbed_sde_step_disagrees_with_the_reference(perturbation):
    perturbed = _mutant(sde_module, *STEP_PERTURBATIONS[perturbation]).sde_step
    broken = {case[0]: found for case in STEP_CASES if (found := _step_disagreement(perturbed, case))}
    assert broken, f"{perturbation}: every case still agrees"


def test_the_grid_form_of_the_reference_is_the_same_step():
    """solver.py's flow_grpo_step (the rollouts Sol-RL's official code runs) gives the same next state and
    log-probability as sde_step at one sigma for the batch, drawn and given."""
    gen = torch.Generator().manual_seed(1)
    x, v, noise = (torch.randn(3, 4, 5, 5, generator=gen) for _ in range(3))
    for index in (0, 4, LAST):
        ref_prev, ref_x0, ref_lp = ref_flow_grpo_step(v, x, 0.7, SIGMAS, index, variance_noise=noise)
        out = sde_step(x, v, SIGMAS, index, 0.7, noise=noise)
        assert _close(out.prev_sample, ref_prev) and _close(out.log_prob, ref_lp)
        given = ref_flow_grpo_step(v, x, 0.7, SIGMAS, index, prev_sample=ref_prev + 0.1)[2]
        assert _close(sde_step(x, v, SIGMAS, index, 0.7, prev=ref_prev + 0.1).log_prob, given)


def _velocity(x: torch.Tensor, s: torch.Tensor, cond) -> torch.Tensor:
    """A smooth stand-in for a network: depends on the state and on sigma, in the state's dtype."""
    return (torch.tanh(1.3 * x.float()) - 0.7 * s.view(-1, *([1] * (x.dim() - 1))) * x.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grid", ["linspace", "scheduler"])
def test_at_eta_zero_the_sde_mean_is_solrls_fp32_euler_step(dtype, grid):
    sigmas = sigma_grid(8, shift=3.0 if grid == "scheduler" else 1.0, kind=grid)
    noise = noise_for_seeds([5, 6, 7], (4, 6, 6), torch.device("cpu"), dtype)
    euler = sample(_velocity, noise, None, sigmas, solver="euler", euler_step="fp32")
    x, cps = noise, noise
    for i in range(len(sigmas) - 1):
        s = torch.full((x.shape[0],), float(sigmas[i]))
        step = sde_step(x, _velocity(x, s, None), sigmas, i, 0.0, seeds=[5, 6, 7])
        assert torch.equal(step.prev_sample, step.mean)  # no noise at eta 0
        x = step.mean.to(dtype)  # the state rounded once, as euler_step="fp32" rounds it
        cps = sde_step(cps, _velocity(cps, s, None), sigmas, i, 0.0, kind="cps", seeds=[5, 6, 7]).mean.to(dtype)
    assert torch.equal(x, euler)  # bit for bit
    torch.testing.assert_close(cps.float(), euler.float(), rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_the_step_noise_depends_on_the_seed_and_step_alone():
    shape = (4, 6, 6)
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))
    v = torch.randn(3, *shape, generator=torch.Generator().manual_seed(3))
    together = sde_step(x, v, SIGMAS, [1, 4, 6], 0.7, seeds=[11, 22, 33])
    alone = sde_step(x[1:2], v[1:2], SIGMAS, 4, 0.7, seeds=[22])
    assert torch.equal(together.prev_sample[1:2], alone.prev_sample)  # whatever else is in the batch
    reordered = sde_step(x.flip(0), v.flip(0), SIGMAS, [6, 4, 1], 0.7, seeds=[33, 22, 11])
    assert torch.equal(reordered.prev_sample.flip(0), together.prev_sample)
    draw = sde_noise([22, 22, 23], [4, 5, 4], shape)
    assert torch.equal(draw[0], sde_noise(torch.tensor([22]), torch.tensor([4]), shape)[0])
    assert not torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])
    assert not torch.equal(draw[0], noise_for_seeds([22], shape, torch.device("cpu"))[0])  # not the initial noise
    assert abs(float(draw.mean())) < 0.2 and abs(float(draw.std()) - 1) < 0.1
    with pytest.raises(ValueError, match="seeds"):
        sde_step(x, v, SIGMAS, 1, 0.7)
    with pytest.raises(ValueError, match="unknown SDE kind"):
        sde_step(x, v, SIGMAS, 1, 0.7, kind="ode", seeds=[1, 2, 3])


# ------------------------------------------------------------------------------------------------------------
# The loss
# ------------------------------------------------------------------------------------------------------------

def _loss_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    batch = 16
    old = -torch.rand(batch, generator=gen) * 3
    spread = torch.where(torch.arange(batch) % 2 == 0, 1e-6, 1e-3)  # ratios inside and outside 1 +- clip_range
    log_prob = old + spread * torch.randn(batch, generator=gen)
    advantages = 4 * torch.randn(batch, generator=gen)  # some beyond adv_clip_max
    mean = torch.randn(batch, 4, 5, 5, generator=gen)
    ref_mean = mean + 0.05 * torch.randn(batch, 4, 5, 5, generator=gen)
    std_dev_t = (0.2 + torch.rand(batch, generator=gen)).view(-1, 1, 1, 1)
    return log_prob, old, advantages, mean, ref_mean, std_dev_t


LOSS_CASES = [(0.0, 1e-4, 5.0), (0.04, 1e-4, 5.0), (0.01, 1e-5, 2.0)]  # (beta, clip_range, adv_clip_max)


def _loss_disagreement(loss_fn, case) -> list[str]:
    beta, clip_range, adv_clip_max = case
    log_prob, old, advantages, mean, ref_mean, std_dev_t = _loss_inputs()
    found = []
    outs, grads = [], []
    for call in ("solrl", "reference"):
        lp, mu = log_prob.clone().requires_grad_(True), mean.clone().requires_grad_(True)
        if call == "solrl":
            t = loss_fn(lp, old, advantages, clip_range=clip_range, adv_clip_max=adv_clip_max, beta=beta, mean=mu,
                        ref_mean=ref_mean, std_dev_t=std_dev_t)
            out = {"loss": t.loss, "policy_loss": t.policy, "kl_loss": t.kl, "approx_kl": t.approx_kl,
                   "clipfrac": t.clipfrac, "clipfrac_gt_one": t.clipfrac_gt_one, "clipfrac_lt_one": t.clipfrac_lt_one}
        else:
            out = ref_flow_grpo_loss(lp, old, advantages, clip_range, adv_clip_max, beta, mu, ref_mean, std_dev_t)
            if beta == 0:  # the reference does not compute it then; solrl measures it: compare with beta > 0's
                out["kl_loss"] = ref_flow_grpo_loss(lp, old, advantages, clip_range, adv_clip_max, 1.0, mu, ref_mean,
                                                    std_dev_t)["kl_loss"]
        out["loss"].backward()
        outs.append({k: v.detach() for k, v in out.items()})
        grads.append((lp.grad, torch.zeros_like(mean) if mu.grad is None else mu.grad))
    found += [k for k in outs[1] if not _close(outs[0][k], outs[1][k])]
    found += [n for n, a, b in zip(("grad log_prob", "grad mean"), *grads) if not _close(a, b)]
    return found


@pytest.mark.parametrize("case", LOSS_CASES, ids=[f"beta {c[0]}, clip {c[1]}, adv max {c[2]}" for c in LOSS_CASES])
def test_grpo_loss_agrees_with_the_reference(case):
    assert _loss_disagreement(grpo_loss, case) == []
    t = grpo_loss(*_loss_inputs()[:3], clip_range=case[1], adv_clip_max=case[2])
    assert 0 < float(t.clipfrac) < 1  # the inputs exercise both sides of the clip
    assert float(t.clipfrac) == float(t.clipfrac_gt_one) + float(t.clipfrac_lt_one)


LOSS_PERTURBATIONS = {
    "KL without the 2 std^2": ("/ (2 * std_dev_t**2))", ")"),
    "KL by std^2 alone": ("/ (2 * std_dev_t**2))", "/ std_dev_t**2)"),
    "KL summed over elements": ("** 2).mean(dim=dims, keepdim=True)", "** 2).sum(dim=dims, keepdim=True)"),
    "advantages not clipped": ("advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)", "pass"),
    "min of the surrogates": ("torch.maximum(unclipped, clipped)", "torch.minimum(unclipped, clipped)"),
    "ratio inverted": ("torch.exp(log_prob - old_log_prob)", "torch.exp(old_log_prob - log_prob)"),
    "clip range doubled above": ("1.0 + clip_range)  # :893", "1.0 + 2 * clip_range)  # :893"),
    "approx_kl without the half": ("approx_kl = 0.5 * torch.mean", "approx_kl = torch.mean"),
    "clipfrac one-sided": ("torch.mean((torch.abs(ratio - 1.0) > clip_range)",
                           "torch.mean(((ratio - 1.0) > clip_range)"),
}


@pytest.mark.parametrize("perturbation", list(LOSS_PERTURBATIONS))
def test_a_perturbed_grpo_loss_disagrees_with_the_reference(perturbation):
    perturbed = _mutant(grpo_module, *LOSS_PERTURBATIONS[perturbation]).grpo_loss
    assert any(_loss_disagreement(perturbed, case) for case in LOSS_CASES), f"{perturbation}: every case agrees"


def test_the_sde_step_and_the_loss_together_give_the_references_gradient():
    """The update's chain: the log-probability of a stored step recomputed from v, the surrogate and the KL
    against the base's mean, differentiated in v, as the reference computes it (train_sd3.py:880-904)."""
    gen = torch.Generator().manual_seed(4)
    x, v, v_ref, noise = (torch.randn(4, 4, 5, 5, generator=gen) for _ in range(4))
    index, advantages = torch.tensor([0, 2, 5, 8]), torch.randn(4, generator=gen)
    rollout = ref_sde_step_with_logprob(v + 1e-3 * torch.randn(4, 4, 5, 5, generator=gen), x, SIGMAS, index,
                                        variance_noise=noise)
    grads, losses = [], []
    for call in ("solrl", "reference"):
        vg = v.clone().requires_grad_(True)
        if call == "solrl":
            step = sde_step(x, vg, SIGMAS, index, 0.7, prev=rollout[0])
            ref_mean = sde_step(x, v_ref, SIGMAS, index, 0.7, prev=rollout[0]).mean
            loss = grpo_loss(step.log_prob, rollout[1], advantages, clip_range=1e-4, adv_clip_max=5.0, beta=0.01,
                             mean=step.mean, ref_mean=ref_mean, std_dev_t=step.std_dev_t).loss
        else:
            _, lp, mean, std = ref_sde_step_with_logprob(vg, x, SIGMAS, index, prev_sample=rollout[0])
            ref_mean = ref_sde_step_with_logprob(v_ref, x, SIGMAS, index, prev_sample=rollout[0])[2]
            loss = ref_flow_grpo_loss(lp, rollout[1], advantages, 1e-4, 5.0, 0.01, mean, ref_mean, std)["loss"]
        loss.backward()
        grads.append(vg.grad)
        losses.append(loss.detach())
    assert _close(*losses) and _close(*grads) and float(grads[0].abs().sum()) > 0


def test_the_kl_needs_the_means_when_it_is_weighted():
    log_prob, old, advantages, *_ = _loss_inputs()
    with pytest.raises(ValueError, match="KL"):
        grpo_loss(log_prob, old, advantages, clip_range=1e-4, adv_clip_max=5.0, beta=0.01)
    unweighted = grpo_loss(log_prob, old, advantages, clip_range=1e-4, adv_clip_max=5.0)
    assert torch.isnan(unweighted.kl) and torch.equal(unweighted.loss, unweighted.policy)


# ------------------------------------------------------------------------------------------------------------
# The advantages
# ------------------------------------------------------------------------------------------------------------

def _epoch():
    """Rewards of one epoch: 5 prompt groups of 6, two of them drawn from the same text."""
    prompts = [p for p in ("a cat", "a dog", "a cat", "two birds", "a red cube") for _ in range(6)]
    rewards = torch.randn(len(prompts), generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 0.3 + 1.0
    return prompts, rewards


@pytest.mark.parametrize("global_std", [True, False])
def test_prompt_advantages_agree_with_the_reference(global_std):
    prompts, rewards = _epoch()
    ours = prompt_advantages(prompts, rewards, global_std)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, ref_per_prompt_advantages(prompts, rewards, global_std), rtol=1e-12, atol=1e-12)


ADVANTAGE_PERTURBATIONS = {
    "sample std": (".std(unbiased=False) + 1e-4", ".std() + 1e-4"),
    "epsilon 1e-8": (".std(unbiased=False) + 1e-4", ".std(unbiased=False) + 1e-8"),
    "global and own std swapped": ("(rewards if global_std else rewards[members])",
                                   "(rewards[members] if global_std else rewards)"),
    "one mean for all": ("mean = rewards[members].mean()", "mean = rewards.mean()"),
}


@pytest.mark.parametrize("perturbation", list(ADVANTAGE_PERTURBATIONS))
def test_perturbed_prompt_advantages_disagree_with_the_reference(perturbation):
    perturbed = _mutant(grpo_module, *ADVANTAGE_PERTURBATIONS[perturbation]).prompt_advantages
    prompts, rewards = _epoch()
    assert any(not torch.allclose(perturbed(prompts, rewards, g), ref_per_prompt_advantages(prompts, rewards, g),
                                  rtol=1e-12, atol=1e-12) for g in (True, False))


@pytest.mark.parametrize("clip", [5.0, 1.0, math.inf])
def test_solrls_advantages_are_flow_grpos_clipped(clip):
    """stages.advantages -> nft.combined_advantages -> group_advantages, keyed by text (prompts.text_keys), equals
    Flow-GRPO's tracker with global std followed by the loss's clamp to adv_clip_max, to fp32 rounding."""
    prompts, rewards = _epoch()
    keys = torch.tensor(text_keys(prompts), dtype=torch.long)
    theirs = ref_per_prompt_advantages(prompts, rewards).clamp(-clip, clip).float()
    assert bool((theirs.abs() == clip).any()) == (clip == 1.0)  # the clip bites at 1, not at 5
    torch.testing.assert_close(group_advantages(rewards.float(), keys, clip), theirs, rtol=1e-5, atol=1e-5)
    for aggregation in ("sum", "advantage"):
        ours = combined_advantages(rewards.float(), {"r": rewards.float()}, {"r": 1.0}, keys, aggregation, clip)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
