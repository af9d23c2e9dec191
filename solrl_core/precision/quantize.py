"""Swap the GEMM layers of an explore copy of a model for low-precision ones.

Sol-RL samples rollouts with an NVFP4 copy of the policy. Every eligible nn.Linear, and every 1x1 nn.Conv2d (SANA's
GLUMBConv feed-forward in diffusers is built from 1x1 convs, so a Linear-only swap would leave its MLP in high
precision), is wrapped for one explore precision:
- `nvfp4-emulated`: the weight fake-quantized once (16x16 tiles), the input on every call (1x16 blocks along the
  reduction dim), see `solrl_core.precision.nvfp4`: exact NVFP4 numerics, anywhere.
- `fp8`: real E4M3 GEMMs through `torch._scaled_mm`, see `solrl_core.precision.fp8`.
- `fp8-e5m2-tensor`: weight and input fake-quantized to per-tensor FP8 E5M2 at their own amax (`e5m2.py`): emulated.
- `fp8-e5m2-delayed`: the official explore copy's recipe exactly, Transformer Engine's delayed-scaled per-tensor
  E5M2 (`solrl_core.precision.e5m2_delayed`): emulated, no speed-up.
Which layers stay in high precision is the official explore model's rule (NVlabs/Sana
train_scripts/sol_rl/train_utils.py, `replace_linear_with_te`): a name containing one of the model's skip substrings
(`nvfp4_skip_modules`: embedders, the final layer, SANA's self-attention qkv), then any layer with max(in_features,
out_features) <= the model's `nvfp4_min_dim`, then (ours) a layer the GEMM cannot take (a conv that is not 1x1, dims
not multiples of 16, K not of the wrapper's K_MULTIPLE: 32 for real NVFP4). The size rule sees the fused shape of
projections diffusers splits (`cross_attn.kv_linear` is `attn2.to_k` + `attn2.to_v`): split layers get the fused
layer's verdict. Each decision names its rule.

The wrappers register the wrapped layer's own Parameters under the same names (`state_dict()` keys unchanged,
weights load as before); `requantize` afterwards, and after a dtype change, refreshes the cached quantized weights.
For sampling: the cached weight carries no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from solrl_core.precision import e5m2, e5m2_delayed, fp8
from solrl_core.precision.nvfp4 import BLOCK, fake_quantize_1d, fake_quantize_2d


class _QuantizedGemm(nn.Module):
    """Shared part of the wrappers: the wrapped layer's parameters, a cached quantized weight
    (`requantize`), and the original layer for unwrapping."""

    PRECISION = ""  # the explore precision this wrapper implements
    LAYER_KIND = ""  # "linear" | "conv1x1"
    CACHES: tuple[str, ...] = ()  # the buffers `requantize` fills
    K_MULTIPLE = BLOCK  # the reduction dim (in features, in channels) must be a multiple of this; else high precision
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
        if not self.weight.is_meta:  # a copy filled later from a sharded policy (sharded_copy.py): nothing yet
            self.requantize()

    @property
    def wrapped(self) -> nn.Module:
        """The original layer, holding the current parameters (also after an assign-load)."""
        module: nn.Module = object.__getattribute__(self, "_wrapped")
        module.weight = self.weight
        module.bias = self.bias
        return module

    @torch.no_grad()
    def requantize(self, weight: Tensor | None = None) -> None:
        """Recompute the cached quantized weight from the current (high-precision) weight, or from
        `weight` (of its shape), which is then not kept."""
        for name, value in self.quantized(self._source(weight)).items():
            self._store(name, value)

    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        """The caches (`CACHES`) computed from `weight`, not stored: a copy sharded like the policy
        keeps only its rank's share of each (load_tensor)."""
        raise NotImplementedError

    def _source(self, weight: Tensor | None) -> Tensor:
        return (self.weight if weight is None else weight).detach()

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
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        w = weight.detach()
        return {"weight_q": fake_quantize_2d(w.reshape(w.shape[0], -1)).reshape(w.shape)}


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
    """Real FP8 GEMMs (`solrl_core.precision.fp8`): e4m3 weight with one scale per output row, cached;
    e4m3 input with one scale per row, computed on every call."""

    PRECISION = "fp8"
    CACHES = ("weight_q", "weight_scale")
    weight_q: Tensor
    weight_scale: Tensor
    rowwise: bool

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        """Also after a move or a dtype change: the scaling follows the weight's device."""
        w = weight.detach()
        self.rowwise = fp8.rowwise_supported(w.device)
        q, scale = fp8.quantize(w.reshape(w.shape[0], -1), self.rowwise)
        return {"weight_q": q, "weight_scale": scale.reshape(1, -1).contiguous()}


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


class _EmulatedE5M2(_QuantizedGemm):
    PRECISION = "fp8-e5m2-tensor"
    CACHES = ("weight_q",)
    weight_q: Tensor

    @torch.no_grad()
    def quantized(self, weight: Tensor) -> dict[str, Tensor]:
        return {"weight_q": e5m2.fake_quantize_tensor(weight.detach())}


class EmulatedE5M2Linear(_EmulatedE5M2):
    """nn.Linear with per-tensor FP8 E5M2 weight and input, each at its own amax (e5m2.py)."""

    LAYER_KIND = "linear"

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(e5m2.fake_quantize_tensor(x), self.weight_q, self.bias)


class EmulatedE5M2Conv1x1(_EmulatedE5M2):
    """1x1 nn.Conv2d with per-tensor FP8 E5M2 weight and input (one scale per tensor: no permute needed)."""

    LAYER_KIND = "conv1x1"

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(e5m2.fake_quantize_tensor(x), self.weight_q, self.bias)


QuantizedGemm = _QuantizedGemm  # what every wrapper is, for isinstance checks outside this module

# precision -> (wrapper for nn.Linear, wrapper for 1x1 nn.Conv2d)
WRAPPERS: dict[str, tuple[type[_QuantizedGemm], type[_QuantizedGemm]]] = {
    "nvfp4-emulated": (EmulatedNVFP4Linear, EmulatedNVFP4Conv1x1),
    "fp8": (Fp8Linear, Fp8Conv1x1),
    "fp8-e5m2-tensor": (EmulatedE5M2Linear, EmulatedE5M2Conv1x1),
    "fp8-e5m2-delayed": tuple(  # type: ignore[dict-item]  # numerics: e5m2_delayed.py
        type(f"DelayedE5M2{kind.title()}", (e5m2_delayed.DelayedGemm, _QuantizedGemm), {"LAYER_KIND": kind})
        for kind in ("linear", "conv1x1")),
}


@dataclass(frozen=True)
class LayerRule:
    """Which layers of an explore copy stay in high precision (see the module docstring)."""

    skip: tuple[str, ...] = ()  # name substrings (official nvfp4_skip_modules)
    min_dim: int = 0  # max(in, out) <= min_dim stays (official nvfp4_min_dim); 0 = off
    fused: tuple[str, ...] = ()  # "a+b" sibling suffixes the official model holds as one layer

    @classmethod
    def of(cls, model_cfg: Any) -> "LayerRule":
        """The rule a model preset declares (`model.quant_skip`, `quant_min_dim`, `quant_fused`)."""
        return cls(tuple(model_cfg.quant_skip), int(model_cfg.quant_min_dim), tuple(model_cfg.quant_fused))

    def describe(self) -> str:
        parts = [f"skip names {', '.join(self.skip) or 'none'}"]
        if self.min_dim:
            fused = f" (fused: {', '.join(self.fused)})" if self.fused else ""
            parts.append(f"skip max(in, out) <= {self.min_dim}{fused}")
        return "; ".join(parts)


@dataclass(frozen=True)
class LayerEntry:
    """One Linear/Conv2d of the model and what quantize_model did with it."""

    name: str
    kind: str  # "linear" | "conv1x1" | "conv2d"
    shape: tuple[int, ...]
    quantized: bool
    reason: str  # why it was skipped; "" when quantized
    rule: str = ""  # the rule that skipped it: "name" | "min_dim" | "kernel"; "" when quantized

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class QuantReport:
    """Which layers run at the explore precision, written to the run directory and shown to the user."""

    entries: tuple[LayerEntry, ...]
    precision: str = "nvfp4-emulated"
    rule: LayerRule = LayerRule()

    @property
    def quantized(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if e.quantized)

    @property
    def skipped(self) -> tuple[LayerEntry, ...]:
        return tuple(e for e in self.entries if not e.quantized)

    def skipped_by(self) -> dict[str, int]:
        """How many layers each rule kept in high precision."""
        out: dict[str, int] = {}
        for e in self.skipped:
            out[e.rule] = out.get(e.rule, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the precision, the rule and the counts first, then one record per layer."""
        return {
            "precision": self.precision,
            "rule": {"skip": list(self.rule.skip), "min_dim": self.rule.min_dim, "fused": list(self.rule.fused)},
            "quantized_layers": len(self.quantized),
            "total_layers": len(self.entries),
            "quantized_weights": sum(e.numel for e in self.quantized),
            "total_weights": sum(e.numel for e in self.entries),
            "skipped_by_rule": self.skipped_by(),
            "entries": [{**asdict(e), "shape": list(e.shape)} for e in self.entries],
        }

    def summary(self) -> str:
        q, total = self.quantized, self.entries
        text = (f"quantized {len(q)} of {len(total)} layers "
                f"({_count(sum(e.numel for e in q))} of {_count(sum(e.numel for e in total))} weights)")
        by = self.skipped_by()
        if by:
            labels = {"name": "by name", "min_dim": f"by max(in, out) <= {self.rule.min_dim}",
                      "kernel": "not a plain GEMM"}
            text += "; kept in high precision: " + ", ".join(f"{n} {labels.get(r, r)}" for r, n in sorted(by.items()))
        return text


def _count(n: int) -> str:
    return next((f"{n / div:.1f}{unit}" for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if n >= div), str(n))


def _kind(module: nn.Module) -> str:
    if isinstance(module, _QuantizedGemm):
        return module.LAYER_KIND
    if isinstance(module, nn.Linear):
        return "linear"
    return "conv1x1" if tuple(module.kernel_size) == (1, 1) else "conv2d"


def _dims(module: nn.Module) -> tuple[int, int]:
    """(out, in) of a Linear or a conv seen as a GEMM."""
    return module.weight.shape[0], math.prod(module.weight.shape[1:])


def _fused_width(name: str, layers: dict[str, nn.Module], fused: Sequence[str]) -> tuple[str, int] | None:
    """(group, summed output width) when `name` is a member of a fused group whose siblings all exist."""
    for group in fused:
        members = [m for m in group.split("+") if m]
        for member in members:
            if name == member or name.endswith("." + member):
                parent = name[: len(name) - len(member)]
                siblings = [layers.get(parent + m) for m in members]
                if all(s is not None for s in siblings):
                    return group, sum(_dims(s)[0] for s in siblings)  # type: ignore[arg-type]
    return None


def _skip(name: str, module: nn.Linear | nn.Conv2d, rule: LayerRule, layers: dict[str, nn.Module],
          k_multiple: int = BLOCK) -> tuple[str, str]:
    """(rule, reason) this layer stays in high precision for, or ("", "") when it is quantized.
    The official order: name patterns, then the size rule; then what our GEMMs cannot take."""
    for pattern in rule.skip:
        if pattern and pattern in name:
            return "name", f"skip pattern '{pattern}'"
    if name == "":
        return "kernel", "the model itself is the layer"
    out_dim, in_dim = _dims(module)
    if rule.min_dim > 0:
        fused = _fused_width(name, layers, rule.fused)
        width = max(in_dim, fused[1] if fused else out_dim)
        if width <= rule.min_dim:
            where = f" (fused {fused[0]})" if fused else ""
            return "min_dim", f"max(in, out) = {width}{where} <= min_dim {rule.min_dim}"
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        if (kh, kw) != (1, 1):
            return "kernel", f"conv kernel {kh}x{kw}"
        if module.groups != 1:
            return "kernel", f"grouped conv (groups={module.groups})"
        if tuple(module.stride) != (1, 1):
            return "kernel", f"conv stride {module.stride[0]}x{module.stride[1]}"
        if tuple(module.padding) != (0, 0) or module.padding_mode != "zeros":
            return "kernel", "conv padding"
    if out_dim % BLOCK or in_dim % BLOCK:
        return "kernel", f"shape not divisible by {BLOCK}"
    if in_dim % k_multiple:
        return "kernel", f"in {in_dim} not a multiple of {k_multiple} (the real NVFP4 GEMM's reduction dim)"
    return "", ""


def plan_layers(model: nn.Module, rule: LayerRule, k_multiple: int = BLOCK) -> list[LayerEntry]:
    """What `quantize_model` would do with each Linear / Conv2d of `model`, changing nothing (works on the meta
    device: a real-size model's layer set is checked without its weights); `k_multiple`: the wrappers' K_MULTIPLE."""
    layers = {name: (m.wrapped if isinstance(m, _QuantizedGemm) else m) for name, m in model.named_modules()
              if isinstance(m, (_QuantizedGemm, nn.Linear, nn.Conv2d))}
    entries = []
    for name, layer in layers.items():
        which, reason = _skip(name, layer, rule, layers, k_multiple)
        entries.append(LayerEntry(name, _kind(layer), tuple(layer.weight.shape), not which, reason, which))
    return entries


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def quantize_model(model: nn.Module, skip: Sequence[str] | LayerRule, precision: str = "nvfp4-emulated",
                   wrappers: tuple[type, type] | None = None) -> QuantReport:
    """Wrap every eligible Linear and 1x1 Conv2d of `model` in place for `precision` (WRAPPERS' or `wrappers`'s),
    report on all.

    `skip` is the model's LayerRule (or, for a name-only rule, its skip substrings). Safe to call
    again: existing wrappers of this precision are kept, others are swapped, and layers the rule now
    skips are unwrapped; nothing is ever wrapped twice.
    """
    if precision not in WRAPPERS and wrappers is None:
        raise ValueError(f"no quantized layers for precision {precision!r}; known: {', '.join(WRAPPERS)}")
    rule = skip if isinstance(skip, LayerRule) else LayerRule(skip=(skip,) if isinstance(skip, str) else tuple(skip))
    linear_cls, conv_cls = wrappers or WRAPPERS[precision]
    entries = plan_layers(model, rule, max(linear_cls.K_MULTIPLE, conv_cls.K_MULTIPLE))
    for entry in entries:
        current = model.get_submodule(entry.name) if entry.name else model
        original = current.wrapped if isinstance(current, _QuantizedGemm) else current
        if not entry.quantized:
            if current is not original:
                _set_submodule(model, entry.name, original)
        elif type(current) not in (linear_cls, conv_cls):  # another precision, or another backend of it
            _set_submodule(model, entry.name, (linear_cls if isinstance(original, nn.Linear) else conv_cls)(original))
    if hasattr(linear_cls, "attach"):  # fp8-e5m2-delayed: fused groups share a state; TE's update after each forward
        linear_cls.attach(model, rule.fused)
    return QuantReport(tuple(entries), precision, rule)


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


@torch.no_grad()
def load_tensor(model: nn.Module, name: str, value: Tensor) -> None:
    """Set the parameter or buffer `name` of `model` to `value` (cast to its dtype). A quantized
    layer's weight goes straight into its quantized cache, its high-precision weight left untouched:
    a copy filled from a sharded policy never holds it (sharded_copy.py)."""
    from torch.distributed.tensor import DTensor

    owner_name, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_name)
    target = getattr(owner, attr)
    if not (isinstance(owner, _QuantizedGemm) and attr == "weight"):
        _write(target, value)
    elif any(isinstance(getattr(owner, c), DTensor) for c in owner.CACHES):  # sharded_copy.shard_copy's
        for cache, q in owner.quantized(value.to(target.dtype)).items():
            _write(getattr(owner, cache), q)
    else:
        owner.requantize(value.to(target.dtype))


def _write(target: Tensor, value: Tensor) -> None:
    """`target` set to `value` (whole, the same on every rank); a sharded tensor (a DTensor: a copy
    sharded like the policy, sharded_copy.py) takes only this rank's shard, without communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        value = distribute_tensor(value.to(target.device, target.dtype), target.device_mesh, target.placements,
                                  src_data_rank=None)
        target.to_local().copy_(value.to_local())
    else:
        target.copy_(value)
