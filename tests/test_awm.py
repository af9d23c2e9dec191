"""algorithm.loss=awm: the AWM loss agrees with a plain transcription of the reference code (values and
gradients) and disagrees once perturbed; the setting is checked; a Sol-RL + AWM run resumes bit for bit,
on the CPU lanes; other families train with it; `solrl train --set algorithm.loss=awm` runs."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from solrl_core.config.choices import LOSSES
from solrl_core.config.presets import resolve_config
from solrl_core.errors import SolrlError
from solrl_core.loop import update
from solrl_core.loop.awm import awm_loss
from tests.conftest import FAST
from tests.helpers import assert_refused, logged_events, saved_adapters, solrl_process, train_recording


# ---- A plain transcription of the reference ------------------------------------------------------------------
# scxue/advantage_weighted_matching at be5137232e33a21b449ed65a533211d0deb97ed8,
# advantage_weighted_matching/scripts/train_sd3_awm.py; the reference's arithmetic, order and dtypes.


def ref_log_prob(model_output, noise, clean_latents, timestep, ghuber_power=0.25):
    """train_sd3_awm.py:210-252 `compute_log_prob_awm` after the forward, weighting 'ghuber' (:248-249)."""
    model_output = model_output.double()
    log_prob = -(model_output - (noise.double() - clean_latents.double())) ** 2
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    t = timestep.reshape(-1)
    log_prob = -(torch.pow(-log_prob + 1e-10, ghuber_power)
                 - torch.pow(torch.tensor(1e-10, dtype=log_prob.dtype), ghuber_power)) * t / ghuber_power
    return log_prob, model_output


def ref_loss(log_prob, advantages, train_timesteps, batch_size, adv_clip_max=5.0, advantage_max=1.0,
             clip_range=1.0, beta=0.0, model_output=None, model_output_ref=None, ema_beta=0.0,
             model_output_ema: Optional[torch.Tensor] = None):
    """train_sd3_awm.py:1282-1354, one micro-batch, on-policy (old = this forward's, :1282-1284), loss_type
    'exp_first' (:1305-1317), KL weights 'Uniform' (:1336-1337, :1346-1347), the EMA-KL inside `if beta > 0`."""
    old_log_prob = log_prob.detach()
    adv = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    adv = adv / adv_clip_max * advantage_max
    ratio = torch.exp(log_prob.reshape(-1) - old_log_prob.reshape(-1).detach())
    adv = adv.unsqueeze(0).repeat(train_timesteps, 1).view(-1)
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    if beta > 0:
        shape = (train_timesteps, batch_size, *model_output.shape[1:])
        mo, mo_ref = model_output.reshape(shape), model_output_ref.reshape(shape)
        dims = tuple(range(2, mo.ndim))
        kl_loss = ((mo - mo_ref) ** 2).mean(dim=dims, keepdim=True).mean(dim=0).mean()
        if ema_beta > 0:
            mo_ema = model_output_ema.reshape(shape)
            ema_kl_loss = ((mo - mo_ema) ** 2).mean(dim=dims, keepdim=True).mean(dim=0).mean()
            loss = loss + beta * kl_loss + ema_beta * ema_kl_loss
        else:
            loss = loss + beta * kl_loss
    return loss


def ref_timestep_indices(num_steps, timestep_fraction, train_timesteps, rand_u):
    """train_sd3_awm.py:1172-1177, time_type 'discrete': one rollout-grid index per stratum (`rand_u`: the
    reference's torch.rand(T), :1176)."""
    boundaries = torch.linspace(0, int(num_steps * timestep_fraction), steps=train_timesteps + 1)
    lower = boundaries[:-1].long()
    upper = boundaries[1:].long()
    return lower + (rand_u * (upper - lower)).long()


# ---- The loss against it ----------------------------------------------------------------------------------


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(4, 2, 3, 3, generator=g), torch.randn(4, 2, 3, 3, generator=g)
    sigma = torch.tensor([0.9, 0.55, 0.3, 0.1])
    v = ((eps - x0) + 0.3 * torch.randn(4, 2, 3, 3, generator=g)).requires_grad_(True)
    v_old, v_ref = v.detach() + 0.1 * torch.randn(4, 2, 3, 3, generator=g), v.detach() + 0.2 * torch.randn(4, 2, 3, 3,
                                                                                                           generator=g)
    adv = torch.tensor([7.0, -2.0, 0.5, -6.0])  # two beyond adv_clip_max
    return v, v_old, v_ref, x0, eps, sigma, adv


def _reference(v, v_old, v_ref, x0, eps, sigma, adv, *, beta=1e-4, ema_beta=1.0):
    lp, mo = ref_log_prob(v, eps, x0, sigma)
    loss = ref_loss(lp, adv.double(), 1, v.shape[0], beta=beta, model_output=mo, model_output_ref=v_ref.double(),
                    ema_beta=ema_beta, model_output_ema=v_old.double())
    return loss, torch.autograd.grad(loss, v)[0]


def _solrl(v, v_old, v_ref, x0, eps, sigma, adv, *, kl_beta=1e-4, anchor_beta=1.0, power=0.25):
    terms = awm_loss(v, v_old, v_ref, x0, eps, sigma, adv, kl_beta=kl_beta, anchor_beta=anchor_beta, power=power,
                     adv_clip_max=5.0)
    return terms.loss, torch.autograd.grad(terms.loss, v)[0]


@pytest.mark.parametrize("kl_beta", [1e-4, 0.05])
def test_the_awm_loss_and_its_gradient_agree_with_the_reference(kl_beta):
    case = _case()
    want, want_grad = _reference(*case, beta=kl_beta)
    got, got_grad = _solrl(*case, kl_beta=kl_beta)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-15)
    assert torch.allclose(got_grad, want_grad, rtol=1e-6, atol=1e-12)
    assert got_grad.abs().sum() > 0


def test_at_kl_beta_0_neither_penalty_enters_as_in_the_reference():
    v, v_old, _, x0, eps, sigma, adv = _case(1)
    want, want_grad = _reference(v, v_old, v_old, x0, eps, sigma, adv, beta=0.0, ema_beta=1.0)
    got, got_grad = _solrl(v, v_old, None, x0, eps, sigma, adv, kl_beta=0.0, anchor_beta=1.0)
    assert torch.allclose(got, want, rtol=1e-12) and torch.allclose(got_grad, want_grad, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("perturbed", [{"power": 0.5}, {"anchor_beta": 0.0}, {"kl_beta": 1e-3}])
def test_a_perturbed_awm_loss_disagrees_with_the_reference(perturbed):
    case = _case(2)
    want, want_grad = _reference(*case)
    got, got_grad = _solrl(*case, **perturbed)
    assert not torch.allclose(got_grad, want_grad, rtol=1e-3, atol=1e-9)


def test_a_wrong_advantage_scale_or_timestep_weight_disagrees():
    v, v_old, v_ref, x0, eps, sigma, adv = _case(3)
    _, want_grad = _reference(v, v_old, v_ref, x0, eps, sigma, adv)
    _, unclipped = _solrl(v, v_old, v_ref, x0, eps, sigma, adv * 0.5)  # clamp(7)/5 = 1 but clamp(3.5)/5 = 0.7
    _, flat_t = _solrl(v, v_old, v_ref, x0, eps, torch.ones(4), adv)
    for grad in (unclipped, flat_t):
        assert not torch.allclose(grad, want_grad, rtol=1e-3, atol=1e-9)


def test_a_nonfinite_sample_is_zeroed_and_counted():
    v, v_old, v_ref, x0, eps, sigma, adv = _case(4)
    bad = v.detach().clone()
    bad[1] = float("inf")
    terms = awm_loss(bad, v_old, v_ref, x0, eps, sigma, adv, kl_beta=0.0, anchor_beta=1.0, power=0.25,
                     adv_clip_max=5.0)
    assert terms.nonfinite == 1 and torch.isfinite(terms.policy)


@pytest.mark.parametrize("steps,fraction,strata", [(14, 0.9, 6), (10, 0.6, 6), (10, 0.6, 4), (4, 0.5, 2)])
def test_stratified_timesteps_are_the_references_draw_from_each_samples_generator(steps, fraction, strata):
    alg = resolve_config("tiny", "sol_rl", sets=["algorithm.train_timesteps=stratified", f"algorithm.strata={strata}",
                                                 f"sampler.steps={steps}", f"algorithm.timestep_fraction={fraction}",
                                                 "explore.steps=2"]).algorithm
    picks = update.train_timesteps([torch.Generator().manual_seed(s) for s in range(5)], steps,
                                   int(steps * fraction), alg)
    for s, row in enumerate(picks):
        u = torch.rand(strata, generator=torch.Generator().manual_seed(s))
        assert torch.equal(row, ref_timestep_indices(steps, fraction, strata, u))
    assert picks.shape == (5, strata) and bool((picks.diff(dim=1) > 0).all())  # one per stratum, in order


def test_subset_timesteps_stay_a_random_subset_of_the_grid():
    alg = resolve_config("tiny", "sol_rl").algorithm
    picks = update.train_timesteps([torch.Generator().manual_seed(s) for s in range(3)], 10, 6, alg)
    for s, row in enumerate(picks):
        assert torch.equal(row, torch.randperm(10, generator=torch.Generator().manual_seed(s))[:6])


# ---- The setting ------------------------------------------------------------------------------------------


def test_the_update_computes_each_loss_the_config_names():
    assert tuple(update._LOSSES) == tuple(LOSSES) == ("nft", "awm", "flow_grpo")
    assert resolve_config("tiny", "sol_rl").algorithm.loss == "nft"
    assert resolve_config("tiny", "sol_rl", sets=["algorithm.loss=awm"]).algorithm.loss == "awm"


def test_an_unknown_loss_is_refused_with_the_closest():
    with pytest.raises(SolrlError, match="unknown algorithm.loss 'awn'") as refused:
        resolve_config("tiny", "sol_rl", sets=["algorithm.loss=awn"])
    assert "awm" in refused.value.fix


@pytest.mark.parametrize("setting", ["algorithm.awm_power=0", "algorithm.awm_anchor_beta=-1", "algorithm.strata=0",
                                     "algorithm.train_timesteps=uniform"])
def test_awm_settings_out_of_range_are_refused(setting):
    with pytest.raises(SolrlError, match=setting.split("=")[0]):
        resolve_config("tiny", "sol_rl", sets=[setting])


def test_more_strata_than_trained_grid_steps_are_refused():
    with pytest.raises(SolrlError, match="algorithm.strata=6 strata over 2 grid steps") as refused:
        resolve_config("tiny", "sol_rl", sets=[*FAST, "algorithm.train_timesteps=stratified"])
    assert "at most 2" in refused.value.fix


# ---- Runs ---------------------------------------------------------------------------------------------------


def _sets(run_dir, *extra):
    return [*FAST, "run.eval_prompts=", "run.iterations=2", "algorithm.loss=awm", f"run.run_dir={run_dir}", *extra]


@pytest.mark.slow
def test_a_sol_rl_awm_run_resumes_bit_for_bit_on_the_cpu_lanes(tmp_path, monkeypatch):
    lanes, calls = [], []
    real_lanes, real_loss = update._lanes, update.awm_loss
    monkeypatch.setattr(update, "_lanes", lambda run: lanes.append(real_lanes(run)) or lanes[-1])
    monkeypatch.setattr(update, "awm_loss", lambda *a, **k: calls.append(1) or real_loss(*a, **k))
    train_recording(_sets(tmp_path / "straight"))
    train_recording(_sets(tmp_path / "stopped"), stop_after=1)
    train_recording(_sets(tmp_path / "stopped"), resume=True)
    assert calls and max(lanes) > 1  # the AWM loss ran, micro-steps side by side
    one, two = saved_adapters(tmp_path / "straight", 2), saved_adapters(tmp_path / "stopped", 2)
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    its = [[e["loss"] for e in logged_events(d) if e["event"] == "iteration"] for d in (tmp_path / "straight",
                                                                                       tmp_path / "stopped")]
    assert len(its[0]) == 2 and its[0] == its[1]


STRATIFIED = ("algorithm.train_timesteps=stratified", "algorithm.strata=2")


@pytest.mark.slow
@pytest.mark.parametrize("family,extra", [("diffusionnft", ()), ("naive_scaling", STRATIFIED)])
def test_other_families_train_with_the_awm_loss(tmp_path, family, extra, monkeypatch):
    calls, real_loss = [], update.awm_loss
    monkeypatch.setattr(update, "awm_loss", lambda *a, **k: calls.append(1) or real_loss(*a, **k))
    _, seen = train_recording(_sets(tmp_path / family, *extra), family=family)
    assert calls and [e.iteration for e in seen if type(e).__name__ == "IterationFinished"] == [1, 2]


@pytest.mark.slow
def test_solrl_train_with_the_awm_loss_from_the_cli(tmp_path):
    nft = solrl_process(tmp_path, "train", "--iterations", "2", "--no-eval", "--run-dir", "nft")
    awm = solrl_process(tmp_path, "train", "--iterations", "2", "--no-eval", "--run-dir", "awm",
                        "--set", "algorithm.loss=awm")
    assert awm.returncode == 0 and nft.returncode == 0, (awm.stdout + awm.stderr)[-3000:]
    assert "iter    2/2" in awm.stdout
    losses = {d: [e["loss"]["loss"] for e in logged_events(tmp_path / d) if e["event"] == "iteration"]
              for d in ("nft", "awm")}
    assert len(losses["awm"]) == 2 and losses["awm"] != losses["nft"]
    a, b = saved_adapters(tmp_path / "nft", 2), saved_adapters(tmp_path / "awm", 2)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_solrl_train_takes_the_loss_as_a_flag_and_a_resume_refuses_it(tmp_path):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    shown = CliRunner().invoke(app, ["train", "--loss", "awm", "--dump-config"])
    assert shown.exit_code == 0 and 'loss = "awm"' in shown.output, shown.output
    refused = solrl_process(tmp_path, "train", "--resume", str(tmp_path), "--loss", "awm")
    assert_refused(refused, "--resume continues a run with the config saved in its folder")


def test_a_frontier_run_with_the_awm_loss_is_not_taken_for_the_default(monkeypatch):
    import sys

    from tests.helpers import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("frontier", None)
    import frontier

    digest = frontier.config_digest("tiny")
    assert digest([]) == digest(["algorithm.loss=nft"]) != digest(["algorithm.loss=awm"])
    assert digest([]) != digest(["algorithm.train_timesteps=stratified", "algorithm.strata=2"])
