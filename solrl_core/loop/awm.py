"""The Advantage Weighted Matching (AWM) objective: pretraining's flow-matching loss, each sample
weighted by its advantage (Xue et al., arXiv 2509.25050).

Read from scxue/advantage_weighted_matching at be5137232e33a21b449ed65a533211d0deb97ed8, paths under
advantage_weighted_matching/ (T = scripts/train_sd3_awm.py, C = config/dgx_awm.py, the PickScore config
`pickscore_sd3_no_cfg_1node`, the one that rolls out with the ODE, as solrl does):

    x_t   = (1 - t) x0 + t eps                                       T:1232, T:1268 (loop/update.py builds it)
    mse   = mean over dims of (v - (eps - x0))^2, in float64           T:237-239 ("log-prob" lp = -mse)
    lp_w  = -((mse + 1e-10)^p - (1e-10)^p) t / p                       T:248-249 ('ghuber', C:341-342: p = 0.25)
    A     = clamp(A, -adv_clip_max, adv_clip_max) / adv_clip_max       T:1293-1299 (advantage_max 1, C:336;
                                                                       adv_clip_max 5, config/base_awm.py:91)
    ratio = exp(lp_w - lp_w.detach())                                  T:1282-1284, T:1305-1308 (on-policy,
                                                                       C:69: the old lp is this very forward's)
    policy = mean(-A ratio)                                            T:1316-1327 (the clip, clip_range 1 at C:365,
                                                                       is inert at ratio 1: it is left out)
    kl    = mean((v - v_ref)^2)                                        T:1330-1340 ('Uniform', C:335)
    anchor = mean((v - v_old)^2)                                       T:1341-1349 (v_old: the reference's 'ema'
                                                                       adapter, which decays as solrl's old one)
    loss  = policy + kl_beta kl + anchor_beta anchor                   T:1350; both penalties only when kl_beta > 0,
                                                                       the anchor inside the KL's `if` (T:1330, :1341)

The ratio is 1 in value, so the gradient is -mean(A d lp_w): the advantage-weighted, t-weighted
generalised-Huber flow-matching loss. kl_beta 1e-4 (C:333) and the anchor's 1 (C:345) are the PickScore
config's; tests/test_awm.py holds a plain transcription of T:210-252 and T:1282-1354 it agrees with.
"""

from __future__ import annotations

import torch

from solrl_core.loop.nft import LossTerms


def awm_loss(v: torch.Tensor, v_old: torch.Tensor | None, v_ref: torch.Tensor | None, x0: torch.Tensor,
             eps: torch.Tensor, sigma: torch.Tensor, advantages: torch.Tensor, *, kl_beta: float,
             anchor_beta: float, power: float, adv_clip_max: float) -> LossTerms:
    """The AWM loss of a batch at one timestep per sample (sigma is [B]; v, v_old, v_ref, x0, eps [B, ...]).

    v_ref may be None when kl_beta is 0 (the reference forward is skipped); the KL is then NaN and, as
    in the reference, neither penalty enters. v_old may be None where the anchor does not enter (kl_beta or
    anchor_beta 0). A sample whose weighted loss is not finite is zeroed and
    counted. The returned loss is float64, as the reference computes it."""
    dims = tuple(range(1, v.dim()))
    v64 = v.double()
    mse = ((v64 - (eps.double() - x0.double())) ** 2).mean(dim=dims)
    tiny = torch.tensor(1e-10, dtype=torch.float64, device=v.device)
    lp = -(torch.pow(mse + tiny, power) - torch.pow(tiny, power)) * sigma.double() / power
    finite = torch.isfinite(lp)
    lp = torch.where(finite, lp, torch.zeros_like(lp))
    adv = advantages.double().clamp(-adv_clip_max, adv_clip_max) / adv_clip_max
    policy = (-adv * torch.exp(lp - lp.detach())).mean()
    nonfinite = int((~finite).sum())
    if v_ref is None:  # kl_beta = 0: the reference was not run, so the KL is not measured (NaN, shown as such)
        if kl_beta != 0:
            raise ValueError("v_ref is needed when kl_beta != 0")
        return LossTerms(loss=policy, policy=policy.detach(), kl=torch.tensor(float("nan")), nonfinite=nonfinite)
    kl = ((v64 - v_ref.double()) ** 2).mean()
    loss = policy
    if kl_beta > 0:
        loss = loss + kl_beta * kl
        if anchor_beta > 0:
            loss = loss + anchor_beta * ((v64 - v_old.double()) ** 2).mean()
    return LossTerms(loss=loss, policy=policy.detach(), kl=kl.detach(), nonfinite=nonfinite)
