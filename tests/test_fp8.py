"""The fp8 explore backend: E4M3 quantization, the scaled GEMM wrappers and the explore copy built
from them. torch._scaled_mm has a CPU kernel with the same numerics as the GPU's (no speed-up), so
everything but the speed is checked here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solrl_core.engine.rollout import RolloutCopy
from solrl_core.precision import fp8
from solrl_core.precision.quantize import (
    EmulatedNVFP4Linear,
    Fp8Conv1x1,
    Fp8Linear,
    quantize_model,
    requantize,
)

# Every finite E4M3 magnitude: 3 mantissa bits, exponent bias 7, no infinities, 448 the largest.
E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_VALUES = E4M3_VALUES[torch.isfinite(E4M3_VALUES)].unique()


def _reference(x: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """Quantize-dequantize by hand: scale so the row (or tensor) maximum maps to 448, then round
    each value to the nearest E4M3 value (ties to even, as the cast does)."""
    amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax()
    scale = (amax / 448.0).clamp(min=1e-12)
    y = (x / scale).clamp(-448, 448)
    return y.to(torch.float8_e4m3fn).float() * scale


@pytest.mark.parametrize("rowwise", [True, False])
def test_quantize_maps_the_row_maximum_to_448_and_rounds_to_e4m3(rowwise):
    torch.manual_seed(0)
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 8).unsqueeze(1)
    values, scale = fp8.quantize(x, rowwise)
    assert values.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert scale.shape == ((8, 1) if rowwise else (1, 1))
    # every stored value is an E4M3 value, and the largest magnitude of each row (tensor) is 448
    assert torch.isin(values.float(), torch.cat([E4M3_VALUES, -E4M3_VALUES])).all()
    peak = values.float().abs().amax(dim=-1) if rowwise else values.float().abs().amax()
    assert torch.equal(peak, torch.full_like(peak, 448.0))
    deq = fp8.dequantize(values, scale)
    assert torch.allclose(deq, _reference(x, rowwise), rtol=0, atol=0)
    # 3 mantissa bits: within half a step, 2^-4 relative, for normal numbers (above 2^-6 * scale)
    normal = (x / scale).abs() >= 2.0 ** -6
    rel = ((deq - x).abs() / x.abs())[normal]
    assert rel.max() <= 2.0 ** -4 + 1e-7


def test_quantize_an_all_zero_row_gives_zeros_not_nan():
    x = torch.zeros(3, 32)
    x[1] = torch.linspace(-1, 1, 32)
    values, scale = fp8.quantize(x, True)
    deq = fp8.dequantize(values, scale)
    assert torch.isfinite(deq).all() and torch.equal(deq[0], torch.zeros(32)) and torch.equal(deq[2], torch.zeros(32))


@pytest.mark.parametrize("rowwise", [True, False])
def test_linear_is_the_gemm_of_the_quantized_operands(rowwise):
    torch.manual_seed(1)
    layer = nn.Linear(64, 48)
    x = torch.randn(2, 5, 64)
    w_q, w_s = fp8.quantize(layer.weight.detach(), rowwise)
    y = fp8.linear(x, w_q, w_s.reshape(1, -1), layer.bias, rowwise)
    expected = (_reference(x.reshape(-1, 64).double(), rowwise) @ _reference(layer.weight.detach().double(), rowwise).T
                + layer.bias.double()).reshape(2, 5, 48)
    assert y.shape == (2, 5, 48) and y.dtype == torch.float32
    assert torch.allclose(y.double(), expected, rtol=1e-5, atol=1e-5)
    # and close to the full-precision layer: a few percent of its output scale
    exact = layer(x)
    assert (y - exact).abs().max() < 0.05 * exact.abs().max()


def test_wrappers_match_their_layers_and_keep_the_parameters():
    torch.manual_seed(2)
    linear, conv = nn.Linear(32, 64), nn.Conv2d(32, 64, 1)
    conv.weight.data = linear.weight.data.reshape(64, 32, 1, 1).clone()
    conv.bias.data = linear.bias.data.clone()
    q_linear, q_conv = Fp8Linear(linear), Fp8Conv1x1(conv)
    assert q_linear.weight is linear.weight and q_conv.bias is conv.bias
    x = torch.randn(2, 32, 4, 4)
    by_conv = q_conv(x)
    by_linear = q_linear(x.movedim(1, -1)).movedim(-1, 1)
    assert by_conv.shape == (2, 64, 4, 4)
    assert torch.allclose(by_conv, by_linear, atol=1e-6)
    assert (by_conv - conv(x)).abs().max() < 0.05 * conv(x).abs().max()
    assert q_linear.weight_q.dtype == torch.float8_e4m3fn and q_linear.weight_scale.shape == (1, 64)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.proj = nn.Linear(64, 64)
        self.ff = nn.Conv2d(64, 128, 1)
        self.odd = nn.Linear(64, 24)
        self.out = nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(x))
        h = self.ff(h.movedim(-1, 1).unsqueeze(-1)).squeeze(-1).movedim(1, -1)
        return self.out(F.gelu(h)) + self.odd(self.proj(self.embed(x))).sum(-1, keepdim=True)


def test_fp8_covers_the_same_layers_as_the_emulation_and_swaps_precisions_in_place():
    torch.manual_seed(3)
    model = _Block()
    keys = list(model.state_dict())
    emulated = quantize_model(copy.deepcopy(model), ("embed", "out"), "nvfp4-emulated")
    report = quantize_model(model, ("embed", "out"), "fp8")
    assert report.entries == emulated.entries
    assert (report.precision, emulated.precision) == ("fp8", "nvfp4-emulated")
    assert report.to_dict()["precision"] == "fp8"
    assert [e.name for e in report.quantized] == ["proj", "ff"]
    assert dict((e.name, e.reason) for e in report.skipped) == {
        "embed": "skip pattern 'embed'", "odd": "shape not divisible by 16", "out": "skip pattern 'out'"}
    assert isinstance(model.proj, Fp8Linear) and isinstance(model.ff, Fp8Conv1x1)
    assert list(model.state_dict()) == keys
    # switching precision re-wraps the same layers, never twice
    quantize_model(model, ("embed", "out"), "nvfp4-emulated")
    assert isinstance(model.proj, EmulatedNVFP4Linear) and not isinstance(model.proj.wrapped, EmulatedNVFP4Linear)
    quantize_model(model, ("embed", "out"), "fp8")
    assert isinstance(model.proj, Fp8Linear) and type(model.proj.wrapped) is nn.Linear
    with pytest.raises(ValueError, match="no quantized layers for precision 'int4'"):
        quantize_model(model, (), "int4")


def test_requantize_follows_new_weights_in_place():
    torch.manual_seed(4)
    model = _Block()
    quantize_model(model, ("embed", "out"), "fp8")
    cache = model.proj.weight_q
    x = torch.randn(3, 5, 16)
    before = model(x)
    new = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(new)
    stale = model(x)
    requantize(model)
    assert model.proj.weight_q is cache  # same storage: a compiled or captured graph reads the new values
    fresh = model(x)
    reference = _Block()
    reference.load_state_dict(new)
    quantize_model(reference, ("embed", "out"), "fp8")
    assert torch.equal(fresh, reference(x))
    assert not torch.equal(stale, fresh) and not torch.equal(before, fresh)


def test_an_fp8_explore_copy_generates_close_to_full_precision():
    from solrl_core.config.presets import resolve_config
    from solrl_core.config.schema import ModelConfig
    from solrl_core.data.tinyworld import SIZE
    from solrl_core.engine.sampler import Sampler
    from solrl_core.loop.evaluation import eval_seeds
    from solrl_core.models.tiny import build_tiny

    model = build_tiny(ModelConfig(loader="tiny", weights="tinyworld", resolution=SIZE), torch.device("cpu"),
                       torch.float32)
    prompts = ["a red circle", "two blue squares"]
    cond, seeds = model.encode(prompts), eval_seeds(2, 1)
    skip = resolve_config("tiny", "sol_rl").model.quant_skip
    copies = {p: RolloutCopy(copy.deepcopy(model.transformer), p, skip) for p in ("fp8", "fp32")}
    assert copies["fp8"].report is not None and copies["fp8"].report.quantized
    out = {p: Sampler(batch_size=2).generate(model, c.forward, cond, seeds, 6, torch.float32)
           for p, c in copies.items()}
    err = (out["fp8"] - out["fp32"]).abs().mean() / out["fp32"].abs().mean()
    assert 0 < err < 0.05


def _precision_and_wrappers(name: str) -> tuple[str, tuple[type, type] | None]:
    if name != "fp8-torchao":
        return name, None
    pytest.importorskip("torchao")
    from solrl_core.precision.backends import wrappers_for

    return "fp8", wrappers_for("fp8", "torchao")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp8", "nvfp4-emulated", "fp8-torchao"])
def test_a_compiled_copy_follows_refreshes_without_recompiling(precision):
    """explore.compile: refreshed weights reach the compiled graph, and the refresh (in-place
    re-quantization) does not trigger a recompile; fp8's torchao backend compiles to one graph (a
    break at each layer would keep its input quantization out of the kernel before it)."""
    import torch._dynamo

    precision, wrappers = _precision_and_wrappers(precision)
    torch._dynamo.reset()  # no graphs left from other tests: every compile here is this test's own
    torch.manual_seed(5)
    model = _Block()
    quantize_model(model, ("embed", "out"), precision, wrappers)
    compiled = torch.compile(model, fullgraph=wrappers is not None)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        first = compiled(x)
        new = {k: v + 0.1 * torch.randn_like(v) for k, v in model.state_dict().items()}
        model.load_state_dict(new)
        requantize(model)
        with torch._dynamo.config.patch(error_on_recompile=True):
            second = compiled(x)
    reference = _Block()
    reference.load_state_dict(new)
    quantize_model(reference, ("embed", "out"), precision, wrappers)
    with torch.no_grad():
        expected = reference(x)
    assert not torch.allclose(first, second)
    assert torch.allclose(second, expected, rtol=1e-4, atol=1e-4)
