"""Out-of-memory back-off: a phase that does not fit halves its batch and the iteration starts again.

Each phase names itself where it runs, with `charged_to(phase)` around its work; an error that
passes through several is charged to the innermost:

    phase        setting halved           where
    reward       reward.batch_size        RewardSet.__call__ (every reward scoring)
    update       optimizer.micro_batch    update.update
    evaluation   sampler.rollout_batch    trainer's evaluation during training
    rollout      sampler.rollout_batch    rollout.rollout (generate and decode)

Every draw of an iteration derives from (run seed, iteration), and neither the rollout batch nor
the micro-batch changes what is computed (only how it is chunked), so the redone iteration computes
what the first attempt would have, to float rounding. The halved size is written to the run's
config.toml, which a resume reads. At size 1 the run stops with a checkpoint and says what to change.

One process only: with several, the other ranks would wait forever in a collective for the one
that failed, so there an out-of-memory error ends the run (torchrun stops every rank) and the
previous checkpoint is intact.
"""

from __future__ import annotations

import dataclasses
import gc
from typing import TYPE_CHECKING, Callable

import torch

from solrl_core import events as ev
from solrl_core.config.convert import save_run_config
from solrl_core.errors import SolrlError
from solrl_core.faults.phase import phase_of

if TYPE_CHECKING:
    from solrl_core.config.schema import Config
    from solrl_core.loop.loop_state import LoopState
    from solrl_core.loop.session import Run


SETTINGS = {"reward": ("reward", "batch_size"), "update": ("optimizer", "micro_batch"),
            # faults/phase.py: PHASES
            "evaluation": ("sampler", "rollout_batch"), "rollout": ("sampler", "rollout_batch")}

FIXES = {
    "rollout": "lower model.resolution or explore.group_size N, keep the explore copy quantized (explore.precision: a "
               "bf16/fp32 copy holds the model twice), or use a smaller model",
    "evaluation": "lower model.resolution or run.eval_seeds, or evaluate after training with `solrl eval`",
    "reward": "lower model.resolution (smaller images to score), or give the reward model a GPU of its own",
    "update": "lower model.resolution or selection.group_size K, keep the explore copy quantized (explore.precision), "
              "or use a smaller model",
}


class DoesNotFit(SolrlError):
    """A phase ran out of memory at batch size 1."""

    def __init__(self, phase: str) -> None:
        section, key = SETTINGS[phase]
        super().__init__(f"out of GPU memory in the {phase} even at {section}.{key}=1",
                         FIXES[phase] + "; then `solrl train --resume RUN` (a checkpoint was saved)")
        self.phase = phase


def size(config: "Config", phase: str) -> int:
    section, key = SETTINGS[phase]
    return getattr(getattr(config, section), key)


def with_size(config: "Config", phase: str, value: int) -> "Config":
    section, key = SETTINGS[phase]
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{key: value})})


def retry(run: "Run", state: "LoopState", bus: ev.EventBus, work: Callable[["Run"], object]) -> "Run":
    """`work(run)`, redone from its start with a halved batch after each out-of-memory error.
    Returns the run to go on with (its config holding the sizes that fit).

    The state an attempt may have advanced before failing (reward streaks) is restored, and the
    failed attempt's tensors are released before the next one starts."""
    while True:
        saved = state.streaks()
        phase = None
        try:
            work(run)
            return run
        except torch.cuda.OutOfMemoryError as exc:
            phase = phase_of(exc)
            if run.world_size > 1 or phase is None:
                raise
        # here, outside the handler, the exception and the frames holding the attempt's tensors are gone
        state.set_streaks(saved)
        run.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        run = back_off(run, bus, phase, state.iteration + 1)


def back_off(run: "Run", bus: ev.EventBus, phase: str, iteration: int) -> "Run":
    """The run with `phase`'s batch halved (also in the run's config.toml), or raise DoesNotFit."""
    old = size(run.config, phase)
    if old <= 1:
        raise DoesNotFit(phase)
    new = old // 2
    run = run.with_config(with_size(run.config, phase, new))
    if phase == "reward":  # model rewards read their chunk size from their own context
        for reward in run.rewards.rewards.values():
            if hasattr(reward, "batch_size"):
                reward.batch_size = new
    if run.rank == 0:
        save_run_config(run.run_dir, run.config)
    section, key = SETTINGS[phase]
    bus.emit(ev.OutOfMemoryBackoff(iteration=iteration, phase=phase, setting=f"{section}.{key}", old=old, new=new))
    return run
