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
the node size. What differs from a replicated run, and why:

- The low-precision explore copy is built from the shards (sharded_copy.py): on the meta device,
  filled and refreshed one gathered FSDP unit at a time from the sharded policy, without the
  high-precision weights of its quantized layers (fp8: about half a bf16 copy; the emulations hold
  their fake-quantized weights at the run dtype). It is kept whole on every process, or sharded like
  the policy where a whole one does not fit by the memory ESTIMATE (`distributed.copy_layout`,
  `copy_layout`): then each process holds 1/S of it, gathered block by block for Stage 1 (FSDP2 on
  the same mesh), eager. So sol_rl and naive_quant explore at the explore precision, as on a replica,
  and the rank check runs (every rank regenerates its own first group, each forward a collective;
  rank 0 reports). A full-precision rollout copy only with `sampler.rollout_copy=true`, sharded like
  the policy the same way (no quantization), eager; otherwise the full-precision rollouts and the
  update's v_old run on the policy with its `old` adapter, and the start-up line says so. Refused:
  the compile family and compiling either sharded copy (sampler.compile=true with a rollout copy,
  explore.compile=true with a sharded explore copy), and a compiled update (not run sharded in this
  version).
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

With one process, fsdp shards nothing (the whole model, as replicate) but keeps the fsdp plan: a
rollout copy only when asked for, whole, and an explore copy as a replica's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
from torch import nn

from solrl_core.config.families import family
from solrl_core.config.schema import Config
from solrl_core.engine.regions import repeated_blocks
from solrl_core.errors import SolrlError
from solrl_core.plan.footprint import MemoryEstimate, estimate_memory
from solrl_core.plan.plan import MachinePlan
from solrl_core.plan.resolve import COMPILED_ANYWAY, FIT_SHARE
from solrl_core.precision.hardware import GpuInfo
from solrl_core.runtime import distributed

# A sharded GPU holds, besides its 1/S of the weights, the blocks gathered whole for the forward in
# flight and the one prefetched: 2 of SANA's 20 blocks, fewer of the other models' (FLUX.1 57,
# SD3.5-L 38, Qwen-Image 60). An APPROXIMATE upper share of the full weights, for estimates only.
GATHERED_SHARE = 0.1


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


def replica_fits(cfg: Config, explore_precision: str, dtype_name: str, gpu: GpuInfo | None) -> tuple[bool, str]:
    """Whether one full replica (gradient checkpointing on, no rollout copy: its smallest) fits `gpu` by
    the memory ESTIMATE, and the figures."""
    if gpu is None:
        return True, "a CPU: no GPU memory limit"
    peak = estimate_memory(cfg, explore_precision, dtype_name, checkpointing=True, rollout_copy=False).peak
    budget = gpu.memory_gib * FIT_SHARE
    fits = peak <= budget
    return fits, f"one replica's estimated peak {peak:.1f} GiB, {'within' if fits else 'over'} {budget:.1f} GiB"


def resolve_strategy(cfg: Config, machine: MachinePlan, dtype_name: str, gpu: GpuInfo | None,
                     world: int) -> tuple[str, str]:
    """(strategy, why) for `distributed.strategy`; auto: replicate while one replica fits (or with one
    process: nothing to shard over), else fsdp."""
    asked = cfg.distributed.strategy
    if asked != "auto":
        return asked, "as configured"
    if world == 1:
        return "replicate", "auto with one process: nothing to shard over"
    fits, figures = replica_fits(cfg, machine.explore_precision, dtype_name, gpu)
    return ("replicate" if fits else "fsdp"), f"auto: {figures}"


def fsdp_machine(machine: MachinePlan, cfg: Config, dtype_name: str, gpu: GpuInfo | None = None,
                 shard: int = 1) -> MachinePlan:
    """`machine` under fsdp over `shard` processes per node: the explore copy built from the shards
    (sharded_copy.py), whole on every process or sharded like the policy as `distributed.copy_layout`
    and the memory ESTIMATE say (`explore_layout`; where neither fits `gpu`, with explore.precision=auto,
    Stage 1 at the run dtype; an explicit precision is refused), a full-precision rollout copy sharded
    like the policy only with sampler.rollout_copy=true; a setting fsdp cannot run is refused."""
    fix = "set distributed.strategy=replicate (a full replica per GPU), or drop the setting"
    fam = family(cfg.algorithm.family)
    if fam.copy == "compiled":
        raise SolrlError(f"the {fam.name} family rolls out on a compiled full-precision copy of the model; under "
                         "distributed.strategy=fsdp the rollout copy is sharded and eager (not run compiled in this version)",
                         "set distributed.strategy=replicate, or use naive_scaling with sampler.rollout_copy=true")
    rollout = cfg.sampler.rollout_copy == "true"
    if rollout and shard > 1 and cfg.sampler.compile == "true":
        raise SolrlError("sampler.compile=true compiles the rollout copy, which under distributed.strategy=fsdp is sharded "
                         "like the policy and eager (not run compiled in this version)",
                         "set sampler.compile=auto, or distributed.strategy=replicate")
    if cfg.optimizer.compile == "true":
        raise SolrlError("optimizer.compile=true is not available with distributed.strategy=fsdp in this version "
                         "(a compiled update is not run sharded)", fix)
    if cfg.explore.calibrate != "off":  # calibration.py measures on rank 0 alone; a sharded forward needs every rank
        raise SolrlError("explore.calibrate measures on one process, and under distributed.strategy=fsdp every "
                         "full-precision forward needs all of them (not available in this version)", fix)
    if cfg.memory.copies.startswith("cpu-"):
        raise SolrlError(f"memory.copies={cfg.memory.copies} is not available with distributed.strategy=fsdp in this "
                         "version (the sharded explore copy is filled from the shards on the GPU)", fix)
    low = fam.low_precision and machine.explore_precision != dtype_name
    layout, why = copy_layout(machine, cfg, dtype_name, gpu, shard, rollout) if low else ("", "")
    rollout, auto_why = _auto_rollout_copy(cfg, dtype_name, gpu, shard, machine.explore_precision if layout else None,
                                           layout or "whole", rollout)
    if layout == "sharded" and cfg.explore.compile == "true":
        raise SolrlError(f"explore.compile=true compiles the explore copy, which under distributed.strategy=fsdp is sharded "
                         f"like the policy here ({why}) and eager (not run compiled in this version)",
                         "set explore.compile=auto, or distributed.copy_layout=whole where a whole copy fits")
    precision, built = machine.explore_precision, "built and refreshed one gathered block at a time from the sharded policy"
    if layout == "whole":
        explore_why = (f"{machine.explore_why}; under fsdp a whole {precision} copy on each process ({why}), {built}, "
                       "without its high-precision weights")
    elif layout == "sharded":
        eager_why = machine.explore_why.split(COMPILED_ANYWAY)[0]  # a sharded copy runs eager whatever the precision
        explore_why = (f"{eager_why}; under fsdp a {precision} copy sharded like the policy, 1/{shard} on each "
                       f"process and gathered block by block for Stage 1's forwards, eager ({why}), {built}")
    else:
        explore_why = (f"auto: {why}, so " if why else "") + "Stage 1 at the run dtype on the policy's old adapter"
    if not rollout:
        rollout_why = (f"{'as configured' if cfg.sampler.rollout_copy == 'false' else auto_why}: "
                       "rollouts and v_old on the policy's old adapter (sampler.rollout_copy=true keeps one sharded like the policy)")
    elif shard == 1:
        rollout_why = f"{auto_why or 'as configured'}; one process: a whole copy, eager"
    else:
        rollout_why = (f"{auto_why or 'as configured'}; under fsdp sharded like the policy, 1/{shard} on each process and gathered block "
                       f"by block for Stage 2's forwards and v_old's, eager, {built}")
    return replace(machine, explore_precision=precision if layout else dtype_name, explore_layout=layout,
                   explore_compile=machine.explore_compile and layout == "whole", rollout_copy=rollout, rollout_compile=False,
                   update_compile=False, policy_rollout_compile=False, explore_why=explore_why, memory_fits=True,
                   memory=replace(machine.memory, copies="gpu"),
                   memory_why="under fsdp the copies stay on the GPU; the VAE and gradient "
                              "checkpointing as chosen for one replica", rollout_copy_why=rollout_why)


def _auto_rollout_copy(cfg: Config, dtype_name: str, gpu: GpuInfo | None, shard: int, explore_precision: str | None,
                       layout: str, asked: bool) -> tuple[bool, str]:
    """(keep, why) of the full-precision rollout copy under fsdp: as configured, or with
    sampler.rollout_copy=auto, kept sharded like the policy where the memory ESTIMATE with it (and the
    explore copy as laid out) fits `gpu`. Without a GPU (a CPU) or with sampler.compile=true (a sharded
    copy is not compiled in this version), auto keeps none."""
    if cfg.sampler.rollout_copy != "auto":
        return asked, ""
    if gpu is None:
        return False, "auto under fsdp keeps none without a GPU memory limit to decide by"
    if cfg.sampler.compile == "true":
        return False, "auto under fsdp keeps none with sampler.compile=true (a sharded copy runs eager)"
    budget = gpu.memory_gib * FIT_SHARE
    peak = sharded_estimate(cfg, dtype_name, shard, explore_precision=explore_precision, copy_layout=layout,
                            rollout_copy=True).peak
    fits = peak <= budget
    return fits, f"auto: estimated peak {peak:.1f} GiB with it, {'within' if fits else 'over'} {budget:.1f} GiB"


def copy_layout(machine: MachinePlan, cfg: Config, dtype_name: str, gpu: GpuInfo | None, shard: int,
                rollout_copy: bool = False) -> tuple[str, str]:
    """(layout, why) of the low-precision explore copy under fsdp: `distributed.copy_layout`, auto taking
    the first of whole and sharded that fits `gpu` by the memory ESTIMATE (`sharded_estimate`, with the
    sharded rollout copy where one is kept); with one process, whole (nothing to shard over).
    ("", figures) where none fits and explore.precision is auto (Stage 1 then at the run dtype); an
    explicit precision is refused with the figures."""
    asked = cfg.distributed.copy_layout
    if shard == 1:
        return "whole", "one process: nothing to shard the copy over"
    if gpu is None:
        return ("whole" if asked == "auto" else asked), ("auto: " if asked == "auto" else "as configured; ") + \
            "a CPU, no GPU memory limit"
    precision, budget = machine.explore_precision, gpu.memory_gib * FIT_SHARE
    peaks = {layout: sharded_estimate(cfg, dtype_name, shard, explore_precision=precision, copy_layout=layout,
                                      rollout_copy=rollout_copy).peak
             for layout in (("whole", "sharded") if asked == "auto" else (asked,))}
    for layout, peak in peaks.items():
        if peak > budget:
            continue
        head = "as configured; " if asked != "auto" else "auto: " if layout == "whole" else \
            f"auto: a whole copy's {peaks['whole']:.1f} GiB over {budget:.1f}; "
        return layout, f"{head}estimated peak {peak:.1f} GiB within {budget:.1f} GiB"
    without = sharded_estimate(cfg, dtype_name, shard, rollout_copy=rollout_copy).peak
    (first, peak), *rest = peaks.items()
    figures = (f"a {first} {precision} explore copy per GPU takes the estimated peak under fsdp over {shard} to {peak:.1f} GiB"
               + "".join(f", a {layout} one to {p:.1f} GiB" for layout, p in rest)
               + f", over {budget:.1f} GiB ({without:.1f} GiB without it)")
    if cfg.explore.precision != "auto":
        raise SolrlError(figures, "set explore.precision=auto (Stage 1 then at the run dtype where the copy does not fit), "
                                  "distributed.copy_layout=auto, more processes per node, or a GPU with more memory")
    return "", figures


def shard_count(world: int) -> int:
    """Processes sharing one copy of the weights: one node's (torchrun's LOCAL_WORLD_SIZE) where the
    mesh is 2-D (`device_mesh`), else all of them."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world if per_node <= 1 or per_node >= world or world % per_node else per_node


def device_mesh(device: torch.device, world: int):  # type: ignore[no-untyped-def]
    """The sharding mesh: 1-D over the processes of one node, 2-D (replicate across nodes, shard within
    one) when torchrun's LOCAL_WORLD_SIZE says the run spans several with more than one process each
    (with one GPU per node, shard over all)."""
    from torch.distributed.device_mesh import init_device_mesh

    per_node = shard_count(world)
    if per_node == world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))


def open_layout(cfg: Config, machine: MachinePlan, dtype_name: str, device: torch.device,
                gpu: GpuInfo | None) -> tuple[Layout, MachinePlan]:
    """The run's layout and its machine plan (under fsdp, the copies it keeps: `fsdp_machine`); the mesh
    is built with more than one process."""
    world = distributed.world_size()
    strategy, why = resolve_strategy(cfg, machine, dtype_name, gpu, world)
    if strategy == "replicate":
        return Layout("replicate", why), machine
    machine = fsdp_machine(machine, cfg, dtype_name, gpu, shard_count(world))
    if world == 1:
        return Layout("fsdp", f"{why}; one process: nothing to shard over, the whole model, no rollout copy"), machine
    return Layout("fsdp", why, device_mesh(device, world)), machine


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



def sharded_estimate(cfg: Config, dtype_name: str, shard: int, checkpointing: bool = True,
                     explore_precision: str | None = None, copy_layout: str = "whole",
                     rollout_copy: bool = False) -> MemoryEstimate:
    """Peak GPU memory ESTIMATE per process under fsdp with `shard` processes per shard group (a node):
    a replica's estimate (footprint.py), its policy weights divided by `shard` plus the gathered blocks
    (GATHERED_SHARE of the weights, when sharded), and, where the family explores at
    `explore_precision` (None: at the run dtype), an explore copy without its high-precision weights
    (footprint.copy_bytes): whole as a replica's (`copy_layout` whole), or sharded like the policy
    (1/shard of it plus its gathered blocks, the same share). A full-precision `rollout_copy` is
    always sharded like the policy (a run-dtype copy, 1/shard plus its gathered share). Each copy's
    gathered blocks are counted beside the policy's although they are gathered in different phases:
    an upper estimate. APPROXIMATE."""
    explore = explore_precision or dtype_name
    est = estimate_memory(cfg, explore, dtype_name, checkpointing, rollout_copy=False)
    gathered = GATHERED_SHARE if shard > 1 else 0.0
    policy = est.policy / shard + est.policy * gathered
    copy = est.explore_copy / shard + est.explore_copy * gathered if copy_layout == "sharded" else est.explore_copy
    full = est.rollout_copy_size / shard + est.rollout_copy_size * gathered if rollout_copy else 0.0
    return replace(est, policy=policy, explore_copy=copy, rollout_copy=full)
