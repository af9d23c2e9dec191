"""`solrl doctor`: can this machine run the requested run, and if not, what to do about it.

`run_checks(cfg)` returns one `Check` per fact: the software stack (Python, torch and its CUDA
build, Transformer Engine, diffusers/transformers/peft and the combinations known to
break), the GPUs and the explore precisions each supports, the reward backends and weights, the
base model's weights (local folder or Hugging Face cache; gated repositories and HF_TOKEN; the
HF_HUB_OFFLINE state), the prompt sets (read if local, cached or reachable if not), free disk for
what is still to download, processes versus GPUs, a peak GPU memory ESTIMATE (per GPU for each
distributed strategy too, and the collective backend: doctor/strategy.py; the memory mode each model
preset needs per GPU size, the run's own or with --memory-modes every one: doctor/modes.py), and whether the
explore precision runs here. Each check says whether the requested run depends on it
(`needed_by_run`); the CLI exits non-zero only for those that fail.

Weights are looked for only in the local cache (`huggingface_hub.try_to_load_from_cache`); the
network is asked, with a few seconds' timeout, only whether what is missing can be fetched, and each
remote:URL or vlm:URL reward the run names is asked whether it answers (doctor/remote.py). Sizes
below are approximate, from the models' published parameter counts and repository sizes, and are
labelled so wherever they are shown.
"""

from __future__ import annotations

from solrl_core.config.schema import Config
from solrl_core.doctor.backends import backends_check, simulated_gpu
from solrl_core.doctor.check import FAIL, Check, machine
from solrl_core.doctor.memory import _explore, _memory, _memory_without_gpu, _processes, planned
from solrl_core.doctor.modes import modes_check
from solrl_core.doctor.prompts import prompt_checks
from solrl_core.doctor.remote import _remote_rewards
from solrl_core.doctor.software import (
    _combinations,
    _device,
    _gpus,
    _library,
    _python,
    _reward_backends,
    _torch,
    _torchvision,
    _transformer_engine,
    matching_torchvision,
)
from solrl_core.doctor.strategy import backend_check, strategy_check
from solrl_core.doctor.weights import _disk, _hub_mode, _hub_token, _model_weights, _reward_weights, hub_reachable
from solrl_core.plan.plan import RunPlan
from solrl_core.precision.hardware import GpuInfo
from solrl_core.rewards.registry import torchvision_rewards

__all__ = ["Check", "failed_for_run", "matching_torchvision", "run_checks"]


def run_checks(cfg: Config | None, nproc: int = 1, explore_precision: str | None = None,
               only_needed: bool = False, memory_modes: bool = False, gpu_capability: str | None = None, *,
               plan: RunPlan | None = None, prompts: dict[str, list[str]] | None = None) -> list[Check]:
    """Every check for running `cfg` with `nproc` processes (cfg None: the machine alone).
    `explore_precision` overrides cfg.explore.precision and may also be 'nvfp4' or 'fp8'.
    `only_needed` (a run's own preflight) skips importing the reward backends and torchvision the run
    does not use: the doctor shows them, a run need not pay their import (about 12 s on a 2-core CPU).
    `memory_modes`: the memory-mode table for every model preset, not only the run's (doctor/modes.py).
    `gpu_capability` ('10.0'): the explore-backends row answers for a simulated GPU of it.
    `plan` and `prompts` (a run's own preflight, tools/start.py): the plan the run resolved and the
    prompts it read, by spec; the checks read them rather than planning again or reading the files."""
    m = machine()
    rewards = set(cfg.reward.weights) if cfg is not None else set()
    requested = explore_precision or (cfg.explore.precision if cfg is not None else None)
    checks = [_python(), _torch(m)]
    gpu: GpuInfo | None = None
    if cfg is not None:
        device_check, gpu = _device(cfg, m)
        checks.append(device_check)
    elif m.gpus:
        gpu = m.gpus[0]
    checks += _gpus(m, gpu)
    # Transformer Engine matters to the run only when its Stage 1 runs at the explore precision.
    low = requested if cfg is not None and (plan or planned(cfg, gpu, requested)).low_precision else None
    checks.append(_transformer_engine(m, gpu, low))
    checks += [_library(name) for name in ("diffusers", "transformers", "peft")]
    checks += _combinations(rewards)
    if not only_needed or rewards & set(torchvision_rewards()):
        checks.append(_torchvision(rewards))
    checks += _reward_backends(rewards, only_needed)
    checks.append(_hub_mode(m))
    if cfg is None:
        return checks
    model_check, model_download = _model_weights(cfg, m)
    checks.append(model_check)
    checks += _hub_token(cfg, model_download)
    reward_checks, reward_download = _reward_weights(cfg, m)
    checks += reward_checks
    checks += _remote_rewards(cfg)
    checks += prompt_checks(cfg, m, read=prompts or {})
    checks.append(_disk(m, model_download, reward_download, cfg))
    reach = hub_reachable(m, model_download + reward_download)
    if reach is not None:
        checks.append(reach)
    checks.append(_processes(nproc, m, gpu))
    if plan is None:  # the doctor's own: estimates for other GPUs and strategies besides the run's
        checks.append(_memory(cfg, gpu, requested) if gpu is not None else _memory_without_gpu(cfg, requested))
        checks += [c for c in (strategy_check(cfg, gpu, nproc), backend_check(nproc, gpu)) if c is not None]
        checks += [c for c in (modes_check(cfg, memory_modes),) if c is not None]
    else:  # a run's preflight: its own plan's estimate (never blocking), and what it needs to launch
        checks.append(_memory(cfg, gpu, requested, plan))
        checks += [c for c in (strategy_check(cfg, gpu, nproc, plan), backend_check(nproc, gpu)) if c is not None]
    checks.append(_explore(cfg, gpu, requested, plan))
    checks.append(backends_check(simulated_gpu(gpu_capability) if gpu_capability else gpu, cfg.explore.fp8_backend,
                                 simulated=bool(gpu_capability)))
    return checks


def failed_for_run(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL and c.needed_by_run]
