"""Compile warm-up: each torch.compile'd module (explore copy, rollout copy, the update's policy
forwards) compiled on warm-up calls before the first iteration, reported as its own events: a
compile is a one-time cost, not a slow iteration."""

from __future__ import annotations

import time

import torch

from solrl_core import events as ev
from solrl_core.engine.policy import OLD
from solrl_core.loop.session import Run
from solrl_core.loop.stages import quantized_copy


def warm_up_compiled(run: Run, bus: ev.EventBus) -> None:
    """Compile every compiled module of `run` at every batch size the run will give it.

    torch.compile turns the batch dimension dynamic at the second size, and a graph's guards can still
    depend on the batch (on a CPU the convolution backend changes at batch 16, and SANA's feed-forward
    is convolutions), so only the sizes themselves make sure iteration 1 compiles nothing."""
    sizes = warm_up_sizes(run)
    for target, copy_ in (("explore copy", run.engine.explore_copy), ("rollout copy", run.engine.rollout_copy)):
        if copy_ is None or copy_.compiled is None:
            continue
        bus.emit(ev.CompileStarted(target=target))
        t0 = time.perf_counter()
        with run.engine.copy_in(copy_):  # a copy the memory mode parks on the CPU (offload.py)
            for n in sizes[target]:
                cond = run.engine.conditioning(run.prompts[:1] * n).to(run.device)
                x = torch.zeros(n, *run.engine.model.latent_shape, device=run.device, dtype=copy_.dtype)
                with torch.no_grad():
                    run.engine.model.velocity(copy_.forward, x, torch.ones(n, device=run.device), cond)
        _synchronize(run)
        bus.emit(ev.CompileFinished(target=target, seconds=time.perf_counter() - t0))
    if run.engine.compiled_update:
        bus.emit(ev.CompileStarted(target="update"))
        t0 = time.perf_counter()
        with run.engine.update_scope():
            _warm_up_update(run, sizes["update"])
            if run.machine.policy_rollout_compile:  # implies no rollout copy
                _warm_up_policy_rollouts(run, sizes["rollout copy"])
        bus.emit(ev.CompileFinished(target="update", seconds=time.perf_counter() - t0))


def warm_up_sizes(run: Run) -> dict[str, list[int]]:
    """The batch sizes each compiled module sees in an iteration on this rank, largest first: the
    rollouts' chunks of sampler.rollout_batch (Stage 1, Stage 2, the rank check), and v_old's and the
    update's micro-batches. Samples left out for a non-finite reward, or an out-of-memory back-off,
    can still bring a new size (one recompile, then)."""
    cfg, plan = run.config, run.plan
    batch, micro = cfg.sampler.rollout_batch, cfg.optimizer.micro_batch
    groups = cfg.run.prompts_per_iteration // run.world_size

    def chunks(n: int, size: int) -> set[int]:
        return {s for s in (min(n, size), n % size) if s}

    drafts, kept = groups * plan.explore_seeds, groups * plan.keep
    full = chunks(kept, batch) if plan.regenerate else set()
    if run.engine.explore_copy is None:  # Stage 1 (every rollout of a full-precision family) on the rollout copy
        full |= chunks(drafts, batch)
    if plan.regenerate and cfg.explore.rank_check_every:
        full |= chunks(plan.explore_seeds, batch)
    # a quantized copy's Stage-1 batches hold one prompt group each (stages.roll_out)
    explore = chunks(plan.explore_seeds, batch) if quantized_copy(run) else chunks(drafts, batch)
    out = {"explore copy": explore, "rollout copy": full | chunks(kept, micro), "update": chunks(kept, micro)}
    return {k: sorted(v, reverse=True) for k, v in out.items()}


def _warm_up_update(run: Run, sizes: list[int]) -> None:
    """Each graph of the compiled update at each micro-batch size, in the update's own states: the
    trained forward and backward under autocast, the reference (and, without a rollout copy, the old
    adapter) without gradients. The warm-up's gradients are dropped; the weights are not touched."""
    model, policy = run.engine.model, run.engine.policy
    states = [None] if run.config.algorithm.kl_beta != 0 else []
    if run.engine.rollout_copy is None:
        states.append(OLD)
    for n in sizes:
        cond = run.engine.conditioning(run.prompts[:1] * n).to(run.device)
        # as update._micro_step feeds them
        x = torch.zeros(n, *model.latent_shape, device=run.device, dtype=run.engine.dtype)
        sigma = torch.full((n,), 0.5, device=run.device)
        with run.engine.autocast():
            model.velocity(run.engine.policy_forward, x, sigma, cond).float().sum().backward()
        with torch.no_grad():
            for state in states:
                with run.engine.autocast(), policy.use(state):
                    model.velocity(run.engine.policy_forward, x, sigma, cond)
    for p in policy.trainable_parameters():
        p.grad = None
    _synchronize(run)


def _warm_up_policy_rollouts(run: Run, sizes: list[int]) -> None:
    """The full-precision rollouts' graphs on the policy's old adapter (no rollout copy): latents in
    the run dtype under autocast, without gradients, as stages.roll_out calls them."""
    for n in sizes:
        cond = run.engine.conditioning(run.prompts[:1] * n).to(run.device)
        x = torch.zeros(n, *run.engine.model.latent_shape, device=run.device, dtype=run.engine.dtype)
        with torch.no_grad(), run.engine.autocast(), run.engine.policy.use(OLD):
            run.engine.model.velocity(run.engine.policy_forward, x, torch.ones(n, device=run.device), cond)


def _synchronize(run: Run) -> None:
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
