"""Exact NVFP4 quantize-dequantize emulation in plain torch, for any device and float dtype.

The explore model of Sol-RL runs in NVFP4 on Blackwell GPUs; everywhere else we emulate it so
that rollouts see the same rounding. An NVFP4 value is ``e2m1 * s_block * s_global``: E2M1
magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, one E4M3 scale per 16 values (1x16 blocks for
activations, 16x16 tiles for weights) and one FP32 per-tensor scale.

Formulas (REFERENCE.md section 5, from Transformer Engine's pure-python NVFP4 reference,
``transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py``, class ``NVFP4QuantizerRef``,
method ``_quantize_blockwise_reference``)::

    S_enc = 448 * 6 / amax            (1 where amax == 0)
    s     = e4m3(clamp(vmax * S_enc / 6, max=448))
    q     = e2m1_round(clamp(x / (s / S_enc), -6, 6))
    x_hat = q * s / S_enc

Where the float32 order of operations matters we follow TE's reference, which keeps the order
of its CUDA kernel (``core_nvfp4.cuh``, ``compute_decoding_scaling_factor``):
``vmax * (S_enc * float32(1/6))`` for the block scale and ``x * (1 / (s * (1 / S_enc)))`` for the
scaled value. The order only matters where a value is within a float32 ulp of an E4M3 or E2M1
rounding tie: evaluating the formulas above left to right changed 4 of 52M elements of random
float32 tensors, each by one E2M1 step; bfloat16 inputs hit exact ties more often (about 0.1% of
elements), and there torchao's NVFP4Tensor, using yet another order, can differ from TE.
TE's reference has no element-wise dequantize (it folds the global scales into the GEMM
epilogue), so ``x_hat`` is ``q * s / S_enc`` with ``q * s`` exact and one rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
E4M3_MAX = 448.0
BLOCK = 16

_FP32_MAX = torch.finfo(torch.float32).max
# 1/6 rounded to float32, as the CUDA kernel's constexpr; a Python float holds it exactly.
_INV_FP4_MAX = float(torch.tensor(1.0 / FP4_MAX, dtype=torch.float32))
_EXPONENT_BITS = 0x7F800000  # a float32's exponent field
_ONE_EXPONENT = 0x00800000  # one unit of it: subtracting halves a power of two


def round_to_e2m1(x: Tensor) -> Tensor:
    """Round float32 values in [-6, 6] to the nearest E2M1 value, ties to even mantissa.

    E2M1 steps are 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]; scaling by a power of two makes
    each range an integer grid, where ``torch.round`` (half to even) picks the even code:
    0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. This is exactly
    TE's ``cast_to_fp4x2`` (closed intervals around even codes, open around odd ones) and
    torchao's bit-level round-to-nearest-even ``f32_to_f4_unpacked``; the two agree on ties.
    The sign is kept, so small negatives become -0.0 like TE's code 8.
    """
    if x.dtype != torch.float32:
        return round_to_e2m1(x.float()).to(x.dtype)
    # The step (0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]) is half the power of two at or below |x|,
    # clamped to [0.5, 2]: the float32 exponent bits alone (sign and mantissa masked off), one less,
    # so no abs, comparison or select pass (those were 40% of an eager quantization on a CPU). The
    # clamp sends zeros and subnormals (mask 0, minus one: -inf) to 0.5; NaN stays NaN. Round is
    # odd-symmetric, so the sign needs no copysign.
    step = (x.view(torch.int32) & _EXPONENT_BITS).sub_(_ONE_EXPONENT).view(torch.float32).clamp_(0.5, 2.0)
    return torch.div(x, step).round_().mul_(step)


def global_scale(amax: Tensor) -> Tensor:
    """Per-tensor encode scale ``S_enc = 448 * 6 / amax`` in float32.

    Maps the tensor's amax onto the largest block scale times the largest E2M1 value. As in TE:
    1.0 where amax == 0 (or amax is inf, which would give 0), FLT_MAX where amax is so small that
    the quotient overflows.
    """
    amax = amax.to(torch.float32)
    s_enc = torch.clamp(torch.div(E4M3_MAX * FP4_MAX, amax), max=_FP32_MAX)
    return torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def _qdq_blocks(x: Tensor, vmax: Tensor, s_enc: Tensor) -> Tensor:
    """Quantize-dequantize float32 ``x`` given each element's block amax (broadcastable)."""
    q, s = _quantize_blocks(x, vmax, s_enc)
    return q.mul_(s).div_(s_enc)


def _quantize_blocks(x: Tensor, vmax: Tensor, s_enc: Tensor) -> tuple[Tensor, Tensor]:
    """(E2M1 values, E4M3 block scales as float32) of float32 ``x`` given each block's amax."""
    s = torch.clamp(vmax * (s_enc * _INV_FP4_MAX), max=E4M3_MAX)
    s = s.to(torch.float8_e4m3fn).to(torch.float32)
    # A block whose scale rounds to 0 in E4M3 dequantizes to 0 whatever q is (TE clamps the
    # reciprocal's inf to FLT_MAX and multiplies by s = 0). Its encode factor is set to 0 at block
    # level, so q is 0 there and no element-wise select is needed; the reciprocal never meets 0.
    nonzero = s > 0
    safe_s = torch.where(nonzero, s, torch.ones_like(s))
    encode = torch.where(nonzero, 1.0 / (safe_s * (1.0 / s_enc)), torch.zeros_like(s))
    return round_to_e2m1(torch.clamp_(x * encode, -FP4_MAX, FP4_MAX)), s


def _block_amax(x: Tensor, dim: int | tuple[int, ...]) -> Tensor:
    """max |x| over `dim`, kept (abs then amax: torch's infinity norm was several times slower on a CPU)."""
    return x.abs().amax(dim=dim, keepdim=True)


def _check_float(x: Tensor) -> None:
    if not x.is_floating_point():
        raise TypeError(f"NVFP4 emulation needs a floating-point tensor, got {x.dtype}")


def fake_quantize_1d(x: Tensor, block: int = BLOCK) -> Tensor:
    """NVFP4 quantize-dequantize of an activation: 1x16 blocks along the last dim.

    The global scale comes from the whole tensor's amax (TE's non-row-scaled default). Returns
    the input's dtype and shape; computes in float32.
    """
    _check_float(x)
    if x.ndim == 0 or x.shape[-1] % block != 0:
        raise ValueError(
            f"NVFP4 1D blocks need the last dim divisible by {block}, got shape {tuple(x.shape)}"
        )
    if x.numel() == 0:
        return x.clone()
    xf = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // block, block)
    vmax = _block_amax(xf, -1)
    return _qdq_blocks(xf, vmax, global_scale(vmax.amax())).reshape(x.shape).to(x.dtype)


def quantize_1d(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """What `fake_quantize_1d` rounds to, before dequantizing: (E2M1 values of x's shape, one E4M3
    scale per 1x16 block of shape [..., K / 16], S_enc), all float32; ``codes * scales / S_enc`` (each
    scale repeated over its block) is `fake_quantize_1d(x)` bit for bit. The packed NVFP4 GEMM's input."""
    _check_float(x)
    xf = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    vmax = _block_amax(xf, -1)
    s_enc = global_scale(vmax.amax())
    q, s = _quantize_blocks(xf, vmax, s_enc)
    return q.reshape(x.shape), s.squeeze(-1), s_enc


def fake_quantize_2d(w: Tensor, tile: int = BLOCK) -> Tensor:
    """NVFP4 quantize-dequantize of a weight: one scale per 16x16 tile of a 2D tensor.

    Weights use square tiles so that W and W^T quantize identically (TE's 2D weight recipe).
    """
    _check_float(w)
    if w.ndim != 2 or w.shape[0] % tile != 0 or w.shape[1] % tile != 0:
        raise ValueError(
            f"NVFP4 2D tiles need a 2D tensor with both dims divisible by {tile}, "
            f"got shape {tuple(w.shape)}"
        )
    if w.numel() == 0:
        return w.clone()
    rows, cols = w.shape
    wf = w.to(torch.float32).reshape(rows // tile, tile, cols // tile, tile)
    vmax = _block_amax(wf, (1, 3))
    return _qdq_blocks(wf, vmax, global_scale(vmax.amax())).reshape(rows, cols).to(w.dtype)


def quantize_2d(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`quantize_1d`'s parts for a weight in 16x16 tiles: each tile's one scale is repeated over its 16
    rows, so the scales have the 1x16-block shape [rows, cols / 16] the NVFP4 GEMM reads."""
    _check_float(w)
    rows, cols = w.shape
    wf = w.to(torch.float32).reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    vmax = _block_amax(wf, (1, 3))
    s_enc = global_scale(vmax.amax())
    q, s = _quantize_blocks(wf, vmax, s_enc)
    return q.reshape(rows, cols), s.expand(-1, BLOCK, -1, 1).reshape(rows, cols // BLOCK), s_enc
