"""`fp8-e5m2-delayed`: the official explore copy's recipe exactly, Transformer Engine's delayed scaling.

The official code swaps the explore model's eligible nn.Linear layers for `te.Linear` and runs each
transformer forward inside `te.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E2M1,
amax_history_len=16, amax_compute_algo="max"))` (NVlabs/Sana train_scripts/sol_rl/train_utils.py:22-33,
`replace_linear_with_te`, `wrap_forward_with_fp8`). What Transformer Engine computes with that recipe (TE
transformer_engine/pytorch/
quantization.py and common/recipe/delayed_scaling.cu), transcribed here in plain torch:

- Per layer, one scale and a 16-row amax history for its input and one for its weight; scales start
  at 1 and the history at 0 (`DelayedScalingRecipeState`). E2M1 is not a DelayedScaling format, so
  both tensors are FP8 **E5M2** (`get_fp8_te_dtype`: E4M3 only for E4M3 and HYBRID).
- Every call casts the input and the weight with the scale in effect, `e5m2(x * scale)` rounded to
  nearest even and saturated at +-57344 (`satfinite`), and max-accumulates each tensor's amax into
  history row 0; the GEMM multiplies the FP8 codes with fp32 accumulation and scales the result by
  1 / scale_x * 1 / scale_w; the bias is added in fp32, then one rounding to the input's dtype.
- At the end of each transformer forward, and **only when autograd is enabled**
  (`FP8GlobalStateManager.autocast_exit`: `... and torch.is_grad_enabled()`), every layer's state is
  updated (`kernel_bulk`, the fused update TE runs by default): where the newest amax (row 0) is
  non-zero, amax = max over all 16 rows, the history rolls one row (row 0 zeroed for the next call)
  and scale = 57344 / amax (fp32 max where that overflows); where it is zero, nothing changes.
  So the scale of call k + 1 comes from the amaxes of calls k-15..k, and the first call's is 1.

Rollouts run without autograd, in the official code (`@torch.no_grad()` pipelines) as here
(`Engine.generate`), so TE never updates these scales there: **the official explore copy casts
every tensor at scale 1**, i.e. plain E5M2 (normal down to 2^-14, subnormal down to 2^-16), for the
whole run. `fp8-e5m2-delayed` keeps that behaviour because it is TE's; a forward with autograd on
(the tests) moves the scales exactly as TE would. The history lives in each layer across calls and
across the copy's refreshes, as TE keeps it in each te.Linear. TE's all-reduce of the amaxes over
the processes (`reduce_amax`) belongs to the update, which a rollout never reaches: left out.

SANA's cross-attention key/value is one fused `kv_linear` in the official model, one weight with one
scale; diffusers splits it into `attn2.to_k` and `attn2.to_v`. The members of a fused group
(`model.quant_fused`) share one state here, so both are cast with the fused layer's scales and their
amaxes meet in one history (`DelayedGemm.attach`). A NaN element adds nothing to the history (TE's
`fmaxf` skips it; here a tensor holding a NaN leaves the history as it was).

The GEMM: `torch._scaled_mm` refuses two E5M2 operands on CUDA ("Multiplication of two Float8_e5m2
matrices is not supported"; cuBLASLt has no E5M2 x E5M2 kernel), so where no such kernel answers
(`real_gemm`, probed once per device) the codes are multiplied in fp32: E5M2 values are exact in
fp32 and in TF32, so each product is exact and the sum is accumulated in fp32, as an FP8 tensor
core does. The numerics are TE's; there is no FP8 speed-up.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from solrl_core.precision.e5m2 import E5M2_MAX

HISTORY = 16  # the official recipe's amax_history_len
INPUT, WEIGHT = 0, 1  # the two state slots of a layer (TE's third, the output's, is unused by te.Linear)
FP32_MAX = torch.finfo(torch.float32).max


def cast(x: Tensor, scale: Tensor) -> Tensor:
    """x * scale as FP8 E5M2 codes: round to nearest even, saturated at +-57344 (TE's satfinite cast)."""
    return (x.float() * scale).clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2)


class DelayedScaling(nn.Module):
    """One layer's (or one fused group's) TE delayed-scaling state: `scale` [2] and `amax_history`
    [16, 2], slots INPUT and WEIGHT. Non-persistent buffers: never saved, never loaded."""

    scale: Tensor
    amax_history: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(2), persistent=False)
        self.register_buffer("amax_history", torch.zeros(HISTORY, 2), persistent=False)

    def follow(self, device: torch.device) -> None:
        """Keep the state on the device of the tensors it scales, in fp32 (a copy parked on the CPU, or
        a module cast to another dtype, moves or casts its buffers)."""
        if self.scale.device != device or self.scale.dtype != torch.float32:
            self.scale = self.scale.to(device, torch.float32)
            self.amax_history = self.amax_history.to(device, torch.float32)

    @torch.no_grad()
    def record(self, slot: int, x: Tensor) -> None:
        """Max-accumulate x's amax into history row 0, as TE's cast kernel does."""
        self.amax_history[0, slot] = torch.fmax(self.amax_history[0, slot], x.detach().abs().amax().float())

    @torch.no_grad()
    def update(self) -> None:
        """TE's fused amax-and-scale update (delayed_scaling.cu, kernel_bulk) with the "max" algorithm."""
        history, newest = self.amax_history, self.amax_history[0].clone()
        active = newest != 0
        amax = torch.cat([history[1:], newest[None]]).amax(dim=0)
        rolled = torch.cat([history.new_zeros(1, 2), history[2:], newest[None]])
        history.copy_(torch.where(active, rolled, history))
        # A true division, as TE's kernel (scale_norm / amax): `float / tensor` is a reciprocal times
        # the float in torch, one ulp away.
        fresh = torch.full_like(amax, E5M2_MAX) / torch.where(active, amax, torch.ones_like(amax))
        fresh = torch.where(torch.isinf(fresh), torch.full_like(fresh, FP32_MAX), fresh)
        self.scale.copy_(torch.where(active & torch.isfinite(amax) & (amax > 0), fresh, self.scale))

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None, real: bool) -> Tensor:
        """F.linear(x, weight, bias) as te.Linear computes it under the recipe: both operands cast with
        the scales in effect (their amaxes recorded), an FP8 GEMM, the result in x's dtype."""
        self.follow(x.device)
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        self.record(INPUT, x2)
        self.record(WEIGHT, weight)
        x_q, w_q = cast(x2, self.scale[INPUT]), cast(weight, self.scale[WEIGHT])
        inv_x, inv_w = 1.0 / self.scale[INPUT], 1.0 / self.scale[WEIGHT]
        y = gemm(x_q, w_q, inv_x, inv_w, real)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype).reshape(*lead, weight.shape[0])


def gemm(x_q: Tensor, w_q: Tensor, inv_x: Tensor, inv_w: Tensor, real: bool) -> Tensor:
    """(x_q @ w_q^T) * inv_x * inv_w in fp32 from E5M2 codes: a real FP8 GEMM (`torch._scaled_mm`),
    or the codes multiplied exactly in fp32 (see the module docstring)."""
    if real:
        return torch._scaled_mm(x_q.contiguous(), w_q.t(), scale_a=inv_x.reshape(1, 1), scale_b=inv_w.reshape(1, 1),
                                out_dtype=torch.float32)
    return F.linear(x_q.float(), w_q.float()) * (inv_x * inv_w)


@functools.cache
def _cuda_has_e5m2_gemm(index: int) -> bool:
    return e5m2_gemm_runs(torch.device("cuda", index))


def e5m2_gemm_runs(device: torch.device) -> bool:
    """Whether `torch._scaled_mm` takes two E5M2 operands on `device` (one 16x16 call). torch refuses
    with "Multiplication of two Float8_e5m2 matrices is not supported": a ValueError from current
    releases (TORCH_CHECK_VALUE), a RuntimeError from older ones; either means no."""
    a = torch.zeros(16, 16, device=device).to(torch.float8_e5m2)
    one = torch.ones(1, 1, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    except (ValueError, RuntimeError):
        return False
    return True


def real_gemm(device: torch.device) -> bool:
    """Whether this device runs an E5M2 x E5M2 GEMM natively. Never on a CPU (its `_scaled_mm` is a
    reference kernel, no faster than the fp32 product); on CUDA, what torch answers to one small call."""
    if device.type != "cuda":
        return False
    return _cuda_has_e5m2_gemm(device.index if device.index is not None else torch.cuda.current_device())


def _end_of_forward(module: nn.Module, args: Any, output: Any) -> None:
    """TE's update at the exit of the autocast the official code opens around each transformer forward."""
    if not torch.is_grad_enabled():
        return
    for state in module.modules():
        if isinstance(state, DelayedScaling):
            state.update()


class DelayedGemm:
    """The GEMM wrappers' part for `fp8-e5m2-delayed` (quantize.py pairs it with its wrapper base): the
    weight kept as given (cast on every call, as te.Linear casts it), a DelayedScaling state per layer."""

    PRECISION = "fp8-e5m2-delayed"
    CACHES = ("weight_src",)
    LAYER_KIND: str
    weight_src: Tensor
    scaling: DelayedScaling

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)  # type: ignore[call-arg]
        self.scaling = DelayedScaling()

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        # A copy, never a view: a lean copy's first fill hands over the policy's own base tensors.
        return {"weight_src": weight.detach().clone()}

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight_src.reshape(self.weight_src.shape[0], -1)
        real = real_gemm(x.device)
        if self.LAYER_KIND == "linear":
            return self.scaling.linear(x, w, self.bias, real)  # type: ignore[attr-defined]
        return self.scaling.linear(x.movedim(-3, -1), w, self.bias, real).movedim(-1, -3)  # type: ignore[attr-defined]

    @classmethod
    def attach(cls, model: nn.Module, fused: tuple[str, ...]) -> None:
        """After quantize_model wrapped `model`: the members of each fused group share one state, and
        the states update at the end of the model's forward (when autograd is on, as TE's)."""
        layers = {name: m for name, m in model.named_modules() if isinstance(m, cls)}
        for group in fused:
            members = [m for m in group.split("+") if m]
            for name in layers:
                if not name.endswith("." + members[0]) and name != members[0]:
                    continue
                parent = name[: len(name) - len(members[0])]
                siblings = [layers.get(parent + m) for m in members]
                if all(s is not None for s in siblings):
                    for s in siblings[1:]:
                        s.scaling = siblings[0].scaling  # type: ignore[union-attr]
        if layers and _end_of_forward not in model._forward_hooks.values():
            model.register_forward_hook(_end_of_forward)
