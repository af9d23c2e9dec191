"""Rollouts as values: which seeds were generated for which prompts, by which copy, and their scores.

A `RolloutCopy` is the frozen network rollouts run on: the base weights with the `old` adapter
merged in, optionally re-quantized (explore precision) or torch.compile'd block by block. It is refreshed after
every optimizer step. Full-precision rollouts of the non-compiled families need no copy: they run
on the policy with its `old` adapter active, so a large model is held once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Iterator

import torch
from torch import nn

from solrl_core.engine.regions import CompiledBlocks
from solrl_core.engine.sde import Trajectory
from solrl_core.precision import fp8_attention as fp8_attn
from solrl_core.precision.hardware import IMPLEMENTED_EXPLORE
from solrl_core.precision.backends import QUANTIZED, wrappers_for
from solrl_core.precision.quantize import LayerRule, QuantizedGemm, QuantReport, load_tensor, quantize_model, requantize


@dataclass(frozen=True)
class Draws:
    """What a rollout generates: one image per (prompt, seed), each sample in a prompt group."""

    prompts: list[str]  # per sample
    groups: torch.Tensor  # [B] prompt-group index of each sample
    seeds: torch.Tensor  # [B] integer noise seeds


@dataclass(frozen=True)
class RolloutBatch:
    prompts: list[str]  # per sample
    groups: torch.Tensor  # [B] prompt-group index of each sample
    seeds: torch.Tensor  # [B] integer noise seeds
    latents: torch.Tensor  # [B, C, H, W] final clean latents
    sigmas: torch.Tensor  # the sigma grid the rollout integrated
    rewards: torch.Tensor  # [B] total reward
    components: dict[str, torch.Tensor]  # [B] per reward
    seconds_reward: float
    trajectory: Trajectory | None = None  # the SDE path of a loss that trains on it (algorithm.loss=flow_grpo)

    @property
    def draws(self) -> Draws:
        return Draws(self.prompts, self.groups, self.seeds)

    def subset(self, index: torch.Tensor) -> "RolloutBatch":
        idx = index.tolist()
        return replace(self, prompts=[self.prompts[i] for i in idx], groups=self.groups[index], seeds=self.seeds[index],
                       latents=self.latents[index], rewards=self.rewards[index],
                       components={k: v[index] for k, v in self.components.items()},
                       trajectory=self.trajectory.subset(index) if self.trajectory is not None else None)


def cast(module: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """`module` in `dtype` (in place), cast only where a tensor is not: diffusers warns of "modules that
    should be kept in float32" at every `.to(dtype)` of one of its models, even one already in that
    dtype that keeps none in float32 (the tiny models)."""
    if dtype is None or all(t.dtype == dtype for t in (*module.parameters(), *module.buffers())
                            if t.is_floating_point()):
        return module
    return module.to(dtype)


class RolloutCopy:
    """A merged, frozen copy of the base transformer at a rollout precision."""

    def __init__(self, module: nn.Module, precision: str, rule: LayerRule, *, compile: bool = False,
                 compile_mode: str = "default", sharded: bool = False, fp8_backend: str = "scaled_mm",
                 fp8_attention: bool = False, nvfp4_emulation: str = "exact") -> None:
        """Takes ownership of `module` (a copy of the base transformer, without adapters). `sharded`: a
        skeleton to be sharded like the policy when first filled (sharded_copy.shard_copy). `fp8_backend`:
        fp8's kernel (explore.fp8_backend, precision/backends.py). `fp8_attention`: its forward runs
        with FP8 attention (explore.fp8_attention, precision/fp8_attention.py). `nvfp4_emulation`:
        nvfp4-emulated's GEMM order (explore.nvfp4_emulation)."""
        if precision not in IMPLEMENTED_EXPLORE:
            raise ValueError(f"no rollout backend for precision {precision!r} (hardware.require_explore_precision says "
                             f"why)")
        self.precision = precision
        self.sharded = sharded
        self.module = module.requires_grad_(False).eval()
        if precision in ("bf16", "fp32"):
            cast(self.module, {"bf16": torch.bfloat16, "fp32": torch.float32}[precision])
        self.dtype = next(self.module.parameters()).dtype  # nvfp4-emulated and fp8 compute in the base dtype
        self.report: QuantReport | None = None
        if precision in QUANTIZED:
            self.report = quantize_model(self.module, rule, precision,
                                         wrappers_for(precision, fp8_backend, nvfp4_emulation))
        # compiled in place, block by block (regions.py): `forward` is the module either way. A copy
        # still on the meta device (sharded_copy.py) compiles once it is on its device (`materialize`).
        self.compile_mode = compile_mode if compile else None
        self.compiled = (CompiledBlocks(self.module, compile_mode, gemm_autotune=precision != "fp8")
                         if compile and not self.on_meta else None)
        self.forward: nn.Module = self.module
        self.attention = fp8_attn.Swap(self.module) if fp8_attention else None

    @property
    def fp8_attention(self) -> bool:
        """Whether the forward runs with FP8 attention (explore.fp8_attention)."""
        return self.attention is not None

    def without_fp8_attention(self) -> contextlib.AbstractContextManager:
        """The forward with the model's own attention inside (the rank check's arms without it)."""
        return self.attention.off() if self.attention is not None else contextlib.nullcontext()

    def take_over(self, other: "RolloutCopy") -> None:
        """Become `other` (its module, precision, quantization and compiled blocks), this copy's own
        module freed: the engine keeps one explore copy object whatever precision a calibration
        chose (explore.calibrate=steps+precision, calibration.py). `other` is not to be used after."""
        self.__dict__.update(other.__dict__)

    @property
    def on_meta(self) -> bool:
        """Built as a skeleton (sharded_copy.meta_copy) and not yet given storage (`materialize`): a
        quantized layer's high-precision weight, which a lean copy never holds, does not count."""
        skipped = {id(m.weight) for m in self.module.modules() if isinstance(m, QuantizedGemm)}
        return any(p.is_meta for p in self.module.parameters() if id(p) not in skipped)

    @property
    def lean(self) -> bool:
        """Holds only the quantized caches of its quantized layers, not their high-precision weights
        (engine._copy, sharded_copy.py): refreshed through `quantize.load_tensor`, layer by layer."""
        return any(isinstance(m, QuantizedGemm) and m.weight.is_meta for m in self.module.modules())

    def materialize(self, device: torch.device) -> None:
        """Give every meta parameter storage on `device` (filled afterwards), except a quantized
        layer's high-precision weight, which such a copy never holds (quantize.load_tensor); then compile."""
        skipped = {id(m.weight) for m in self.module.modules() if isinstance(m, QuantizedGemm)}
        for module in self.module.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                if p.is_meta and id(p) not in skipped:
                    module._parameters[name] = nn.Parameter(torch.empty_like(p, device=device), requires_grad=False)
        if self.compile_mode is not None and self.compiled is None:
            self.compiled = CompiledBlocks(self.module, self.compile_mode, gemm_autotune=self.precision != "fp8")

    @torch.no_grad()
    def refresh(self, merged: dict[str, torch.Tensor], units: Iterator[list[nn.Module]] | None = None) -> None:
        """Load base + old-adapter weights and re-quantize (weights are quantized once per refresh). A
        lean copy quantizes each given weight straight into its layer's cache; the layers not given
        (frozen, not adapted) keep theirs. `units`: the copy's modules brought to the GPU a group at a
        time (offload.Parking.unit_by_unit), for a copy parked on the CPU: each group is loaded and
        re-quantized while it is there, so its caches are made on the GPU and leave with it."""
        if self.lean:
            if units is None:
                for name, value in merged.items():
                    load_tensor(self.module, name, value)
                return
            owned: dict[str, list[str]] = {}
            for name in merged:
                owned.setdefault(name.rpartition(".")[0], []).append(name)
            path = {id(m): n for n, m in self.module.named_modules()}
            for unit in units:
                for module in unit:
                    for name in owned.pop(path[id(module)], ()):
                        load_tensor(self.module, name, merged[name])
            if owned:
                raise RuntimeError(f"rollout copy does not hold {[n for names in owned.values() for n in names][:3]}")
            return
        result = self.module.load_state_dict(merged, strict=False)
        if result.unexpected_keys:
            raise RuntimeError(f"rollout copy does not hold {result.unexpected_keys[:3]}")
        if self.report is None:
            return
        if units is None:
            requantize(self.module)
            return
        for unit in units:
            for module in unit:
                if isinstance(module, QuantizedGemm):
                    module.requantize()
