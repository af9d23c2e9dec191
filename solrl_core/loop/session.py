"""Everything a run needs before its first iteration, resolved once and reported.

`open_session` checks every input first (config, prompts, rewards, resume folder, model weights)
and only then creates the run directory, so bad input never leaves a half-written run behind.
It returns a `Session`: the `Run`, fixed for the run (config, device, model, policy, copies,
optimizer, rewards, prompts), and the `LoopState` the loop advances and a checkpoint saves. A run
started by the front door (solrl_core/tools/start.py) comes with its `Checked` inputs: the config
validated, the prompts read and the plan resolved there are taken as they are, not made again.

Under torchrun every rank opens its own session (a full model replica, or its shards of the model
with distributed.strategy=fsdp: sharding.py); rank 0 alone chooses the run directory and the
checkpoint to resume, and alone writes to the run directory, holding its lock (faults/lock.py) from
before the checkpoint is read until the run ends.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from solrl_core.config.convert import save_run_config
from solrl_core.config.run_inputs import absolute_paths
from solrl_core.config.schema import Config
from solrl_core.data.prompts import check_split, load_prompts
from solrl_core.engine.checkpoint import (CheckpointFolder, checkpoint_to_resume, list_checkpoints, load_checkpoint,
                                          remove_orphans, set_aside_newer)
from solrl_core.engine.engine import CopySpec, Engine, open_engine, resolve_runtime
from solrl_core.engine.policy import OLD, TRAINED
from solrl_core.engine.regions import UPDATE_COMPILE_MODE, CompiledBlocks
from solrl_core.engine.rollout import RolloutCopy
from solrl_core.engine.sharding import Layout, layout_of, shard_policy
from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.faults.links import check_tree
from solrl_core.faults.lock import RunLock
from solrl_core.io.atomic import write_atomic
from solrl_core.io.rundir import CONFIG_FILE, fresh_run_dir, restarts
from solrl_core.loop.eval_rewards import HeldOut, held_out_rewards
from solrl_core.loop.loop_state import LoopState, evaluation_pending
from solrl_core.plan.memory_modes import too_small
from solrl_core.plan.plan import MachinePlan, RunPlan
from solrl_core.plan.resolve import gpu_of, resolve_plan
from solrl_core.precision import fp8_attention
from solrl_core.precision.hardware import require_explore_precision
from solrl_core.rewards import RewardSet
from solrl_core.rewards.health import RewardHealth
from solrl_core.rewards.identity import check_servers, record_servers
from solrl_core.runtime import distributed
from solrl_core.runtime.threads import apply_threads
from solrl_core.text import plural


@dataclass(frozen=True)
class Run:
    """What is fixed for a run once it is open: its engine (model, policy, copies, sampler, rewards),
    its plan and the training's own parts. An out-of-memory back-off continues with `with_config`
    (smaller batches); nothing else replaces a field."""

    config: Config
    run_dir: Path
    engine: Engine
    plan: RunPlan  # its machine: what the auto switches chose on this machine, and why
    optimizer: torch.optim.Optimizer
    prompts: list[str]
    eval_prompts: list[str]  # empty: no evaluation during training
    rank: int = 0  # this process among world_size (torchrun); it owns prompt groups rank*P/W .. (rank+1)*P/W - 1
    world_size: int = 1
    lock: RunLock | None = None  # rank 0's hold on run_dir; released when train() returns
    layout: Layout = Layout("replicate", "default")  # the strategy the plan chose and its mesh (sharding.py)
    # what opening the run folder did (orphaned saves removed, checkpoints set aside): warnings
    notes: tuple[str, ...] = ()
    held_out: HeldOut | None = None  # run.eval_rewards, loaded when the run evaluates (eval_rewards.py)
    checkpoints: CheckpointFolder | None = None  # rank 0's checkpoints/, pinned when opened: saves never follow a swap

    @property
    def sharded(self) -> bool:
        """The policy is FSDP-sharded over the processes: every forward needs every rank."""
        return self.layout.sharded

    @property
    def machine(self) -> MachinePlan:
        return self.plan.machine

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def rewards(self) -> RewardSet:
        return self.engine.rewards

    def with_config(self, config: Config) -> "Run":
        """The same run with a changed config (batch sizes), its engine's sampler rebuilt from it."""
        return replace(self, config=config, engine=self.engine.with_config(config))


@dataclass
class Session:
    """An open run and its loop state: what `open_session` and `train` return."""

    run: Run
    state: LoopState


@dataclass(frozen=True)
class Checked:
    """What the front door (tools/start.py) made of a run before any model loads, for the session to
    take as it is: its config was validated there, these prompt files read, this plan resolved."""

    plan: RunPlan  # for the real world size, resolved by `plan_run`
    prompts: dict[str, list[str]]  # the prompts read, by spec (run.prompts, run.eval_prompts); others: read here


def plan_run(cfg: Config, world: int) -> RunPlan:
    """The run's plan on this machine for `world` processes: the device and dtype `cfg` resolves to,
    and the torch threads it sets (run.threads, shared by this node's processes: threads.py)."""
    device, dtype_name, _ = resolve_runtime(cfg)
    if device.type == "cuda" and world > 1 and not distributed.is_initialized():  # before the process group is joined
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))  # the GPU init_from_env will give it
    threads = apply_threads(cfg.run.threads)  # auto: one per usable core, shared by this node's processes (threads.py)
    return resolve_plan(cfg, device, dtype_name, world=world, threads=threads.describe())  # fsdp: the copies it keeps


def open_session(cfg: Config, resume: bool = False, from_checkpoint: str | None = None,
                 checked: Checked | None = None) -> Session:
    """Validate inputs, load the model, create (or reopen) the run directory, restore a checkpoint
    (`from_checkpoint`: its name, e.g. iter_000020; default the newest, verified against its manifest).
    `checked`: what the front door already validated, read and planned (None: all of it is done here)."""
    if checked is None:
        cfg.validate()
    rank, world = distributed.rank(), distributed.world_size()
    check_split(cfg.run.prompts_per_iteration, world)
    read = checked.prompts if checked is not None else {}
    prompts = read.get(cfg.run.prompts) or load_prompts(cfg.run.prompts)
    eval_spec = cfg.run.eval_prompts
    eval_prompts = (read.get(eval_spec) or load_prompts(eval_spec)) if eval_spec else []
    device, dtype_name, dtype = resolve_runtime(cfg)
    rewards = RewardSet.from_config(cfg.reward, device)
    rewards.check_prompts(prompts + eval_prompts)
    # a plugin's wrong output: said before the model loads
    rewards.probe_plugins(prompts[:2], cfg.model.resolution, device)
    held_out = held_out_rewards(cfg, cfg.run.eval_rewards, device) if eval_prompts else None
    plan = checked.plan if checked is not None else plan_run(cfg, world)
    machine = plan.machine
    if not machine.memory_fits and machine.strategy == "replicate":  # before any weights load
        gpu = gpu_of(device)
        raise too_small(cfg, machine, dtype_name,
                        f"{gpu.name}, {gpu.memory_gib:.0f} GiB" if gpu is not None else str(device))
    layout = layout_of(machine, device, world)
    if plan.calibrated_precision and not plan.explores_low:
        raise SolrlError(f"explore.calibrate=steps+precision chooses among low explore precisions, and on this machine "
                         f"explore.precision={cfg.explore.precision} resolves to the run dtype ({machine.explore_why})",
                         "name a low one (explore.precision=nvfp4-emulated runs anywhere), or use "
                         "explore.calibrate=steps")
    if plan.explores_low:  # before anything is written: a refused precision leaves no run dir
        require_explore_precision(plan.explore_precision, device)
    if cfg.explore.fp8_attention:
        fp8_attention.require(plan.explore_precision, cfg.model.loader, device)
    # the lock is dropped with it on an error below
    run_dir, checkpoint, lock, notes = _claim_run_dir(cfg, resume, from_checkpoint)
    if checkpoint is not None:  # a remote: server now serving another reward than the run trained against
        try:
            notes = [*notes, *check_servers(run_dir, rewards.rewards, cfg.reward.remote.get("on_change", "refuse"))]
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    engine = open_engine(cfg, device=device, rewards=rewards, refresh=False, machine=machine,
                         explore=CopySpec(plan.explore_precision, plan.explore_compiled, from_shards=layout.sharded,
                                          sharded=layout.sharded and machine.explore_layout == "sharded")
                         if plan.explores_low else None,
                         rollout=CopySpec(plan.full_precision, plan.rollout_compiled, from_shards=layout.sharded,
                                          sharded=layout.sharded) if plan.rollout_copy else None)
    policy = engine.policy
    if world > 1:  # a LoRA's random init (and anything else) must start equal on every rank: rank 0's
        for adapter in (TRAINED, OLD, "ema"):
            policy.load_state(adapter, distributed.broadcast_tensors(policy.state(adapter)))
    if layout.sharded:  # before the optimizer: it holds the sharded parameters
        shard_policy(policy, layout)
    opt = cfg.optimizer
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2),
                                  weight_decay=opt.weight_decay, eps=opt.eps)
    state = LoopState(health=RewardHealth(cfg.reward.health_min_std, cfg.reward.health_patience))
    if checkpoint is not None:  # every rank reads it: resuming across nodes needs the run dir on a shared filesystem
        state.restore(load_checkpoint(checkpoint, policy, optimizer))
    cfg = absolute_paths(replace(cfg, run=replace(cfg.run, run_dir=str(run_dir))))  # config.toml works from any folder
    if rank == 0:
        lock = _write_run_dir(run_dir, lock, cfg, engine.explore_copy)
        record_servers(run_dir, rewards.rewards)
    # only now that the resume is committed: a failure above leaves them listed
    if rank == 0 and checkpoint is not None:
        notes = [*notes, *(f"set {p.name} aside (newer than {checkpoint.name}); it is kept until you delete it: rm -r "
                           f"{p}"
                           for p in set_aside_newer(run_dir, checkpoint))]
    # torch's default mode: run.compile_mode is the official copies' mode; the official update runs eager
    forward = (CompiledBlocks(policy.transformer, UPDATE_COMPILE_MODE, active=False) if machine.update_compile
               else policy.transformer)
    engine = replace(engine.with_config(cfg), policy_forward=forward,
                     policy_rollout_compile=machine.policy_rollout_compile)
    run = Run(config=cfg, run_dir=run_dir, engine=engine, plan=plan, optimizer=optimizer,
              prompts=prompts, eval_prompts=eval_prompts, rank=rank, world_size=world, lock=lock, layout=layout,
              notes=tuple(notes), held_out=held_out, checkpoints=CheckpointFolder(run_dir) if rank == 0 else None)
    engine.refresh_copies()
    distributed.barrier()  # the run directory exists before any rank goes on
    return Session(run, state)


def _write_run_dir(run_dir: Path, lock: RunLock | None, cfg: Config, explore_copy: RolloutCopy | None) -> RunLock:
    """Rank 0: create and lock a fresh folder (after every input was checked), then write the config
    and the quantization report. Returns the folder's lock."""
    if lock is None:
        with disk.writing(run_dir.parent, f"the run folder {run_dir.name}"):
            run_dir.mkdir(parents=True, exist_ok=True)
        lock = RunLock.acquire(run_dir, cfg.run.lock)
        if (run_dir / CONFIG_FILE).exists() and list_checkpoints(run_dir):
            lock.release()
            raise SolrlError(f"{run_dir} already holds a run", f"continue it with `solrl train --resume {run_dir}`")
    # Rewritten on resume too: `--resume --iterations N` extends the run for every later resume.
    save_run_config(run_dir, cfg)
    if explore_copy is not None and explore_copy.report is not None:
        write_atomic(run_dir / "quantization_report.json", json.dumps(explore_copy.report.to_dict(), indent=2))
    return lock


def _claim_run_dir(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None, RunLock | None,
                                                                               list[str]]:
    """The run directory and the checkpoint to resume from, decided by rank 0 (a fresh directory's
    name holds the time, and another rank must not mistake rank 0's new config for an older run);
    an error there is raised on every rank. Rank 0 returns the run directory's lock (None for a
    folder still to be created) and what opening it did, as warnings; the other ranks None and []."""
    outcome: tuple = ()
    lock, notes = None, []
    if distributed.is_main():
        try:
            run_dir, chosen, lock, notes = _run_dir_and_checkpoint(cfg, resume, checkpoint)
            outcome = ("ok", run_dir, chosen)
        except SolrlError as exc:
            outcome = ("error", exc.message, exc.fix)
    outcome = distributed.broadcast_object(outcome)
    if outcome[0] == "error":
        raise SolrlError(outcome[1], outcome[2])
    return outcome[1], outcome[2], lock, notes


def _check_unfinished(run_dir: Path, chosen: Path, iterations: int) -> None:
    """A resume with nothing left to train is a question the user meant to ask differently."""
    done = int(chosen.name.rpartition("_")[2]) if chosen.name.rpartition("_")[2].isdigit() else 0
    if done >= iterations and not evaluation_pending(chosen):  # a stop dropped its last evaluation: the resume does it
        raise SolrlError(f"{run_dir} already reached its {plural(iterations, 'iteration')} (checkpoint {chosen.name})",
                         f"to train further, pass a larger total: solrl train --resume {run_dir} --iterations "
                         f"{done * 2}")


def _run_dir_and_checkpoint(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None,
                                                                                        RunLock | None, list[str]]:
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else fresh_run_dir(cfg.preset)
    if checkpoint is not None and not resume:
        raise SolrlError("--checkpoint picks the checkpoint a --resume continues from", f"add --resume {run_dir}")
    if run_dir.is_dir():  # before the lock is opened and anything truncated, appended or deleted
        check_tree(run_dir)
    # before anything is read: no other writer
    lock = RunLock.acquire(run_dir, cfg.run.lock) if run_dir.is_dir() else None
    try:
        notes = remove_orphans(run_dir) if lock is not None and lock.held else []  # ours: no live save writes them
        if resume and restarts(run_dir) and checkpoint is None:
            return run_dir, None, lock, notes  # stopped or killed before its first checkpoint: it starts again
        if resume:
            chosen = checkpoint_to_resume(run_dir, checkpoint)
            _check_unfinished(run_dir, chosen, cfg.run.iterations)
            return run_dir, chosen, lock, notes
        if (run_dir / CONFIG_FILE).exists() and not restarts(run_dir):
            raise SolrlError(f"{run_dir} already holds a run", f"continue it with `solrl train --resume {run_dir}` or "
                                                               f"pick another --run-dir")
        return run_dir, None, lock, notes
    except BaseException:
        if lock is not None:
            lock.release()
        raise
