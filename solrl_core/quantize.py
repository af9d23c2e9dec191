"""Swap the GEMM layers of an explore copy of a model for emulated NVFP4 ones.

Sol-RL samples rollouts with an NVFP4 copy of the policy. Without a Blackwell GPU we emulate it:
every eligible nn.Linear, and every 1x1 nn.Conv2d (SANA's GLUMBConv feed-forward in diffusers is
built from 1x1 convs, so a Linear-only swap would leave its MLP in high precision), is wrapped so
that its weight is fake-quantized once (16x16 tiles) and its input on every call (1x16 blocks
along the reduction dim), see `solrl_core.nvfp4`. Embedders, the patch embed and the final layer
are left alone by name, as the official explore model does, and every decision is reported.

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

from solrl_core.nvfp4 import BLOCK, fake_quantize_1d, fake_quantize_2d


class _EmulatedNVFP4(nn.Module):
    """Shared part of the wrappers: shared parameters, the cached weight, requantize."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    weight_q: Tensor

    def __init__(self, module: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        # Kept outside nn.Module's registry: registering it would prefix every key with its
        # attribute name. Its parameters are registered here instead, under their own names.
        object.__setattr__(self, "_wrapped", module)
        self.register_parameter("weight", module.weight)
        self.register_parameter("bias", module.bias)
        # Not persistent: a cache derived from `weight`, never saved or loaded.
        self.register_buffer("weight_q", torch.empty(0), persistent=False)
        self.requantize()

    @property
    def wrapped(self) -> nn.Module:
        """The original layer, holding the current parameters (also after an assign-load)."""
        module: nn.Module = object.__getattribute__(self, "_wrapped")
        module.weight = self.weight
        module.bias = self.bias
        return module

    @torch.no_grad()
    def requantize(self) -> None:
        """Recompute the cached NVFP4 weight from the current (high-precision) weight."""
        w = self.weight.detach()
        self.weight_q = fake_quantize_2d(w.reshape(w.shape[0], -1)).reshape(w.shape)

    def extra_repr(self) -> str:
        return f"nvfp4 emulated, wraps {object.__getattribute__(self, '_wrapped')!r}"


class EmulatedNVFP4Linear(_EmulatedNVFP4):
    """nn.Linear with NVFP4 weight (16x16 tiles) and input (1x16 blocks); bias stays as is."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.in_features = linear.in_features
        self.out_features = linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(fake_quantize_1d(x), self.weight_q, self.bias)


class EmulatedNVFP4Conv1x1(_EmulatedNVFP4):
    """1x1 nn.Conv2d (a per-pixel linear) with NVFP4 weight and input; bias stays as is.

    Activations are NCHW and the reduction runs over channels, so the 1x16 blocks run along
    C: the input is permuted to channels-last for quantization and back for the conv.
    """

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__(conv)
        self.in_channels = conv.in_channels
        self.out_channels = conv.out_channels

    def forward(self, x: Tensor) -> Tensor:
        x_q = fake_quantize_1d(x.movedim(-3, -1)).movedim(-1, -3)
        return F.conv2d(x_q, self.weight_q, self.bias)


_WRAPPERS = (EmulatedNVFP4Linear, EmulatedNVFP4Conv1x1)


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
    """Which layers run in emulated NVFP4, written to the run directory and shown to the user."""

    entries: tuple[LayerEntry, ...]

    @property
    def quantized(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if e.quantized)

    @property
    def skipped(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if not e.quantized)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: counts first, then one record per layer."""
        return {
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
    if isinstance(module, (nn.Linear, EmulatedNVFP4Linear)):
        return "linear"
    if isinstance(module, EmulatedNVFP4Conv1x1) or tuple(module.kernel_size) == (1, 1):
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


def quantize_model(model: nn.Module, skip: Sequence[str]) -> QuantReport:
    """Wrap every eligible Linear and 1x1 Conv2d of `model` in place; report on all of them.

    A layer is eligible when its qualified name contains none of the `skip` substrings and its
    weight's out and in dims are divisible by 16. Safe to call again: existing wrappers are kept
    (or unwrapped if a `skip` pattern now names them), never wrapped twice.
    """
    if isinstance(skip, str):
        skip = (skip,)
    entries: list[LayerEntry] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, _WRAPPERS):
            reason = _skip_reason(name, module.wrapped, skip)
            if reason:
                _set_submodule(model, name, module.wrapped)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            reason = _skip_reason(name, module, skip)
            if not reason:
                wrapper = (
                    EmulatedNVFP4Linear(module)
                    if isinstance(module, nn.Linear)
                    else EmulatedNVFP4Conv1x1(module)
                )
                _set_submodule(model, name, wrapper)
        else:
            continue
        shape = tuple(module.weight.shape)
        entries.append(LayerEntry(name, _kind(module), shape, not reason, reason))
    return QuantReport(tuple(entries))


def requantize(model: nn.Module) -> None:
    """Refresh every wrapper's cached NVFP4 weight, after new weights were loaded."""
    for module in model.modules():
        if isinstance(module, _WRAPPERS):
            module.requantize()
