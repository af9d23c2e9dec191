"""The explore backends' numerics on a CPU, against the exact references: real NVFP4 (torchao's
NVFP4Tensor over solrl's quantizer) against the emulation, torchao's fp8 against fp8's own reference
kernel; which backend each precision uses, and which the plan picks on a CPU, sm_90 and sm_100.

The FP4 GEMM has no CPU kernel: `torch._scaled_mm` is replaced by a reference that decodes the
float4 operands and the swizzled E4M3 scales from cuBLAS's documented layout, written here from its
formula (not torchao's `from_blocked`), so what torchao hands the kernel is checked too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solrl_core.config.presets import resolve_config
from solrl_core.engine.rollout import RolloutCopy
from solrl_core.errors import SolrlError
from solrl_core.plan.resolve import resolve_machine
from solrl_core.precision import backends, hardware, nvfp4_gemm
from solrl_core.precision.nvfp4 import E2M1_VALUES, fake_quantize_2d
from solrl_core.precision.quantize import (EmulatedNVFP4Conv1x1, EmulatedNVFP4Linear, Fp8Conv1x1, Fp8Linear,
                                           quantize_model)

pytest.importorskip("torchao")  # in the dev extra: CI runs these

H100 = hardware.GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 79.6)
B200 = hardware.GpuInfo(0, "NVIDIA B200", (10, 0), 180.0)
CUDA = torch.device("cuda", 0)
_E2M1 = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))


def _decode_fp4(data: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, K/2] -> float32 [rows, K]: the low nibble first, E2M1 codes 0-7 positive, 8-15 negative."""
    b = data.view(torch.uint8)
    return torch.stack([_E2M1[(b & 0xF).long()], _E2M1[(b >> 4).long()]], -1).reshape(b.shape[0], -1)


def _unswizzle(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """cuBLAS's block-scaling-factor layout: 128x4 tiles of scales, each stored as 32x16 with row r
    at (r % 32) * 16 + (r % 128) // 32 * 4 and column c at c % 4; tiles row-major."""
    col_tiles = -(-cols // 4)
    r, c = torch.arange(rows)[:, None], torch.arange(cols)[None, :]
    index = (r // 128) * col_tiles * 512 + (c // 4) * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4
    return flat.reshape(-1).float()[index]


@pytest.fixture
def fp4_kernel(monkeypatch):
    """A CPU stand-in for the float4 `torch._scaled_mm`; records the dtypes it was called with."""
    calls = []

    def scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None, **_):  # type: ignore[no-untyped-def]
        calls.append((a.dtype, b.dtype, scale_a.dtype, scale_b.dtype))
        m, n, k = a.shape[0], b.shape[1], a.shape[1] * 2
        a_hp = _decode_fp4(a) * _unswizzle(scale_a, m, k // 16).repeat_interleave(16, 1)
        b_hp = _decode_fp4(b.t()) * _unswizzle(scale_b, n, k // 16).repeat_interleave(16, 1)
        y = a_hp @ b_hp.t()
        return (y if bias is None else y + bias).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    return calls


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 64)
        self.proj = nn.Linear(64, 96)
        self.ff = nn.Conv2d(96, 128, 1)
        self.out = nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(x))
        h = self.ff(h.movedim(-1, 1).unsqueeze(-1)).squeeze(-1).movedim(1, -1)
        return self.out(F.gelu(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_real_nvfp4_layers_reach_the_float4_gemm_and_equal_the_emulated_layers(fp4_kernel, dtype):
    """The layers hand torch._scaled_mm float4 operands and E4M3 scales whose product is the
    emulation's; the output equals the emulated layer's to fp32 accumulation rounding."""
    torch.manual_seed(0)
    linear, conv = nn.Linear(64, 48).to(dtype), nn.Conv2d(64, 32, 1).to(dtype)
    x = torch.randn(3, 40, 64).to(dtype)
    image = torch.randn(2, 64, 5, 7).to(dtype).to(memory_format=torch.channels_last)
    pairs = ((backends.Nvfp4Linear(copy.deepcopy(linear)), EmulatedNVFP4Linear(linear), x),
             (backends.Nvfp4Conv1x1(copy.deepcopy(conv)), EmulatedNVFP4Conv1x1(conv), image))
    for real, emulated, inp in pairs:
        with torch.no_grad():
            got, want = real(inp), emulated(inp)
        assert got.shape == want.shape and got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: both outputs rounded to bf16 once
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * want.abs().max().item())
    assert fp4_kernel and all(c == (torch.float4_e2m1fn_x2,) * 2 + (torch.float8_e4m3fn,) * 2 for c in fp4_kernel)


def test_an_nvfp4_copy_refreshes_into_the_same_caches_as_the_emulation(fp4_kernel):
    """A refresh re-quantizes in place (a compiled graph keeps reading the same tensors), and the
    packed weight it writes dequantizes to the emulated copy's weight bit for bit."""
    torch.manual_seed(1)
    base = _Block()
    real = RolloutCopy(copy.deepcopy(base), "nvfp4", ("embed", "out"))
    emulated = RolloutCopy(copy.deepcopy(base), "nvfp4-emulated", ("embed", "out"))
    layer = real.module.proj
    assert isinstance(layer, backends.Nvfp4Linear) and isinstance(real.module.ff, backends.Nvfp4Conv1x1)
    before = {name: getattr(layer, name) for name in layer.CACHES}
    new = {k: v + 0.1 * torch.randn_like(v) for k, v in base.state_dict().items()}
    real.refresh(new)
    emulated.refresh(new)
    assert all(getattr(layer, name) is t for name, t in before.items())  # written in place
    for name in ("proj", "ff"):
        r, e = real.module.get_submodule(name), emulated.module.get_submodule(name)
        w = e.weight_q.reshape(e.weight_q.shape[0], -1)
        got = nvfp4_gemm.dequantize(r.weight_packed, r.weight_block_scale, r.weight_s_enc, tuple(w.shape))
        assert torch.equal(got.view(torch.int32), w.view(torch.int32))
        assert torch.equal(w, fake_quantize_2d(new[f"{name}.weight"].reshape(w.shape)))
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(real.forward(x), emulated.forward(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torchao_fp8_equals_fp8s_reference_kernel(dtype):
    """torchao's Float8 PerRow layers against solrl's fp8 wrapper, both through torch's CPU
    reference `_scaled_mm`: bit for bit on fp32 inputs; on bf16 ones torchao rounds each row's scale
    to bf16, so codes may sit one E4M3 step apart: within 2 steps of the scale (2^-3) relative."""
    torch.manual_seed(2)
    layer, conv = nn.Linear(64, 48).to(dtype), nn.Conv2d(64, 32, 1).to(dtype)
    x = torch.randn(4, 9, 64).to(dtype)
    image = torch.randn(2, 64, 3, 5).to(dtype).to(memory_format=torch.channels_last)
    for ours, theirs, inp in ((Fp8Linear(copy.deepcopy(layer)), backends.TorchaoFp8Linear(layer), x),
                              (Fp8Conv1x1(copy.deepcopy(conv)), backends.TorchaoFp8Conv1x1(conv), image)):
        with torch.no_grad():
            want, got = ours(inp), theirs(inp)
        assert got.shape == want.shape and got.dtype == dtype
        if dtype == torch.float32:
            assert torch.equal(got, want)
            assert torch.equal(theirs.weight_q.view(torch.uint8), ours.weight_q.view(torch.uint8))
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -3, atol=2 ** -3 * want.abs().max().item())


def test_fp8_backend_is_a_setting_and_the_copy_uses_it():
    base = _Block()
    for name, cls in (("scaled_mm", Fp8Linear), ("torchao", backends.TorchaoFp8Linear)):
        made = RolloutCopy(copy.deepcopy(base), "fp8", ("embed", "out"), fp8_backend=name)
        assert type(made.module.proj) is cls
    quantize_model(made.module, ("embed", "out"), "fp8")  # back to the default backend: swapped, not kept
    assert type(made.module.proj) is Fp8Linear
    assert resolve_config("tiny", "sol_rl", sets=["explore.fp8_backend=torchao"]).explore.fp8_backend == "torchao"
    with pytest.raises(SolrlError, match="explore.fp8_backend"):
        resolve_config("tiny", "sol_rl", sets=["explore.fp8_backend=cutlass"])


def test_auto_picks_real_nvfp4_on_blackwell_and_says_it_is_unmeasured(monkeypatch):
    sana = resolve_config("sana", "sol_rl")
    b200 = resolve_machine(sana, CUDA, "bf16", gpu=B200)
    assert b200.explore_precision == "nvfp4" and "unmeasured on this GPU" in b200.explore_why
    assert "torchao" in b200.explore_why and "unmeasured on this GPU" in b200.describe()
    h100 = resolve_machine(sana, CUDA, "bf16", gpu=H100)
    assert h100.explore_precision == "fp8" and "unmeasured" not in h100.explore_why  # timed on an H100
    chosen = resolve_machine(resolve_config("sana", "sol_rl",
                                            sets=["explore.precision=fp8", "explore.fp8_backend=torchao"]),
                             CUDA, "bf16", gpu=H100)
    assert "torchao backend, unmeasured on this GPU" in chosen.explore_why
    monkeypatch.setattr(nvfp4_gemm, "torchao_missing", lambda: "torchao is not installed (pip install torchao)")
    without = resolve_machine(sana, CUDA, "bf16", gpu=B200)
    assert without.explore_precision == "fp8"
    assert "nvfp4: compute capability 10.0 is enough, but torchao is not installed" in without.explore_why


def test_nvfp4_is_refused_on_hopper_and_on_a_cpu_with_what_would_work(monkeypatch):
    with pytest.raises(SolrlError) as err:
        hardware.require_explore_precision("nvfp4", "cpu")
    assert "does not run on the CPU" in err.value.message and "--explore-precision nvfp4-emulated" in err.value.fix
    monkeypatch.setattr(hardware, "gpus", lambda: [H100])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(SolrlError, match="compute capability 9.0 < 10.0"):
        hardware.require_explore_precision("nvfp4", "cuda:0")
    monkeypatch.setattr(hardware, "gpus", lambda: [B200])
    hardware.require_explore_precision("nvfp4", "cuda:0")  # accepted: torchao is installed here


def test_each_precision_names_its_backend_and_whether_it_is_measured_there():
    cpu = {p: backends.backend_of(p, None) for p in hardware.PRECISIONS}
    assert (cpu["nvfp4"].name == "torchao" and cpu["fp8"].name == "scaled_mm" and cpu["nvfp4-emulated"].name
            == "emulation")
    assert not any(b.measured for b in cpu.values())
    assert backends.backend_of("fp8", H100).measured and not backends.backend_of("fp8", H100, "torchao").measured
    assert not backends.backend_of("nvfp4", B200).measured
    assert "unmeasured on this GPU" in backends.backend_of("nvfp4", B200).describe()



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_emulation_in_torchaos_order_equals_the_real_kernel_bit_for_bit(fp4_kernel, dtype):
    """explore.nvfp4_emulation=torchao: torchao's NVFP4Tensor GEMM (nvfp4_tensor.py:561-576, 0.18) returns
    the fp32 accumulation in the input's dtype times the per-tensor scale product rounded to that dtype,
    then adds the bias; the emulation in that order equals it bit for bit, where the exact emulation
    (each value dequantized first) does not on bf16."""
    torch.manual_seed(3)
    linear, conv = nn.Linear(96, 48).to(dtype), nn.Conv2d(64, 32, 1).to(dtype)
    x, image = (3 * torch.randn(4, 9, 96)).to(dtype), torch.randn(2, 64, 5, 3).to(dtype)
    kernel_order = backends.wrappers_for("nvfp4-emulated", nvfp4_emulation="torchao")
    assert kernel_order == (backends.KernelOrderNvfp4Linear, backends.KernelOrderNvfp4Conv1x1)
    for layer, inp, real_cls, emulated_cls, exact_cls in (
            (linear, x, backends.Nvfp4Linear, kernel_order[0], EmulatedNVFP4Linear),
            (conv, image, backends.Nvfp4Conv1x1, kernel_order[1], EmulatedNVFP4Conv1x1)):
        with torch.no_grad():
            real, emulated = real_cls(copy.deepcopy(layer))(inp), emulated_cls(copy.deepcopy(layer))(inp)
            exact = exact_cls(copy.deepcopy(layer))(inp)
        assert emulated.dtype == real.dtype == dtype
        assert torch.equal(emulated, real)
        if dtype == torch.bfloat16:
            assert not torch.equal(exact, real)
    assert fp4_kernel  # the real layers went through torchao's dispatch to the (stand-in) float4 GEMM


def test_the_nvfp4_emulation_setting_reaches_the_explore_copy():
    cfg = resolve_config("tiny", "sol_rl", "tinyworld_geneval", sets=["explore.nvfp4_emulation=torchao"])
    assert cfg.explore.nvfp4_emulation == "torchao"
    with pytest.raises(SolrlError, match="nvfp4_emulation"):
        resolve_config("tiny", "sol_rl", "tinyworld_geneval", sets=["explore.nvfp4_emulation=bf16"])
    made = RolloutCopy(_Block(), "nvfp4-emulated", ("embed", "out"), nvfp4_emulation="torchao")
    assert isinstance(made.module.proj, backends.KernelOrderNvfp4Linear)
    assert isinstance(made.module.ff, backends.KernelOrderNvfp4Conv1x1)


def test_real_nvfp4_keeps_a_layer_whose_k_is_not_a_multiple_of_32_in_high_precision(tmp_path):
    """Two FP4 codes a byte halve K, and torch._scaled_mm wants the packed operands' dims multiples of 16:
    K % 32 == 16 cannot run on the kernel. Such a layer stays in high precision with its reason in the
    report (quantization_report.json's content); the emulation, which has no packing, quantizes it."""
    import json

    model = nn.Sequential(nn.Linear(48, 64), nn.Linear(64, 32), nn.Conv2d(80, 32, 1))
    real = quantize_model(copy.deepcopy(model), (), "nvfp4", backends.wrappers_for("nvfp4"))
    report = json.loads(json.dumps(real.to_dict()))
    layers = {e["name"]: e for e in report["entries"]}
    assert [layers[n]["quantized"] for n in ("0", "1", "2")] == [False, True, False]
    assert "multiple of 32" in layers["0"]["reason"] and "multiple of 32" in layers["2"]["reason"]
    emulated = quantize_model(copy.deepcopy(model), (), "nvfp4-emulated")
    assert all(e.quantized for e in emulated.entries)
