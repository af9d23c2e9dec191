"""Everything a run needs before its first iteration, resolved once and reported.

`open_session` checks every input first (config, prompts, rewards, resume folder, model weights)
and only then creates the run directory, so bad input never leaves a half-written run behind.

Under torchrun every rank opens its own session (a full model replica); rank 0 alone chooses the
run directory and the checkpoint to resume, and alone writes to the run directory, holding its lock
(faults/lock.py) from before the checkpoint is read until the run ends.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import tomli_w
import torch
from torch import nn

from solrl_core import distributed
from solrl_core.checkpoint import checkpoint_to_resume, load_checkpoint, set_aside_newer
from solrl_core.config import Config, from_dict, to_dict
from solrl_core.errors import SolrlError
from solrl_core.faults.guard import FaultState
from solrl_core.faults.lock import RunLock
from solrl_core.precision.hardware import require_explore_precision
from solrl_core.models import DiffusionModel, load_model
from solrl_core.models.base import Conditioning
from solrl_core.policy import OLD, TRAINED, Policy
from solrl_core.prompts import check_split, load_prompts
from solrl_core.rewards import RewardSet
from solrl_core.rewards.health import RewardHealth
from solrl_core.precision.quantize import LayerRule
from solrl_core.precision.resolve import MachinePlan, resolve_machine
from solrl_core.rollout import RolloutCopy, compile_module
from solrl_core.device import resolve_device, resolve_dtype
from solrl_core.plan import StagePlan, plan_stages
from solrl_core.rundir import CONFIG_FILE, EVENTS_FILE, fresh_run_dir, load_run_config, save_run_config, write_atomic  # noqa: F401

@dataclass
class Session:
    config: Config
    run_dir: Path
    device: torch.device
    dtype_name: str
    dtype: torch.dtype
    plan: StagePlan
    model: DiffusionModel
    policy: Policy
    explore_copy: RolloutCopy | None  # None: Stage 1 runs at full precision (below)
    optimizer: torch.optim.Optimizer
    rewards: RewardSet
    prompts: list[str]
    eval_prompts: list[str]  # empty: no evaluation during training
    iteration: int = 0
    step: int = 0
    history: list[float] = field(default_factory=list)
    resumed: bool = False
    health: RewardHealth = field(default_factory=lambda: RewardHealth(min_std=0.0, patience=0))
    rank: int = 0  # this process among world_size (torchrun); it owns prompt groups rank*P/W .. (rank+1)*P/W - 1
    world_size: int = 1
    rollout_copy: RolloutCopy | None = None  # None: full-precision rollouts and v_old on the policy's old adapter
    machine: MachinePlan | None = None
    faults: FaultState = field(default_factory=FaultState)  # non-finite reward and skipped-step streaks
    lock: RunLock | None = None  # rank 0's hold on run_dir; released when train() returns
    # The update's policy forwards (trained, reference, old without a rollout copy) call this: the
    # transformer, or one torch.compile of it (optimizer.compile), whose guards give each adapter
    # state and grad mode its own graph. Evaluation and inference call the transformer itself.
    policy_forward: nn.Module | None = None
    _cond_cache: dict[str, Conditioning] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy_forward is None:
            self.policy_forward = self.policy.transformer

    def conditioning(self, prompts: list[str]) -> Conditioning:
        """Text conditioning per prompt, each unique prompt encoded once per run (text encoders
        can then leave the GPU: see the model loaders)."""
        new = [p for p in dict.fromkeys(prompts) if p not in self._cond_cache]
        if new:
            enc = self.model.encode(new)
            for i, p in enumerate(new):
                self._cond_cache[p] = enc[i:i + 1]
        return Conditioning.cat([self._cond_cache[p] for p in prompts])

    def copies(self) -> list[RolloutCopy]:
        return [c for c in (self.explore_copy, self.rollout_copy) if c is not None]

    def refresh_copies(self) -> None:
        """Load base + old adapter (merged once) into every rollout copy, re-quantizing the explore copy."""
        copies = self.copies()
        if copies:
            merged = self.policy.merged_weights(OLD)
            for c in copies:
                c.refresh(merged)

    def loop_state(self) -> dict:
        return {"iteration": self.iteration, "step": self.step, "history": self.history,
                "reward_streaks": dict(self.health.streaks), "faults": self.faults.to_dict()}


def open_session(cfg: Config, resume: bool = False, from_checkpoint: str | None = None) -> Session:
    """Validate inputs, load the model, create (or reopen) the run directory, restore a checkpoint
    (`from_checkpoint`: its name, e.g. iter_000020; default the newest, verified against its manifest)."""
    cfg.validate()
    rank, world = distributed.rank(), distributed.world_size()
    check_split(cfg.run.prompts_per_iteration, world)
    prompts = load_prompts(cfg.run.prompts)
    eval_prompts = load_prompts(cfg.run.eval_prompts) if cfg.run.eval_prompts else []
    device = resolve_device(cfg.run.device)
    if world > 1 and device.type == "cuda":  # one GPU per process, whatever cuda:N the config names
        device = torch.device("cuda", torch.cuda.current_device())
    rewards = RewardSet.from_config(cfg.reward, device)
    rewards.check_prompts(prompts + eval_prompts)
    dtype_name, dtype = resolve_dtype(cfg.run.dtype, device)
    if cfg.run.threads > 0:
        torch.set_num_threads(cfg.run.threads)
    machine = resolve_machine(cfg, device, dtype_name)
    plan = plan_stages(cfg, dtype_name, machine.explore_precision, rollout_copy=machine.rollout_copy,
                       rollout_compiled=machine.rollout_compile, explore_compiled=machine.explore_compile)
    if plan.explore_precision != dtype_name:  # before anything is written: a refused precision leaves no run dir
        require_explore_precision(plan.explore_precision, device)
    run_dir, checkpoint, lock = _claim_run_dir(cfg, resume, from_checkpoint)  # the lock is dropped with it on an error below

    model = load_model(cfg.model, device, dtype)
    explore_copy = rollout_copy = None  # copied before the adapters are added
    if plan.explore_precision != dtype_name:
        explore_copy = RolloutCopy(copy.deepcopy(model.transformer), plan.explore_precision, LayerRule.of(cfg.model),
                                   compile=plan.explore_compiled, compile_mode=cfg.run.compile_mode)
    if plan.rollout_copy:
        rollout_copy = RolloutCopy(copy.deepcopy(model.transformer), dtype_name, LayerRule.of(cfg.model),
                                   compile=plan.rollout_compiled, compile_mode=cfg.run.compile_mode)
    if machine.checkpointing:  # acts only where gradients are on: the trained forward
        model.transformer.enable_gradient_checkpointing()
    policy = Policy(model.transformer, cfg.model)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.optimizer.lr, betas=(cfg.optimizer.beta1, cfg.optimizer.beta2),
                                  weight_decay=cfg.optimizer.weight_decay, eps=cfg.optimizer.eps)
    session = Session(cfg, run_dir, device, dtype_name, dtype, plan, model, policy, explore_copy, optimizer, rewards, prompts,
                      eval_prompts, health=RewardHealth(cfg.reward.health_min_std, cfg.reward.health_patience),
                      rank=rank, world_size=world, rollout_copy=rollout_copy, machine=machine,
                      policy_forward=compile_module(policy.transformer, cfg.run.compile_mode) if machine.update_compile else policy.transformer)
    if checkpoint is not None:  # every rank reads it: resuming across nodes needs the run dir on a shared filesystem
        state = load_checkpoint(checkpoint, policy, optimizer)
        session.iteration, session.step, session.history = state["iteration"], state["step"], state["history"]
        session.health.streaks = dict(state.get("reward_streaks", {}))
        session.faults = FaultState.from_dict(state.get("faults"))
        session.resumed = True
    if world > 1:  # a LoRA's random init (and anything else) must start equal on every replica: rank 0's
        for adapter in (TRAINED, OLD, "ema"):
            policy.load_state(adapter, distributed.broadcast_tensors(policy.state(adapter)))
    session.refresh_copies()
    session.config = replace(cfg, run=replace(cfg.run, run_dir=str(run_dir)))
    if rank == 0:
        if lock is None:  # a fresh folder: created and locked now, after every input was checked
            run_dir.mkdir(parents=True, exist_ok=True)
            lock = RunLock.acquire(run_dir)
            if (run_dir / CONFIG_FILE).exists():
                lock.release()
                raise SolrlError(f"{run_dir} already holds a run", f"continue it with `solrl train --resume {run_dir}`")
        session.lock = lock
        # Rewritten on resume too: `--resume --iterations N` extends the run for every later resume.
        save_run_config(run_dir, session.config)
        if explore_copy is not None and explore_copy.report is not None:
            write_atomic(run_dir / "quantization_report.json", json.dumps(explore_copy.report.to_dict(), indent=2))
    distributed.barrier()  # the run directory exists before any rank goes on
    return session


def _claim_run_dir(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None, RunLock | None]:
    """The run directory and the checkpoint to resume from, decided by rank 0 (a fresh directory's
    name holds the time, and another rank must not mistake rank 0's new config for an older run);
    an error there is raised on every rank. Rank 0 returns the run directory's lock (None for a
    folder still to be created); the other ranks None."""
    outcome: tuple = ()
    lock = None
    if distributed.is_main():
        try:
            run_dir, chosen, lock = _run_dir_and_checkpoint(cfg, resume, checkpoint)
            outcome = ("ok", run_dir, chosen)
        except SolrlError as exc:
            outcome = ("error", exc.message, exc.fix)
    outcome = distributed.broadcast_object(outcome)
    if outcome[0] == "error":
        raise SolrlError(outcome[1], outcome[2])
    return outcome[1], outcome[2], lock


def _run_dir_and_checkpoint(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None, RunLock | None]:
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else fresh_run_dir(cfg.preset)
    if checkpoint is not None and not resume:
        raise SolrlError("--checkpoint picks the checkpoint a --resume continues from", f"add --resume {run_dir}")
    lock = RunLock.acquire(run_dir) if run_dir.is_dir() else None  # before anything is read: no other writer
    try:
        if resume:
            chosen = checkpoint_to_resume(run_dir, checkpoint)
            set_aside_newer(run_dir, chosen)
            return run_dir, chosen, lock
        if (run_dir / CONFIG_FILE).exists():
            raise SolrlError(f"{run_dir} already holds a run", f"continue it with `solrl train --resume {run_dir}` or pick another --run-dir")
        return run_dir, None, lock
    except BaseException:
        if lock is not None:
            lock.release()
        raise
