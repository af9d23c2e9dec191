"""`fp8-e5m2-delayed`: the official explore recipe (TE DelayedScaling, E5M2, history 16, "max"), checked
call by call against a plain transcription of Transformer Engine's formula."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from solrl_core.precision.quantize import LayerRule, quantize_model, requantize

E5M2_MAX = 57344.0
FP32_MAX = torch.finfo(torch.float32).max


def _e5m2(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (t.float() * scale).clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2).float()


class TeLinear:
    """One te.Linear under DelayedScaling(amax_history_len=16, amax_compute_algo="max"), written from TE's
    code with plain lists: the cast kernel max-accumulates |t| into history row 0; at the autocast exit
    with autograd on (quantization.py autocast_exit), delayed_scaling.cu's kernel rolls the history
    ([0, h2 .. h15, h0]), takes the max of h1..h15 and h0, and sets scale = fp8_max / amax."""

    def __init__(self, layer: nn.Linear) -> None:
        self.weight, self.bias = layer.weight.detach().clone(), layer.bias.detach().clone()
        self.history = {"x": [0.0] * 16, "w": [0.0] * 16}
        self.scale = {"x": torch.tensor(1.0), "w": torch.tensor(1.0)}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for key, t in (("x", x), ("w", self.weight)):
            self.history[key][0] = max(self.history[key][0], t.abs().max().item())
        sx, sw = self.scale["x"], self.scale["w"]
        y = torch.nn.functional.linear(_e5m2(x, sx), _e5m2(self.weight, sw)) * ((1.0 / sx) * (1.0 / sw))
        return (y + self.bias.float()).to(x.dtype)

    def update(self) -> None:
        for key, h in self.history.items():
            newest = h[0]
            if newest == 0.0:
                continue
            rolled = h[1:] + [newest]
            self.history[key] = [0.0] + rolled[1:]
            amax = max(rolled)
            if math.isfinite(amax) and amax > 0:
                scale = torch.tensor(E5M2_MAX) / torch.tensor(amax)
                self.scale[key] = torch.tensor(FP32_MAX) if torch.isinf(scale) else scale


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16))


def test_delayed_scaling_follows_te_call_by_call_across_a_refresh():
    net = _net()
    refs = [TeLinear(net[0]), TeLinear(net[2])]
    quantize_model(net, LayerRule(), "fp8-e5m2-delayed")
    gen = torch.Generator().manual_seed(1)
    seen_scales = set()
    for call in range(24):
        x = torch.randn(5, 32, generator=gen) * 10 ** (4 * torch.rand(1, generator=gen).item() - 2)
        if call == 12:  # the copy's refresh: new weights, the histories carry on (TE keeps them in the layer)
            with torch.no_grad():
                for layer, ref in zip((net[0], net[2]), refs):
                    layer.weight.mul_(3.0)
                    ref.weight = ref.weight * 3.0
            requantize(net)
        if call == 0:  # the first call runs at scale 1
            assert all(torch.equal(layer.scaling.scale, torch.ones(2)) for layer in (net[0], net[2]))
        grad = call % 5 != 3  # TE updates only at an autocast exit with autograd on
        with torch.set_grad_enabled(grad):
            got = net(x)
        want = refs[1](torch.nn.functional.gelu(refs[0](x)))
        if grad:
            for ref in refs:
                ref.update()
        assert torch.allclose(got.detach(), want, rtol=1e-5, atol=1e-6), call
        for layer, ref in zip((net[0], net[2]), refs):
            state = layer.scaling
            assert torch.equal(state.scale, torch.stack([ref.scale["x"], ref.scale["w"]])), call
            assert state.amax_history[:, 0].tolist() == ref.history["x"], call
            assert state.amax_history[:, 1].tolist() == ref.history["w"], call
            seen_scales.add(round(state.scale[0].item(), 3))
    assert len(seen_scales) > 5  # the inputs' range moved the scales


def test_the_first_call_and_every_call_without_autograd_run_at_scale_one():
    net = _net()
    quantize_model(net, LayerRule(), "fp8-e5m2-delayed")
    x = torch.randn(4, 32) * 1e-3  # far below 1: at scale 1 most of it is subnormal or zero in E5M2
    first = net[0](x)
    plain = torch.nn.functional.linear(_e5m2(x, torch.tensor(1.0)),
                                       _e5m2(net[0].weight, torch.tensor(1.0))) + net[0].bias
    assert torch.allclose(first.detach(), plain, rtol=1e-6, atol=1e-7)
    with torch.no_grad():  # rollouts: TE never updates the scales there
        for _ in range(20):
            net(x)
    assert torch.equal(net[0].scaling.scale, torch.ones(2))
    assert net[0].scaling.amax_history[0, 0].item() == pytest.approx(x.abs().max().item())
    net(x)  # one forward with autograd on: the scales move to fp8_max / amax
    assert net[0].scaling.scale[0].item() == pytest.approx(E5M2_MAX / x.abs().max().item(), rel=1e-6)


def test_sanas_key_and_value_share_one_fused_scale():
    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.to_q, self.to_k, self.to_v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.to_q(x) + self.to_k(x) + self.to_v(x)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn2 = Attn()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn2(x)

    torch.manual_seed(0)
    block = Block()
    with torch.no_grad():
        block.attn2.to_v.weight.mul_(4.0)  # V's amax well above K's
    quantize_model(block, LayerRule(fused=("attn2.to_k+attn2.to_v",)), "fp8-e5m2-delayed")
    k, v, q = block.attn2.to_k, block.attn2.to_v, block.attn2.to_q
    assert k.scaling is v.scaling and q.scaling is not k.scaling
    block(torch.randn(3, 32))
    fused_amax = max(k.weight.abs().max().item(), v.weight.abs().max().item())
    assert k.scaling.scale[1].item() == pytest.approx(E5M2_MAX / fused_amax, rel=1e-6)
    assert q.scaling.scale[1].item() == pytest.approx(E5M2_MAX / q.weight.abs().max().item(), rel=1e-6)


def test_rank_check_runs_the_official_recipe_on_the_tiny_world(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from solrl_cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["rank-check", "--explore-precision", "fp8-e5m2-delayed", "--count", "2",
                                      "--seeds", "16", "--preview-steps", "2", "--full-steps", "4", "--out", "rc"])
    assert result.exit_code == 0, result.output
    assert "fp8-e5m2-delayed@2" in result.output
    overall = json.loads((tmp_path / "rc" / "rank_check.json").read_text())["overall"]
    assert 0.0 <= overall["fp8-e5m2-delayed@2"]["top8"] <= 1.0


def test_the_real_fp8_gemm_path_computes_what_the_emulation_does():
    """`torch._scaled_mm` with two E5M2 operands (CPU: torch's reference kernel; CUDA where cuBLASLt
    has one) against the codes multiplied in fp32: the same scales, the same product."""
    from solrl_core.precision.e5m2_delayed import cast, gemm, real_gemm

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 32, generator=gen), torch.randn(16, 32, generator=gen)
    sx, sw = torch.tensor(3.0), torch.tensor(0.5)
    x_q, w_q = cast(x, sx), cast(w, sw)
    emulated = gemm(x_q, w_q, 1.0 / sx, 1.0 / sw, real=False)
    assert torch.allclose(gemm(x_q, w_q, 1.0 / sx, 1.0 / sw, real=True), emulated, rtol=1e-5, atol=1e-5)
    assert torch.allclose(emulated, _e5m2(x, sx) @ _e5m2(w, sw).T / (sx * sw), rtol=1e-5, atol=1e-5)
    assert not real_gemm(torch.device("cpu"))  # a reference kernel is no faster than the fp32 product


@pytest.mark.parametrize("error", [ValueError, RuntimeError])
def test_the_e5m2_probe_takes_either_refusal_torch_raises_as_no(monkeypatch, error):
    """Current torch refuses an E5M2 x E5M2 `_scaled_mm` with a ValueError (TORCH_CHECK_VALUE), older
    releases with a RuntimeError: the probe must answer "no" to both, not crash the first CUDA forward."""
    from solrl_core.precision import e5m2_delayed

    def refuses(*args, **kwargs):
        raise error("Multiplication of two Float8_e5m2 matrices is not supported")

    monkeypatch.setattr(torch, "_scaled_mm", refuses)
    assert e5m2_delayed.e5m2_gemm_runs(torch.device("cpu")) is False
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, **kw: a.float() @ b.float())
    assert e5m2_delayed.e5m2_gemm_runs(torch.device("cpu")) is True
