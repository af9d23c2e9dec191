"""`solrl compare`: several runs side by side from their events.jsonl alone (no tracker needed).

One PNG: Stage-2 reward and held-out evaluation against iteration and against training seconds,
and the mean time per phase; and the same numbers as table rows. Training seconds are the sum of
what the run measured (iterations, evaluations, checkpoints, rank checks), so the time between a
stop and its resume does not count.
"""

from __future__ import annotations

import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.event_bus import TooDeep, parse_line
from solrl_core.events import PHASES
from solrl_core.faults.links import check_path
from solrl_core.io.rundir import EVENTS_FILE, check_run_folder
from solrl_core.text import printable

# events outside an iteration whose seconds count as training time
_TIMED = (ev.EvalFinished, ev.CheckpointSaved, ev.RankCheckResult)


@dataclass(frozen=True)
class Timed:
    """An event and the training seconds of its run when it was written."""

    event: Any
    elapsed: float


@dataclass
class RunRecord:
    """What one run's events say, in iteration order (a resume replaces what followed its checkpoint)."""

    name: str
    family: str = "?"
    device: str = "?"
    total: int = 0
    iterations: list[Timed] = field(default_factory=list)  # IterationFinished events
    evals: list[Timed] = field(default_factory=list)  # EvalFinished events
    skipped: dict[str, int] = field(default_factory=dict)  # events of kinds this version does not know, by kind
    # lines torn by a kill mid-write (or damaged, skip_damaged), skipped
    warnings: list[str] = field(default_factory=list)
    eval_every: int = 0  # run.eval_every as the run's last run_started says (0: not said)
    # the iteration counts the run's sessions planned (each evaluates there)
    ends: set[int] = field(default_factory=set)

    def series(self, key: str) -> tuple[list[int], list[float], list[float]]:
        """(iterations, training seconds, Stage-2 `key`) of every iteration."""
        its = self.iterations
        return [t.event.iteration for t in its], [t.elapsed for t in its], [getattr(t.event.final, key) for t in its]

    def phase_means(self) -> dict[str, float]:
        out = {}
        for phase in PHASES:
            values = [t.event.seconds[phase] for t in self.iterations if phase in t.event.seconds]
            if values:
                out[phase] = statistics.fmean(values)
        return out


def load_run(run_dir: str | Path, skip_damaged: bool = False) -> RunRecord:
    """One run's events.jsonl, decoded by `events.decode`. A kind this version does not know is
    skipped and counted in `skipped`. A line torn by a kill mid-write (not JSON, and either the last
    line with no newline after it, or the line just before a resumed run's run_started) is skipped
    with a warning in `warnings`; any other line that is not JSON, or whose fields do not fit its
    kind, raises SolrlError naming the line, or with `skip_damaged` (`solrl compare`) is skipped with a
    warning naming it and how to drop it."""
    path = check_path(check_run_folder(run_dir), EVENTS_FILE)  # a link or fifo there is refused, not read
    if not path.is_file():
        raise SolrlError(f"{run_dir} has no {EVENTS_FILE}", "pass run folders written by `solrl train`")
    record = RunRecord(name=Path(run_dir).name)
    elapsed = 0.0
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if _torn(line, lines[number:], last=number == len(lines) and not text.endswith("\n")):
            record.warnings.append(f"{path} line {number} skipped: torn by a kill mid-write (not JSON)")
            continue
        try:
            e = ev.decode(parse_line(line))
        except ev.UnknownEventKind as exc:  # written by a newer solrl: skipped, counted in `skipped`
            record.skipped[str(exc.kind)] = record.skipped.get(str(exc.kind), 0) + 1
            continue
        except (ev.EventDecodeError, TooDeep, ValueError) as exc:
            what = str(exc) if isinstance(exc, (ev.EventDecodeError,
                                                TooDeep)) else f"not JSON ({printable(line[:40])!r})"
            if not skip_damaged:
                raise SolrlError(f"{path} line {number} is damaged: {what}", _drop_line(path, number, run_dir)) from exc
            record.warnings.append(f"{path} line {number} skipped: damaged ({what}); "
                                   f"{_drop_line(path, number, run_dir)}")
            continue
        if isinstance(e, ev.RunStarted):
            record.family = e.config.get("algorithm", {}).get("family", "?")
            record.device, record.total = e.device, e.iterations
            record.ends.add(e.iterations)
            settings = e.config.get("run")
            every = settings.get("eval_every", 0) if isinstance(settings, dict) else 0
            record.eval_every = every if isinstance(every, int) and not isinstance(every,
                                                                                   bool) and 0 < every <= 10**9 else 0
            record.iterations = [it for it in record.iterations if it.event.iteration <= e.start_iteration]
            record.evals = [x for x in record.evals if x.event.iteration <= e.start_iteration]
            elapsed = max([it.elapsed for it in record.iterations] + [x.elapsed for x in record.evals] + [0.0])
        elif isinstance(e, ev.IterationFinished):
            elapsed += e.seconds["total"]
            record.iterations.append(Timed(e, elapsed))
        elif isinstance(e, _TIMED):
            elapsed += e.seconds
            if isinstance(e, ev.EvalFinished):
                record.evals.append(Timed(e, elapsed))
    return record


def _drop_line(path: Path, number: int, run_dir: str | Path) -> str:
    """The fix for a damaged line: it is one event, and the run's checkpoints and --resume never read the log."""
    return (f"delete that line (one event; the run's checkpoints and --resume do not read this log), e.g. "
            f"sed -i '{number}d' {shlex.quote(str(path))}, then compare again; or leave {run_dir} out")


def _torn(line: str, after: list[str], last: bool) -> bool:
    """Whether `line` is one a kill cut short: not JSON, and the file's unfinished last line, or
    followed by the run_started record of the run that resumed after the kill."""
    try:
        parse_line(line)
        return False
    except TooDeep:  # complete, not cut short: damage the caller names
        return False
    except ValueError:
        pass
    if last:
        return True
    following = next((x for x in after if x.strip()), "")
    try:
        return parse_line(following).get("event") == ev.RunStarted.kind
    except (ValueError, AttributeError):
        return False


def table(runs: list[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """Header and one row per run: progress, Stage-2 reward first and last-3, evaluation first and
    last, measured seconds (iterations, evaluations, checkpoints), and mean seconds per phase."""
    header = ["run", "family", "device", "iterations", "reward first", "reward last 3", "eval first", "eval last",
              "measured s", "eval rewards: base -> last (change +- s.e.)", *[f"{p} s/it" for p in PHASES]]
    rows = []
    for run in runs:
        _, secs, rewards = run.series("mean")
        means = run.phase_means()
        measured = max(secs[-1:] + [t.elapsed for t in run.evals[-1:]], default=None)
        rows.append([run.name, run.family, run.device, f"{len(run.iterations)}/{run.total}",
                     _num(rewards[0] if rewards else None), _num(statistics.fmean(rewards[-3:]) if rewards else None),
                     _num(run.evals[0].event.mean if run.evals else None),
                     _num(run.evals[-1].event.mean if run.evals else None),
                     f"{measured:.1f}" if measured is not None else "-",
                     _eval_rewards(run.evals[-1].event) if run.evals else "-",
                     *[f"{means[p]:.3f}" if p in means else "-" for p in PHASES]])
    return header, rows


def _eval_rewards(e: ev.Event) -> str:
    """'NAME 0.901 -> 0.896 (-0.0054 +- 0.0013); ...': each eval reward of a run's last evaluation since its
    base (run.eval_rewards); the mean alone without a base; '-' for none."""
    if not isinstance(e, ev.EvalFinished) or not e.eval_rewards:
        return "-"
    parts = []
    for name, now in e.eval_rewards.items():
        change, se = e.eval_changes.get(name), e.eval_se.get(name)
        parts.append(f"{name} {now:.4g}" if change is None else
                     f"{name} {now - change:.4g} -> {now:.4g} ({change:+.4f}"
                     + (f" +- {se:.4f})" if se is not None else ")"))
    return "; ".join(parts)


def figure(runs: list[RunRecord], path: Path) -> Path:
    """The PNG: rewards and evaluations against iteration and training seconds; phase times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig = plt.figure(figsize=(15, 8.5))
    grid = fig.add_gridspec(2, 3)
    axes = {(r, c): fig.add_subplot(grid[r, c]) for r in range(2) for c in range(2)}
    bars = fig.add_subplot(grid[:, 2])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color, label = colors[i % len(colors)], run.name if run.name == run.family else f"{run.name} ({run.family})"
        its, secs, mean = run.series("mean")
        _, _, best = run.series("best")
        _, _, worst = run.series("worst")
        for c, x in enumerate((its, secs)):
            ax = axes[0, c]
            ax.plot(x, mean, color=color, marker="o" if len(x) < 30 else None, markersize=3, label=label)
            ax.fill_between(x, worst, best, color=color, alpha=0.12, linewidth=0)
            ev_x = [t.event.iteration if c == 0 else t.elapsed for t in run.evals]
            axes[1, c].plot(ev_x, [t.event.mean for t in run.evals], color=color, marker="o", markersize=4, label=label)
    for r in range(2):
        axes[r, 0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for c, xlabel in enumerate(("iteration", "training seconds (measured, summed)")):
        axes[0, c].set(xlabel=xlabel, ylabel="Stage-2 reward (mean; band: worst..best)")
        axes[1, c].set(xlabel=xlabel, ylabel="held-out evaluation reward")
        for r in range(2):
            axes[r, c].grid(alpha=0.3)
    axes[0, 0].set_title("Stage-2 reward per iteration")
    axes[0, 1].set_title("Stage-2 reward against time")
    axes[1, 0].set_title("evaluation (iteration 0: base weights, then EMA)")
    axes[1, 1].set_title("evaluation against time")
    axes[0, 0].legend(fontsize=8)
    if not any(run.evals for run in runs):
        for c in range(2):
            axes[1, c].text(0.5, 0.5, "no evaluations in these runs\n(run.eval_prompts)", ha="center", va="center",
                            transform=axes[1, c].transAxes)
    phases = [p for p in PHASES if p != "total"]
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        means = run.phase_means()
        bars.barh(np.arange(len(phases)) + i * width, [means.get(p, 0.0) for p in phases], height=width,
                  color=colors[i % len(colors)], label=f"{run.name}: {means.get('total', 0.0):.2f} s/iteration")
    bars.set_yticks(np.arange(len(phases)) + width * (len(runs) - 1) / 2, phases)
    bars.invert_yaxis()
    bars.set(xlabel="mean seconds per iteration", title="time per phase")
    bars.legend(fontsize=8, loc="lower right")
    bars.grid(axis="x", alpha=0.3)
    devices = ", ".join(sorted({run.device for run in runs}))
    fig.suptitle(f"solrl compare: {len(runs)} runs, measured on {devices}", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
