"""`solrl doctor` on many GPUs: the per-GPU memory ESTIMATE of each distributed strategy (replicate,
and fsdp at several processes per node), the one this run would take, and the collective backend
a multi-process run needs (NCCL on GPUs, gloo on CPUs). Estimates are approximate (footprint.py)."""

from __future__ import annotations

from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check
from solrl_core.engine.sharding import replica_fits, sharded_estimate
from solrl_core.plan.footprint import estimate_memory, model_size
from solrl_core.plan.resolve import FIT_SHARE, auto_explore_precision
from solrl_core.precision.hardware import GpuInfo

SHARD_COUNTS = (2, 4, 8)  # processes per node shown besides the run's own


def strategy_estimates(cfg: Config, explore_precision: str, dtype_name: str, nproc: int,
                       budget: float | None = None) -> dict[str, float]:
    """Peak GiB per GPU ESTIMATE: 'replicate' (the smallest replica: gradient checkpointing on, no
    rollout copy) and 'fsdp/S' for S processes per node sharing the weights, with the explore copy laid
    out as `distributed.copy_layout` says (sharding.copy_layout): auto keeps it whole where that fits
    `budget` GiB (or with no budget), else sharded like the policy."""
    out = {"replicate": estimate_memory(cfg, explore_precision, dtype_name, checkpointing=True, rollout_copy=False).peak}
    for shard in sorted({*SHARD_COUNTS, nproc} - {1}):
        peaks = {layout: sharded_estimate(cfg, dtype_name, shard, explore_precision=explore_precision,
                                          copy_layout=layout).peak for layout in ("whole", "sharded")}
        asked = cfg.distributed.copy_layout
        layout = asked if asked != "auto" else "whole" if budget is None or peaks["whole"] <= budget else "sharded"
        out[f"fsdp/{shard}"] = peaks[layout]
    return out


def strategy_check(cfg: Config, gpu: GpuInfo | None, nproc: int) -> Check:
    if cfg.model.loader in TINY_LOADERS:
        return Check("strategy", PASS, f"distributed.strategy={cfg.distributed.strategy}; the tiny model fits anywhere")
    dtype_name = "bf16" if cfg.run.dtype == "auto" else cfg.run.dtype
    precision = cfg.explore.precision if cfg.explore.precision != "auto" else auto_explore_precision(gpu, dtype_name)[0]
    if gpu is None and cfg.explore.precision == "auto":
        precision = "fp8"  # as the memory check assumes without a GPU
    budget = gpu.memory_gib * FIT_SHARE if gpu is not None else None
    est = strategy_estimates(cfg, precision, dtype_name, nproc, budget)
    table = ", ".join(f"{'replicate' if k == 'replicate' else 'fsdp over ' + k[5:]} {v:.1f} GiB" for k, v in est.items())
    detail = f"per-GPU estimate ({model_size(cfg).label}, {dtype_name}, approximate): {table}"
    if gpu is None:
        return Check("strategy", PASS, f"{detail}; no GPU here to choose for")
    asked = cfg.distributed.strategy
    chosen = asked if asked != "auto" else ("replicate" if nproc == 1 or replica_fits(cfg, precision, dtype_name, gpu)[0]
                                            else "fsdp")
    mine = est["replicate"] if chosen == "replicate" else est.get(f"fsdp/{nproc}", est["replicate"])
    detail += f"; this run: {chosen}{' (auto)' if asked == 'auto' else ''} at {nproc} process(es) on {gpu.memory_gib:.0f} GiB"
    if chosen == "fsdp" and nproc == 1:
        return Check("strategy", WARN, detail + ": one process shards nothing", "start one process per GPU: --nproc-per-node N")
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
