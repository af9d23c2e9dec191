"""Everything a run needs before its first iteration, resolved once and reported.

`open_session` checks every input first (config, prompts, rewards, resume folder, model weights)
and only then creates the run directory, so bad input never leaves a half-written run behind.
It returns a `Session`: the `Run`, fixed for the run (config, device, model, policy, copies,
optimizer, rewards, prompts), and the `LoopState` the loop advances and a checkpoint saves.

Under torchrun every rank opens its own session (a full model replica, or its shards of the model
with distributed.strategy=fsdp: sharding.py); rank 0 alone chooses the run directory and the
checkpoint to resume, and alone writes to the run directory, holding its lock (faults/lock.py) from
before the checkpoint is read until the run ends.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from solrl_core import distributed
from solrl_core.attention import training_attention
from solrl_core.checkpoint import checkpoint_to_resume, list_checkpoints, load_checkpoint, remove_orphans, set_aside_newer
from solrl_core.config import Config
from solrl_core.device import resolve_device, resolve_dtype
from solrl_core.errors import SolrlError
from solrl_core.faults import disk
from solrl_core.faults.lock import RunLock
from solrl_core.loop_state import LoopState
from solrl_core.models import DiffusionModel, load_model
from solrl_core.models.base import Conditioning
from solrl_core.plan import StagePlan, plan_stages
from solrl_core.policy import OLD, TRAINED, Policy
from solrl_core.precision.hardware import require_explore_precision
from solrl_core.precision.quantize import LayerRule
from solrl_core.precision.resolve import MachinePlan, gpu_of, resolve_machine
from solrl_core.prompts import check_split, load_prompts
from solrl_core.rewards import RewardSet
from solrl_core.rewards.health import RewardHealth
from solrl_core.rewards.identity import check_servers, record_servers
from solrl_core.regions import CompiledBlocks
from solrl_core.rollout import RolloutCopy
from solrl_core.run_inputs import absolute_paths
from solrl_core.rundir import CONFIG_FILE, fresh_run_dir, restarts, save_run_config, write_atomic
from solrl_core.sampler import Sampler
from solrl_core.sharding import Layout, open_layout, shard_policy
from solrl_core.text import plural
from solrl_core.threads import apply_threads


class TextCache:
    """Text conditioning per prompt, each unique prompt encoded once per run (text encoders can then
    leave the GPU: see the model loaders)."""

    def __init__(self, model: DiffusionModel) -> None:
        self.model = model
        self.cache: dict[str, Conditioning] = {}

    def __call__(self, prompts: list[str]) -> Conditioning:
        new = [p for p in dict.fromkeys(prompts) if p not in self.cache]
        if new:
            enc = self.model.encode(new)
            for i, p in enumerate(new):
                self.cache[p] = enc[i:i + 1]
        return Conditioning.cat([self.cache[p] for p in prompts])


@dataclass(frozen=True)
class Run:
    """What is fixed for a run once it is open. An out-of-memory back-off continues with
    `with_config` (smaller batches); nothing else replaces a field."""

    config: Config
    run_dir: Path
    device: torch.device
    dtype_name: str
    dtype: torch.dtype
    plan: StagePlan
    machine: MachinePlan
    model: DiffusionModel
    policy: Policy
    optimizer: torch.optim.Optimizer
    rewards: RewardSet
    prompts: list[str]
    eval_prompts: list[str]  # empty: no evaluation during training
    sampler: Sampler  # built from config.sampler
    conditioning: TextCache  # the prompts' text conditioning, encoded once each
    explore_copy: RolloutCopy | None = None  # None: Stage 1 runs at full precision
    rollout_copy: RolloutCopy | None = None  # None: full-precision rollouts and v_old on the policy's old adapter
    # The update's policy forwards (trained, reference, old without a rollout copy) call this: the
    # transformer, or (optimizer.compile) the transformer with its blocks compiled while the update
    # runs (regions.py), whose guards give each adapter state and grad mode its own graph.
    # Evaluation and inference call the transformer itself, eager.
    policy_forward: nn.Module | CompiledBlocks | None = None
    rank: int = 0  # this process among world_size (torchrun); it owns prompt groups rank*P/W .. (rank+1)*P/W - 1
    world_size: int = 1
    lock: RunLock | None = None  # rank 0's hold on run_dir; released when train() returns
    layout: Layout = Layout("replicate", "default")  # distributed.strategy as resolved (sharding.py)
    notes: tuple[str, ...] = ()  # what opening the run folder did (orphaned saves removed, checkpoints set aside): warnings

    @property
    def sharded(self) -> bool:
        """The policy is FSDP-sharded over the processes: every forward needs every rank."""
        return self.layout.sharded

    @property
    def compiled_update(self) -> bool:
        return isinstance(self.policy_forward, CompiledBlocks)

    def rollout_scope(self) -> contextlib.AbstractContextManager:
        """Where full-precision rollouts on the policy run: its compiled blocks when the machine says so."""
        return self.update_scope() if self.machine.policy_rollout_compile else contextlib.nullcontext()

    @contextlib.contextmanager
    def update_scope(self) -> Iterator[None]:
        """Where the update runs: its compiled blocks on for forwards and backwards alike (a
        checkpointed block recomputed eagerly would not match its compiled forward), and SDPA
        without cuDNN attention, whose backward fails at FLUX's shapes (attention.py)."""
        with training_attention(), (self.policy_forward.on() if isinstance(self.policy_forward, CompiledBlocks)
                                    else contextlib.nullcontext()):
            yield

    def with_config(self, config: Config) -> "Run":
        """The same run with a changed config (batch sizes), its sampler rebuilt from it."""
        return replace(self, config=config, sampler=Sampler.of(config.sampler))

    def copies(self) -> list[RolloutCopy]:
        return [c for c in (self.explore_copy, self.rollout_copy) if c is not None]

    def refresh_copies(self) -> None:
        """Load base + old adapter (merged once) into every rollout copy, re-quantizing the explore copy."""
        copies = self.copies()
        if copies:
            merged = self.policy.merged_weights(OLD)
            for c in copies:
                c.refresh(merged)


@dataclass
class Session:
    """An open run and its loop state: what `open_session` and `train` return."""

    run: Run
    state: LoopState


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
    threads = apply_threads(cfg.run.threads)  # auto: one per usable core, shared by this node's processes (threads.py)
    machine = replace(resolve_machine(cfg, device, dtype_name), threads=threads.describe())
    layout, machine = open_layout(cfg, machine, dtype_name, device, gpu_of(device))  # fsdp: no copies
    plan = plan_stages(cfg, dtype_name, machine.explore_precision, rollout_copy=machine.rollout_copy,
                       rollout_compiled=machine.rollout_compile, explore_compiled=machine.explore_compile)
    if plan.explores_low:  # before anything is written: a refused precision leaves no run dir
        require_explore_precision(plan.explore_precision, device)
    run_dir, checkpoint, lock, notes = _claim_run_dir(cfg, resume, from_checkpoint)  # the lock is dropped with it on an error below
    if checkpoint is not None:  # a remote: server now serving another reward than the run trained against
        try:
            notes = [*notes, *check_servers(run_dir, rewards.rewards, cfg.reward.remote.get("on_change", "refuse"))]
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    model = load_model(cfg.model, device, dtype)
    explore_copy, rollout_copy = _copies(cfg, plan, model)  # copied before the adapters are added
    if cfg.model.train_precision == "fp32-base" and dtype == torch.bfloat16:  # the copies stay bf16, as the official SD3's
        model.transformer.to(torch.float32)
    if machine.checkpointing:  # acts only where gradients are on: the trained forward
        model.transformer.enable_gradient_checkpointing()
    policy = Policy(model.transformer, cfg.model)
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
        lock = _write_run_dir(run_dir, lock, cfg, explore_copy)
        record_servers(run_dir, rewards.rewards)
    if rank == 0 and checkpoint is not None:  # only now that the resume is committed: a failure above leaves them listed
        notes = [*notes, *(f"set {p.name} aside (newer than {checkpoint.name}); it is kept until you delete it: rm -r {p}"
                           for p in set_aside_newer(run_dir, checkpoint))]
    forward = (CompiledBlocks(policy.transformer, cfg.run.compile_mode, active=False) if machine.update_compile
               else policy.transformer)
    run = Run(config=cfg, run_dir=run_dir, device=device, dtype_name=dtype_name, dtype=dtype, plan=plan, machine=machine,
              model=model, policy=policy, optimizer=optimizer, rewards=rewards, prompts=prompts, eval_prompts=eval_prompts,
              sampler=Sampler.of(cfg.sampler), conditioning=TextCache(model), explore_copy=explore_copy,
              rollout_copy=rollout_copy, policy_forward=forward, rank=rank, world_size=world, lock=lock,
              layout=layout, notes=tuple(notes))
    run.refresh_copies()
    distributed.barrier()  # the run directory exists before any rank goes on
    return Session(run, state)


def _copies(cfg: Config, plan: StagePlan, model: DiffusionModel) -> tuple[RolloutCopy | None, RolloutCopy | None]:
    """The explore copy (a low explore precision) and the full-precision rollout copy, each where the plan keeps one."""
    explore_copy = rollout_copy = None
    if plan.explores_low:
        explore_copy = RolloutCopy(copy.deepcopy(model.transformer), plan.explore_precision, LayerRule.of(cfg.model),
                                   compile=plan.explore_compiled, compile_mode=cfg.run.compile_mode)
    if plan.rollout_copy:
        rollout_copy = RolloutCopy(copy.deepcopy(model.transformer), plan.full_precision, LayerRule.of(cfg.model),
                                   compile=plan.rollout_compiled, compile_mode=cfg.run.compile_mode)
    return explore_copy, rollout_copy


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


def _claim_run_dir(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None, RunLock | None, list[str]]:
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
    if done >= iterations:
        raise SolrlError(f"{run_dir} already reached its {plural(iterations, 'iteration')} (checkpoint {chosen.name})",
                         f"to train further, pass a larger total: solrl train --resume {run_dir} --iterations {done * 2}")


def _run_dir_and_checkpoint(cfg: Config, resume: bool, checkpoint: str | None) -> tuple[Path, Path | None, RunLock | None, list[str]]:
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else fresh_run_dir(cfg.preset)
    if checkpoint is not None and not resume:
        raise SolrlError("--checkpoint picks the checkpoint a --resume continues from", f"add --resume {run_dir}")
    lock = RunLock.acquire(run_dir, cfg.run.lock) if run_dir.is_dir() else None  # before anything is read: no other writer
    try:
        notes = remove_orphans(run_dir) if lock is not None and lock.held else []  # ours: no live save writes them
        if resume and restarts(run_dir) and checkpoint is None:
            return run_dir, None, lock, notes  # stopped or killed before its first checkpoint: it starts again
        if resume:
            chosen = checkpoint_to_resume(run_dir, checkpoint)
            _check_unfinished(run_dir, chosen, cfg.run.iterations)
            return run_dir, chosen, lock, notes
        if (run_dir / CONFIG_FILE).exists() and not restarts(run_dir):
            raise SolrlError(f"{run_dir} already holds a run", f"continue it with `solrl train --resume {run_dir}` or pick another --run-dir")
        return run_dir, None, lock, notes
    except BaseException:
        if lock is not None:
            lock.release()
        raise
