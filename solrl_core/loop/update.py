"""The update: one optimizer step of the run's loss (algorithm.loss: nft.py's DiffusionNFT loss, awm.py's
AWM loss or grpo.py's Flow-GRPO loss, chosen in `_loss`) on the Stage-2 rollouts, accumulated over
micro-batches and train timesteps."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import numpy as np
import torch

from solrl_core.config.schema import AlgorithmConfig
from solrl_core.engine.policy import OLD
from solrl_core.engine.rollout import RolloutBatch
from solrl_core.engine.sde import SdeStep, sde_step
from solrl_core.engine.sharding import sync_gradients
from solrl_core.faults.phase import charged_to
from solrl_core.loop.awm import awm_loss
from solrl_core.loop.grpo import grpo_loss
from solrl_core.loop.nft import LossTerms, nft_loss
from solrl_core.loop.session import Run
from solrl_core.models.base import Conditioning
from solrl_core.runtime import distributed
from solrl_core.runtime.lanes import map_in_lanes


@dataclass(frozen=True)
class UpdateResult:
    """What one update did; `loss`, `policy` and `kl` are means over every (sample, timestep) pair."""

    loss: float
    policy: float
    kl: float
    nonfinite: int  # loss terms that were not finite (zeroed, or their micro-batch skipped)
    grad_norm: float
    stepped: bool  # False: the gradient was not finite (or there was none) and the step was skipped

    @classmethod
    def skipped(cls) -> "UpdateResult":
        """No usable sample: no step."""
        return cls(math.nan, math.nan, math.nan, 0, math.nan, False)

    def losses(self) -> dict[str, float]:
        return {"loss": self.loss, "policy": self.policy, "kl": self.kl}

    @classmethod
    def combined(cls, parts: list["UpdateResult"], sizes: list[int]) -> "UpdateResult":
        """An iteration of several optimizer steps (optimizer.steps_per_iteration), each on `sizes[i]` samples:
        the losses weighted by them, the non-finite terms summed, the mean gradient norm, stepped if any did."""
        total = sum(sizes)

        def mean(values: list[float]) -> float:
            return sum(v * n for v, n in zip(values, sizes) if n) / total if total else math.nan

        return cls(mean([r.loss for r in parts]), mean([r.policy for r in parts]), mean([r.kl for r in parts]),
                   sum(r.nonfinite for r in parts), sum(r.grad_norm for r in parts) / len(parts),
                   any(r.stepped for r in parts))


def update(run: Run, batch: RolloutBatch, advantages: torch.Tensor, rng: np.random.Generator, samples: int,
           local: slice) -> UpdateResult:
    """One optimizer step of the run's loss on this rank's `batch` with its `advantages`.

    The gradient is the mean over every (sample, train timestep) pair of every rank: each rank
    weighs a micro-batch's mean loss by its share of the rank's pairs, and the ranks (which hold
    equally many samples) average their gradients. Each sample's timesteps and training noise come
    from its own generator, drawn for all `samples` of every rank (this rank's, `batch`, are the
    `local` ones), so neither the split over ranks nor the micro-batch size changes them."""
    cfg, policy = run.config, run.engine.policy
    alg = cfg.algorithm
    grid = batch.sigmas[:-1]
    per_sample = min(max(1, int(run.plan.full_steps * alg.timestep_fraction)), grid.numel())
    n = len(batch.prompts)
    gens = [torch.Generator().manual_seed(int(s)) for s in rng.integers(0, 2**63 - 1, size=samples)[local]]
    picks = train_timesteps(gens, grid.numel(), per_sample, alg) if batch.trajectory is None else \
        batch.trajectory.trained_steps(per_sample)
    per_sample = picks.shape[1]
    cond = run.engine.conditioning(batch.prompts)
    micro = cfg.optimizer.micro_batch
    pairs = n * per_sample
    params = policy.trainable_parameters()
    run.optimizer.zero_grad(set_to_none=True)
    sums = torch.zeros(4, dtype=torch.float64)  # loss, policy, kl, non-finite terms
    with charged_to("update"), run.engine.update_scope():
        steps = [(slice(start, min(start + micro, n)), j) for j in range(per_sample) for start in range(0, n, micro)]

        def inputs(chunk: slice, j: int) -> _Inputs:  # a sample's noise for its steps in their order, however run
            weight = (chunk.stop - chunk.start) / pairs
            if batch.trajectory is not None:  # flow_grpo: a stored SDE step, no training noise
                return _path_inputs(run, batch, chunk, picks[chunk, j], cond[chunk], advantages[chunk], weight)
            eps = torch.stack([torch.randn(batch.latents.shape[1:], generator=g) for g in gens[chunk]])
            return _inputs(run, batch.latents[chunk], grid[picks[chunk, j]], eps, cond[chunk], advantages[chunk],
                           weight)

        if run.sharded:
            sums += _sharded_steps(run, (inputs(c, j) for c, j in steps), len(steps), batch.sigmas)
        else:
            sums += _micro_steps(run, steps, inputs, _lanes(run))
            distributed.all_reduce_mean_grads(params)  # every rank now holds the same gradient, so takes the same step
        clip = cfg.optimizer.grad_clip
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf)
        # a NaN step would poison the weights
        stepped = bool(torch.isfinite(grad_norm)) and any(p.grad is not None for p in params)
        if stepped:
            run.optimizer.step()
    if run.world_size > 1:
        sums = distributed.all_reduce(sums) / torch.tensor([run.world_size] * 3 + [1], dtype=torch.float64)
    return UpdateResult(float(sums[0]), float(sums[1]), float(sums[2]), int(sums[3]), float(grad_norm), stepped)


def train_timesteps(gens: list[torch.Generator], grid_size: int, span: int, alg: AlgorithmConfig) -> torch.Tensor:
    """[samples, timesteps per sample]: each sample's train grid indices, drawn from its generator.
    subset: a random `span` of the `grid_size` (DiffusionNFT's). stratified: AWM's 'discrete' draw
    (scripts/train_sd3_awm.py:1172-1180): boundaries linspace(0, span, strata + 1), one index
    lower + trunc(u (upper - lower)) in each stratum, u ~ U[0, 1) (there one draw per micro-batch).
    (algorithm.loss=flow_grpo trains the steps its rollouts' paths name: Trajectory.trained_steps.)"""
    if alg.train_timesteps == "stratified":
        bounds = torch.linspace(0, span, alg.strata + 1)
        lower, upper = bounds[:-1].long(), bounds[1:].long()
        return torch.stack([lower + (torch.rand(alg.strata, generator=g) * (upper - lower)).long() for g in gens])
    return torch.stack([torch.randperm(grid_size, generator=g)[:span] for g in gens])


@dataclass(frozen=True)
class _Inputs:
    """One micro-step on the run's device: a micro-batch at one train timestep per sample, its loss
    weighted by its share of the pairs. The three forwards get one input, xt in the run dtype (`x_in`),
    and the same fp32 timesteps, as the official code feeds its one bf16 xt and sigma to old, trained
    and reference (train_sana.py:878-889). eps: the training noise xt was made with (AWM's target is
    eps - x0). flow_grpo's step (`_path_inputs`) is a stored SDE step instead: xt the fp32 state before
    it, `prev` the state after, `index` its grid index in `sigmas`, `old_log_prob` the rollout's."""

    x0: torch.Tensor
    sigma: torch.Tensor
    eps: torch.Tensor | None
    xt: torch.Tensor
    x_in: torch.Tensor
    cond: Conditioning
    adv: torch.Tensor
    weight: float
    prev: torch.Tensor | None = None
    index: torch.Tensor | None = None
    sigmas: torch.Tensor | None = None
    old_log_prob: torch.Tensor | None = None


def _inputs(run: Run, x0: torch.Tensor, sigma: torch.Tensor, eps: torch.Tensor, cond: Conditioning, adv: torch.Tensor,
            weight: float) -> _Inputs:
    device = run.device
    x0, sigma, eps, cond, adv = x0.to(device), sigma.to(device), eps.to(device), cond.to(device), adv.to(device)
    sigma, eps = rounded_inputs(sigma, eps, run.config.algorithm.loss_dtype)
    sigma, xt = loss_inputs(x0, sigma, eps, run.config.algorithm.loss_dtype)
    return _Inputs(x0, sigma, eps, xt, xt.to(run.engine.dtype), cond, adv, weight)


def _path_inputs(run: Run, batch: RolloutBatch, chunk: slice, index: torch.Tensor, cond: Conditioning,
                 adv: torch.Tensor, weight: float) -> _Inputs:
    """flow_grpo's micro-step: each sample's stored SDE step at grid `index` (train_sd3.py:181-215: the
    state before it in fp32, the state after, the rollout's log-probability). The forwards see the state in
    the run dtype and the sigma the rollout's network saw (Sampler.model_call's)."""
    device, path = run.device, batch.trajectory
    rows = torch.arange(chunk.start, chunk.stop)
    xt = path.states[rows, index].to(device)
    sigmas = batch.sigmas.to(device)
    sigma = run.engine.sampler.seen_sigma(sigmas[index.to(device)])
    return _Inputs(batch.latents[chunk].to(device), sigma, None, xt, xt.to(run.engine.dtype), cond.to(device),
                   adv.to(device), weight, prev=path.states[rows, index + 1].to(device), index=index, sigmas=sigmas,
                   old_log_prob=path.log_probs[rows, index].to(device))


Targets = tuple[torch.Tensor | None, torch.Tensor | None]  # v_old (None where unweighed), v_ref (None at kl_beta 0)
Grads = tuple[torch.Tensor | None, ...]


def _targets(run: Run, steps: list[_Inputs], lanes: int) -> list[Targets]:
    """The forwards without gradients of each of `steps`, `lanes` at a time: v_old of all, then v_ref
    of all (the policy with no adapter, switched once for all of them)."""
    old = torch.no_grad()(lambda s: old_velocity(run, s.x_in, s.sigma, s.cond))
    ref = torch.no_grad()(lambda s: _policy_velocity(run, s.x_in, s.sigma, s.cond))
    v_olds = map_in_lanes(old, steps, lanes) if _needs_old(run.config.algorithm) else [None] * len(steps)
    v_refs: list[torch.Tensor | None] = [None] * len(steps)
    if run.config.algorithm.kl_beta != 0:  # the reference only enters the loss through kl_beta: no forward for nothing
        with run.engine.policy.use(None):
            v_refs = map_in_lanes(ref, steps, lanes)
    return list(zip(v_olds, v_refs))


def _needs_old(alg: AlgorithmConfig) -> bool:
    """Whether the loss weighs v_old: AWM only in its anchor, which enters beside the KL (no forward for a
    term that is not there); flow_grpo never (its old policy is the rollout's, whose log-probabilities the
    batch holds)."""
    return alg.loss == "nft" or (alg.loss == "awm" and alg.kl_beta != 0 and alg.awm_anchor_beta != 0)


def _micro_step(run: Run, step: _Inputs, targets: Targets,
                params: list[torch.nn.Parameter]) -> tuple[torch.Tensor, Grads | None]:
    """The trained forward of one micro-step, its loss and the loss's gradient of each of `params` (None:
    the loss was not finite). Returns (loss, policy, kl) x weight and the non-finite terms, and the
    gradient, which the caller sums into the parameters' in micro-step order, as backward() accumulates.
    Sharded, backward() itself: FSDP reduces the gradient over the ranks in hooks on it (autograd.grad
    would pass them by), and every rank joins every backward, a non-finite one too (it skips the step)."""
    v_old, v_ref = targets
    v = _policy_velocity(run, step.x_in, step.sigma, step.cond)
    terms = _loss(run, v, v_old, v_ref, step)
    finite = bool(torch.isfinite(terms.loss))
    sums = _sums(terms, step.weight) if finite else _skipped(step.x0)
    if run.sharded:
        (terms.loss * step.weight).backward()
        return sums, None
    return sums, torch.autograd.grad(terms.loss * step.weight, params, allow_unused=True) if finite else None


def _policy_velocity(run: Run, x_in: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """The policy's velocity (with whichever adapter is on), in fp32."""
    with run.engine.autocast():
        return run.engine.model.velocity(run.engine.policy_forward, x_in, sigma, cond).float()


def _loss(run: Run, v: torch.Tensor, v_old: torch.Tensor | None, v_ref: torch.Tensor | None,
          step: _Inputs) -> LossTerms:
    """The loss terms of one micro-step: the run's algorithm.loss, with its settings (the one place the
    loss is chosen)."""
    return _LOSSES[run.config.algorithm.loss](run.config.algorithm, v, v_old, v_ref, step)


def _nft(alg: AlgorithmConfig, v: torch.Tensor, v_old: torch.Tensor, v_ref: torch.Tensor | None,
         step: _Inputs) -> LossTerms:
    return nft_loss(v, v_old, v_ref, step.xt, step.x0, step.sigma, step.adv, nft_beta=alg.nft_beta,
                    kl_beta=alg.kl_beta, adv_clip_max=alg.adv_clip_max)


def _awm(alg: AlgorithmConfig, v: torch.Tensor, v_old: torch.Tensor | None, v_ref: torch.Tensor | None,
         step: _Inputs) -> LossTerms:
    return awm_loss(v, v_old, v_ref, step.x0, step.eps, step.sigma, step.adv, kl_beta=alg.kl_beta,
                    anchor_beta=alg.awm_anchor_beta, power=alg.awm_power, adv_clip_max=alg.adv_clip_max)


def _grpo(alg: AlgorithmConfig, v: torch.Tensor, v_old: torch.Tensor | None, v_ref: torch.Tensor | None,
          step: _Inputs) -> LossTerms:
    """Flow-GRPO: the log-probability of the stored step under the trained policy (and the base's mean for
    the KL), against the rollout's (train_sd3.py:877-904)."""
    def at(velocity: torch.Tensor) -> SdeStep:
        return sde_step(step.xt, velocity, step.sigmas, step.index, alg.sde_eta, kind=alg.sde_kind, prev=step.prev)

    now = at(v)
    ref_mean = at(v_ref).mean if v_ref is not None else None
    terms = grpo_loss(now.log_prob, step.old_log_prob, step.adv, clip_range=alg.clip_range,
                      adv_clip_max=alg.adv_clip_max, beta=alg.kl_beta, mean=now.mean, ref_mean=ref_mean,
                      std_dev_t=now.std_dev_t)
    return LossTerms(loss=terms.loss, policy=terms.policy, kl=terms.kl, nonfinite=0)


# algorithm.loss -> its terms of one micro-step (config/choices.py: LOSSES names them)
_LOSSES: dict[str, Callable[[AlgorithmConfig, torch.Tensor, torch.Tensor, torch.Tensor | None, _Inputs],
                            LossTerms]] = {"nft": _nft, "awm": _awm, "flow_grpo": _grpo}


def _sums(terms: LossTerms, weight: float) -> torch.Tensor:
    """(loss, policy, kl) x weight and the non-finite terms of one micro-step."""
    return torch.tensor([float(terms.loss.detach()) * weight, float(terms.policy) * weight, float(terms.kl) * weight,
                         terms.nonfinite], dtype=torch.float64)


def _skipped(x0: torch.Tensor) -> torch.Tensor:
    """A micro-step whose loss was not finite: nothing added, its samples counted as non-finite."""
    return torch.tensor([0.0, 0.0, 0.0, x0.shape[0]], dtype=torch.float64)


def _lanes(run: Run) -> int:
    """How many micro-steps run side by side (runtime/lanes.py): the engine's CPU lanes, for an eager
    update in one process whose v_old comes from the rollout copy or is not needed (the old adapter, like
    the reference forward, is the policy's state, switched for all lanes at once: `_targets`)."""
    engine = run.engine
    if (run.world_size > 1 or run.sharded or engine.compiled_update
            or (engine.rollout_copy is None and _needs_old(run.config.algorithm))):
        return 1
    return engine.lanes_for("trained")


def _micro_steps(run: Run, steps: list[tuple[slice, int]], inputs: Callable[[slice, int], _Inputs],
                 lanes: int) -> torch.Tensor:
    """`_micro_step` of each of `steps` (a micro-batch's samples, the index of its train timestep), in
    order, `lanes` side by side: with one lane, one micro-step at a time (its inputs, forwards and
    gradient held alone); with several (a CPU's), all together. Each gradient is summed into the
    parameters' in the order of `steps`, the same sums in the same order with any number of lanes."""
    params = list(run.engine.policy.trainable_parameters())
    sums = torch.zeros(4, dtype=torch.float64)
    window = len(steps) if lanes > 1 else 1
    for start in range(0, len(steps), window):
        part = [inputs(chunk, j) for chunk, j in steps[start:start + window]]
        targets = _targets(run, part, lanes)
        done = map_in_lanes(lambda k: _micro_step(run, part[k], targets[k], params), range(len(part)), lanes)
        for step_sums, grads in done:
            sums += step_sums
            for p, g in zip(params, grads or ()):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad.add_(g)
    return sums


def _sharded_steps(run: Run, steps: Iterator[_Inputs], count: int, sigmas: torch.Tensor) -> torch.Tensor:
    """FSDP: `_micro_step` of each of this rank's `count` steps with backward(), the gradients reduced
    over the ranks once, at the last. Every rank runs as many forwards and backwards (each gathers
    weights from all) as the rank with most (samples with a non-finite reward are dropped per rank):
    a rank with fewer adds idle ones."""
    backwards = int(distributed.all_reduce(torch.tensor([count]), "max").item())
    transformer = run.engine.policy.transformer
    sums = torch.zeros(4, dtype=torch.float64)
    for step in steps:
        backwards -= 1
        sync_gradients(transformer, backwards == 0)
        sums += _micro_step(run, step, _targets(run, [step], 1)[0], [])[0]
    while backwards > 0:
        backwards -= 1
        sync_gradients(transformer, backwards == 0)
        _idle_step(run, sigmas)
    return sums


def rounded_inputs(sigma: torch.Tensor, eps: torch.Tensor, dtype: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """(sigma, eps) as the update uses them: `dtype` bf16 rounds both to bf16 (see loss_inputs)."""
    if dtype == "bf16":
        return sigma.to(torch.bfloat16).float(), eps.to(torch.bfloat16).float()
    return sigma, eps


def loss_inputs(x0: torch.Tensor, sigma: torch.Tensor, eps: torch.Tensor, dtype: str = "fp32") -> tuple[torch.Tensor,
                                                                                                        torch.Tensor]:
    """(sigma, xt = (1 - sigma) x0 + sigma eps) of the update. `dtype` bf16: sigma and eps rounded to
    bf16 before and xt after, as the official SANA (bf16 sigma, xt cast to bf16: train_sana.py:874-878)
    and FLUX.1 (t cast to bf16, noise drawn in bf16: train_flux1.py:933-936) build them."""
    sigma, eps = rounded_inputs(sigma, eps, dtype)
    s = sigma.view(-1, *[1] * (x0.dim() - 1))  # image latents [B,C,H,W], video [B,C,F,H,W]
    xt = (1 - s) * x0 + s * eps
    return sigma, (xt.to(torch.bfloat16).float() if dtype == "bf16" else xt)


def _idle_step(run: Run, sigmas: torch.Tensor) -> None:
    """A micro-step that adds nothing to the gradient (weight 0, zero input): the collectives a
    sharded rank with fewer samples must join."""
    x0 = torch.zeros(1, *run.engine.model.latent_shape)
    cond = run.engine.conditioning(run.prompts[:1])
    step = _inputs(run, x0, sigmas[:1], torch.zeros_like(x0), cond, torch.zeros(1), 0.0)
    if run.config.algorithm.loss == "flow_grpo":  # its loss reads a stored step: the first, from and to zero
        step = replace(step, prev=step.xt, index=torch.zeros(1, dtype=torch.long), sigmas=sigmas.to(run.device),
                       old_log_prob=torch.zeros(1, device=run.device))
    _micro_step(run, step, _targets(run, [step], 1)[0], [])


def old_velocity(run: Run, xt: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
    """v_old: on the rollout copy (base + old merged, no adapter overhead; called outside autocast in
    its own dtype, as its rollouts are, so a compiled copy keeps its graph), else the old adapter."""
    full = run.engine.rollout_copy
    if full is not None:
        return run.engine.model.velocity(full.forward, xt.to(full.dtype), sigma, cond).float()
    with run.engine.autocast(), run.engine.policy.use(OLD):
        return run.engine.model.velocity(run.engine.policy_forward, xt, sigma, cond).float()
