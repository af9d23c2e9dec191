"""Many GPUs and many nodes through torch.distributed: one process per GPU, started by torchrun.

The split follows the official recipe: the iteration's prompt groups are dealt out to the ranks,
each group whole on one rank, and every rank holds a full replica of the model and its LoRA
adapters. Three things cross ranks, all small:

- the per-sample rewards of each stage (all-gathered), so advantages use the std over every reward
  of the iteration, selection and reward health see the global batch, and logged stats are global;
- the LoRA gradients (all-reduced, averaged) once per optimizer step;
- a few Python objects at start-up (run directory, checkpoint choice) and the stop flag.

Gradients are averaged with an explicit all-reduce rather than by wrapping the peft model in
DistributedDataParallel: one optimizer step accumulates over many micro-batches and timesteps and
runs the trained, old and reference adapters through the same module, which DDP's per-backward
hooks (and its `no_sync` bookkeeping) fit poorly; one flat all-reduce of the LoRA gradients before
clipping is exact, easy to read and costs the same. Every rank then takes the same optimizer step on
the same parameters, so old-adapter decay, EMA and explore-copy refresh stay identical everywhere.

With one process (no torchrun variables) nothing is initialised and every helper is the identity.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
from typing import Any, Iterable

import torch
import torch.distributed as dist

from solrl_core.errors import SolrlError

# Rank 0 alone evaluates and writes checkpoints while the others wait at a barrier: the default
# NCCL timeout (10 minutes) is shorter than a large model's evaluation.
TIMEOUT = dt.timedelta(minutes=60)


def init_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank); joins the process group when torchrun's variables say so.

    Backend nccl when CUDA is available, else gloo. The CUDA device is set from LOCAL_RANK.
    Without torchrun (no RANK, WORLD_SIZE 1 or unset) nothing is initialised: (0, 1, 0).
    """
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if is_initialized():
        return dist.get_rank(), dist.get_world_size(), local
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and "RANK" not in os.environ:
        return 0, 1, 0
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise SolrlError(f"torch.distributed variables {', '.join(missing)} are not set",
                         "start the processes with `solrl train --nproc-per-node N` or "
                         "`torchrun --nproc-per-node N -m solrl_cli train`")
    if torch.cuda.is_available():
        if local >= torch.cuda.device_count():
            raise SolrlError(f"LOCAL_RANK {local} but this node has {torch.cuda.device_count()} GPUs",
                             "start at most one process per GPU (--nproc-per-node)")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=TIMEOUT, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    atexit.register(_shutdown)
    return dist.get_rank(), dist.get_world_size(), local


def _shutdown() -> None:
    """At exit, while the interpreter is whole: free what still holds collective work (an FSDP module's
    pending reduce-scatter, unreachable until a collection), then the process groups. Left to the
    interpreter's finalization, gloo's worker threads can drop such work without the GIL and abort the
    process (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291)."""
    if is_initialized():
        import gc

        gc.collect()
        dist.destroy_process_group()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def _comm_device() -> torch.device:
    """NCCL moves CUDA tensors only; gloo CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_tensor(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t` concatenated along dim 0, rank 0's first. Shapes must be equal on every rank
    (each rank holds the same number of prompt groups); a mismatch is an error, not a hang."""
    if world_size() == 1:
        return t
    dev = _comm_device()
    shape = torch.tensor(list(t.shape), dtype=torch.long, device=dev)
    dims = [torch.zeros_like(shape) for _ in range(world_size())]
    dist.all_gather(dims, shape)
    if any(not torch.equal(d, shape) for d in dims):
        raise RuntimeError(f"all_gather of unequal shapes across ranks: {[tuple(d.tolist()) for d in dims]} "
                           "(every rank must hold the same number of samples)")
    local = t.detach().to(dev).contiguous()
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(t.device)


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """A reduced copy of `t` (op: sum, max or mean) over every rank."""
    if world_size() == 1:
        return t
    buf = t.detach().to(_comm_device()).clone()
    dist.all_reduce(buf, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "mean": dist.ReduceOp.SUM}[op])
    if op == "mean":
        buf /= world_size()
    return buf.to(t.device)


def any_true(flag: bool) -> bool:
    """True on every rank when it is true on any (a Ctrl-C seen by one rank stops all together)."""
    return bool(all_reduce(torch.tensor([int(flag)]), "max").item())


def all_reduce_mean_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Average the gradients of `params` over ranks, in place, as one flat float32 all-reduce.

    A parameter without a gradient counts as zero; if no rank produced any gradient at all (every
    loss was non-finite) the gradients stay None, as in a one-process run, and the step is skipped."""
    params = list(params)
    if world_size() == 1 or not params:
        return
    dev = _comm_device()
    had = any(p.grad is not None for p in params)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).to(dev, torch.float32)
                      for p in params] + [torch.tensor([float(had)], device=dev)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if float(flat[-1]) == 0:
        return
    flat = flat[:-1] / world_size()
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.device, p.dtype)
        offset += n


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """`obj` as rank `src` holds it, on every rank (pickled: for small objects)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def broadcast_tensors(tensors: dict[str, torch.Tensor], src: int = 0) -> dict[str, torch.Tensor]:
    """Rank `src`'s values of a dict of tensors (same keys and shapes on every rank), as one flat
    broadcast; returned on each tensor's own device and dtype."""
    if world_size() == 1 or not tensors:
        return tensors
    dev = _comm_device()
    keys = sorted(tensors)
    flat = torch.cat([tensors[k].detach().reshape(-1).to(dev, torch.float32) for k in keys])
    dist.broadcast(flat, src=src)
    out, offset = {}, 0
    for k in keys:
        t = tensors[k]
        out[k] = flat[offset:offset + t.numel()].view(t.shape).to(t.device, t.dtype)
        offset += t.numel()
    return out


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t` whole: a DTensor's shards gathered from every rank (a collective: every rank calls it), any
    other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`value` (whole, the same on every rank) as `target` holds it: on target's device and dtype, and,
    where `target` is a DTensor, this rank's shard of it, taken without communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    value = value.to(target.device, target.dtype)
    if isinstance(target, DTensor):
        return distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)
    return value
