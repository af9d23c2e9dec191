"""The Flow-GRPO objective: a PPO-style clipped ratio of per-step log-probabilities, with its KL to the base.

Read from yifan123/flow_grpo at 879042cf5707f8b90daa98d147d7deac2317c5da. For one trained step j of one
micro-batch, with log_prob the current policy's log-probability of the stored next state
(engine/sde.py's `sde_step(..., prev=...)`, train_sd3.py:181-215, :880) and old_log_prob the one
recorded at rollout (train_sd3.py:684, :891):

    A         = clamp(advantages, -adv_clip_max, adv_clip_max)                              (train_sd3.py:886-890)
    ratio     = exp(log_prob - old_log_prob)                                                (:891)
    policy    = mean(max(-A ratio, -A clamp(ratio, 1 - clip_range, 1 + clip_range)))        (:892-898)
    kl        = mean( mean_over_elements((mean - ref_mean)^2) / (2 std_dev_t^2) )           (:900-901)
    loss      = policy + beta kl  if beta > 0, else policy                                  (:899-904)
    approx_kl = 0.5 mean((log_prob - old_log_prob)^2)                                       (:906-909)
    clipfrac  = mean(|ratio - 1| > clip_range); clipfrac_gt_one, clipfrac_lt_one one-sided  (:910-930)

`mean` is the step's transition mean under the trained adapter and `ref_mean` the same under the base
(adapters disabled, no gradient, :880-883). The KL divides by std_dev_t^2 as the SDE step returns it,
not by the transition's variance (std_dev_t sqrt(-dt))^2. The reference's mean over (1, 2, 3) of SD3's
latents (over (1, 2) of FLUX's packed ones, train_flux.py:857) is here the mean over every dimension but
the batch one. The reference backpropagates each (micro-batch, j) loss and accelerate averages over
gradient_accumulation_steps x num_train_timesteps of them (train_sd3.py:353-361, :938).

The advantages (flow_grpo/stat_tracking.py:11-31, PerPromptStatTracker.update, type 'grpo', used at
train_sd3.py:759-787 with sample.global_std = True): per prompt text,
A = (r - mean of that text's rewards) / (std + 1e-4), std the population std (numpy's, ddof 0) of every
gathered reward (global_std) or of the text's own. The reference tracks rewards already repeated over
the trained steps (:745), equal columns, so one column is the same; its tracker is cleared after each
epoch (:785), so one call sees one epoch's rewards. The clip to adv_clip_max comes later, in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class GrpoTerms:
    """The loss of one trained step and what the reference logs of it (train_sd3.py:906-935)."""

    loss: torch.Tensor  # scalar, differentiable in log_prob (and in mean, for the KL)
    policy: torch.Tensor  # the clipped surrogate, detached
    kl: torch.Tensor  # mean over samples of mean((mean - ref_mean)^2) / (2 std_dev_t^2), detached; NaN without ref_mean
    approx_kl: torch.Tensor  # 0.5 mean((log_prob - old_log_prob)^2), detached
    clipfrac: torch.Tensor  # share of samples with |ratio - 1| > clip_range
    clipfrac_gt_one: torch.Tensor  # share with ratio - 1 > clip_range
    clipfrac_lt_one: torch.Tensor  # share with 1 - ratio > clip_range


def grpo_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, *, clip_range: float,
              adv_clip_max: float, beta: float = 0.0, mean: torch.Tensor | None = None,
              ref_mean: torch.Tensor | None = None, std_dev_t: torch.Tensor | None = None) -> GrpoTerms:
    """Flow-GRPO's loss for a batch at one trained step (log_prob, old_log_prob, advantages all [B]); the
    module docstring has the formulas. `mean`, `ref_mean`, `std_dev_t` (sde.SdeStep's, under the trained
    adapter and under the base) are needed when beta > 0; given with beta = 0 the KL is measured, not added."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)  # train_sd3.py:886-890
    ratio = torch.exp(log_prob - old_log_prob)  # :891
    unclipped = -advantages * ratio  # :892
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)  # :893-897
    policy = torch.mean(torch.maximum(unclipped, clipped))  # :898
    if mean is None or ref_mean is None or std_dev_t is None:
        if beta > 0:
            raise ValueError("the KL (beta > 0) needs mean, ref_mean and std_dev_t")
        kl = torch.tensor(float("nan"))
    else:
        dims = tuple(range(1, mean.ndim))
        kl = torch.mean(((mean - ref_mean) ** 2).mean(dim=dims, keepdim=True) / (2 * std_dev_t**2))  # :900-901
    loss = policy + beta * kl if beta > 0 else policy  # :899-904
    with torch.no_grad():
        approx_kl = 0.5 * torch.mean((log_prob - old_log_prob) ** 2)  # :906-909
        clipfrac = torch.mean((torch.abs(ratio - 1.0) > clip_range).float())  # :910-916
        clipfrac_gt_one = torch.mean((ratio - 1.0 > clip_range).float())  # :917-923
        clipfrac_lt_one = torch.mean((1.0 - ratio > clip_range).float())  # :924-930
    return GrpoTerms(loss=loss, policy=policy.detach(), kl=kl.detach(), approx_kl=approx_kl, clipfrac=clipfrac,
                     clipfrac_gt_one=clipfrac_gt_one, clipfrac_lt_one=clipfrac_lt_one)


def prompt_advantages(prompts: Sequence[str], rewards: torch.Tensor, global_std: bool = True) -> torch.Tensor:
    """Flow-GRPO's advantages of one epoch's rewards [N] (float64, as the reference's numpy arrays), unclipped:
    (r - mean of the prompt's rewards) / (population std of all rewards, or of the prompt's, + 1e-4)
    (stat_tracking.py:11-31). loop/nft.py's group_advantages is the same normalisation (global std) in fp32,
    clipped (tests/test_flow_grpo.py holds them equal)."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)  # :13
    if len(prompts) != rewards.numel():
        raise ValueError(f"{len(prompts)} prompts for {rewards.numel()} rewards")
    out = torch.zeros_like(rewards)  # :15
    for text in sorted(set(prompts)):  # :14, :16, :22
        members = torch.tensor([p == text for p in prompts])
        mean = rewards[members].mean()  # :25
        std = (rewards if global_std else rewards[members]).std(unbiased=False) + 1e-4  # :26-29
        out[members] = (rewards[members] - mean) / std  # :31
    return out
