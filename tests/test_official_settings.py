"""Settings that follow the official Sol-RL configs (NVlabs/Sana 4b72423 configs/sol_rl/*.py,
train_scripts/sol_rl/): the LoRA init per model, each family's rollout model, the update's one set
of timesteps for its three forwards, and the official explore numerics (per-tensor FP8 E5M2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config import ModelConfig
from solrl_core.errors import SolrlError
from solrl_core.loop_state import LoopState
from solrl_core.precision.e5m2 import E5M2_MAX, fake_quantize_tensor
from solrl_core.precision.hardware import GpuInfo
from solrl_core.precision.quantize import LayerRule, quantize_model
from solrl_core.precision.resolve import resolve_machine
from solrl_core.presets import resolve_config
from solrl_core.session import open_session
from solrl_core.stages import explore, regenerate, score_drafts, score_finals, select_seeds
from solrl_core.stages import train as update_on

diffusers = pytest.importorskip("diffusers")
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.1)
CUDA = torch.device("cuda", 0)


# --- LoRA init per model ----------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["sana", "flux1", "sd3"])
def test_every_official_model_starts_its_lora_gaussian(model):
    assert resolve_config(model, "sol_rl", "imagereward").model.lora_init == "gaussian"


def _lora_a(init: str, width: int = 256, rank: int = 32) -> torch.Tensor:
    from solrl_core.policy import Policy

    torch.manual_seed(0)
    net = diffusers.SanaTransformer2DModel(in_channels=4, out_channels=4, num_attention_heads=width // 64,
                                           attention_head_dim=64, num_layers=1, num_cross_attention_heads=width // 64,
                                           cross_attention_head_dim=64, cross_attention_dim=width, caption_channels=32,
                                           sample_size=8, patch_size=1)
    policy = Policy(net, ModelConfig(lora_init=init, lora_rank=rank, lora_alpha=2 * rank, lora_targets=("attn1.to_q",)))
    return next(p for n, p in net.named_parameters() if "lora_A.default" in n).detach()


def test_lora_init_reaches_peft():
    gaussian, kaiming = _lora_a("gaussian"), _lora_a("kaiming")
    # peft's gaussian: normal with std 1/r; its default: Kaiming-uniform, bound 1/sqrt(in_features).
    assert gaussian.std().item() == pytest.approx(1 / 32, rel=0.05)
    assert kaiming.abs().max().item() <= 1 / math.sqrt(256) + 1e-7
    assert kaiming.std().item() == pytest.approx(1 / math.sqrt(3 * 256), rel=0.05)


def test_an_unknown_lora_init_is_refused():
    with pytest.raises(SolrlError, match="model.lora_init"):
        resolve_config("tiny", "sol_rl", sets=["model.lora_init=pissa"])


# --- each family rolls out on the official model ----------------------------------------------------

@pytest.mark.parametrize("family", ["naive_scaling", "diffusionnft"])
def test_the_official_peft_baselines_roll_out_eagerly_on_the_old_adapter(family):
    cfg = resolve_config("sana", family, "imagereward")
    plan = resolve_machine(cfg, CUDA, "bf16", gpu=H100)
    assert not plan.rollout_copy and not plan.rollout_compile and not plan.policy_rollout_compile
    assert "as configured" in plan.rollout_copy_why


@pytest.mark.parametrize("family", ["compile", "sol_rl", "naive_quant"])
def test_the_compiled_families_roll_out_on_a_merged_compiled_copy(family):
    plan = resolve_machine(resolve_config("sana", family, "imagereward"), CUDA, "bf16", gpu=H100)
    assert plan.rollout_copy and plan.rollout_compile


def test_naive_scaling_can_still_be_compiled():
    cfg = resolve_config("sana", "naive_scaling", "imagereward", sets=["sampler.rollout_copy=auto", "sampler.compile=auto"])
    plan = resolve_machine(cfg, CUDA, "bf16", gpu=H100)
    assert plan.rollout_copy and plan.rollout_compile


def test_presets_say_which_family_is_compiled():
    from solrl_core.presets import get_preset

    assert "eager" in get_preset("families", "naive_scaling").description
    assert "compile" in get_preset("families", "compile").description


# --- the update's three forwards see the same timesteps ---------------------------------------------

def test_old_trained_and_reference_forwards_get_identical_inputs(fast_sets):
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.eval_prompts=", "run.dtype=bf16", "sampler.rollout_copy=true"))
    run = open_session(cfg).run
    assert run.engine.rollout_copy is not None and cfg.algorithm.kl_beta != 0
    rng = np.random.default_rng(0)
    drafts = explore(run, run.prompts[:2], rng)
    kept = drafts.subset(select_seeds(run, score_drafts(run, LoopState(), ev.EventBus(), drafts), rng))
    batch = score_finals(run, LoopState(), ev.EventBus(), regenerate(run, kept))
    calls: list[tuple[torch.Tensor, torch.dtype]] = []

    def record(module, args, kwargs):  # type: ignore[no-untyped-def]
        calls.append((kwargs["timestep"].detach().clone(), kwargs["hidden_states"].dtype))

    hooks = [m.register_forward_pre_hook(record, with_kwargs=True) for m in (run.engine.rollout_copy.module, run.engine.policy.transformer)]
    try:
        update_on(run, batch, rng)
    finally:
        for h in hooks:
            h.remove()
    assert calls and len(calls) % 3 == 0  # per micro-batch: old (copy), reference, trained
    for i in range(0, len(calls), 3):
        (t_old, d_old), (t_ref, d_ref), (t, d) = calls[i:i + 3]
        assert t.dtype == torch.float32 and torch.equal(t_old, t) and torch.equal(t_ref, t)
        assert d_old == d_ref == d == torch.bfloat16


def test_sana_and_sd3_wrappers_pass_fp32_timesteps_to_the_transformer():
    from solrl_core.models.base import Conditioning, sana_velocity
    from solrl_core.models.sd3 import sd3_velocity

    seen = []

    def fake(**kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["timestep"])
        return (kwargs["hidden_states"],)

    sigma = torch.tensor([0.6013])
    latents = torch.zeros(1, 4, 2, 2, dtype=torch.bfloat16)
    cond = Conditioning(embeds=torch.zeros(1, 3, 8), mask=torch.ones(1, 3), pooled=torch.zeros(1, 8))
    sana_velocity(fake, latents, sigma, cond)
    sd3_velocity(fake, latents, sigma, cond)
    for t in seen:
        assert t.dtype == torch.float32 and t.item() == pytest.approx(601.3, abs=1e-3)


# --- the official explore numerics: per-tensor FP8 E5M2 ---------------------------------------------

def test_e5m2_keeps_two_mantissa_bits_at_the_tensors_scale():
    x = torch.tensor([1.0, 0.3, -0.7, 0.0, 1e-3])
    q = fake_quantize_tensor(x)
    scale = E5M2_MAX / 1.0
    assert torch.equal(q, (x * scale).to(torch.float8_e5m2).float() / scale)
    assert q[0] == 1.0 and q[3] == 0.0
    assert q[1].item() == pytest.approx(2**14 / E5M2_MAX)  # 0.3 x 57344 = 17203 -> 2^14 on a 2-bit mantissa
    assert torch.equal(fake_quantize_tensor(torch.zeros(3)), torch.zeros(3))
    assert fake_quantize_tensor(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_e5m2_explore_copy_swaps_the_rules_layers_and_stays_close():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 64)
    want = net(x)
    report = quantize_model(net, LayerRule(), "fp8-e5m2-tensor")
    assert len(report.quantized) == 2 and report.precision == "fp8-e5m2-tensor"
    got = net(x)
    err = ((got - want).norm() / want.norm()).item()
    assert 0 < err < 0.15  # 2 mantissa bits: a few percent, never exact


def test_e5m2_explore_precision_trains_the_tiny_model(fast_sets):
    from solrl_core.trainer import StopFlag, train

    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=1", "run.eval_prompts=",
                                                          "explore.precision=fp8-e5m2-tensor"))
    session = train(cfg, ev.EventBus(), stop=StopFlag())
    assert session.run.plan.explore_precision == "fp8-e5m2-tensor"
    assert session.run.engine.explore_copy.report.precision == "fp8-e5m2-tensor"


# --- training precision per model -------------------------------------------------------------------

def test_presets_carry_each_official_training_regime():
    assert resolve_config("sana", "sol_rl", "imagereward").model.train_precision == "bf16"
    assert resolve_config("sd3", "sol_rl", "imagereward").model.train_precision == "fp32-base"
    assert resolve_config("flux1", "sol_rl", "imagereward").model.train_precision == "autocast"


def test_fp32_base_doubles_the_policy_in_the_estimate():
    from solrl_core.footprint import estimate_memory

    bf16 = estimate_memory(resolve_config("sd3", "sol_rl", "imagereward", sets=["model.train_precision=autocast"]),
                           "fp8", "bf16")
    fp32 = estimate_memory(resolve_config("sd3", "sol_rl", "imagereward"), "fp8", "bf16")
    assert fp32.policy == pytest.approx(2 * bf16.policy) and fp32.explore_copy == bf16.explore_copy


@pytest.mark.parametrize("regime, base, autocast_on", [("autocast", torch.bfloat16, True), ("bf16", torch.bfloat16, False),
                                                        ("fp32-base", torch.float32, True)])
def test_each_training_regime_runs_its_forwards_as_named(fast_sets, monkeypatch, regime, base, autocast_on):
    from solrl_core.trainer import StopFlag, train

    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=1", "run.eval_prompts=", "run.dtype=bf16",
                                                          "sampler.rollout_copy=false", f"model.train_precision={regime}"))
    seen: list[tuple[bool, torch.dtype]] = []

    def record(module, args, kwargs):  # type: ignore[no-untyped-def]
        if torch.is_grad_enabled():  # the trained forward
            seen.append((torch.is_autocast_enabled("cpu"), kwargs["hidden_states"].dtype))

    import solrl_core.session as session_module

    opened = session_module.open_session

    def hooked(*a, **k):  # type: ignore[no-untyped-def]
        s = opened(*a, **k)
        s.run.engine.policy.transformer.register_forward_pre_hook(record, with_kwargs=True)
        return s

    import solrl_core.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "open_session", hooked)
    session = train(cfg, ev.EventBus(), stop=StopFlag())
    base_dtypes = {p.dtype for n, p in session.run.engine.policy.transformer.named_parameters() if "lora_" not in n}
    assert base_dtypes == {base}
    assert seen and {a for a, _ in seen} == {autocast_on} and {d for _, d in seen} == {torch.bfloat16}
    assert next(session.run.engine.explore_copy.module.parameters()).dtype == torch.bfloat16
