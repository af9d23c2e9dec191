"""Swapping a model's GEMM layers for emulated NVFP4 ones: what is wrapped, and what still works."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solrl_core.precision.nvfp4 import fake_quantize_1d, fake_quantize_2d
from solrl_core.precision.quantize import (
    EmulatedNVFP4Conv1x1,
    EmulatedNVFP4Linear,
    LayerEntry,
    QuantReport,
    quantize_model,
    requantize,
)

SANA_SKIP = ("patch_embed", "time_embed", "caption_projection", "proj_out", "caption_norm")


@pytest.fixture(scope="module")
def sana() -> nn.Module:
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.SanaTransformer2DModel(
        in_channels=3,
        out_channels=3,
        num_attention_heads=2,
        attention_head_dim=32,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=32,
        cross_attention_dim=64,
        caption_channels=32,
        sample_size=32,
        patch_size=4,
    )
    return model.eval()


def _sana_inputs(batch: int = 2, tokens: int = 8) -> dict:
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(batch, tokens, dtype=torch.long)
    mask[1, 5:] = 0
    return dict(
        hidden_states=torch.randn(batch, 3, 32, 32, generator=g),
        encoder_hidden_states=torch.randn(batch, tokens, 32, generator=g),
        timestep=torch.rand(batch, generator=g) * 1000,
        encoder_attention_mask=mask,
        return_dict=False,
    )


def test_sana_layers_quantized_and_skipped(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    report = quantize_model(model, SANA_SKIP)
    quantized = {e.name for e in report.quantized}
    skipped = {e.name: e.reason for e in report.skipped}

    for block in (0, 1):
        for attn in ("attn1", "attn2"):
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                name = f"transformer_blocks.{block}.{attn}.{proj}"
                assert name in quantized
                assert isinstance(model.get_submodule(name), EmulatedNVFP4Linear)
        for conv in ("conv_inverted", "conv_point"):
            name = f"transformer_blocks.{block}.ff.{conv}"
            assert name in quantized
            assert isinstance(model.get_submodule(name), EmulatedNVFP4Conv1x1)
        depth = f"transformer_blocks.{block}.ff.conv_depth"
        assert skipped[depth] == "conv kernel 3x3"
        assert type(model.get_submodule(depth)) is nn.Conv2d

    assert skipped["patch_embed.proj"] == "skip pattern 'patch_embed'"
    assert skipped["proj_out"] == "skip pattern 'proj_out'"
    assert skipped["time_embed.linear"] == "skip pattern 'time_embed'"
    assert skipped["caption_projection.linear_1"] == "skip pattern 'caption_projection'"
    assert len(quantized) == 20
    # Every Linear and Conv2d of the original model is in the report, once.
    layers = [n for n, m in sana.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert [e.name for e in report.entries] == layers
    assert all(isinstance(e, LayerEntry) for e in report.entries)


def test_sana_state_dict_keys_unchanged_and_loadable(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    before = model.state_dict()
    quantize_model(model, SANA_SKIP)
    after = model.state_dict()
    assert list(after.keys()) == list(before.keys())
    assert all(torch.equal(after[k], before[k]) for k in before)
    # The original (unquantized) model's checkpoint loads strictly into the quantized copy.
    result = model.load_state_dict(sana.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys


def test_sana_forward_close_but_not_equal(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    quantize_model(model, SANA_SKIP)
    inputs = _sana_inputs()
    with torch.no_grad():
        reference = sana(**inputs)[0]
        out = model(**inputs)[0]
    assert out.shape == reference.shape == (2, 3, 32, 32)
    assert torch.isfinite(out).all()
    assert not torch.equal(out, reference)
    rel = ((out - reference).norm() / reference.norm()).item()
    assert 0.0 < rel < 0.3, rel


def test_sana_requantize_after_loading_new_weights(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    quantize_model(model, SANA_SKIP)
    wrappers = {n: m for n, m in model.named_modules() if isinstance(m, EmulatedNVFP4Linear)}
    wrappers |= {n: m for n, m in model.named_modules() if isinstance(m, EmulatedNVFP4Conv1x1)}
    cached = {n: m.weight_q.clone() for n, m in wrappers.items()}

    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in sana.state_dict().items()}
    model.load_state_dict(new_state)
    for name, module in wrappers.items():
        # Loaded into the wrapper, visible through the wrapped layer, cache not yet refreshed.
        assert torch.equal(module.weight, new_state[f"{name}.weight"])
        assert module.wrapped.weight is module.weight
        assert torch.equal(module.weight_q, cached[name])

    requantize(model)
    for name, module in wrappers.items():
        assert not torch.equal(module.weight_q, cached[name])
        expected = fake_quantize_2d(module.weight.detach().flatten(1)).view_as(module.weight)
        assert torch.equal(module.weight_q, expected)


def test_quantize_twice_does_not_double_wrap(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    first = quantize_model(model, SANA_SKIP)
    keys = list(model.state_dict().keys())
    second = quantize_model(model, SANA_SKIP)
    assert second == first
    assert list(model.state_dict().keys()) == keys
    wrappers = (EmulatedNVFP4Linear, EmulatedNVFP4Conv1x1)
    for module in model.modules():
        if isinstance(module, wrappers):
            assert not any(isinstance(child, wrappers) for child in module.children())
            assert type(module.wrapped) in (nn.Linear, nn.Conv2d)


def test_rerun_with_new_skip_pattern_unwraps(sana: nn.Module) -> None:
    model = copy.deepcopy(sana)
    quantize_model(model, SANA_SKIP)
    report = quantize_model(model, (*SANA_SKIP, "attn2"))
    name = "transformer_blocks.0.attn2.to_q"
    assert type(model.get_submodule(name)) is nn.Linear
    assert {e.name: e.reason for e in report.skipped}[name] == "skip pattern 'attn2'"
    assert len(report.quantized) == 12


def test_report_summary_and_json(sana: nn.Module) -> None:
    report = quantize_model(copy.deepcopy(sana), SANA_SKIP)
    assert isinstance(report, QuantReport)
    assert re.fullmatch(r"quantized 20 of 29 layers \(\S+ of \S+ weights\); kept in high precision: 2 not a plain "
                        r"GEMM, 7 by name", report.summary())
    data = json.loads(json.dumps(report.to_dict()))
    assert data["quantized_layers"] == 20 and data["total_layers"] == 29
    assert data["quantized_weights"] == sum(e.numel for e in report.quantized)
    assert data["entries"][0]["shape"] == [64, 3, 4, 4]
    assert {e["reason"] for e in data["entries"] if e["quantized"]} == {""}


def test_linear_wrapper_forward_is_exact() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    wrapper = EmulatedNVFP4Linear(linear)
    x = torch.randn(3, 5, 64)
    expected = F.linear(fake_quantize_1d(x), fake_quantize_2d(linear.weight.detach()), linear.bias)
    assert torch.equal(wrapper(x), expected)
    assert wrapper.wrapped is linear


def test_conv1x1_wrapper_quantizes_along_channels() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 48, kernel_size=1, bias=False)
    wrapper = EmulatedNVFP4Conv1x1(conv)
    x = torch.randn(2, 32, 5, 7)
    x_q = fake_quantize_1d(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    w_q = fake_quantize_2d(conv.weight.detach().flatten(1)).view_as(conv.weight)
    assert torch.equal(wrapper(x), F.conv2d(x_q, w_q))
    # Same numbers as a quantized linear over channels (up to summation order).
    linear = nn.Linear(32, 48, bias=False)
    linear.weight.data.copy_(conv.weight.detach().flatten(1))
    as_linear = EmulatedNVFP4Linear(linear)(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    torch.testing.assert_close(wrapper(x), as_linear)


def test_skip_reasons_on_a_small_model() -> None:
    model = nn.Sequential(
        nn.Linear(32, 48),  # quantized
        nn.Linear(48, 20),  # out dim 20
        nn.Conv2d(32, 32, kernel_size=1, groups=2),
        nn.Conv2d(32, 32, kernel_size=1, stride=2),
        nn.Conv2d(32, 32, kernel_size=3, padding=1),
        nn.Conv2d(32, 32, kernel_size=1),  # quantized
        nn.Linear(32, 32),  # skipped by name
    )
    report = quantize_model(model, skip=("6",))
    reasons = {e.name: e.reason for e in report.entries}
    assert reasons == {
        "0": "",
        "1": "shape not divisible by 16",
        "2": "grouped conv (groups=2)",
        "3": "conv stride 2x2",
        "4": "conv kernel 3x3",
        "5": "",
        "6": "skip pattern '6'",
    }
    kinds = [e.kind for e in report.entries]
    assert kinds == ["linear", "linear", "conv1x1", "conv1x1", "conv2d", "conv1x1", "linear"]
    assert report.summary().startswith("quantized 2 of 7 layers")


def test_bfloat16_model_and_device_move() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16)).to(torch.bfloat16)
    quantize_model(model, skip=())
    assert model[0].weight_q.dtype == torch.bfloat16
    out = model(torch.randn(4, 32, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (4, 16)
    # .to() moves the shared parameters and the cache together; requantize after a dtype change.
    model.float()
    assert model[0].weight.dtype == model[0].weight_q.dtype == torch.float32
    assert model[0].wrapped.weight is model[0].weight
    requantize(model)
    assert torch.equal(model[0].weight_q, fake_quantize_2d(model[0].weight.detach()))


def test_requantize_without_wrappers_is_a_no_op() -> None:
    model = nn.Sequential(nn.Linear(32, 32))
    requantize(model)
    assert type(model[0]) is nn.Linear
