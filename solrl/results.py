"""What the Python API returns, as plain fields: a run's evaluation (base against its last evaluation,
per reward and per kind, with paired standard errors), its warnings, and what `evaluate` and
`infer` wrote. Read from the events the run emitted, as the terminal's end summary is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from solrl_core import events as ev
from solrl_core.fault_text import FAULT_EVENTS, fault_message


@dataclass(frozen=True)
class Metric:
    """One score at the base and now: `change` = final - base, `se` its paired standard error (the same
    prompts and seeds scored with both weights; None where none was computed)."""

    base: float
    final: float
    change: float
    se: float | None = None


@dataclass(frozen=True)
class EvalReport:
    """An evaluation against the base. `metrics` by name: 'reward' (the trained reward, weighted sum),
    each trained reward's statistics (e.g. 'tinyworld_geneval.count', 'tinyworld_geneval.strict_accuracy'),
    and each eval reward not trained on (e.g. 'tinyworld_fidelity')."""

    prompts: str
    samples: int  # images per weight set
    weights: str  # the evaluated weights: ema or trained
    iteration: int  # the iteration evaluated (0 for `solrl.evaluate`)
    metrics: dict[str, Metric]
    picture: Path | None = None  # base beside the evaluated weights on a few images (a training run's)


@dataclass(frozen=True)
class RunResult:
    """What a call to `train` leaves: where the run is, how far it got, how it scored, what it warned of."""

    run_dir: Path  # absolute
    iteration: int  # iterations finished, counting those before a resume
    finished: bool  # False when a stop (signal, stop_on_*) ended it before run.iterations
    evaluation: EvalReport | None  # the base against the last evaluation; None when the run evaluated neither
    warnings: list[str]  # every warning the run printed, in order
    events: list[Any] = field(repr=False)


@dataclass(frozen=True)
class EvalResult:
    """What `evaluate` wrote: `out_dir` with samples.jsonl (one row per image) and summary.json;
    `reports`: each tuned weight set against the base (empty for a base model alone)."""

    out_dir: Path
    summary: dict[str, Any]  # summary.json: per weight set, per reward and statistic, mean and change with s.e.
    reports: dict[str, EvalReport]


@dataclass(frozen=True)
class InferResult:
    out_dir: Path
    index: Path  # images.jsonl: weights, prompt, seed and path of every image
    grid: Path | None  # grid.png: one row per (prompt, seed), one column per weight set


def report(base: ev.EvalFinished, last: ev.EvalFinished) -> EvalReport:
    """The change from the base evaluation to `last`, from their events."""
    se = last.delta_se
    metrics = {"reward": Metric(base.mean, last.mean, last.mean - base.mean, se.get("mean"))}
    if len(last.components) > 1:
        metrics.update({k: Metric(base.components[k], v, v - base.components[k]) for k, v in last.components.items()
                        if k in base.components})
    metrics.update({k: Metric(base.extras[k], v, v - base.extras[k], se.get(k)) for k, v in last.extras.items()
                    if k in base.extras})
    metrics.update({k: Metric(v - last.eval_changes[k], v, last.eval_changes[k], last.eval_se.get(k))
                    for k, v in last.eval_rewards.items() if k in last.eval_changes})
    return EvalReport(last.prompts, last.samples, last.weights, last.iteration, metrics,
                      Path(last.picture) if last.picture else None)


def run_report(events: list[Any]) -> EvalReport | None:
    """The run's end summary as an EvalReport: its RunFinished event's base and last evaluations."""
    end = next((e for e in reversed(events) if isinstance(e, ev.RunFinished)), None)
    if end is None or end.base_eval is None or end.last_eval is None:
        return None
    base, last = ev.decode(dict(end.base_eval)), ev.decode(dict(end.last_eval))
    return report(base, last) if isinstance(base, ev.EvalFinished) and isinstance(last, ev.EvalFinished) else None


def summary_reports(summary: dict[str, Any], prompts: str) -> dict[str, EvalReport]:
    """Each tuned weight set of a `solrl eval` summary (evaluation.summary) against its base."""
    base_name = next(iter(summary))
    out = {}
    for weights, entry in list(summary.items())[1:]:
        base = summary[base_name]
        total = entry["rewards"]["total"]
        metrics = {"reward": Metric(base["rewards"]["total"]["mean"], total["mean"], total["delta"], total["delta_se"])}
        if len(entry["rewards"]) > 2:  # several trained rewards: each besides the weighted sum
            metrics.update({k: Metric(base["rewards"][k]["mean"], r["mean"], r["delta"], r["delta_se"])
                            for k, r in entry["rewards"].items() if k != "total"})
        metrics.update({k: Metric(base["extras"][k], v, entry["extras_delta"][k], entry["extras_delta_se"].get(k))
                        for k, v in entry["extras"].items() if k in entry.get("extras_delta", {})})
        metrics.update({k: Metric(base["eval_rewards"][k]["mean"], r["mean"], r["delta"], r["delta_se"])
                        for k, r in entry.get("eval_rewards", {}).items() if "delta" in r})
        out[weights] = EvalReport(prompts, entry["samples"], weights, 0, metrics)
    return out


def warning_text(event: Any) -> str | None:
    """The line a warning event prints as (the terminal's and the TUI's text); None for other events."""
    if isinstance(event, ev.RunWarning):
        return event.message
    return fault_message(event) if isinstance(event, FAULT_EVENTS) else None


Progress = Callable[[str, int, int], None]  # (what, done, total): 'train' iterations, or 'eval base'/'eval ema' images


def progress_listener(progress: Progress) -> Callable[[Any], None]:
    """An event subscriber that tells `progress` each iteration finished and each evaluation's images."""
    def on_event(e: Any) -> None:
        if isinstance(e, ev.IterationFinished):
            progress("train", e.iteration, e.iterations)
        elif isinstance(e, ev.EvalProgress):
            progress(f"eval {e.weights}", e.done, e.total)
    return on_event
