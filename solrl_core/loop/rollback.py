"""run.on_hacking = rollback: back to the last good checkpoint, then what run.rollback_then says.

When an evaluation flags reward hacking (hacking.py), the run loads the newest checkpoint saved at an
evaluation that no rule flagged (every evaluation saves one; with rollback the base evaluation's
iteration 0 too), sets the later checkpoints aside (checkpoints/superseded-*, kept, never resumed
or pruned) and then:

  stop      ends the run there: its newest checkpoint is the last good one, which `solrl export`,
            `infer` and `--resume` read; resume with something changed, or the same fall follows.
  lower_lr  trains on from it at half the learning rate (optimizer.lr x 0.5^rollbacks); after
            MAX_ROLLBACKS rollbacks the next one stops instead.

Going on unchanged is not offered: every draw derives from (seed, iteration), so the same iterations
would be trained again and fall again. A smaller step is the one change that keeps the run's recipe
(the reward, the KL weight, the prompts) as the user set it; the learning rate lives in the
optimizer's state, so the checkpoints after a rollback hold it and a resume continues exactly, and
the rollback count is in the loop state.
"""

from __future__ import annotations

from pathlib import Path

from solrl_core import events as ev
from solrl_core.engine.checkpoint import load_checkpoint, set_aside_newer
from solrl_core.loop.evaluation import RunEvals
from solrl_core.loop.hacking import rollback_target
from solrl_core.loop.loop_state import LoopState
from solrl_core.loop.session import Run
from solrl_core.loop.stage1 import hold_calibration
from solrl_core.runtime import distributed

MAX_ROLLBACKS = 3  # rollbacks that train on (rollback_then=lower_lr); the next one stops
LR_FACTOR = 0.5


def roll_back(run: Run, state: LoopState, bus: ev.EventBus, evals: RunEvals) -> bool | None:
    """After the evaluation of `state.iteration` was flagged: restore the newest checkpoint evaluated
    clean before it, on every rank. Returns whether the run stops there; None when there is no such
    checkpoint (the caller stops as on_hacking=stop would, with a checkpoint of this iteration)."""
    flagged = state.iteration
    target = rollback_target(run.run_dir, state.evaluations, flagged) if run.rank == 0 else None
    target = distributed.broadcast_object(str(target) if target is not None else None)
    if target is None:
        bus.emit(ev.RunWarning(message=f"no checkpoint evaluated clean before iteration {flagged} is left to roll back "
                                       f"to: the run stops here instead, with a checkpoint of iteration {flagged}"))
        return None
    count = state.rollbacks + 1
    then = run.config.run.rollback_then if count <= MAX_ROLLBACKS else "stop"
    clock, resumed = state.earlier_seconds, state.resumed
    # every rank reads it, as a resume does
    state.restore(load_checkpoint(Path(target), run.engine.policy, run.optimizer))
    state.earlier_seconds, state.resumed, state.rollbacks = clock, resumed, count
    lr = run.optimizer.param_groups[0]["lr"]
    if then == "lower_lr":
        lr = run.config.optimizer.lr * LR_FACTOR ** count
        for group in run.optimizer.param_groups:
            group["lr"] = lr
    hold_calibration(run, state)  # Stage 1 at the checkpoint's calibration's choice, as a resume would
    run.engine.refresh_copies()
    moved = set_aside_newer(run.run_dir, Path(target)) if run.rank == 0 else []
    distributed.barrier()
    # the end shows the restored one
    evals.last_event = evals.events.get(state.iteration) if state.iteration > 0 else None
    bus.emit(ev.RolledBack(iteration=flagged, to=state.iteration, checkpoint=target, then=then, lr=lr, rollbacks=count,
                           set_aside=[p.name for p in moved]))
    return then == "stop"
