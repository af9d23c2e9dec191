"""SANA's feed-forward in an fp8 explore copy, as the GPU will run it, checked on a CPU: its 1x1
convolutions are token GEMMs over the block's own buffers (no NCHW <-> NHWC copy around them), and
under Inductor each activation quantization is fused into the kernel that produces its input (the
modulated LayerNorm before the first GEMM, the GLU gate before the second), read from the generated
code. Nothing here times anything: a GPU lease does (benchmarks/explore_step.py --compile)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from solrl_core.precision.backends import wrappers_for

sana = pytest.importorskip("diffusers.models.transformers.sana_transformer")
H = W = 4  # latent tokens as an H x W image
# Ops that write a float copy of an activation: a layout change. The e4m3 cast (`_to_copy` to float8)
# is the quantization itself and is allowed.
_COPIES = {"aten.clone.default", "aten.copy_.default", "aten.contiguous.default", "aten._to_copy.default"}


class _Ffn(nn.Module):
    """The feed-forward half of diffusers' SanaTransformerBlock.forward, verbatim in its reshapes: the
    modulated LayerNorm's tokens viewed as NCHW for GLUMBConv, and its output viewed back as tokens."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = sana.GLUMBConv(dim, dim, 2.5, norm_type=None, residual_connection=False)

    def forward(self, hidden: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        norm = self.norm2(hidden) * (1 + scale) + shift
        norm = norm.unflatten(1, (H, W)).permute(0, 3, 1, 2)
        return self.ff(norm).flatten(2, 3).permute(0, 2, 1)


def _fp8_ffn(backend: str) -> tuple[_Ffn, _Ffn]:
    torch.manual_seed(0)
    plain = _Ffn()
    quantized = copy.deepcopy(plain)
    conv_wrapper = wrappers_for("fp8", backend)[1]
    for name in ("conv_inverted", "conv_point"):
        setattr(quantized.ff, name, conv_wrapper(getattr(quantized.ff, name)))
    return plain, quantized


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(shape, generator=g) for shape in ((2, H * W, 32), (2, 1, 32), (2, 1, 32)))


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        to_fp8 = func is torch.ops.aten._to_copy.default and isinstance(out,
                torch.Tensor) and out.dtype == torch.float8_e4m3fn
        if str(func) in _COPIES and not to_fp8:
            self.copies.append(f"{func} -> {tuple(out.shape)}")
        return out


@pytest.mark.parametrize("backend", ["scaled_mm", "torchao"])
def test_sana_ffn_1x1_convs_are_token_gemms_with_no_layout_copy(backend):
    """Each 1x1 conv reads the channels-last view the block hands it as a [tokens, C] matrix and
    writes one back, so no activation is copied to another layout; the output stays the plain FFN's
    to FP8 rounding."""
    if backend == "torchao":
        pytest.importorskip("torchao")
    plain, quantized = _fp8_ffn(backend)
    x = _inputs()
    with torch.no_grad(), _Ops() as ops:
        got = quantized(*x)
    assert ops.copies == []
    with torch.no_grad():
        want = plain(*x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0.1, atol=0.1 * want.abs().max().item())  # E4M3: 3 mantissa bits


def test_inductor_fuses_each_activation_quantization_into_the_kernel_before_it():
    """Inductor's generated code for the compiled fp8 FFN: two `_scaled_mm` calls whose e4m3 input is
    written by the kernel that computes it (LayerNorm + modulation; SiLU gate), GEMM operands and the
    output as views of the buffers (no layout copy), three generated kernels in all; the result equals
    eager to fp32 rounding."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    _, quantized = _fp8_ffn("scaled_mm")
    x = _inputs()
    with torch.no_grad():
        want = quantized(*x)
        got, (code, *_) = run_and_get_code(torch.compile(quantized), *x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    body = code[code.index("def call(self, args):"):]
    kernels = re.findall(r"^\s+(cpp_fused_\w+)\((.*)\)$", body, re.M)
    gemms = re.findall(r"extern_kernels\._scaled_mm\((\w+), (.*), out=(\w+)\)", body)
    assert len(gemms) == 2 and len(kernels) == 3, (kernels, gemms)

    def writer(buf: str) -> str:
        (name,) = [name for name, args in kernels if buf in re.findall(r"\w+", args)]
        return name

    (first, _, _), (second, _, out) = gemms
    assert all(op in writer(first) for op in ("native_layer_norm", "mul", "add", "amax", "_to_copy"))
    assert all(op in writer(second) for op in ("silu", "mul", "amax", "_to_copy"))
    assert re.search(rf"return \(reinterpret_tensor\({out},", body)  # the tokens are the GEMM's own output
