"""Per-tensor FP8 E5M2 quantize-dequantize: the numerics of the official explore copy.

The official code's "NVFP4" recipe is `DelayedScaling(fp8_format=Format.E2M1, amax_history_len=16,
amax_compute_algo="max")` (NVlabs/Sana train_scripts/sol_rl/train_utils.py:27-31). E2M1 is not one
of DelayedScaling's formats: Transformer Engine gives every tensor of such a recipe the E4M3 dtype
only for E4M3 and HYBRID and E5M2 otherwise (`get_fp8_te_dtype`), so its te.Linear layers run
per-tensor scaled FP8 **E5M2** GEMMs (2 mantissa bits, range +-57344), not 16-element NVFP4 blocks.

Emulated here in plain torch for any device: each tensor is scaled by 57344 / amax (its own amax:
TE's delayed scale comes from the last 16 calls' amax instead), rounded to E5M2 (round to nearest
even, as torch's and TE's casts) and scaled back. Either scale gives the same relative precision (2
mantissa bits); the grids differ by the ratio of the two scales, so values differ, not their error.
"""

from __future__ import annotations

import torch
from torch import Tensor

E5M2_MAX = 57344.0


def fake_quantize_tensor(x: Tensor) -> Tensor:
    """x rounded to per-tensor scaled FP8 E5M2, in x's dtype (0 stays 0; an all-zero tensor is unchanged)."""
    amax = x.detach().abs().amax().float()
    scale = torch.where(amax > 0, E5M2_MAX / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2)
    return (q.float() / scale).to(x.dtype)
