"""Real NVFP4 GEMMs for the explore copy's `nvfp4` precision: solrl's exact quantizer, torchao's NVFP4 tensor.

Why torchao and not Transformer Engine's NVFP4BlockScaling: torchao pip-installs and imports on any
machine (so its layout and dispatch are tested on a CPU in CI), its `NVFP4Tensor` is a plain tensor
subclass that a 1x1 conv and torch.compile take as they are, and its GEMM is torch's own
`torch._scaled_mm` on `float4_e2m1fn_x2` with swizzled E4M3 block scales (cuBLASLt's block-scaled FP4
kernels, compute capability >= 10.0). TE installs only on a CUDA machine and brings its own modules.

The numbers are solrl's, not torchao's: torchao's quantizer rounds E4M3 and E2M1 ties in another
float32 operation order and clamps block scales to E4M3's smallest normal (tests/test_nvfp4.py), so
the weight (16x16 tiles, once per refresh) and the activation (1x16 blocks, on every call) are
quantized by `nvfp4.quantize_2d` / `quantize_1d`, the emulation's own code, and only packed into
torchao's layout here: two E2M1 codes a byte (`pack_uint4`), block scales in cuBLAS's 128x4 swizzle
(`to_blocked`), the per-tensor decode scale 1 / S_enc. Unpacked, they dequantize to the emulation's
values bit for bit (`dequantize`); the GEMM accumulates in fp32 and applies both decode scales once.

Speed: unmeasured. The FP4 GEMM runs only on compute capability >= 10.0, and no figure has been
taken on one (precision/backends.py says so wherever the choice is shown).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
from torch import Tensor

from solrl_core.precision.nvfp4 import BLOCK, quantize_1d, quantize_2d

TORCHAO_INSTALL = "pip install torchao"


def torchao_missing() -> str:
    """Why torchao's NVFP4 tensor cannot be used here ('' when it can): not installed, or a torch
    without the float4 dtype the GEMM takes."""
    if importlib.util.find_spec("torchao") is None:
        return f"torchao is not installed ({TORCHAO_INSTALL})"
    if not hasattr(torch, "float4_e2m1fn_x2"):
        return f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype (torch >= 2.8 has)"
    return ""


def pack(codes: Tensor, scales: Tensor, s_enc: Tensor) -> dict[str, Tensor]:
    """Values from `nvfp4.quantize_1d` / `quantize_2d` of a 2-D [M, K] tensor, in torchao's layout:
    `packed` uint8 [M, K / 2] (two E2M1 codes a byte, the even column in the low nibble), `scale` the
    E4M3 block scales swizzled (flat), `s_enc` float32 of shape (1,)."""
    from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked, pack_uint4
    from torchao.prototype.mx_formats.utils import to_blocked

    scale = to_blocked(scales.to(torch.float8_e4m3fn))
    return {"packed": pack_uint4(f32_to_f4_unpacked(codes.contiguous())), "scale": scale,
            "s_enc": s_enc.reshape(1).to(torch.float32)}


def unpack(packed: Tensor, scale: Tensor, shape: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """(E2M1 values [M, K], E4M3 scales [M, K / 16] as float32) of `pack`'s layout, through torchao's decoders."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.utils import from_blocked

    rows, cols = shape
    codes = f4_unpacked_to_f32(unpack_uint4(packed.contiguous())).reshape(rows, cols)
    return codes, from_blocked(scale, rows, cols // BLOCK).to(torch.float32)


def dequantize(packed: Tensor, scale: Tensor, s_enc: Tensor, shape: tuple[int, int]) -> Tensor:
    """The float32 values the packed tensor stands for: ``code * scale / S_enc``, the emulation's
    formula (`nvfp4._qdq_blocks`), so equal to `fake_quantize_1d` / `fake_quantize_2d` bit for bit."""
    codes, scales = unpack(packed, scale, shape)
    return (codes.reshape(shape[0], -1, BLOCK) * scales.unsqueeze(-1)).div_(s_enc).reshape(shape)


def quantize_weight(weight: Tensor) -> dict[str, Tensor]:
    """A [out, in] weight in 16x16 tiles, packed (the explore copy's cache, made once per refresh)."""
    return pack(*quantize_2d(weight))


def _nvfp4_tensor(packed: Tensor, scale: Tensor, s_enc: Tensor, shape: tuple[int, int], dtype: torch.dtype,
                  weight: bool) -> Any:
    """torchao's NVFP4Tensor over solrl's packed values (swizzled scales). A weight carries the
    activation settings that make torchao's linear a dynamic NVFP4 GEMM (its input comes prequantized)."""
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, QuantizeTensorToNVFP4Kwargs

    from torchao.prototype.mx_formats.utils import hp_data_dims_to_swizzled_scale_dims_nvfp4

    act = QuantizeTensorToNVFP4Kwargs(is_swizzled_scales=True) if weight else None
    scale = scale.view(hp_data_dims_to_swizzled_scale_dims_nvfp4(*shape))
    return NVFP4Tensor(packed, scale, BLOCK, dtype, per_tensor_scale=s_enc.reciprocal().reshape(()),
                       is_swizzled_scales=True, act_quant_kwargs=act)


def linear(x: Tensor, packed: Tensor, scale: Tensor, s_enc: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear with an NVFP4 GEMM: the weight from `quantize_weight` ([out, in] of `packed`'s rows),
    the input quantized here in 1x16 blocks along its last dim (exact emulation numerics), both as
    torchao NVFP4Tensors, whose linear calls `torch._scaled_mm` on float4 (compute capability >= 10.0)."""
    import torch.nn.functional as F

    lead, k = x.shape[:-1], x.shape[-1]
    out = packed.shape[0]
    x2 = x.reshape(-1, k)
    a = pack(*quantize_1d(x2))
    x_q = _nvfp4_tensor(a["packed"], a["scale"], a["s_enc"], (x2.shape[0], k), x.dtype, weight=False)
    w_q = _nvfp4_tensor(packed, scale, s_enc, (out, k), x.dtype, weight=True)
    return F.linear(x_q, w_q, bias).reshape(*lead, out)


def kernel_order_linear(x: Tensor, codes: Tensor, scales: Tensor, s_enc: Tensor, bias: Tensor | None) -> Tensor:
    """F.linear as `linear` computes it on the kernel, in plain torch (any device): the weight's E2M1
    values `codes` [out, in] and block scales [out, in / 16] from `nvfp4.quantize_2d`, the input
    quantized here in 1x16 blocks. torchao 0.18's NVFP4Tensor GEMM (prototype/mx_formats/nvfp4_tensor.py,
    `_addmm_nvfp4_dispatch`) runs `torch._scaled_mm` on codes x block scales with fp32 accumulation and
    the output in the input's dtype (:561-569), then multiplies it by the product of the two per-tensor
    decode scales, 1 / S_enc each (our `_nvfp4_tensor`), taken in fp32 (:523-525) and rounded to that
    dtype (:571-572), and adds the bias after (:575-576). The exact emulation (`nvfp4.fake_quantize_*`)
    instead dequantizes each value as ``code * scale / S_enc`` before a GEMM in the input's dtype: with
    bf16 inputs the two differ by up to about 2^-8 relative. This order matches the kernel's epilogue;
    the fp32 accumulation order of a GPU GEMM is the GEMM's own."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    q_x, s_x, s_enc_x = quantize_1d(x2)
    a = (q_x.reshape(x2.shape[0], -1, BLOCK) * s_x.unsqueeze(-1)).reshape(x2.shape)  # exact: 2 x 4 mantissa bits
    b = (codes.reshape(codes.shape[0], -1, BLOCK) * scales.unsqueeze(-1)).reshape(codes.shape)
    y = torch.nn.functional.linear(a, b).to(x.dtype)
    y = y * (s_enc_x.reciprocal() * s_enc.reciprocal()).to(x.dtype)
    if bias is not None:
        y = y + bias.to(x.dtype)
    return y.reshape(*lead, codes.shape[0])
