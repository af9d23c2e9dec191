"""FP8 (E4M3) GEMMs with dynamic scaling, through torch's own `torch._scaled_mm`.

The explore copy's `fp8` precision. Weights are quantized once per refresh with one scale per
output row; activations on every call with one scale per row (token), or one per tensor where the
GPU's row-wise kernel is missing. The GEMM is `torch._scaled_mm`: cuBLASLt / CUTLASS FP8 tensor
cores on compute capability >= 8.9, and a reference kernel on the CPU (same numerics, no speed-up),
which is what lets the numerics be tested on any machine.

x ~ q * scale with scale = amax / 448 (E4M3's largest finite value) and q = e4m3(x / scale);
y = (q_x * s_x) @ (q_w * s_w)^T, accumulated in fp32 by the kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

E4M3_MAX = 448.0
_TINY = 1e-12  # scale floor: an all-zero row quantizes to zeros, never to NaN

# Row-wise scaled FP8 GEMMs: CUTLASS on sm89/sm90/sm100 in torch; cuBLASLt refuses them on sm120
# (consumer Blackwell, pytorch/pytorch#192707), where one scale per tensor is used instead.
ROWWISE_MAX_MAJOR = 11


def rowwise_supported(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` takes one scale per row on this device."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] <= ROWWISE_MAX_MAJOR


def quantize(x: Tensor, rowwise: bool) -> tuple[Tensor, Tensor]:
    """A 2-D tensor -> (e4m3 values, fp32 scales) with x ~ values * scales.

    rowwise: scales of shape (rows, 1); else one scale of shape (1, 1)."""
    amax = x.abs().amax(dim=-1, keepdim=True) if rowwise else x.abs().amax().reshape(1, 1)
    scale = (amax.float() / E4M3_MAX).clamp(min=_TINY)
    values = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def dequantize(values: Tensor, scale: Tensor) -> Tensor:
    return values.float() * scale


def linear(x: Tensor, weight_q: Tensor, weight_scale: Tensor, bias: Tensor | None, rowwise: bool) -> Tensor:
    """F.linear with an FP8 GEMM: `weight_q` (out, in) e4m3 row-major and `weight_scale` (1, out)
    (or (1, 1)) from `quantize(weight, rowwise)`, the input quantized here, the result in x's dtype."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()  # CUDA's FP8 GEMM takes a row-major first operand only
    x_q, x_scale = quantize(x2, rowwise)
    # CUDA's row-wise kernel writes bf16 only; the CPU kernel writes fp32 (exact reference numerics).
    out_dtype = torch.bfloat16 if x.is_cuda else torch.float32
    y = torch._scaled_mm(x_q, weight_q.t(), scale_a=x_scale, scale_b=weight_scale, out_dtype=out_dtype).to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, weight_q.shape[0])
