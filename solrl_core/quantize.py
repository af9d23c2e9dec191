"""Swap the GEMM layers of an explore copy of a model for low-precision ones.

Sol-RL samples rollouts with an NVFP4 copy of the policy. Every eligible nn.Linear, and every 1x1
nn.Conv2d (SANA's GLUMBConv feed-forward in diffusers is built from 1x1 convs, so a Linear-only
swap would leave its MLP in high precision), is wrapped for one explore precision:
- `nvfp4-emulated`: the weight is fake-quantized once (16x16 tiles) and the input on every call
  (1x16 blocks along the reduction dim), see `solrl_core.nvfp4`: exact NVFP4 numerics, anywhere.
- `fp8`: real E4M3 GEMMs through `torch._scaled_mm`, see `solrl_core.fp8`.
Embedders, the patch embed and the final layer are left alone by name, as the official explore
model does, and every decision is reported.

The wrappers register the wrapped layer's own Parameter objects under the same names, so
`state_dict()` keys are unchanged and weights can be loaded into the copy as before; call
`requantize` afterwards (and after a dtype change) to refresh the cached quantized weights.
The wrappers are for sampling: the cached weight carries no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from solrl_core import fp8
from solrl_core.nvfp4 import BLOCK, fake_quantize_1d, fake_quantize_2d


class _QuantizedGemm(nn.Module):
    """Shared part of the wrappers: the wrapped layer's parameters, a cached quantized weight
    (`requantize`), and the original layer for unwrapping."""

    PRECISION = ""  # the explore precision this wrapper implements
    LAYER_KIND = ""  # "linear" | "conv1x1"
    CACHES: tuple[str, ...] = ()  # the buffers `requantize` fills
    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, module: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        # Kept outside nn.Module's registry: registering it would prefix every key with its
        # attribute name. Its parameters are registered here instead, under their own names.
        object.__setattr__(self, "_wrapped", module)
        self.register_parameter("weight", module.weight)
        self.register_parameter("bias", module.bias)
        for dim in ("in_features", "out_features", "in_channels", "out_channels"):
            if hasattr(module, dim):
                setattr(self, dim, getattr(module, dim))
        for name in self.CACHES:  # not persistent: derived from `weight`, never saved or loaded
            self.register_buffer(name, torch.empty(0), persistent=False)
        self.requantize()

    @property
    def wrapped(self) -> nn.Module:
        """The original layer, holding the current parameters (also after an assign-load)."""
        module: nn.Module = object.__getattribute__(self, "_wrapped")
        module.weight = self.weight
        module.bias = self.bias
        return module

    def requantize(self) -> None:
        """Recompute the cached quantized weight from the current (high-precision) weight."""
        raise NotImplementedError

    def _store(self, name: str, value: Tensor) -> None:
        """Set a cache buffer, in place when its shape, dtype and device are unchanged, so whatever
        holds the old tensor (a compiled graph, a captured CUDA graph) reads the new values."""
        old: Tensor = getattr(self, name)
        if old.shape == value.shape and old.dtype == value.dtype and old.device == value.device:
            old.copy_(value)
        else:
            setattr(self, name, value)

    def extra_repr(self) -> str:
        return f"{self.PRECISION}, wraps {object.__getattribute__(self, '_wrapped')!r}"


class _EmulatedNVFP4(_QuantizedGemm):
    PRECISION = "nvfp4-emulated"
    CACHES = ("weight_q",)
    weight_q: Tensor

    @torch.no_grad()
    def requantize(self) -> None:
        w = self.weight.detach()
        self._store("weight_q", fake_quantize_2d(w.reshape(w.shape[0], -1)).reshape(w.shape))


class EmulatedNVFP4Linear(_EmulatedNVFP4):
    """nn.Linear with NVFP4 weight (16x16 tiles) and input (1x16 blocks); bias stays as is."""

    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(fake_quantize_1d(x), self.weight_q, self.bias)


class EmulatedNVFP4Conv1x1(_EmulatedNVFP4):
    """1x1 nn.Conv2d (a per-pixel linear) with NVFP4 weight and input; bias stays as is.

    Activations are NCHW and the reduction runs over channels, so the 1x16 blocks run along
    C: the input is permuted to channels-last for quantization and back for the conv.
    """

    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        x_q = fake_quantize_1d(x.movedim(-3, -1)).movedim(-1, -3)
        return F.conv2d(x_q, self.weight_q, self.bias)


class _Fp8(_QuantizedGemm):
    """Real FP8 GEMMs (`solrl_core.fp8`): e4m3 weight with one scale per output row, cached;
    e4m3 input with one scale per row, computed on every call."""

    PRECISION = "fp8"
    CACHES = ("weight_q", "weight_scale")
    weight_q: Tensor
    weight_scale: Tensor
    rowwise: bool

    @torch.no_grad()
    def requantize(self) -> None:
        """Also after a move or a dtype change: the scaling follows the weight's device."""
        w = self.weight.detach()
        self.rowwise = fp8.rowwise_supported(w.device)
        q, scale = fp8.quantize(w.reshape(w.shape[0], -1), self.rowwise)
        self._store("weight_q", q)
        self._store("weight_scale", scale.reshape(1, -1).contiguous())


class Fp8Linear(_Fp8):
    """nn.Linear through an FP8 GEMM; bias added in the input's dtype."""

    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return fp8.linear(x, self.weight_q, self.weight_scale, self.bias, self.rowwise)


class Fp8Conv1x1(_Fp8):
    """1x1 nn.Conv2d through an FP8 GEMM over channels (one input scale per pixel)."""

    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        y = fp8.linear(x.movedim(-3, -1), self.weight_q, self.weight_scale, self.bias, self.rowwise)
        return y.movedim(-1, -3)


# precision -> (wrapper for nn.Linear, wrapper for 1x1 nn.Conv2d)
WRAPPERS: dict[str, tuple[type[_QuantizedGemm], type[_QuantizedGemm]]] = {
    "nvfp4-emulated": (EmulatedNVFP4Linear, EmulatedNVFP4Conv1x1),
    "fp8": (Fp8Linear, Fp8Conv1x1),
}


@dataclass(frozen=True)
class LayerEntry:
    """One Linear/Conv2d of the model and what quantize_model did with it."""

    name: str
    kind: str  # "linear" | "conv1x1" | "conv2d"
    shape: tuple[int, ...]
    quantized: bool
    reason: str  # why it was skipped; "" when quantized

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class QuantReport:
    """Which layers run at the explore precision, written to the run directory and shown to the user."""

    entries: tuple[LayerEntry, ...]
    precision: str = "nvfp4-emulated"

    @property
    def quantized(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if e.quantized)

    @property
    def skipped(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if not e.quantized)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the precision and counts first, then one record per layer."""
        return {
            "precision": self.precision,
            "quantized_layers": len(self.quantized),
            "total_layers": len(self.entries),
            "quantized_weights": sum(e.numel for e in self.quantized),
            "total_weights": sum(e.numel for e in self.entries),
            "entries": [{**asdict(e), "shape": list(e.shape)} for e in self.entries],
        }

    def summary(self) -> str:
        q, total = self.quantized, self.entries
        return (
            f"quantized {len(q)} of {len(total)} layers "
            f"({_count(sum(e.numel for e in q))} of {_count(sum(e.numel for e in total))} weights)"
        )


def _count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def _kind(module: nn.Module) -> str:
    if isinstance(module, _QuantizedGemm):
        return module.LAYER_KIND
    if isinstance(module, nn.Linear):
        return "linear"
    if tuple(module.kernel_size) == (1, 1):
        return "conv1x1"
    return "conv2d"


def _skip_reason(name: str, module: nn.Linear | nn.Conv2d, skip: Sequence[str]) -> str:
    """Why this layer stays in high precision, or "" when it can be quantized."""
    for pattern in skip:
        if pattern and pattern in name:
            return f"skip pattern '{pattern}'"
    if name == "":
        return "the model itself is the layer"
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        if (kh, kw) != (1, 1):
            return f"conv kernel {kh}x{kw}"
        if module.groups != 1:
            return f"grouped conv (groups={module.groups})"
        if tuple(module.stride) != (1, 1):
            return f"conv stride {module.stride[0]}x{module.stride[1]}"
        if tuple(module.padding) != (0, 0) or module.padding_mode != "zeros":
            return "conv padding"
    out_dim, in_dim = module.weight.shape[0], math.prod(module.weight.shape[1:])
    if out_dim % BLOCK or in_dim % BLOCK:
        return f"shape not divisible by {BLOCK}"
    return ""


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def quantize_model(model: nn.Module, skip: Sequence[str], precision: str = "nvfp4-emulated") -> QuantReport:
    """Wrap every eligible Linear and 1x1 Conv2d of `model` in place for `precision` (a key of
    WRAPPERS); report on all of them.

    A layer is eligible when its qualified name contains none of the `skip` substrings and its
    weight's out and in dims are divisible by 16. Safe to call again: existing wrappers of this
    precision are kept, others are swapped, and layers a `skip` pattern now names are unwrapped;
    nothing is ever wrapped twice.
    """
    if precision not in WRAPPERS:
        raise ValueError(f"no quantized layers for precision {precision!r}; known: {', '.join(WRAPPERS)}")
    if isinstance(skip, str):
        skip = (skip,)
    linear_cls, conv_cls = WRAPPERS[precision]
    entries: list[LayerEntry] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, _QuantizedGemm):
            if module.PRECISION == precision:
                layer: nn.Module = module
            else:
                layer = module.wrapped
                _set_submodule(model, name, layer)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            layer = module
        else:
            continue
        original = layer.wrapped if isinstance(layer, _QuantizedGemm) else layer
        reason = _skip_reason(name, original, skip)
        if reason and layer is not original:
            _set_submodule(model, name, original)
        elif not reason and layer is original:
            _set_submodule(model, name, (linear_cls if isinstance(original, nn.Linear) else conv_cls)(original))
        entries.append(LayerEntry(name, _kind(original), tuple(original.weight.shape), not reason, reason))
    return QuantReport(tuple(entries), precision)


def unwrap_model(model: nn.Module) -> None:
    """Put every wrapped layer back, in place: the model at its own precision again."""
    for name, module in list(model.named_modules()):
        if isinstance(module, _QuantizedGemm):
            _set_submodule(model, name, module.wrapped)


def requantize(model: nn.Module) -> None:
    """Refresh every wrapper's cached quantized weight, after new weights were loaded."""
    for module in model.modules():
        if isinstance(module, _QuantizedGemm):
            module.requantize()
