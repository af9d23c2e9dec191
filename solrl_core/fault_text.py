"""One line for each fault a run survived (solrl_core/faults), each reward-hacking alarm and each
rollback: the text every view shows as a warning (the terminal, the TUI, the monitor's snapshot)
and the Python API returns in a run's `warnings` (solrl/results.py). Plain text from events only."""

from __future__ import annotations

from solrl_core import events as ev

# the events each view shows as warnings
FAULT_EVENTS = (ev.OutOfMemoryBackoff, ev.SamplesDropped, ev.StepSkipped, ev.RewardHacking, ev.RolledBack)


HACKING_THEN = {"warn": "images may be degrading; --set run.on_hacking=stop (or rollback) acts on it",
                "stop": "the run stops here with a checkpoint (run.on_hacking=stop)",
                "rollback": "the run rolls back to its last good checkpoint (run.on_hacking=rollback)"}


def fault_message(e: ev.OutOfMemoryBackoff | ev.SamplesDropped | ev.StepSkipped | ev.RewardHacking
                  | ev.RolledBack) -> str:
    """One line for a fault the run survived (solrl_core/faults), a reward-hacking alarm or a rollback,
    shown as a warning by every view."""
    if isinstance(e, ev.RewardHacking):
        then = HACKING_THEN[e.action or ("stop" if e.stopping else "warn")]  # no action: an older log
        floor = f" and its floor {e.floor:.4g}" if e.floor else ""
        return (f"reward hacking? iteration {e.iteration}: the trained reward {e.trained} rose {e.trained_change:+.4f} "
                f"(+- {e.trained_se:.4f} s.e.) since the base while eval reward {e.reward} fell {e.change:+.4f} "
                f"(+- {e.se:.4f} s.e., more than {e.threshold:g} s.e.{floor}): {then}")
    if isinstance(e, ev.RolledBack):
        aside = f"; set aside: {', '.join(e.set_aside)}" if e.set_aside else ""
        then = (f"training goes on from there at lr {e.lr:g} (run.rollback_then=lower_lr)" if e.then == "lower_lr" else
                "the run stops there (run.rollback_then=stop): resume it with a change (a lower optimizer.lr), "
                "or the same fall follows")
        return (f"rolled back after iteration {e.iteration} to iteration {e.to} ({e.checkpoint}), "
                f"the newest checkpoint evaluated clean (rollback {e.rollbacks}){aside}: {then}")
    if isinstance(e, ev.OutOfMemoryBackoff):
        return (f"out of GPU memory in the {e.phase} (iteration {e.iteration}): {e.setting} {e.old} -> {e.new}, "
                "iteration redone")
    if isinstance(e, ev.SamplesDropped):
        named = ", ".join(f"'{name}' {count}" for name, count in e.rewards.items())
        explore = e.stage == "explore"
        where = "not selected" if explore else "left out of the update"
        lost = "had no finite draft" if explore else "skipped"
        groups = f"; {e.groups_skipped} of {e.groups} prompt groups {lost}" if e.groups_skipped else ""
        return (f"non-finite rewards in iteration {e.iteration} ({e.stage}): {named}; "
                f"{e.dropped} of {e.samples} samples {where}{groups}")
    limit = f" (the run stops at {e.limit})" if e.limit else ""
    return f"optimizer step of iteration {e.iteration} skipped: {e.reason}, {e.in_a_row} in a row{limit}"
