"""Copies of the model on every process of a sharded run (distributed.strategy=fsdp): the
low-precision explore copy, whole or sharded like the policy, and the full-precision rollout copy,
sharded like the policy.

Under fsdp each GPU holds 1/S of the policy's weights (sharding.py), so a copy cannot be a deep
copy of a whole transformer the process holds. Instead:

- Built as a skeleton: `meta_copy` deep-copies the base transformer (before the adapters) with every
  parameter on the meta device (no memory), and quantize.py wraps its GEMM layers as for a replica,
  so the layer set and the quantization report are the replica's.
- Given storage whole (`RolloutCopy.materialize`), or sharded like the policy (`shard_copy`: FSDP2's
  `fully_shard` on the policy's mesh, one unit at a time as it is materialized, so each process holds
  1/S of the copy and gathers one block at a time for its forwards, freed after).
- Filled block by block from the sharded policy (`refresh_from_shards`): each FSDP unit (each
  repeated block, then the root's own layers) is gathered whole (`FSDPModule.unshard`), its adapted
  layers merged with the `old` adapter by the policy's own `merged_weights`, written into the copy
  (a quantized layer's weight straight into its quantized cache: `quantize.load_tensor`; into a
  sharded copy only this rank's dim-0 shard of each tensor), and the gathered unit freed (`reshard`)
  before the next. The first fill writes every weight; each refresh after an optimizer step only the
  adapted layers' (the others are frozen).
- A quantized layer's high-precision weight is never held (it stays on the meta device): the copy
  holds the quantized caches and, at the run dtype, the layers the quantized-layer rule keeps. With
  fp8 that is about half a bf16 copy; the NVFP4 and E5M2 emulations store their fake-quantized
  weights at the run dtype, a full copy's size (footprint.copy_bytes). A
  replica's explore copy is lean the same way, filled from the base model (engine._copy).

Every rank runs the same units in the same order (each gather is a collective), and the merged
weights are the policy's own (`Policy.merged_weights`), so the copy equals a replica's exactly. A
sharded copy's forwards are collectives too: every rank runs as many (the stages give each rank as
many samples).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from solrl_core.engine.policy import OLD, Policy
from solrl_core.engine.rollout import RolloutCopy
from solrl_core.engine.sharding import fsdp_units
from solrl_core.precision.quantize import QuantizedGemm, load_tensor


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose parameters are on the meta device (buffers copied as they are)."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=False) for p in module.parameters()}
    return copy.deepcopy(module, memo)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _unit_modules(policy: Policy, prefix: str, blocks: list[str]) -> list[tuple[str, nn.Module]]:
    """The modules whose parameters the unit at `prefix` holds ("" the root: those in no block)."""
    def inside(name: str, block: str) -> bool:
        return name == block or name.startswith(block + ".")

    everything = policy.transformer.named_modules()
    if prefix:
        return [(n, m) for n, m in everything if inside(n, prefix)]
    return [(n, m) for n, m in everything if not any(inside(n, b) for b in blocks)]


def base_tensors(modules: list[tuple[str, nn.Module]]) -> dict[str, torch.Tensor]:
    """The base model's parameters among `modules`, keyed as in the plain base model (peft's
    `base_layer` dropped, its LoRA layers left out)."""
    out = {}
    for name, module in modules:
        if any(part.startswith("lora_") for part in name.split(".")):
            continue
        for pname, p in module.named_parameters(recurse=False):
            out[f"{name}.{pname}".replace(".base_layer.", ".").removeprefix(".")] = p.detach()
    return out


def policy_mesh(policy: Policy):  # type: ignore[no-untyped-def]
    """The device mesh the policy is sharded on (sharding.shard_policy)."""
    from torch.distributed.tensor import DTensor

    return next(p.device_mesh for p in policy.transformer.parameters() if isinstance(p, DTensor))


def shard_copy(made: RolloutCopy, mesh, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    """Give a skeleton copy (`meta_copy`) storage as a copy sharded like the policy: each FSDP unit
    (each repeated block, then the root) materialized and at once sharded on `mesh` with FSDP2's
    `fully_shard`, so no more than one unit is ever whole on this rank. A quantized layer's caches
    become frozen parameters FSDP shards (dim 0, padded where uneven; mixed dtypes are all-gathered as
    bytes); its high-precision weight stays on the meta device, ignored by FSDP. Every unit is
    resharded after its forward, the root too, so a refresh writes to the shards (`quantize.load_tensor`)
    the next forward gathers. Filled afterwards (`refresh_from_shards`)."""
    from torch.distributed.fsdp import fully_shard

    gemms = [m for m in made.module.modules() if isinstance(m, QuantizedGemm)]
    # the caches' shapes and dtypes, from one uninitialised weight at a time on `device` (fp8's scaling follows it)
    for m in gemms:
        for name, value in m.quantized(torch.empty_like(m.weight, device=device)).items():
            del m._buffers[name]
            m.register_parameter(name, nn.Parameter(torch.empty_like(value, device="meta"), requires_grad=False))
    ignored = {m.weight for m in gemms}
    skip = {id(w) for w in ignored}
    for _, unit in fsdp_units(made.module):  # the blocks first, the root last
        for module in unit.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                if p.is_meta and id(p) not in skip:
                    module._parameters[name] = nn.Parameter(torch.empty_like(p, device=device), requires_grad=False)
        fully_shard(unit, mesh=mesh, reshard_after_forward=True, ignored_params=ignored)


@torch.no_grad()
def refresh_from_shards(policy: Policy, copies: list[RolloutCopy], device: torch.device) -> None:
    """Fill `copies` (skeletons from `meta_copy`) with base + `old` adapter, one FSDP unit gathered at
    a time: every weight the first time, the adapted layers' after that. A copy sharded like the
    policy (`RolloutCopy.sharded`) keeps only this rank's share of each tensor. A collective: every
    rank calls it."""
    first = [c.on_meta for c in copies]
    for c, fresh in zip(copies, first):
        if fresh and c.sharded:
            shard_copy(c, policy_mesh(policy), device)
        elif fresh:
            c.materialize(device)
        elif c.sharded:  # a unit left gathered would be read, stale, by the next forward
            for _, unit in fsdp_units(c.module):
                unit.reshard()
    units = fsdp_units(policy.transformer)
    blocks = [name for name, _ in units if name]
    for prefix, unit in units:
        modules = _unit_modules(policy, prefix, blocks)
        merged_layers = policy.adapted(modules, OLD)
        if not merged_layers and not any(first):
            continue  # nothing here changes after a step
        unit.unshard()
        try:
            merged = policy.merged_weights(OLD, merged_layers)
            base = base_tensors(modules) if any(first) else {}
            for c, fresh in zip(copies, first):
                for name, value in ({**base, **merged} if fresh else merged).items():
                    load_tensor(c.module, name, value)
        finally:
            unit.reshard()
