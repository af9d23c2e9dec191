"""The DiffusionNFT objective and the group-relative advantages it consumes.

No log-probabilities and no PPO ratio: the policy's velocity v is mixed with the old policy's
v_old into an implicit positive policy (pushed toward high-advantage samples' clean latents) and
an implicit negative one (pushed toward low-advantage ones), as in DiffusionNFT and Sol-RL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, clip: float) -> torch.Tensor:
    """A = (r - mean over the samples of its key in `groups`) / (std over every reward of the iteration + 1e-4),
    clipped. The trainer's keys are prompt texts (`stages.advantages`), so equal prompts share one mean."""
    rewards = rewards.float()
    means = torch.zeros_like(rewards)
    for g in groups.unique():
        members = groups == g
        means[members] = rewards[members].mean()
    std = rewards.std(unbiased=False) if rewards.numel() > 1 else torch.tensor(0.0)
    return ((rewards - means) / (std + 1e-4)).clamp(-clip, clip)


def combined_advantages(total: torch.Tensor, components: dict[str, torch.Tensor], weights: dict[str, float],
                        groups: torch.Tensor, aggregation: str, clip: float) -> torch.Tensor:
    """Advantages of several rewards. 'sum': of the weighted sum of raw scores. 'advantage': each
    reward's own group advantage (so a reward on a large scale cannot drown the others), weighted
    and summed, then clipped. With one reward of weight 1 both are the same."""
    if aggregation == "sum":
        return group_advantages(total, groups, clip)
    if aggregation != "advantage":
        raise ValueError(f"unknown aggregation {aggregation!r}")
    combined = sum(w * group_advantages(components[n], groups, math.inf) for n, w in weights.items())
    return torch.as_tensor(combined).clamp(-clip, clip)


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor  # scalar, differentiable
    policy: torch.Tensor  # the NFT part, detached
    kl: torch.Tensor  # mean((v - v_ref)^2), detached
    nonfinite: int  # samples whose loss was not finite (zeroed)


def nft_loss(v: torch.Tensor, v_old: torch.Tensor, v_ref: torch.Tensor | None, xt: torch.Tensor, x0: torch.Tensor,
             sigma: torch.Tensor, advantages: torch.Tensor, *, nft_beta: float, kl_beta: float,
             adv_clip_max: float) -> LossTerms:
    """DiffusionNFT loss for a batch at one timestep per sample (sigma is [B]).

    r      = clamp((clip(A) / adv_clip_max) / 2 + 0.5, 0, 1)     optimality probability
    v_pos  = beta * v + (1 - beta) * v_old ; v_neg = (1 + beta) * v_old - beta * v
    L_pos  = mean((x0_pos - x0)^2) / stopgrad(max(mean|x0_pos - x0|, 1e-5))   (likewise L_neg)
    loss   = adv_clip_max * mean((r * L_pos + (1 - r) * L_neg) / beta) + kl_beta * mean((v - v_ref)^2)

    v_ref may be None when kl_beta is 0 (the reference forward is skipped); the KL is then NaN.
    """
    dims = tuple(range(1, v.dim()))
    s = sigma.view(-1, *([1] * (v.dim() - 1))).to(v.dtype)
    r = ((advantages.clamp(-adv_clip_max, adv_clip_max) / adv_clip_max) / 2 + 0.5).clamp(0, 1).to(v.dtype)
    v_pos = nft_beta * v + (1 - nft_beta) * v_old
    v_neg = (1 + nft_beta) * v_old - nft_beta * v

    def weighted_error(v_mix: torch.Tensor) -> torch.Tensor:
        err = (xt - s * v_mix) - x0
        scale = err.detach().abs().mean(dim=dims).clamp(min=1e-5)
        return (err ** 2).mean(dim=dims) / scale

    per_sample = (r * weighted_error(v_pos) + (1 - r) * weighted_error(v_neg)) / nft_beta
    finite = torch.isfinite(per_sample)
    per_sample = torch.where(finite, per_sample, torch.zeros_like(per_sample))
    policy = adv_clip_max * per_sample.mean()
    if v_ref is None:  # kl_beta = 0: the reference was not run, so the KL is not measured (NaN, shown as such)
        if kl_beta != 0:
            raise ValueError("v_ref is needed when kl_beta != 0")
        return LossTerms(loss=policy, policy=policy.detach(), kl=torch.tensor(float("nan")),
                         nonfinite=int((~finite).sum()))
    kl = ((v - v_ref) ** 2).mean()
    return LossTerms(loss=policy + kl_beta * kl, policy=policy.detach(), kl=kl.detach(),
                     nonfinite=int((~finite).sum()))
