"""The stable metric names solrl sends to experiment trackers, read from typed events (live, or
decoded from events.jsonl by `events.decode`), so the trackers and `solrl compare` name things alike.

Each name is one scalar per step; the step is the iteration the number belongs to (0 is the base
model before the first update). The README lists these names; renaming one breaks users' dashboards.

    time/<phase>                          seconds of the iteration's phase (explore, selection,
                                          regenerate, reward, train, sync, total; calibrate when it ran)
    memory/<phase>                        peak GPU memory in GiB during the phase, when the run measures it
    reward/final/{mean,std,best,worst}    Stage-2 reward over the iteration's trained samples
    reward/final/component/<reward>       Stage-2 mean of one reward component
    reward/draft/...                      the same for the Stage-1 draft rewards (families that select)
    loss/{loss,policy,kl}                 DiffusionNFT loss terms (mean over the iteration)
    loss/nonfinite                        non-finite per-sample losses zeroed in the iteration
    train/grad_norm, train/old_decay      gradient norm before clipping; the old adapter's decay
    eval/mean                             held-out evaluation reward (iteration 0: base weights, then EMA)
    eval/component/<reward>, eval/<extra> per component; reward-defined extras (e.g.
                                          eval/tinyworld_geneval.strict_accuracy)
    eval/seconds                          time the evaluation took
    eval/mean_change_se                   paired standard error of eval/mean's change since the base
    eval_reward/<reward>                  an eval reward's mean (run.eval_rewards: scored, not trained on)
    eval_reward/<reward>/change           its change since the base, and the change's paired
    eval_reward/<reward>/change_se        standard error (absent for the base, or a base kept without it)
    eval_reward/<reward>/floor            minus its hacking floor: a change below it (and 2 s.e.) is flagged
    hacking/<reward>                      1 when an evaluation warned of reward hacking on this eval
                                          reward (its change in standard errors, when not 0: hacking/<reward>/z)
    rank_check/{rho,tau}                  in-run Stage-1 ranking check (absent when a side was constant)
    rank_check/{draft_mean,full_mean,seconds}
    calibration/{steps,min_recall,seconds}  Stage 1's calibrated preview steps, the recall floor, its seconds
    calibration/recall/<precision@steps>  each candidate's recall of the full-precision selection (and
    calibration/candidate_seconds/...)    its measured seconds)
    calibration/chosen_precision/<p>      with steps+precision: 1 for the chosen precision, 0 for the others weighed

A field later added to the iteration event is sent too: a number as `iteration/<field>`, a dict of
numbers as `<name>/<key>` (per-phase dicts keep their keys).
"""

from __future__ import annotations

from typing import Any

from solrl_core import events as ev

# iteration-event field -> metric name (prefix, for dicts)
ITERATION_NAMES = {"seconds": "time", "peak_memory": "memory", "loss": "loss", "nonfinite_losses": "loss/nonfinite",
                   "grad_norm": "train/grad_norm", "old_decay": "train/old_decay"}
_NOT_METRICS = {"event", "time", "iteration", "iterations"}


def scalars(event: ev.Event) -> tuple[int, dict[str, float]] | None:
    """(step, {name: value}) for an event that carries metrics, else None."""
    out: dict[str, float] = {}
    if isinstance(event, ev.IterationFinished):
        for key, value in event.to_dict().items():
            if key in _NOT_METRICS:
                continue
            if key in ("final", "draft"):
                if value:
                    _reward_stats(f"reward/{key}", value, out)
                continue
            _flatten(ITERATION_NAMES.get(key, f"iteration/{key}"), value, out)
        return event.iteration, out
    if isinstance(event, ev.EvalFinished):
        out["eval/mean"] = float(event.mean)
        _flatten("eval/component", event.components, out)
        _flatten("eval", event.extras, out)
        out["eval/seconds"] = float(event.seconds)
        if "mean" in event.delta_se:
            out["eval/mean_change_se"] = float(event.delta_se["mean"])
        for name, value in event.eval_rewards.items():
            out[f"eval_reward/{name}"] = float(value)
            if name in event.eval_changes:
                out[f"eval_reward/{name}/change"] = float(event.eval_changes[name])
            if name in event.eval_se:
                out[f"eval_reward/{name}/change_se"] = float(event.eval_se[name])
            if name in event.eval_floors:  # plotted as -floor beside the change: a change below it is a hacking fall
                out[f"eval_reward/{name}/floor"] = -float(event.eval_floors[name])
            if name in event.trade:  # the gain bought per unit of it lost since the last evaluation (loop/frontier.py)
                out[f"eval_reward/{name}/trade"] = float(event.trade[name])
        return event.iteration, out
    if isinstance(event, ev.RewardHacking):
        out[f"hacking/{event.reward}"] = 1.0
        if event.se > 0:
            out[f"hacking/{event.reward}/z"] = event.change / event.se
        return event.iteration, out
    if isinstance(event, ev.CalibrationDone):
        _flatten("calibration", {"steps": event.steps, "min_recall": event.min_recall, "seconds": event.seconds,
                                 "recall": {c["name"]: c["recall"] for c in event.candidates},
                                 "candidate_seconds": {c["name"]: c["seconds"] for c in event.candidates}}, out)
        if event.precisions:  # a scalar per precision weighed: 1 for the chosen one
            _flatten("calibration", {"chosen_precision": {p: float(p == event.precision) for p in event.precisions}},
                     out)
        return event.iteration, out
    if isinstance(event, ev.RankCheckResult):
        _flatten("rank_check", {k: getattr(event, k) for k in ("rho", "tau", "draft_mean", "full_mean", "seconds")},
                 out)
        return event.iteration, out
    return None


def _reward_stats(prefix: str, stats: dict[str, Any], out: dict[str, float]) -> None:
    for key, value in stats.items():
        _flatten(f"{prefix}/component" if key == "components" else f"{prefix}/{key}", value, out)


def _flatten(name: str, value: Any, out: dict[str, float]) -> None:
    """Numbers under `name`, dicts of numbers under `name/key`; None, text and flags are not metrics."""
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{name}/{key}", inner, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[name] = float(value)
