"""The panels of the TUI: charts, the tables of numbers under them, the log and the environment.

Charts are textual-plotext's `PlotextPlot` (Textualize's Textual wrapper of plotext): axes, ticks
labelled in iterations, a legend, resized with the terminal. Each series is thinned to about two
points per column before it is drawn (`tui_state.thin`), so a run of thousands of iterations draws
as fast as a short one.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static
from textual_plotext import PlotextPlot

from solrl_view.run_summary import fmt
from solrl_cli.tui.state import PHASES, ROLLING, RunState, _clock, thin
from solrl_core.telemetry.mfu import describe, percent

Lines = dict[str, tuple[list[float], list[float]]]  # legend label -> (iterations, values)


class ChartSpec(NamedTuple):
    title: str
    ylabel: str
    lines: Lines
    errors: dict[str, list[float]] = {}  # legend label -> +- error of each point (drawn as bars, unthinned)
    ylim: tuple[float, float] | None = None  # None: plotext's own range


class Chart(PlotextPlot):
    DEFAULT_CSS = "Chart { height: 1fr; min-height: 12; }"

    def show(self, spec: ChartSpec) -> None:
        plt = self.plt
        plt.clear_data()
        plt.xlim(None, None)  # plotext keeps limits across draws: each draw sets its own
        plt.ylim(None, None)
        room = 2 * max(self.size.width, 80)  # braille: two points per column
        seen: list[float] = []
        for label, (xs, ys) in spec.lines.items():
            if xs:
                seen += [xs[0], xs[-1]]
                bars = spec.errors.get(label)
                plt.plot(*thin(xs, ys, room), label=label, marker="braille")
                if bars is not None and len(bars) <= MAX_BARS:  # drawn over the line, capped, so it cannot hide them
                    for x, y, e in zip(xs, ys, bars):
                        if e > 0:
                            plt.plot([x, x], [y - e, y + e], marker="│", color="gray")
                            plt.scatter([x, x], [y - e, y + e], marker="─", color="gray")
                    margin = max(0.5, 0.02 * (xs[-1] - xs[0]))  # a bar at either end stays inside the frame
                    plt.xlim(xs[0] - margin, xs[-1] + margin)
        if seen:
            ticks = iteration_ticks(min(seen), max(seen))
            plt.xticks(ticks, [str(t) for t in ticks])
        if spec.ylim:
            plt.ylim(*spec.ylim)
        plt.title(spec.title)
        plt.xlabel("iteration")
        plt.ylabel(spec.ylabel)
        self.refresh()


def iteration_ticks(lo: float, hi: float, count: int = 8) -> list[int]:
    """Whole iterations at a round spacing (1, 2 or 5 x 10^k) spanning lo..hi, at most about `count`."""
    span = max(hi - lo, 1.0)
    step = next(s for s in (m * 10**k for k in range(12) for m in (1, 2, 5)) if span / s <= count)
    first = int(math.ceil(lo / step) * step)
    return list(range(first, int(hi) + 1, step)) or [int(lo)]


class ChartPanel(VerticalScroll):
    """A note, charts that appear as their series do, and an optional table of the numbers below; on a
    small screen the charts keep a readable height and the panel scrolls (up/down, pgup/pgdn)."""

    DEFAULT_CSS = """
    ChartPanel > .note { height: auto; }
    ChartPanel > .numbers { height: auto; }
    """

    def __init__(self, charts: Callable[[RunState], list[ChartSpec]], note: Callable[[RunState], Any], id: str,
                 table: Callable[[RunState], Any] | None = None) -> None:
        super().__init__(id=id)
        self._charts, self._note, self._table = charts, note, table
        self.note = Static(classes="note")
        self.numbers = Static(classes="numbers") if table is not None else None
        self.charts: dict[str, Chart] = {}

    def compose(self) -> ComposeResult:
        yield self.note
        if self.numbers is not None:
            yield self.numbers

    def draw(self, state: RunState) -> None:
        self.note.update(self._note(state))
        for spec in self._charts(state):
            chart = self.charts.get(spec.title)
            if chart is None:
                chart = self.charts[spec.title] = Chart()
                self.mount(chart, before=self.numbers) if self.numbers is not None else self.mount(chart)
            chart.show(spec)
        if self.numbers is not None and self._table is not None:
            self.numbers.update(self._table(state))


# ---------------------------------------------------------------- what the chart panels show


def reward_charts(s: RunState) -> list[ChartSpec]:
    charts: list[ChartSpec] = [ChartSpec("reward per iteration", "reward", {
        "Stage-2 mean": s.points("final", "mean"), "Stage-2 best": s.points("final", "best"),
        "Stage-2 worst": s.points("final", "worst"), "Stage-1 draft mean": s.points("draft", "mean")})]
    components = s.components("final")
    if len(components) > 1:
        charts.append(ChartSpec("Stage-2 mean per reward component", "reward",
                       {c: s.points("final", "components", c) for c in components}))
    return charts


def time_charts(s: RunState) -> list[ChartSpec]:
    phases = ("total", "explore", "regenerate", "reward", "train")
    return [ChartSpec("seconds per phase", "seconds",
                      {p: s.points("seconds", p) for p in phases if any(s.points("seconds", p)[1])})]


def eval_charts(s: RunState) -> list[ChartSpec]:
    """The evaluation means, each later one with a bar of +- the paired standard error of its change
    since the base; the y range holds every bar and spans at least MIN_SPAN of the values' size, so
    a change within its error does not look like a climb."""
    if not s.evals:
        return []
    xs, ys = [float(e.iteration) for e in s.evals], [e.mean for e in s.evals]
    errors = [e.delta_se.get("mean", 0.0) for e in s.evals]
    label = "evaluation mean" + (" +- s.e. of the change" if any(errors) else "")
    return [ChartSpec("held-out evaluation (iteration 0: base weights, then EMA)", "reward", {label: (xs, ys)},
                      errors={label: errors} if any(errors) else {}, ylim=y_range(ys, errors))]


MAX_BARS = 80  # error bars drawn at most; more evaluations than that draw the line alone
MIN_SPAN = 0.1  # of the largest |value|: the smallest y range an evaluation chart draws


def y_range(ys: list[float], errors: list[float]) -> tuple[float, float]:
    """lo..hi holding every value +- its error, widened about its middle to at least MIN_SPAN x max|value|."""
    lo, hi = min(y - e for y, e in zip(ys, errors)), max(y + e for y, e in zip(ys, errors))
    span = max(hi - lo, MIN_SPAN * max(abs(y) for y in ys), 1e-6)
    middle = (lo + hi) / 2
    return middle - span / 2 - 0.05 * span, middle + span / 2 + 0.05 * span


def latest_table(rows: Callable[[RunState], list[tuple[str, list[float]]]]) -> Callable[[RunState], Table]:
    def view(s: RunState) -> Table:
        table = Table(box=None, padding=(0, 2))
        for col in ("series", "latest", "min", "max"):
            table.add_column(col, justify="left" if col == "series" else "right")
        for title, values in rows(s):
            table.add_row(title, fmt(values[-1]), fmt(min(values)), fmt(max(values)))
        return table
    return view


# ---------------------------------------------------------------- what the table panels show


def time_view(s: RunState) -> Group:
    """The seconds per phase, then what the MFU column divides by (below: the chart comes first on a small screen)."""
    flops = [] if s.flops is None else [*describe(s.flops), "MFU: model FLOPs / seconds / the dense peak at the "
                                        "phase's precision (as solrl bench); total: the work's time at peak over the "
                                        "iteration's"]
    return Group(_phase_table(s), *(Text(line) for line in flops))


def _phase_table(s: RunState) -> Table:
    latest = s.iterations[-1] if s.iterations else None
    peaks, source = (latest.peak_memory or {}, latest.memory_source) if latest else ({}, "")
    title = f"seconds per phase, iterations seen: {s.count}" + (f"; peak GiB of the last iteration: {source}" if peaks
                                                                else "")
    table = Table(title=title, title_justify="left", box=None, padding=(0, 1))  # whole at 80 columns, MFU column too
    mfu = s.mfu()
    for col in ("phase", "last", f"mean last {ROLLING}", "mean all", "share", "peak GiB",
                *(("MFU last",) if mfu else ())):
        table.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    last = latest.seconds if latest else {}
    total = s.rolling("total")
    for phase in PHASES:
        mean = s.rolling(phase)
        share = f"{100 * mean / total:.0f}%" if mean is not None and total and phase != "total" else ""
        table.add_row(phase, _num(last.get(phase)), _num(mean),
                      _num(s.phase_sums[phase] / s.count if s.count else None), share,
                      _num(peaks.get(phase)), *((_mfu(s, mfu, phase),) if mfu else ()))
    return table


def time_note(s: RunState) -> str:
    return "\n".join(s.explore_speed() or [s.explore_speed_note()])


def _mfu(s: RunState, mfu: dict[str, float | None], phase: str) -> str:
    if phase not in mfu:
        return ""
    precision = s.flops.precisions.get(phase, "") if s.flops and phase != "total" else ""
    return f"{percent(mfu[phase])} {precision}".strip()


def reward_rows(s: RunState) -> list[tuple[str, list[float]]]:
    rows = []
    for stage, name in (("final", "Stage-2 final"), ("draft", "Stage-1 draft")):
        rows += [(f"{name} {stat}", s.series(stage, stat)) for stat in ("mean", "best", "worst")]
        rows += [(f"{name[:7]} {comp}", s.series(stage, "components", comp)) for comp in s.components(stage)]
    return [r for r in rows if r[1]]


def reward_note(s: RunState) -> str:
    weights = s.config.reward.weights if s.config else {}
    spec = ", ".join(f"{k}={v:g}" for k, v in weights.items()) or "?"
    return f"rewards {spec}"


def loss_rows(s: RunState) -> list[tuple[str, list[float]]]:
    return [(f"loss {k}" if k != "loss" else "loss", s.series("loss", k)) for k in ("loss", "policy", "kl")] + [
        ("grad norm", s.series("grad_norm")), ("old-policy decay", s.series("old_decay"))]


def loss_note(s: RunState) -> str:
    return f"non-finite losses zeroed: {s.nonfinite} in total"


def eval_note(s: RunState) -> Text:
    """Above the chart: the evaluation running now and how far it is (EvalProgress events), else nothing."""
    return Text(s.evaluation_text(), style="bold")


def eval_view(s: RunState) -> Group | str:
    """Two narrow tables (they fit 80 columns): each evaluation's mean and change since the base, then
    each kind of prompt (and reward component) at the base and at the latest evaluation."""
    if not s.evals:  # the first one may be running: the note above says how far it is
        return "" if s.evaluating else "no evaluation yet (run.eval_prompts sets the prompts, run.eval_every how often)"
    base, last = s.evals[0], s.evals[-1]
    sets = ", ".join(dict.fromkeys(f"{e.prompts} ({e.samples} images)" for e in s.evals))
    traded = sorted({k for e in s.evals for k in e.eval_rewards}) if any(e.trade_since >= 0 for e in s.evals) else []
    head = Text(f"evaluations on {sets}, fixed prompts and seeds; change: since the base, +- its paired s.e."
                + (f"; trade: gain per unit of {', '.join(traded)} lost since the last ('-': none lost beyond noise)"
                   if traded else ""))
    runs = Table(box=None, padding=(0, 1))
    for col in ("iter", "weights", "reward", "change", "s.e.", *(("trade",) if traded else ()), "seconds"):
        runs.add_column(col, justify="left" if col == "weights" else "right", no_wrap=True)
    for e in s.evals:
        first = e is base
        trade = [", ".join(f"{e.trade[k]:.3g}" if k in e.trade else "-" for k in traded)
                 if e.trade_since >= 0 else ""] if traded else []
        runs.add_row(str(e.iteration), e.weights, fmt(e.mean), "" if first else f"{e.mean - base.mean:+.4f}",
                     f"{e.delta_se['mean']:.4f}" if "mean" in e.delta_se else "", *trade, f"{e.seconds:.1f}")
    if last is base:
        return Group(head, runs)
    kinds = Table(title=f"per kind: base against iteration {last.iteration} ({last.weights})", title_justify="left",
                  box=None,
                  padding=(0, 1))
    floors = {f"eval.{k}": v for k, v in last.eval_floors.items()}  # each eval reward against its hacking floor
    for col in ("kind", "base", "latest", "change", "s.e.", *(("floor",) if floors else ())):
        kinds.add_column(col, justify="left" if col == "kind" else "right", no_wrap=col != "kind", overflow="fold")
    named = {**(last.components if len(last.components) > 1 else {}), **last.extras,
             **{f"eval.{k}": v for k, v in last.eval_rewards.items()}}  # eval rewards: scored, not trained on
    before = {**base.components, **base.extras,
              **{f"eval.{k}": last.eval_rewards[k] - c for k, c in last.eval_changes.items()}}
    se = {**last.delta_se, **{f"eval.{k}": v for k, v in last.eval_se.items()}}
    for key, value in named.items():
        was = before.get(key)
        label = f"{key[5:]} (eval)" if key.startswith("eval.") else key.split(".")[-1]
        kinds.add_row(label, "" if was is None else f"{was:.3f}", f"{value:.3f}",
                      "" if was is None else f"{value - was:+.3f}", f"{se[key]:.3f}" if key in se else "",
                      *((f"-{floors[key]:.3g}" if key in floors else "",) if floors else ()))
    return Group(head, runs, Text(""), kinds)


def log_view(s: RunState) -> Text:
    """The log, oldest first, then the warnings: the panel keeps to its bottom (TablePanel follow), where
    the newest lines and every warning are."""
    text = Text()
    if s.quantization:
        text.append(f"explore copy: {s.quantization}\n")
    text.append("log:\n")
    for line in s.log:
        text.append(f"  {line}\n")
    text.append(f"warnings: {s.warning_count}"
                + (f" (last {len(s.warnings)})" if s.warning_count > len(s.warnings) else ""),
                style="yellow" if s.warning_count else "")
    for w in s.warnings:
        text.append(f"\n  {_clock(w['time'])} {w['message']}", style="yellow")
    return text


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


# ---------------------------------------------------------------- the environment panel


def env_view(s: RunState) -> Any:
    """The run's folder and plan, and what it started on, from its start event (not the machine showing it)."""
    run = Text.assemble(("run dir ", "bold"), s.started.run_dir, "\n", ("plan ", "bold"), s.started.plan, "\n",
                        *(f"{line}\n" for line in s.started.tracking)) if s.started else Text()
    return Group(run, _machine(s))


def _machine(s: RunState) -> Any:
    env = s.started.environment if s.started else None
    if not env:
        return "no environment recorded: the run has not started yet, or an older solrl wrote its events"
    ex, te, ao = env["explore"], env["transformer_engine"], env["torchao"]
    chose = f"auto chose {ex['resolved']}" if ex["requested"] == "auto" else f"{ex['requested']} -> {ex['resolved']}"
    head = Text.assemble(("machine the run started on", "bold"), f"  device {env['device']}, Python {env['python']}, "
                         f"{env['platform']}\n", ("explore precision: ", "bold"),
                         f"{chose}; full precision {ex['full_precision']}; solrl runs {', '.join(ex['implemented'])}\n")
    gpus = Table(title="GPUs", title_justify="left", box=None, padding=(0, 2))
    for col in ("", "GPU", "compute cap.", "memory", "explore precisions it supports"):
        gpus.add_column(col)
    for g in env["gpus"]:
        ok = [name for name, (yes, _) in g["precisions"].items() if yes]
        gpus.add_row(*map(Text, ("run" if g["run"] else "", f"cuda:{g['index']} {g['name']}", g["capability"],
                                 f"{g['memory_gib']:.0f} GiB", ", ".join(ok))))
    if not env["gpus"]:
        ok = [name for name, (yes, _) in (env.get("cpu_precisions") or {}).items() if yes]
        gpus.add_row("run", "none: the CPU", "-", "-", ", ".join(ok))
    libs = Table(title="libraries", title_justify="left", box=None, padding=(0, 2))
    libs.add_column("library")
    libs.add_column("version / availability")
    te_line = f"{te['version'] or 'version unknown'}" if te["installed"] else te["reason"]
    if te["installed"]:
        te_line += "".join(f"; its {k.upper()} check: "
                           + ("no answer" if te[k] is None else "yes" if te[k][0] else f"no ({te[k][1]})")
                           for k in ("nvfp4", "fp8"))
    ao_line = ao["version"] if ao["installed"] else ao["reason"]
    if ao["installed"]:
        ao_line += "".join(f"; {label}: {'-' if ao.get(key) is None else 'yes' if ao[key] else 'no'}"
                           for key, label in (("sm_at_least_89", "FP8 (sm >= 8.9)"), ("sm_at_least_100", "NVFP4/MX (sm "
                                                                                                         ">= 10.0)")))
    rows = [("Transformer Engine", te_line), ("torchao", ao_line),
            ("torch", f"{env['libraries'].get('torch')} "
                      f"({'CUDA ' + env['torch_cuda'] if env['torch_cuda'] else 'CPU-only build'})")]
    rows += [(name, version or "not installed") for name, version in env["libraries"].items()
             if name not in ("torch", "torchao", "transformer_engine")]
    for row in rows:  # Text, not markup: a reason may hold brackets (transformer-engine[pytorch])
        libs.add_row(*map(Text, row))
    estimate = env.get("memory_estimate_gib")
    measured = (f"measured peak {s.peak_memory:.2f} GiB (largest per-phase peak in the iteration events)"
                if s.peak_memory is not None else "no measured peak in these events")
    memory = Text.assemble(("GPU memory: ", "bold"), "no GPU (the run used the CPU's memory)" if estimate is None else
                           f"estimate {estimate:.1f} GiB (approximate, as solrl doctor) against {measured}")
    return Group(head, gpus, Text(""), libs, Text(""), memory)
