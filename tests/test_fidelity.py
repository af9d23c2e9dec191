"""Where solrl follows the official Sol-RL code (NVlabs/Sana train_scripts/sol_rl, configs/sol_rl):
fp32 adapters under a bf16 base, the official quantized-layer rule, SD3's sigma grid, SANA's prompt
encoding, the presets' clips, and the step count of the old-policy decay and the EMA."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from solrl_core import events as ev
from solrl_core.config.presets import resolve_config
from solrl_core.engine.sampler import sigma_grid
from solrl_core.loop.trainer import StopFlag, train
from solrl_core.precision.quantize import LayerRule, plan_layers

diffusers = pytest.importorskip("diffusers")


# --- fp32 adapters, EMA and optimizer state under a bf16 base -------------------------------------

def test_bf16_run_on_a_cpu_keeps_adapters_ema_and_adam_moments_in_fp32(fast_sets):
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.dtype=bf16", "run.iterations=1", "run.eval_prompts="))
    bus = ev.EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append)
    session = train(cfg, bus, stop=StopFlag())
    (it,) = [e for e in seen if isinstance(e, ev.IterationFinished)]
    assert np.isfinite(it.loss["loss"]) and it.grad_norm > 0
    policy = session.run.engine.policy
    base = [p for n, p in policy.transformer.named_parameters() if "lora_" not in n]
    assert {p.dtype for p in base} == {torch.bfloat16}
    lora = {n: p for n, p in policy.transformer.named_parameters() if "lora_" in n}
    assert lora and {p.dtype for p in lora.values()} == {torch.float32}
    assert any(".old." in n for n in lora) and any(".default." in n for n in lora)
    assert {t.dtype for t in policy.ema.values()} == {torch.float32}
    moments = [s[k] for s in session.run.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    # The explore copy got the merged old adapter in the base dtype.
    assert next(session.run.engine.explore_copy.module.parameters()).dtype == torch.bfloat16


# --- the official quantized-layer rule ------------------------------------------------------------

def _tiny_sana():
    # Real SANA layer names; widths multiples of 16 (hidden 32), so only the rule decides.
    return diffusers.SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=16, cross_attention_dim=32, caption_channels=32,
        mlp_ratio=2.5, sample_size=8, patch_size=1)


def _tiny_sd3():
    return diffusers.SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=2,
                                           attention_head_dim=16,
                                           num_attention_heads=2, caption_projection_dim=32, joint_attention_dim=32,
                                           pooled_projection_dim=64, out_channels=4)


def _tiny_flux():
    return diffusers.FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                            attention_head_dim=16,
                                            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                                            axes_dims_rope=[4, 4, 8])


def _rule(preset: str, real_hidden: int, tiny_hidden: int) -> LayerRule:
    """The preset's rule with its min-dim scaled from the real width to the tiny one."""
    rule = LayerRule.of(resolve_config(preset, "sol_rl").model)
    return LayerRule(rule.skip, math.floor(rule.min_dim * tiny_hidden / real_hidden), rule.fused)


def _quantized(model: torch.nn.Module, rule: LayerRule) -> set[str]:
    return {e.name for e in plan_layers(model, rule) if e.quantized}


def _expected_sana(blocks: int) -> set[str]:
    """The official SANA explore copy: feed-forward and the fused cross-attention key/value only."""
    return {f"transformer_blocks.{i}.{layer}" for i in range(blocks)
            for layer in ("ff.conv_inverted", "ff.conv_point", "attn2.to_k", "attn2.to_v")}


def _expected_sd3(blocks: int) -> set[str]:
    """The official SD3 explore copy: the image stream's feed-forward only."""
    return {f"transformer_blocks.{i}.ff.net.{j}" for i in range(blocks) for j in ("0.proj", "2")}


def _expected_flux(model: torch.nn.Module, skip: tuple[str, ...]) -> set[str]:
    """FLUX.1 at min-dim 1000: every Linear but the named embedders and final norm."""
    return {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not any(s in n for s in skip)}


def test_sana_rule_quantizes_only_the_official_layers():
    rule = _rule("sana", 2240, 32)
    assert rule.min_dim == 32 and "attn2.to_k+attn2.to_v" in rule.fused
    entries = {e.name: e for e in plan_layers(_tiny_sana(), rule)}
    assert {n for n, e in entries.items() if e.quantized} == _expected_sana(2)
    # Each layer says which rule kept it: the split cross-attention key alone is 32 wide, but the
    # official fused kv_linear (64) is wider than the min-dim, so it stays quantized.
    assert entries["transformer_blocks.0.attn2.to_q"].rule == "min_dim"
    assert entries["transformer_blocks.0.attn2.to_out.0"].rule == "min_dim"
    assert entries["transformer_blocks.0.attn1.to_k"].rule == "name"
    assert entries["transformer_blocks.0.ff.conv_depth"].rule == "kernel"
    wider = {e.name: e for e in plan_layers(_tiny_sana(), LayerRule(rule.skip, 64, rule.fused))}
    assert (wider["transformer_blocks.0.attn2.to_k"].reason == "max(in, out) = 64 (fused attn2.to_k+attn2.to_v) <= "
                                                               "min_dim 64")
    # Without the fused shape the rule would wrongly keep the cross-attention key/value.
    unfused = _quantized(_tiny_sana(), LayerRule(rule.skip, rule.min_dim))
    assert "transformer_blocks.0.attn2.to_k" not in unfused


def test_sd3_rule_quantizes_only_the_image_feed_forward():
    rule = _rule("sd3", 2432, 32)
    assert _quantized(_tiny_sd3(), rule) == _expected_sd3(2)


def test_flux_rule_keeps_only_the_named_layers():
    rule = _rule("flux1", 3072, 32)
    model = _tiny_flux()
    assert _quantized(model, rule) == _expected_flux(model, rule.skip)


def test_the_real_configs_layer_sets_built_on_the_meta_device():
    # The published configurations, built without weights: the rule as the presets ship it.
    with torch.device("meta"):
        sana = diffusers.SanaTransformer2DModel(
            in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
            num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
            caption_channels=2304, mlp_ratio=2.5, sample_size=32, patch_size=1)
        sd3 = diffusers.SD3Transformer2DModel(
            sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64, num_attention_heads=38,
            joint_attention_dim=4096, caption_projection_dim=2432, pooled_projection_dim=2048, out_channels=16,
            pos_embed_max_size=192, qk_norm="rms_norm")
        flux = diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
            axes_dims_rope=(16, 56, 56))
    sana_rule = LayerRule.of(resolve_config("sana", "sol_rl").model)
    sana_entries = plan_layers(sana, sana_rule)
    assert {e.name for e in sana_entries if e.quantized} == _expected_sana(20)
    kv = next(e for e in sana_entries if e.name == "transformer_blocks.0.attn2.to_k")
    assert kv.shape == (2240, 2240) and kv.quantized  # 2240 alone, 4480 fused
    assert _quantized(sd3, LayerRule.of(resolve_config("sd3", "sol_rl").model)) == _expected_sd3(38)
    flux_rule = LayerRule.of(resolve_config("flux1", "sol_rl").model)
    assert _quantized(flux, flux_rule) == _expected_flux(flux, flux_rule.skip)


def test_the_report_says_which_rule_kept_each_layer():
    from solrl_core.precision.quantize import quantize_model

    report = quantize_model(_tiny_sana(), _rule("sana", 2240, 32), "nvfp4-emulated")
    data = report.to_dict()
    assert data["rule"]["min_dim"] == 32 and data["skipped_by_rule"]["min_dim"] > 0
    assert {e["rule"] for e in data["entries"] if not e["quantized"]} == {"name", "min_dim", "kernel"}
    assert "by max(in, out) <= 32" in report.summary() and "by name" in report.summary()


# --- sigma grids as the pipelines build them ------------------------------------------------------

@pytest.mark.parametrize("name", ["sd3", "sd35_medium"])
@pytest.mark.parametrize("steps", [10, 6])
def test_sd3_grid_is_the_sd35_schedulers_own(steps, name):
    cfg = resolve_config(name, "sol_rl").sampler
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)  # SD3.5-Large's and -Medium's scheduler config
    scheduler.set_timesteps(steps)
    ours = sigma_grid(steps, cfg.shift, cfg.sigma_grid)
    assert torch.allclose(ours, scheduler.sigmas.float(), atol=1e-6), (ours, scheduler.sigmas)
    assert abs(float(ours[-2]) - 0.0089) < 1e-4  # where linspace would end at shift(1/steps)


@pytest.mark.parametrize("steps", [10, 6])
def test_flux_grid_is_the_flux_pipelines(steps):
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    cfg = resolve_config("flux1", "sol_rl")
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                          base_image_seq_len=256, max_image_seq_len=4096, shift=3.0)
    tokens = (cfg.model.resolution // 16) ** 2  # 8x VAE, 2x2 packing
    mu = calculate_shift(tokens, 256, 4096, 0.5, 1.15)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
    ours = sigma_grid(steps, cfg.sampler.shift, cfg.sampler.sigma_grid)
    assert torch.allclose(ours, scheduler.sigmas.float(), atol=1e-4), (ours, scheduler.sigmas)


@pytest.mark.parametrize("steps", [10, 28, 3])
def test_qwen_image_grid_is_the_qwen_image_pipelines(steps):
    # Qwen/Qwen-Image's scheduler/scheduler_config.json, and QwenImagePipeline's sigmas and mu.
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    cfg = resolve_config("qwen_image", "sol_rl")
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                          base_image_seq_len=256, max_image_seq_len=8192,
                                                          shift_terminal=0.02,
                                                          time_shift_type="exponential")
    mu = calculate_shift((cfg.model.resolution // 16) ** 2, 256, 8192, 0.5, 0.9)  # 8x VAE, 2x2 packing
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
    ours = sigma_grid(steps, cfg.sampler.shift, cfg.sampler.sigma_grid)
    assert torch.allclose(ours, scheduler.sigmas.float(), atol=1e-4), (ours, scheduler.sigmas)
    assert abs(float(ours[-2]) - 0.02) < 1e-6


@pytest.mark.parametrize("steps", [6, 10])
def test_zimage_grid_is_the_zimage_pipelines(steps):
    # Tongyi-MAI/Z-Image-Turbo's scheduler (static shift 3, no dynamic shifting: the pipeline's mu is
    # unused) on ZImagePipeline's default sigmas, get_default_z_image_sigmas.
    from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

    cfg = resolve_config("zimage", "sol_rl").sampler
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    scheduler.set_timesteps(sigmas=get_default_z_image_sigmas(steps), mu=0.7)
    ours = sigma_grid(steps, cfg.shift, cfg.sigma_grid)
    assert torch.allclose(ours, scheduler.sigmas.float(), atol=1e-6), (ours, scheduler.sigmas)


def test_flux2_klein_grid_is_the_klein_pipelines_at_its_four_steps():
    # Flux2KleinPipeline: linspace(1, 1/n, n) sigmas and mu = compute_empirical_mu(image tokens, n), on
    # a scheduler with FLUX.2's dynamic exponential time shift; the preset's 4 distilled steps everywhere.
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    cfg = resolve_config("flux2_klein", "sol_rl")
    steps = cfg.sampler.steps
    assert steps == cfg.sampler.eval_steps == cfg.explore.steps == 4
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential",
                                                          shift=3.0)
    mu = compute_empirical_mu((cfg.model.resolution // 16) ** 2, steps)  # 8x VAE, 2x2 patches
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
    ours = sigma_grid(steps, cfg.sampler.shift, cfg.sampler.sigma_grid)
    assert torch.allclose(ours, scheduler.sigmas.float(), atol=1e-5), (ours, scheduler.sigmas)


def test_sana_grid_is_plain_linspace():
    cfg = resolve_config("sana", "sol_rl").sampler
    assert torch.allclose(sigma_grid(10, cfg.shift, cfg.sigma_grid), torch.linspace(1, 0, 11))


def test_unknown_grid_is_refused():
    from solrl_core.errors import SolrlError

    with pytest.raises(SolrlError, match="sampler.sigma_grid"):
        resolve_config("sd3", "sol_rl", sets=["sampler.sigma_grid=karras"])


# --- presets ---------------------------------------------------------------------------------------

def test_presets_carry_the_official_clips_and_min_dims():
    expected = {"sana": (1.0, 2240), "sana15": (1.0, 2240), "sana_600m": (1.0, 2240), "sd3": (0.002, 2432),
                "flux1": (1.0, 1000)}
    for name, (clip, min_dim) in expected.items():
        cfg = resolve_config(name, "sol_rl")
        assert (cfg.optimizer.grad_clip, cfg.model.quant_min_dim) == (clip, min_dim), name
        assert cfg.model.prompt_instruction is False


# --- the old-policy decay and the EMA count the step just taken ------------------------------------

def test_decay_and_ema_use_the_step_count_after_the_increment(fast_sets):
    cfg = resolve_config("tiny", "sol_rl", sets=fast_sets("run.iterations=2", "run.eval_prompts="))
    bus = ev.EventBus()
    seen: list[object] = []
    bus.subscribe(seen.append)
    session = train(cfg, bus, stop=StopFlag())
    its = [e for e in seen if isinstance(e, ev.IterationFinished)]
    rate = cfg.algorithm.old_decay_rate
    assert [e.old_decay for e in its] == pytest.approx([rate * 1, rate * 2])
    assert session.state.step == 2
