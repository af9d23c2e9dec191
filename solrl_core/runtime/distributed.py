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

A process torchrun started watches its launcher (`watch_launcher`): if the launcher dies (kill -9),
the process gets a signal and stops as a scheduler's SIGTERM stops it (saves, releases the run lock), where
it would otherwise train on as an orphan holding the lock. A collective that fails because another
process died becomes one clear error naming that rank (`lost_peer`), not a gloo or NCCL trace.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime as dt
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist

from solrl_core.errors import SolrlError

# Rank 0 alone evaluates and writes checkpoints while the others wait at a barrier: the default
# NCCL timeout (10 minutes) is shorter than a large model's evaluation.
TIMEOUT = dt.timedelta(minutes=60)
LAUNCHER_ENV = "SOLRL_LAUNCHER_PID"  # set by solrl_cli/launch.py for the processes it has torchrun start
WATCHED_ENV = "SOLRL_WATCHED_PARENT"  # the launcher's pid, as watch_launcher found it (for `orphaned`)
# The parent-death signal: a signal of its own, because the kernel sends it again as each thread of the
# dying launcher exits, and a repeated SIGTERM would mean "stop now". Unhandled, it ends the process.
LAUNCHER_GONE = signal.SIGUSR2
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_POLL_S = 1.0  # where prctl is missing: how often the parent's pid is looked at
# What gloo and NCCL say when the process at the other end of a collective is gone.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
              "remote process exited")


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
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: stop with it, before waiting on its store
        watch_launcher()
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


def watch_launcher() -> None:
    """LAUNCHER_GONE to this process when its launcher (the parent that started it) dies: the kernel's
    parent-death signal on Linux, else a thread that polls the parent's pid. stopping.py stops on it
    as on a first SIGTERM. The launcher's pid comes from launch.py (LAUNCHER_ENV), else it is the
    parent now; a launcher already gone before the signal was armed is an error here."""
    launcher = int(os.environ.get(LAUNCHER_ENV) or os.getppid())
    os.environ[WATCHED_ENV] = str(launcher)
    if not _parent_death_signal(LAUNCHER_GONE):
        threading.Thread(target=_poll_parent, args=(launcher,), name="solrl-launcher-watch", daemon=True).start()
    if os.getppid() != launcher:  # it died before the signal was armed: nothing would ever send it
        raise SolrlError(f"the launcher that started this process (pid {launcher}) is gone",
                         "start the run again (`solrl train --resume RUN` with the same launcher flags if it has a "
                         "checkpoint)")


def orphaned() -> bool:
    """This process's launcher, watched by `watch_launcher`, is gone (a LAUNCHER_GONE sent while the
    launcher's last threads still exit, or by anyone else, is not acted on)."""
    watched = os.environ.get(WATCHED_ENV)
    return bool(watched) and os.getppid() != int(watched)  # type: ignore[arg-type]


def _parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig): the kernel sends `sig` when the thread that started this process
    exits (torchrun's agent starts its workers from its main thread, so: when the launcher exits)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: no prctl
        return False


def _poll_parent(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(_POLL_S)
    os.kill(os.getpid(), LAUNCHER_GONE)


def lost_peer(exc: BaseException, run_dir: object = "RUN") -> SolrlError | None:
    """The error to stop with when `exc` is a collective failing because another process of the run
    died (None for any other error). Under solrl's launcher, which names the dead rank and its signal
    once for the node, this says only that; under torchrun typed by hand, it names the rank as far as
    this node can tell (/proc)."""
    if not isinstance(exc, RuntimeError) or world_size() == 1 or not any(m in str(exc) for m in _PEER_GONE):
        return None
    dead = [] if os.environ.get(LAUNCHER_ENV) else _dead_local_ranks()
    if dead:
        what = (f"rank {dead[0]} of this run died" if len(dead) == 1 else f"ranks {', '.join(map(str, dead))} of this "
                                                                          f"run died")
    elif os.environ.get(LAUNCHER_ENV):
        what = "another process of this run died (the launcher's line names it)"
    else:
        what = "a process of this run on another node died (its node's launcher names it)"
    return SolrlError(f"rank {rank()} stopped: {what}; its connection closed in a collective",
                      f"the newest checkpoint is intact (written atomically): continue with `solrl train --resume "
                      f"{run_dir}` "
                      "and the same launcher flags")


def _dead_local_ranks() -> list[int]:
    """The ranks this node's launcher started that are no longer running, from /proc (Linux): the
    launcher's children that are alive say their RANK; the node's other ranks are the dead ones."""
    local, here, me = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "0")), rank()
    if not here or not Path("/proc/self/stat").exists():
        return []
    expected = {me - local + i for i in range(here)}
    alive, parent = set(), os.getppid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if fields[0] == "Z" or int(fields[1]) != parent:
                continue
            env = (stat.parent / "environ").read_bytes().split(b"\0")
            alive.update(int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"RANK="))
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return sorted(expected - alive - {me})


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
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).to(dev,
                                                                                                      torch.float32)
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
