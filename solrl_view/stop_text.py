"""What every view says when a run is asked to stop and when it ends: the real run folder, what the
run is waiting for, and whether a checkpoint exists to continue from."""

from __future__ import annotations

from pathlib import Path

from solrl_core import events as ev

LAUNCHER_SOURCE = "the launcher died"  # solrl_core.runtime.stopping's, which imports torch: the views must not


def _again(source: str) -> str:
    if source in ("Ctrl-C", "q"):
        return "Ctrl-C again"
    return "Ctrl-C or SIGTERM" if source == LAUNCHER_SOURCE else f"a second {source} (or Ctrl-C)"


def _kept(checkpoint: str | None) -> str:
    return (f"the last checkpoint, {Path(checkpoint).name}, stays intact" if checkpoint
            else "no checkpoint has been saved yet")


def stop_message(e: ev.StopRequested) -> str:
    """The acknowledgement of a stop request, printed the moment it arrives."""
    ckpts = f"{e.run_dir}/checkpoints" if e.run_dir else "the run folder"
    if e.phase == "evaluation":  # not an iteration: dropped between two of its batches
        waits = (f"dropping the evaluation in progress (a resume does it first), then stopping with iteration "
                 f"{e.iteration} saved to {ckpts}" if e.iteration
                 else "dropping the base evaluation (a resume does it first): nothing to save yet")
    elif e.mode == "phase" and e.phase:
        waits = (f"stopping at the next phase boundary (now in {e.phase} of iteration {e.iteration}): an iteration "
                 f"whose update has not begun is abandoned and redone on resume; the last finished one is saved to "
                 f"{ckpts}")
    elif e.phase:
        waits = f"finishing iteration {e.iteration} (now in {e.phase}), then saving a checkpoint to {ckpts}"
    elif e.iteration:
        waits = f"saving iteration {e.iteration} to {ckpts} once the step in progress ends, then stopping"
    else:
        waits = "stopping before the first iteration: nothing to save yet"
    return f"stop requested ({e.source}): {waits}; {_again(e.source)} stops at once ({_kept(e.checkpoint)})"


def finished_message(e: ev.RunFinished, total: int | None = None) -> str:
    """The line a run ends with. `total`: the run's configured iterations, where known."""
    where = e.run_dir or "<run folder>"
    if e.reason == "failed" and not e.resumable:  # the error's own fix is the next step: no resume beside it
        kept = f"its newest checkpoint is {Path(e.checkpoint).name}" if e.checkpoint else "no checkpoint was saved"
        return (f"failed with {e.iteration} iteration{'' if e.iteration == 1 else 's'} finished; {kept}; the error's "
                f"fix says what to do next")
    if e.checkpoint:
        resume = f"`solrl train --resume {where}` continues from {Path(e.checkpoint).name}"
    else:
        resume = f"no checkpoint was saved: `solrl train --resume {where}` starts it again from iteration 0"
    if e.reason == "failed":
        return f"failed with {e.iteration} iteration{'' if e.iteration == 1 else 's'} finished; {resume}"
    if e.reason == "interrupted" or (total is not None and e.iteration < total):
        return f"stopped after iteration {e.iteration}; {resume}"
    took = f"{e.seconds:.1f}s"
    if e.total_seconds is not None and e.total_seconds > e.seconds:  # resumed: the sessions before count too
        took = f"{e.total_seconds:.1f}s in all ({e.seconds:.1f}s this session)"
    return f"done: {e.iteration} iteration{'' if e.iteration == 1 else 's'} in {took}"
