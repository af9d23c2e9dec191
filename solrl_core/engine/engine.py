"""The engine: the model, the policy and its copies, the sampler, the text cache and the rewards,
opened by `open_engine` for every command (train, eval, infer, explore, rank-check, export), with
one `generate` every rollout, evaluation and image goes through.

`Engine.generate(cond, seeds, steps, on=...)` samples and decodes on one of the networks a run has:

    explore   the low-precision explore copy (base + old merged, quantized); without one, as `rollout`
    rollout   full precision: the merged rollout copy, or the policy's old adapter (autocast, and its
              compiled blocks where the machine says so) where the run keeps no copy
    base, trained, ema   the policy with those weights (evaluation and inference), eager

so Stage 1 in training and in `solrl explore`, Stage 2 and the rank check in training and in
`solrl rank-check`, run on the same network the same way.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from solrl_core.config.schema import Config
from solrl_core.engine.attention import training_attention
from solrl_core.engine.offload import Parking
from solrl_core.engine.policy import OLD, Policy
from solrl_core.engine.regions import CompiledBlocks
from solrl_core.engine.rollout import RolloutCopy, cast
from solrl_core.engine.sampler import Sampler, batch_slices
from solrl_core.engine.sde import SdeSetting, Trajectory
from solrl_core.engine.sharded_copy import base_tensors, is_sharded, meta_copy, refresh_from_shards
from solrl_core.faults.phase import charged_to
from solrl_core.models import DiffusionModel, load_model
from solrl_core.models.base import Conditioning
from solrl_core.plan.plan import MachinePlan, MemoryModes
from solrl_core.precision.backends import QUANTIZED
from solrl_core.precision.quantize import LayerRule, load_tensor
from solrl_core.rewards import RewardSet
from solrl_core.runtime.lanes import map_in_lanes
from solrl_core.runtime.stopping import GenerationStopped

NETWORKS = ("explore", "rollout", "base", "trained", "ema")
Progress = Callable[[int, int], None]  # (images generated so far, images in all)
PROGRESS_REPORTS = 20  # at most this many progress reports per call (and always the last)


class TextCache:
    """Text conditioning per prompt, each unique prompt encoded once (text encoders can then leave
    the GPU: see the model loaders), `chunk` new prompts at a time (a text encoder's memory)."""

    def __init__(self, model: DiffusionModel, chunk: int = 64) -> None:
        self.model, self.chunk = model, chunk
        self.cache: dict[str, Conditioning] = {}

    def __call__(self, prompts: list[str]) -> Conditioning:
        new = [p for p in dict.fromkeys(prompts) if p not in self.cache]
        for start in range(0, len(new), self.chunk):
            part = new[start:start + self.chunk]
            with torch.no_grad():
                enc = self.model.encode(part)
            for i, p in enumerate(part):
                self.cache[p] = enc[i:i + 1]
        return Conditioning.cat([self.cache[p] for p in prompts])


@dataclass(frozen=True)
class CopySpec:
    """A rollout copy to keep: its precision, and whether its blocks are torch.compile'd."""

    precision: str
    compiled: bool = False
    # filled from the policy once it is sharded (sharded_copy.py): built on the meta device, without
    # the high-precision weights of its quantized layers
    from_shards: bool = False
    sharded: bool = False  # and kept sharded like the policy, each rank 1/S of it (sharded_copy.shard_copy)


@dataclass(frozen=True)
class Generated:
    latents: torch.Tensor  # [B, C, H, W] final clean latents
    images: torch.Tensor  # [B, 3, H, W] in [0, 1]
    sigmas: torch.Tensor  # the sigma grid integrated
    seconds: float  # generation and decoding, measured
    trajectory: Trajectory | None = None  # the SDE path, when generated with an SdeSetting (training's rollouts)


@dataclass(frozen=True)
class Engine:
    config: Config
    device: torch.device
    dtype_name: str
    dtype: torch.dtype
    model: DiffusionModel
    policy: Policy
    sampler: Sampler  # built from config.sampler
    conditioning: TextCache  # the prompts' text conditioning, encoded once each
    rewards: RewardSet | None = None
    explore_copy: RolloutCopy | None = None  # None: Stage 1 runs at full precision
    rollout_copy: RolloutCopy | None = None  # None: full-precision rollouts and v_old on the policy's old adapter
    # The update's policy forwards (trained, reference, old without a rollout copy) call this: the
    # transformer, or (optimizer.compile) the transformer with its blocks compiled while the update
    # runs (regions.py), whose guards give each adapter state and grad mode its own graph.
    # Evaluation and inference call the transformer itself, eager.
    policy_forward: nn.Module | CompiledBlocks | None = None
    policy_rollout_compile: bool = False  # full-precision rollouts on the policy use its compiled blocks
    checkpoint: Path | None = None  # the checkpoint its adapters came from (None: untrained, or a training run's own)
    parking: Parking | None = None  # the copies and the VAE on the CPU between phases (memory modes: offload.py)
    machine: MachinePlan | None = None  # what the plan chose on this machine: how a new explore copy is built
    lanes: int = 1  # on a CPU, the torch threads: a rollout's batches run side by side, one each (runtime/lanes.py)

    @property
    def compiled_update(self) -> bool:
        return isinstance(self.policy_forward, CompiledBlocks)

    def with_config(self, config: Config) -> "Engine":
        """The same engine with a changed config (batch sizes), its sampler rebuilt from it."""
        return replace(self, config=config, sampler=Sampler.of(config.sampler))

    def copies(self) -> list[RolloutCopy]:
        return [c for c in (self.explore_copy, self.rollout_copy) if c is not None]

    def refresh_copies(self) -> None:
        """Load base + old adapter (merged once) into every rollout copy, re-quantizing the explore copy."""
        copies = self.copies()
        if copies and is_sharded(self.policy.transformer):  # one gathered block at a time, on every rank
            refresh_from_shards(self.policy, copies, self.device)
        elif copies:
            merged = self.policy.merged_weights(OLD)
            for c in copies:
                c.refresh(merged, self.parking.unit_by_unit(c.module) if self.parking is not None else None)

    def copy_in(self, copy_: RolloutCopy | None) -> contextlib.AbstractContextManager:
        """`copy_` on the GPU for a phase that runs on it, where the memory mode parks it on the CPU."""
        if copy_ is None or self.parking is None:
            return contextlib.nullcontext()
        return self.parking.on_device(copy_.module)

    def vae_in(self) -> contextlib.AbstractContextManager:
        """The VAE on the GPU for a decode, where the memory mode parks it on the CPU."""
        return self.parking.vae_in() if self.parking is not None else contextlib.nullcontext()

    def explore_copy_at(self, precision: str) -> RolloutCopy:
        """A new explore copy at `precision`, built as open_engine builds the run's (a copy of the base
        transformer, quantized by the model's layer rule, lean, in the run dtype; compiled where the plan
        says: MachinePlan.explore_compiled_at), loaded with base + old. A calibration weighing precisions
        (calibration.py) builds one per candidate and keeps the chosen. Where the memory mode parks the
        copies on the CPU, it is parked as the run's is (offload.py)."""
        compiled = self.machine is not None and self.machine.explore_compiled_at(precision)
        made = _copy(self.config, self.model, CopySpec(precision, compiled), source=self.policy.transformer,
                     dtype=self.dtype)
        made.refresh(self.policy.merged_weights(OLD))
        if self.parking is not None:
            self.parking.park([made.module])
        return made

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around the policy's forwards in a bf16 run (the adapters are fp32), unless
        `model.train_precision = bf16` (the official SANA regime: no autocast); on CUDA and on a CPU
        alike, so the bf16 path runs the same way in the CPU test suite."""
        if self.dtype == torch.bfloat16 and self.config.model.train_precision != "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def update_scope(self) -> Iterator[None]:
        """Where the update runs: its compiled blocks on for forwards and backwards alike (a
        checkpointed block recomputed eagerly would not match its compiled forward), and SDPA
        without cuDNN attention, whose backward fails at FLUX's shapes (attention.py)."""
        with training_attention(), (self.policy_forward.on() if isinstance(self.policy_forward, CompiledBlocks)
                                    else contextlib.nullcontext()), self.copy_in(self.rollout_copy):  # v_old's copy
            yield

    def rollout_scope(self) -> contextlib.AbstractContextManager:
        """Where full-precision rollouts on the policy run: its compiled blocks when the machine says so."""
        return self.update_scope() if self.policy_rollout_compile else contextlib.nullcontext()

    @contextlib.contextmanager
    def network(self, on: str) -> Iterator[tuple[nn.Module, torch.dtype]]:
        """The network `on` names (module docstring) and the dtype its noise is drawn in."""
        if on not in NETWORKS:
            raise ValueError(f"unknown network {on!r}: one of {', '.join(NETWORKS)}")
        copy_ = self._copy_for(on)
        if on in ("explore", "rollout") and copy_ is not None:
            with self.copy_in(copy_):
                yield copy_.forward, copy_.dtype
        elif on in ("explore", "rollout"):
            with self.policy.use(OLD) as net, self.autocast(), self.rollout_scope():
                yield net, self.dtype
        else:
            with self.policy.weights(on) as net:
                yield net, self.dtype

    @torch.no_grad()
    def generate(self, cond: Conditioning, seeds: torch.Tensor, steps: int, on: str, *, to_cpu: bool = True,
                 progress: Progress | None = None, stop: Callable[[], bool] | None = None,
                 groups: torch.Tensor | None = None, sde: SdeSetting | None = None) -> Generated:
        """One image per (conditioning row, seed), `steps` sampler steps on the network `on`.

        `to_cpu` (evaluation, inference, the side tools): generated and decoded one rollout batch at a
        time, images gathered on the CPU, `progress` told every few batches; once `stop()` says yes
        before a batch, GenerationStopped drops the rest (an evaluation a stop ends). Otherwise (training's
        rollouts): generated, then decoded together and left on the device for the rewards; `groups`
        (each row's group, consecutive) keeps every batch within one group (Sampler.generate); `sde`: the
        stochastic sampler in place of the ODE solver, the path kept (Sampler.generate_sde)."""
        if sde is not None and to_cpu:
            raise ValueError("the SDE sampler generates training's rollouts only (to_cpu=False)")
        t0 = time.perf_counter()
        sampler = replace(self.sampler, lanes=self.lanes_for(on))
        trajectory = None
        with self.network(on) as (net, dtype), charged_to("rollout"), self.vae_in():
            sizes = None if groups is None else torch.unique_consecutive(groups, return_counts=True)[1].tolist()
            if not to_cpu:
                if sde is not None:
                    latents, trajectory = sampler.generate_sde(self.model, net, cond, seeds, steps, dtype, setting=sde,
                                                                      groups=sizes)
                else:
                    latents = sampler.generate(self.model, net, cond, seeds, steps, dtype, sizes)
                images = self.model.decode(latents)
                if images.is_cuda:  # wait for queued GPU work so a phase's time is its own
                    torch.cuda.synchronize(images.device)
            else:
                latents, images = self._in_batches(net, dtype, cond, seeds, steps, progress=progress, stop=stop,
                                                   sizes=sizes, sampler=sampler)
        return Generated(latents, images, self.sampler.sigmas(steps), time.perf_counter() - t0, trajectory)

    def lanes_for(self, on: str) -> int:
        """How many of a rollout's batches on the network `on` run side by side: `lanes` on a CPU, one
        where that network is compiled (a compiled graph is not shared across threads here)."""
        if self.device.type != "cpu" or self.lanes <= 1:
            return 1
        if on in ("explore", "rollout"):
            copy_ = self._copy_for(on)
            compiled = copy_.compiled is not None if copy_ is not None else self.policy_rollout_compile
            return 1 if compiled else self.lanes
        return self.lanes

    def _copy_for(self, on: str) -> RolloutCopy | None:
        """The copy the network `on` runs on: the explore copy for explore where there is one, else the
        rollout copy (None: the policy itself)."""
        return self.explore_copy if on == "explore" and self.explore_copy is not None else self.rollout_copy

    def _in_batches(self, net: nn.Module, dtype: torch.dtype, cond: Conditioning, seeds: torch.Tensor, steps: int,
                    *, progress: Progress | None, stop: Callable[[], bool] | None,
                    sizes: list[int] | None, sampler: Sampler) -> tuple[torch.Tensor, torch.Tensor]:
        total = seeds.numel()
        parts = batch_slices(total, sampler.batch_size, sizes)
        every = -(-len(parts) // PROGRESS_REPORTS)  # ceil: at most PROGRESS_REPORTS reports
        latents, images = [], []
        lanes = max(1, sampler.lanes)
        inner = replace(sampler, lanes=1)  # each batch whole, in its lane
        for i in range(0, len(parts), lanes):  # `lanes` batches at a time side by side, then decoded in order
            window = parts[i:i + lanes]
            if stop is not None and stop():
                raise GenerationStopped(window[0].start, total)
            made = map_in_lanes(lambda part: inner.generate(self.model, net, cond[part], seeds[part], steps, dtype),
                                window, lanes)
            for j, part in enumerate(window, start=i):
                latents.append(made[j - i])
                images.append(self.decode(latents[-1]))
                if progress is not None and ((j + 1) % every == 0 or j + 1 == len(parts)):
                    progress(part.stop, total)
        return torch.cat(latents), torch.cat(images)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] on the CPU, decoded a rollout batch at a time (VAE memory)."""
        chunk = self.sampler.batch_size
        with self.vae_in():
            return torch.cat([self.model.decode(latents[i:i + chunk]).float().cpu()
                              for i in range(0, latents.shape[0], chunk)])

    def images(self, prompts: list[str], seeds: torch.Tensor, steps: int, on: str,
               progress: Progress | None = None, stop: Callable[[], bool] | None = None) -> torch.Tensor:
        """Images [B, 3, H, W] in [0, 1] on the CPU, one per (prompt, seed) row (`stop`: generate)."""
        return self.generate(self.conditioning(prompts), seeds, steps, on, progress=progress, stop=stop).images


def resolve_runtime(cfg: Config) -> tuple[torch.device, str, torch.dtype]:
    """The device and dtype of `cfg`, "auto" resolved: one GPU per process under torchrun. On CUDA it
    also sets TF32 as `run.tf32` says (tf32.py), so train and every side tool run the same matmuls."""
    from solrl_core.runtime import distributed
    from solrl_core.runtime.device import resolve_device, resolve_dtype
    from solrl_core.runtime.tf32 import apply_tf32

    device = resolve_device(cfg.run.device)
    if distributed.world_size() > 1 and device.type == "cuda":  # one GPU per process, whatever cuda:N the config names
        device = torch.device("cuda", torch.cuda.current_device())
    apply_tf32(cfg.run.tf32, device)
    dtype_name, dtype = resolve_dtype(cfg.run.dtype, device)
    return device, dtype_name, dtype


def open_engine(cfg: Config, *, device: torch.device | None = None, explore: CopySpec | bool | None = None,
                rollout: CopySpec | None = None, checkpoint: Path | None = None, rewards: RewardSet | None = None,
                numerics_only: bool = False, refresh: bool = True, memory: MemoryModes | None = None,
                machine: MachinePlan | None = None) -> Engine:
    """The model of `cfg` with its LoRA adapters (loaded from `checkpoint` when given, else untrained)
    and the copies asked for, copied from the base weights before the adapters are added.

    `explore=True` (a side tool): an explore copy at the precision the plan resolves for one process
    (resolve.resolve_machine), eager, checked to run on this device unless `numerics_only` (measuring
    its numerics where it has only a reference kernel, e.g. fp8 on a CPU). `device`: the one a training
    session resolved (it has set the threads); None resolves it from cfg. `refresh=False` leaves the
    copies unloaded: a training session refreshes them once its adapters are final (synchronised over
    ranks, or restored). `machine`: the run's machine plan, whose gradient checkpointing and memory
    modes (the copies or the VAE parked on the CPU: offload.py) the engine takes; `memory`: those
    modes without a plan (tests)."""
    from solrl_core.precision import fp8_attention
    from solrl_core.precision.hardware import require_explore_precision

    if device is None:  # a side tool: it resolves the device, and sets the torch threads, itself (threads.py)
        from solrl_core.runtime.threads import apply_threads

        device, dtype_name, dtype = resolve_runtime(cfg)
        apply_threads(cfg.run.threads)
    else:
        from solrl_core.runtime.device import resolve_dtype

        dtype_name, dtype = resolve_dtype(cfg.run.dtype, device)
    memory = memory if memory is not None or machine is None else machine.memory
    checkpointing = machine is not None and machine.checkpointing
    if explore is True:  # a side tool: nothing parked, no checkpointing, its explore copies eager
        from solrl_core.plan.resolve import resolve_machine

        machine = replace(resolve_machine(cfg, device, dtype_name), explore_compile=False)
        explore = CopySpec(machine.explore_precision)
        if not numerics_only:
            require_explore_precision(explore.precision, device)
        if cfg.explore.fp8_attention:
            fp8_attention.require(explore.precision, cfg.model.loader, device)
    model = load_model(cfg.model, device, dtype)
    explore_copy = _copy(cfg, model, explore) if explore else None
    rollout_copy = _copy(cfg, model, rollout) if rollout else None
    # the copies stay bf16, as the official SD3's
    if cfg.model.train_precision == "fp32-base" and dtype == torch.bfloat16:
        model.transformer.to(torch.float32)
    if checkpointing:  # acts only where gradients are on: the trained forward
        model.transformer.enable_gradient_checkpointing()
    policy = Policy(model.transformer, cfg.model)
    if checkpoint is not None:
        from solrl_core.engine.checkpoint import load_adapters

        load_adapters(checkpoint, policy)
    engine = Engine(config=cfg, device=device, dtype_name=dtype_name, dtype=dtype, model=model, policy=policy,
                    sampler=Sampler.of(cfg.sampler), conditioning=TextCache(model), rewards=rewards,
                    explore_copy=explore_copy, rollout_copy=rollout_copy, policy_forward=policy.transformer,
                    checkpoint=checkpoint, parking=_parking(memory, device, model, [explore_copy, rollout_copy]),
                    machine=machine, lanes=torch.get_num_threads() if device.type == "cpu" and cfg.run.lanes else 1)
    if refresh:
        engine.refresh_copies()
    return engine


def _parking(memory: MemoryModes | None, device: torch.device, model: DiffusionModel,
             copies: list[RolloutCopy | None]) -> Parking | None:
    """The copies and the VAE sent to the CPU as the memory modes say (None: nothing parked)."""
    if memory is None or (memory.copies == "gpu" and not (memory.vae_on_cpu and model.vae is not None)):
        return None
    parking = Parking(device, memory.copies, model.vae if memory.vae_on_cpu else None)
    parking.park([c.module for c in copies if c is not None])
    parking.park_vae()
    return parking


def _copy(cfg: Config, model: DiffusionModel, spec: CopySpec, source: nn.Module | None = None,
          dtype: torch.dtype | None = None) -> RolloutCopy:
    """A copy of the base transformer (`source`: the policy's, carrying adapters: its base layers
    copied in their place, cast to `dtype`) at the spec's precision.

    A quantized copy of the base model is lean: built on the meta device and filled layer by layer
    (quantize.load_tensor), its quantized layers hold only their quantized caches, never a second
    high-precision weight (fp8: 1 byte a weight instead of 3; footprint.copy_bytes). Filled here
    from the base model on a replica, from the shards under fsdp (sharded_copy.py)."""
    lean = spec.precision in QUANTIZED
    if source is not None:
        module = cast(base_copy(meta_copy(source) if lean else source), dtype)
    elif spec.from_shards or lean:
        module = meta_copy(model.transformer)
    else:
        module = copy.deepcopy(model.transformer)
    made = RolloutCopy(module, spec.precision, LayerRule.of(cfg.model), compile=spec.compiled,
                       compile_mode=cfg.run.compile_mode, sharded=spec.sharded, fp8_backend=cfg.explore.fp8_backend,
                       fp8_attention=cfg.explore.fp8_attention and lean,  # explore copies only: never full precision
                       nvfp4_emulation=cfg.explore.nvfp4_emulation)
    if not spec.from_shards and made.on_meta:
        base = model.transformer if source is None else source
        made.materialize(next(base.parameters()).device)
        state = model.transformer.state_dict() if source is None else base_tensors(list(source.named_modules()))
        for name, value in state.items():
            load_tensor(made.module, name, value)
    return made


def base_copy(transformer: nn.Module) -> nn.Module:
    """A deep copy of `transformer` with every peft adapter layer replaced by a copy of its base layer:
    the plain base architecture with the base weights, as the copies are built before adapters exist."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    memo: dict[int, object] = {id(m): copy.deepcopy(m.get_base_layer()) for m in transformer.modules()
                               if isinstance(m, BaseTunerLayer)}
    return copy.deepcopy(transformer, memo)
