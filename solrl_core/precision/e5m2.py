"""Per-tensor FP8 E5M2 quantize-dequantize at each tensor's own amax (`fp8-e5m2-tensor`).

The official code's "NVFP4" recipe is `DelayedScaling(fp8_format=Format.E2M1, amax_history_len=16,
amax_compute_algo="max")` (NVlabs/Sana train_scripts/sol_rl/train_utils.py:22-33). E2M1 is not one
of DelayedScaling's formats: Transformer Engine gives every tensor of such a recipe the E4M3 dtype
only for E4M3 and HYBRID and E5M2 otherwise (`get_fp8_te_dtype`), so its te.Linear layers run
per-tensor scaled FP8 **E5M2** GEMMs (2 mantissa bits, range +-57344), not 16-element NVFP4 blocks.

This module is the simpler cousin of that recipe, emulated in plain torch for any device: each tensor
scaled by 57344 / its own amax on every call, rounded to E5M2 (round to nearest even, as torch's and
TE's casts) and scaled back to its dtype. Where it differs from the official recipe, which
`fp8-e5m2-delayed` (e5m2_delayed.py) follows exactly: TE's scale comes from a 16-call amax history
and is 1 on the first call (and, as TE updates it only with autograd on, in every rollout); the
dequantized operands here are rounded to the run dtype (bf16: about 0.6% more error at one scale);
SANA's K and V are two tensors here where the official `kv_linear` is one fused weight with one scale.
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
