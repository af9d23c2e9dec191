"""Out-of-memory back-off: a phase that does not fit halves its batch and the iteration starts again.

Which phase failed is read from the traceback (the innermost solrl phase the error passed through),
so the loop needs no bookkeeping of its own:

    phase        setting halved           frames that name it
    reward       reward.batch_size        anything in solrl_core.rewards
    update       optimizer.micro_batch    trainer.update
    evaluation   sampler.rollout_batch    solrl_core.evaluation, trainer._evaluate
    rollout      sampler.rollout_batch    rollout.rollout / rollout.generate

Every draw of an iteration derives from (run seed, iteration), and neither the rollout batch nor
the micro-batch changes what is computed (only how it is chunked), so the redone iteration computes
what the first attempt would have, to float rounding. The halved size is written to the run's
config.toml, which a resume reads. At size 1 the run stops with a checkpoint and says what to change.

One process only: with several, the other ranks would wait forever in a collective for the one
that failed, so there an out-of-memory error ends the run (torchrun stops every rank) and the
previous checkpoint is intact.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import traceback
from typing import TYPE_CHECKING, Callable, TypeVar

import torch

from solrl_core import events as ev
from solrl_core.errors import SolrlError

if TYPE_CHECKING:
    from solrl_core.config import Config
    from solrl_core.session import Session

T = TypeVar("T")

SETTINGS = {"reward": ("reward", "batch_size"), "update": ("optimizer", "micro_batch"),
            "evaluation": ("sampler", "rollout_batch"), "rollout": ("sampler", "rollout_batch")}
_PRECEDENCE = ("reward", "update", "evaluation", "rollout")  # an inner phase is the one that did not fit

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


def phase_of(exc: BaseException) -> str | None:
    """The phase an out-of-memory error was raised in, from the frames it passed through."""
    seen = set()
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        module, func = frame.f_globals.get("__name__", ""), frame.f_code.co_name
        if module.startswith("solrl_core.rewards"):
            seen.add("reward")
        elif module == "solrl_core.trainer" and func == "update":
            seen.add("update")
        elif module == "solrl_core.evaluation" or (module == "solrl_core.trainer" and func == "_evaluate"):
            seen.add("evaluation")
        elif module == "solrl_core.rollout" and func in ("rollout", "generate"):
            seen.add("rollout")
    return next((p for p in _PRECEDENCE if p in seen), None)


def size(config: "Config", phase: str) -> int:
    section, key = SETTINGS[phase]
    return getattr(getattr(config, section), key)


def with_size(config: "Config", phase: str, value: int) -> "Config":
    section, key = SETTINGS[phase]
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{key: value})})


def retry(session: "Session", bus: ev.EventBus, work: Callable[[], T]) -> T:
    """`work()`, redone from its start with a halved batch after each out-of-memory error.

    The state an attempt may have advanced before failing (reward streaks) is restored, and the
    failed attempt's tensors are released before the next one starts."""
    while True:
        saved = copy.deepcopy((session.health.streaks, session.faults))
        phase = None
        try:
            return work()
        except torch.cuda.OutOfMemoryError as exc:
            phase = phase_of(exc)
            if session.world_size > 1 or phase is None:
                raise
        # here, outside the handler, the exception and the frames holding the attempt's tensors are gone
        session.health.streaks, session.faults = saved
        session.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        back_off(session, bus, phase)


def back_off(session: "Session", bus: ev.EventBus, phase: str) -> None:
    """Halve `phase`'s batch in the live session and in the run's config.toml, or raise DoesNotFit."""
    from solrl_core.rundir import save_run_config

    old = size(session.config, phase)
    if old <= 1:
        raise DoesNotFit(phase)
    new = old // 2
    session.config = with_size(session.config, phase, new)
    if phase == "reward":  # model rewards read their chunk size from their own context
        for reward in session.rewards.rewards.values():
            if hasattr(reward, "batch_size"):
                reward.batch_size = new
    if session.rank == 0:
        save_run_config(session.run_dir, session.config)
    section, key = SETTINGS[phase]
    bus.emit(ev.OutOfMemoryBackoff(iteration=session.iteration + 1, phase=phase, setting=f"{section}.{key}", old=old, new=new))
