"""The DiffusionNFT loss and advantages against values worked out by hand."""

import pytest
import torch

from solrl_core.loop.nft import group_advantages, nft_loss


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32).view(2, 1, 1, 2)


def test_nft_loss_matches_hand_computation():
    # Sample 1: A=5 -> r=1.  x0_pos = xt - 0.5*v = [1.5, 2]; err [0.5, 0]; mean sq .125 / mean abs .25 = 0.5
    # Sample 2: A=-2.5 -> r=0.25.  v_pos = v = [2,0]: x0_pos = [-1,-1], err [-1,-1] -> 1/1 = 1
    #           v_neg = 2*v_old - v = [-1, 0]: x0_neg = [2,-1], err [2,-1] -> 2.5/1.5 = 5/3
    #           per-sample = 0.25*1 + 0.75*5/3 = 1.5
    # policy = 5 * mean(0.5, 1.5) = 5;  kl = mean([1,0,2,0]^2) = 1.25;  loss = 5 + 0.1*1.25 = 5.125
    v = _t([[1.0, 0.0], [2.0, 0.0]]).requires_grad_(True)
    v_old = _t([[0.0, 0.0], [0.5, 0.0]])
    v_ref = torch.zeros_like(v_old)
    xt = _t([[2.0, 2.0], [1.0, -1.0]])
    x0 = _t([[1.0, 2.0], [0.0, 0.0]])
    terms = nft_loss(v, v_old, v_ref, xt, x0, torch.tensor([0.5, 1.0]), torch.tensor([5.0, -2.5]),
                     nft_beta=1.0, kl_beta=0.1, adv_clip_max=5.0)
    assert torch.isclose(terms.loss, torch.tensor(5.125))
    assert torch.isclose(terms.policy, torch.tensor(5.0))
    assert torch.isclose(terms.kl, torch.tensor(1.25))
    terms.loss.backward()
    # d/dv0 of sample 1: L_pos = mean(err^2) / 0.25 (the 0.25 is stop-gradient), err = xt - 0.5 v - x0
    #   dL_pos/dv0 = (1/2) * 2 * err0 * (-0.5) / 0.25 = 0.5 * (-0.5) / 0.25 = -1
    #   policy = 5 * mean over 2 samples -> 5/2 * -1 = -2.5 ;  kl: 0.1 * (1/4) * 2 * v0 = 0.05  -> -2.45
    # Without the stop-gradient, L_pos = |err0| and the gradient would be 5/2 * -0.5 + 0.05 = -1.2.
    assert torch.isclose(v.grad.view(2, 2)[0, 0], torch.tensor(-2.45))


def test_nft_beta_mixes_old_policy():
    # beta=0.5 moves v_pos halfway to v_old: with v_old = x0 prediction exact, L_pos shrinks to a quarter of err.
    v = _t([[2.0, 0.0], [2.0, 0.0]])
    zeros = torch.zeros_like(v)
    xt = _t([[2.0, 0.0], [2.0, 0.0]])
    x0 = _t([[2.0, 0.0], [2.0, 0.0]])
    adv = torch.tensor([5.0, 5.0])  # r = 1: only L_pos counts
    sigma = torch.tensor([1.0, 1.0])
    full = nft_loss(v, zeros, zeros, xt, x0, sigma, adv, nft_beta=1.0, kl_beta=0.0, adv_clip_max=5.0)
    half = nft_loss(v, zeros, zeros, xt, x0, sigma, adv, nft_beta=0.5, kl_beta=0.0, adv_clip_max=5.0)
    # beta=1: err=[-2,0]: 2/1 = 2 -> 5*2 = 10.  beta=.5: v_pos=[1,0], err=[-1,0]: .5/.5 = 1, /beta -> 2 -> 10
    assert torch.isclose(full.policy, torch.tensor(10.0))
    assert torch.isclose(half.policy, torch.tensor(10.0))
    half_neg = nft_loss(v, zeros, zeros, xt, x0, sigma, -adv, nft_beta=0.5, kl_beta=0.0, adv_clip_max=5.0)
    # r = 0: v_neg = 1.5*0 - 0.5*v = [-1,0]: err = [1,0]: .5/.5 = 1, /beta -> 2 -> 5*2 = 10
    assert torch.isclose(half_neg.policy, torch.tensor(10.0))


def test_without_a_reference_the_kl_is_not_measured_and_needs_kl_beta_zero():
    v = _t([[1.0, 0.0], [2.0, 0.0]])
    zeros = torch.zeros_like(v)
    args = (_t([[2.0, 2.0], [1.0, -1.0]]), zeros, torch.tensor([0.5, 1.0]), torch.tensor([5.0, -2.5]))
    skipped = nft_loss(v, zeros, None, *args, nft_beta=1.0, kl_beta=0.0, adv_clip_max=5.0)
    assert torch.isnan(skipped.kl) and torch.equal(skipped.loss,
            nft_loss(v, zeros, zeros, *args, nft_beta=1.0, kl_beta=0.0, adv_clip_max=5.0).loss)
    with pytest.raises(ValueError, match="kl_beta"):
        nft_loss(v, zeros, None, *args, nft_beta=1.0, kl_beta=0.1, adv_clip_max=5.0)


def test_nonfinite_losses_are_zeroed_and_counted():
    v = _t([[1.0, 0.0], [float("nan"), 0.0]])
    zeros = torch.zeros_like(v)
    terms = nft_loss(v, zeros, zeros, zeros + 1, zeros, torch.tensor([0.5, 0.5]), torch.tensor([1.0, 1.0]),
                     nft_beta=1.0, kl_beta=0.0, adv_clip_max=5.0)
    assert terms.nonfinite == 1
    assert torch.isfinite(terms.policy)


def test_group_advantages_use_group_mean_and_global_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 10.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    std = (98 / 6) ** 0.5  # population std of all six rewards (mean 6)
    expected = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]) / (std + 1e-4)
    assert torch.allclose(group_advantages(rewards, groups, clip=5.0), expected)
    assert group_advantages(torch.tensor([0.0, 100.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]), clip=0.5).max() == 0.5


def test_the_terminal_says_the_kl_is_off_when_it_was_not_measured():
    import io
    import math

    from rich.console import Console

    from solrl_view.display import TerminalDisplay
    from solrl_core import events as ev

    stats = ev.RewardStats(mean=0.5, std=0.1, best=0.7, worst=0.3, components={})
    lines = []
    for loss, kl in ((1.25, math.nan), (1.25, 0.003), (math.nan, math.nan)):
        out = io.StringIO()
        TerminalDisplay(Console(file=out, width=200))(ev.IterationFinished(
            iteration=1, iterations=2, seconds={"train": 1.0, "total": 1.0}, draft=None, final=stats,
            loss={"loss": loss, "policy": loss, "kl": kl}, nonfinite_losses=0, grad_norm=1.0, old_decay=0.0))
        lines.append(out.getvalue())
    assert "kl off" in lines[0] and "kl 0.003" in lines[1] and "kl nan" in lines[2]  # no step at all: both NaN
