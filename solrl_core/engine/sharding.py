"""Models larger than one GPU: the policy sharded with torch's FSDP2 (`distributed.strategy = fsdp`).

`replicate` (distributed.py) keeps a full replica of the transformer on every GPU; `fsdp` shards it
with `torch.distributed.fsdp.fully_shard`, block by block (regions.repeated_blocks: SANA's 20
transformer blocks, FLUX's 19 + 38, ...) and the rest as the root, so a GPU holds 1/S of the
weights plus the block being gathered for the forward or backward in flight. Each parameter keeps
its dtype: the frozen base in the run dtype, the LoRA adapters (and so AdamW's moments) in fp32, and
the forwards under the same autocast as a replica's. The adapters `default` and `old` and the
reference (adapters disabled) are switched inside the one sharded module, as on a replica.

The mesh (`device_mesh`) is 1-D over one node's processes, and 2-D with several nodes: shard within
a node, replicate across nodes (HYBRID_SHARD, FSDP2's HSDP), taking torchrun's LOCAL_WORLD_SIZE as
the node size. Which strategy a run takes, and under fsdp which copies it keeps and how they are
laid out, is the run's plan (plan/fsdp.py); this module carries it out. What differs from a
replicated run, and why:

- The low-precision explore copy is built from the shards (sharded_copy.py): on the meta device,
  filled and refreshed one gathered FSDP unit at a time from the sharded policy, without the
  high-precision weights of its quantized layers (fp8: about half a bf16 copy; the emulations hold
  their fake-quantized weights at the run dtype), whole on every process or sharded like the policy
  as the plan says (each process 1/S of it, gathered block by block for Stage 1: FSDP2 on the same
  mesh, eager). So sol_rl and naive_quant explore at the explore precision, as on a replica, and the
  rank check runs (every rank regenerates its own first group, each forward a collective; rank 0
  reports). A full-precision rollout copy, where the plan keeps one, is sharded like the policy the
  same way (no quantization), eager; otherwise the full-precision rollouts and the update's v_old run
  on the policy with its `old` adapter, and the start-up line says so.
- Gradients are averaged by FSDP (reduce-scatter within the shard group, all-reduce across nodes),
  once per optimizer step: sync is off for every micro-batch's backward but the last, where the
  LoRA gradients, small, accumulate unsharded. distributed.all_reduce_mean_grads is not applied.
- Every forward and backward is a collective, so every rank must run as many: a rank left with
  fewer samples (those with a non-finite reward are dropped per rank) adds weightless micro-steps
  to match the others (update.py); a micro-batch whose loss is not finite still runs its backward
  (a replica skips it), its non-finite gradient then skips the whole step (counted as any skipped
  step is); evaluation runs on every rank, rank 0 reporting.
- Checkpoints hold what a replicated run writes: the adapters and AdamW's state gathered whole
  (`DTensor.full_tensor`) and written by rank 0, so one LoRA file plain diffusers loads. Read back,
  each rank keeps its shard (`distribute_tensor` with no communication), so a checkpoint resumes at
  any world size and under either strategy. LoRA state is small (AdamW's moments are twice the
  adapter), so gathering it costs little; the frozen base is never saved.

With one process, fsdp shards nothing (the whole model, as replicate) but keeps the fsdp plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from solrl_core.engine.regions import repeated_blocks
from solrl_core.plan.fsdp import shard_count
from solrl_core.plan.plan import MachinePlan
from solrl_core.runtime import distributed


@dataclass(frozen=True)
class Layout:
    """How this run holds the model: the strategy, why, and the sharding mesh (None: not sharded)."""

    strategy: str  # replicate | fsdp
    why: str
    mesh: object | None = None  # torch.distributed.device_mesh.DeviceMesh

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def describe(self) -> str:
        if self.mesh is None:
            return f"{self.strategy} ({self.why})"
        dims = " x ".join(f"{n} {s}" for n, s in zip(self.mesh.mesh_dim_names, self.mesh.shape))
        hybrid = ": sharded within a node, replicated across nodes" if self.mesh.ndim == 2 else ""
        return f"fsdp over {self.mesh.size()} processes (mesh {dims}{hybrid}; {self.why})"


def device_mesh(device: torch.device, world: int):  # type: ignore[no-untyped-def]
    """The sharding mesh: 1-D over the processes of one node, 2-D (replicate across nodes, shard within
    one) when torchrun's LOCAL_WORLD_SIZE says the run spans several with more than one process each
    (with one GPU per node, shard over all)."""
    from torch.distributed.device_mesh import init_device_mesh

    per_node = shard_count(world)
    if per_node == world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))


def layout_of(machine: MachinePlan, device: torch.device, world: int) -> Layout:
    """The layout of the strategy the plan chose (plan/fsdp.py), its mesh built under fsdp with more than
    one process."""
    if machine.strategy == "fsdp" and world > 1:
        return Layout("fsdp", machine.strategy_why, device_mesh(device, world))
    return Layout(machine.strategy, machine.strategy_why)


def shard_policy(policy, layout: Layout) -> None:  # type: ignore[no-untyped-def]
    """Shard the policy's transformer in place (each repeated block, then the root) on the layout's
    mesh, and point the policy at its sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    for _, unit in fsdp_units(policy.transformer):  # the blocks first, the root last
        fully_shard(unit, mesh=layout.mesh)
    policy.rebind()


def fsdp_units(transformer: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each unit `shard_policy` shards, gathered whole at once: every repeated block,
    then the root ("", holding the layers outside the blocks)."""
    blocks = {id(b) for b in repeated_blocks(transformer)}
    return [(n, m) for n, m in transformer.named_modules() if id(m) in blocks] + [("", transformer)]


def sync_gradients(module: nn.Module, on: bool) -> None:
    """FSDP: whether the next backward reduces the gradients over the ranks (off: they accumulate
    unsharded on this rank). A replica's module: nothing to do."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(on)


@dataclass(frozen=True)
class Gathered:
    """What a checkpoint writes, whole, gathered from every rank's shards (sharded runs)."""

    adapters: dict[str, dict[str, torch.Tensor]]  # default, old, ema -> tensors keyed as Policy.state
    optimizer: dict  # optimizer.state_dict() with its tensors whole


def gather(policy, optimizer: torch.optim.Optimizer) -> Gathered:  # type: ignore[no-untyped-def]
    """Every adapter and the optimizer state whole: a collective, every rank calls it."""
    adapters = {name: policy.state(name) for name in ("default", "old", "ema")}
    return Gathered(adapters, optimizer_state(optimizer))


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` with every sharded tensor gathered whole, in the format a replica
    saves (a collective when sharded)."""
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: distributed.full_tensor(v).cpu() if torch.is_tensor(v) else v for k, v in s.items()}
                   for i, s in sd["state"].items()}
    return sd


def load_optimizer_state(optimizer: torch.optim.Optimizer, sd: dict) -> None:
    """Load a whole optimizer state (as a replica saves it) into `optimizer`; where its parameters are
    sharded, each state tensor keeps this rank's shard (no communication)."""
    optimizer.load_state_dict(sd)
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == p.shape:  # the moments, not the step count
                    state[key] = distributed.shard_like(value, p)
