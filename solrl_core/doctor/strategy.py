"""`solrl doctor` on many GPUs: the per-GPU memory ESTIMATE of each distributed strategy (replicate,
and fsdp at several processes per node), the one this run would take, and the collective backend
a multi-process run needs (NCCL on GPUs, gloo on CPUs). Estimates are approximate (footprint.py)."""

from __future__ import annotations

from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check
from solrl_core.doctor.memory import ASSUMED_GPU, planned
from solrl_core.plan.footprint import FIT_SHARE, estimate_memory, model_size
from solrl_core.plan.fsdp import fitting_layout, layout_peaks, resolve_strategy
from solrl_core.plan.plan import RunPlan
from solrl_core.precision.hardware import GpuInfo

SHARD_COUNTS = (2, 4, 8)  # processes per node shown besides the run's own


def strategy_estimates(cfg: Config, explore_precision: str, dtype_name: str, nproc: int,
                       budget: float | None = None) -> dict[str, float]:
    """Peak GiB per GPU ESTIMATE: 'replicate' (the smallest replica: gradient checkpointing on, no
    rollout copy) and 'fsdp/S' for S processes per node sharing the weights, with the explore copy laid
    out as `distributed.copy_layout` takes it (fsdp.fitting_layout): auto keeps it whole where that fits
    `budget` GiB (or with no budget), else sharded like the policy (sharded too where neither fits)."""
    out = {"replicate": estimate_memory(cfg, explore_precision, dtype_name, checkpointing=True,
                                        rollout_copy=False).peak}
    asked = cfg.distributed.copy_layout
    for shard in sorted({*SHARD_COUNTS, nproc} - {1}):
        peaks = layout_peaks(cfg, dtype_name, shard, explore_precision)
        out[f"fsdp/{shard}"] = peaks[fitting_layout(asked, peaks, budget) or ("sharded" if asked == "auto" else asked)]
    return out


def strategy_check(cfg: Config, gpu: GpuInfo | None, nproc: int, plan: RunPlan | None = None) -> Check:
    """`plan`: the run's own (its preflight), else the one a run of `cfg` would make here."""
    if cfg.model.loader in TINY_LOADERS:
        return Check("strategy", PASS, f"distributed.strategy={cfg.distributed.strategy}; the tiny model fits anywhere")
    plan = plan or planned(cfg, gpu if gpu is not None else ASSUMED_GPU)  # no GPU: a GPU run's, as the memory check's
    dtype_name, precision = plan.full_precision, plan.machine.explore_precision
    budget = gpu.memory_gib * FIT_SHARE if gpu is not None else None
    est = strategy_estimates(cfg, precision, dtype_name, nproc, budget)
    table = ", ".join(f"{'replicate' if k == 'replicate' else 'fsdp over ' + k[5:]} {v:.1f} GiB"
                      for k, v in est.items())
    detail = f"per-GPU estimate ({model_size(cfg).label}, {dtype_name}, approximate): {table}"
    if gpu is None:
        return Check("strategy", PASS, f"{detail}; no GPU here to choose for")
    asked = cfg.distributed.strategy
    chosen = resolve_strategy(cfg, plan.machine, dtype_name, gpu, nproc)[0]
    mine = est["replicate"] if chosen == "replicate" else est.get(f"fsdp/{nproc}", est["replicate"])
    detail += (f"; this run: {chosen}{' (auto)' if asked == 'auto' else ''} at {nproc} process(es) on "
               f"{gpu.memory_gib:.0f} GiB")
    if chosen == "fsdp" and nproc == 1:
        return Check("strategy", WARN, detail + ": one process shards nothing", "start one process per GPU: "
                                                                                "--nproc-per-node N")
    if mine > budget:
        fits = [k[5:] for k, v in est.items() if k.startswith("fsdp/") and v <= budget]
        fix = (f"shard it: --set distributed.strategy=fsdp --nproc-per-node {fits[0]} (or more)" if fits
               else "no strategy fits by this estimate: a GPU with more memory, or a smaller optimizer.micro_batch")
        return Check("strategy", WARN, detail + f": over {budget:.0f} GiB by this estimate", fix)
    return Check("strategy", PASS, detail)


def backend_check(nproc: int, gpu: GpuInfo | None) -> Check | None:
    """The collective backend of a multi-process run: NCCL between GPUs, gloo on CPUs."""
    if nproc <= 1:
        return None
    import torch.distributed as dist

    name, ok = ("nccl", dist.is_nccl_available()) if gpu is not None else ("gloo", dist.is_gloo_available())
    if ok:
        return Check("collectives", PASS, f"{name} is available in this torch build", "", True)
    return Check("collectives", FAIL, f"{name} is not available in this torch build (needed by {nproc} processes)",
                 "install a torch build with it (the CUDA wheels from pytorch.org ship NCCL)", True)
