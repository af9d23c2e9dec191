"""The live view of a run (Textual): one app that only consumes events, as plain dicts.

Two sources feed it the same dicts, so a live run and a replay share one ingestion path:
`JsonlTail` follows a run's events.jsonl (`solrl monitor RUN_DIR`), and `QueueSource` is a bus
subscriber that queues events for the app (`solrl train --tui`, via `run_tui_training`). History
lives in `RunState`, apart from rendering; the app applies new events in batches on a timer and
redraws only the visible panel, so a run of thousands of iterations stays cheap, and the training
thread never waits on the screen.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import ContentSwitcher, Footer, ProgressBar, Sparkline, Static

from solrl_cli.display import fmt

PHASES = ("explore", "selection", "regenerate", "reward", "train", "sync", "total")  # as solrl_core.events.PHASES
PANELS = {"time": "time", "rewards": "rewards", "loss": "loss", "eval": "eval", "log": "warnings & log"}
EVENTS_FILE = "events.jsonl"  # solrl_core.session.EVENTS_FILE; importing that module would load torch
HISTORY = 2000  # iterations kept for plots; the aggregates count every iteration
ROLLING = 10


# ---------------------------------------------------------------- sources: each poll() returns new event dicts


class JsonlTail:
    """Follows RUN_DIR/events.jsonl: everything already there on the first poll, then appended lines.

    A last line still being written (no newline yet) waits for the next poll; a file that shrank
    (replaced) is read again from the start."""

    poll_interval = 0.5
    max_bytes = 8 << 20  # per poll, so replaying a huge log never freezes the screen

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.finished = False  # another process writes the file: it may always grow

    def poll(self) -> list[dict[str, Any]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(min(size - self._offset, self.max_bytes))
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = {"event": "warning", "time": time.time(), "message": f"monitor: skipped an unreadable line of {self.path.name}"}
            if isinstance(record, dict) and "event" in record:
                out.append(record)
        return out


class QueueSource:
    """A bus subscriber for a run in this process: put_nowait on an unbounded queue (the trainer
    never blocks on the screen); the app converts events to dicts when it drains them."""

    poll_interval = 0.25

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.done = threading.Event()  # set by the training thread when train() returns or raises
        self.error: BaseException | None = None

    def __call__(self, event: Any) -> None:
        self._queue.put_nowait(event)

    def poll(self, limit: int = 10_000) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(queue.Empty):
            while len(out) < limit:
                out.append(self._queue.get_nowait().to_dict())
        return out

    @property
    def finished(self) -> bool:
        return self.done.is_set() and self._queue.empty()


# ---------------------------------------------------------------- state: what the events say, kept apart from the view


class RunState:
    def __init__(self, history: int = HISTORY) -> None:
        self.started: dict[str, Any] | None = None
        self.quantization = ""
        self.iterations: deque[dict[str, Any]] = deque(maxlen=history)
        self.count = 0  # every iteration seen (the deque keeps the last `history`)
        self.phase_sums = dict.fromkeys(PHASES, 0.0)
        self.nonfinite = 0
        self.evals: deque[dict[str, Any]] = deque(maxlen=500)
        self.warnings: deque[dict[str, Any]] = deque(maxlen=50)
        self.warning_count = 0
        self.log: deque[str] = deque(maxlen=50)  # checkpoints, images, run finished
        self.finished: dict[str, Any] | None = None
        self.last_time: float | None = None
        self.version = 0  # bumped per event: the view redraws only when it moved

    def apply(self, e: dict[str, Any]) -> None:
        self.version += 1
        self.last_time = e.get("time", self.last_time)
        kind = e.get("event")
        if kind == "run_started":
            self.started, self.finished = e, None
            while self.iterations and self.iterations[-1]["iteration"] > e["start_iteration"]:
                self._drop(self.iterations.pop())  # logged after the checkpoint this run resumes from
        elif kind == "quantization_report":
            self.quantization = e["summary"]
        elif kind == "iteration":
            self.iterations.append(e)
            self.count += 1
            for k in PHASES:
                self.phase_sums[k] += e["seconds"].get(k, 0.0)
            self.nonfinite += e.get("nonfinite_losses", 0)
        elif kind == "eval":
            self.evals.append(e)
        elif kind == "warning":
            self.warnings.append(e)
            self.warning_count += 1
        elif kind == "checkpoint":
            self.log.append(f"{_clock(e)} checkpoint iteration {e['iteration']} -> {e['path']} ({e['seconds']:.2f}s)")
        elif kind == "rank_check":
            cor = "  ".join(f"{n} {e[n]:.3f}" if e[n] is not None else f"{n} - (constant)" for n in ("rho", "tau"))
            self.log.append(f"{_clock(e)} rank check iteration {e['iteration']} ({e['seeds']} seeds of one prompt, draft vs "
                            f"full): {cor}")
        elif kind == "images_written":
            self.log.append(f"{_clock(e)} {e['count']} images ({e['weights']} weights) -> {e['folder']}")
        elif kind == "run_finished":
            self.finished = e
            self.log.append(f"{_clock(e)} run {e['reason']} at iteration {e['iteration']} after {e['seconds']:.1f}s")

    def _drop(self, it: dict[str, Any]) -> None:
        self.count -= 1
        for k in PHASES:
            self.phase_sums[k] -= it["seconds"].get(k, 0.0)
        self.nonfinite -= it.get("nonfinite_losses", 0)

    @property
    def iteration(self) -> int:
        if self.iterations:
            return self.iterations[-1]["iteration"]
        return self.started["start_iteration"] if self.started else 0

    @property
    def total(self) -> int:
        if self.started:  # a resumed run may have raised it
            return self.started["iterations"]
        return self.iterations[-1]["iterations"] if self.iterations else 0

    def series(self, *path: str) -> list[float]:
        """One number per kept iteration, e.g. series("final", "mean"); iterations lacking it are skipped."""
        out = []
        for it in self.iterations:
            value: Any = it
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                out.append(float(value))
        return out

    def components(self, stage: str) -> list[str]:
        last = next((it[stage] for it in reversed(self.iterations) if it.get(stage)), None)
        return sorted(last["components"]) if last else []

    def rolling(self, phase: str) -> float | None:
        recent = [it["seconds"][phase] for it in itertools.islice(reversed(self.iterations), ROLLING) if phase in it["seconds"]]
        return statistics.fmean(recent) if recent else None

    def explore_speed(self) -> list[str]:
        """Stage-1 versus Stage-2 generation speed, from the timings and the run's config (sol_rl only:
        the one family that generates the same seeds in both stages). Empty when not derivable."""
        cfg = (self.started or {}).get("config") or {}
        t_draft, t_final = self.rolling("explore"), self.rolling("regenerate")
        try:
            if cfg["algorithm"]["family"] != "sol_rl" or not t_draft or not t_final:
                return []
            prompts, n, k = cfg["run"]["prompts_per_iteration"], cfg["explore"]["group_size"], cfg["selection"]["group_size"]
            steps_draft, steps_final = cfg["explore"]["steps"], cfg["sampler"]["steps"]
        except (KeyError, TypeError):
            return []
        draft, final = prompts * n / t_draft, prompts * k / t_final
        return [f"Stage 1 draft rollouts: {prompts} prompts x {n} seeds in {t_draft:.2f}s = {draft:.1f}/s "
                f"({steps_draft} steps, {self.started['explore_precision']})",
                f"Stage 2 final rollouts: {prompts} prompts x {k} seeds in {t_final:.2f}s = {final:.1f}/s "
                f"({steps_final} steps, {self.started['dtype']})",
                f"explore speed-up per rollout {draft / final:.2f}x, per denoising step "
                f"{draft * steps_draft / (final * steps_final):.2f}x  (generation time only, mean of the last "
                f"{min(len(self.iterations), ROLLING)} iterations)"]

    def eta(self) -> float | None:
        per = self.rolling("total")
        return None if per is None or self.finished else per * max(self.total - self.iteration, 0)


def _clock(e: dict[str, Any]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(e["time"])) if "time" in e else "--:--:--"


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


def gpu_line() -> str:
    """Utilisation and memory of this machine's GPUs, when nvidia-ml-py imports and finds one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        parts = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            parts.append(f"gpu{i} {pynvml.nvmlDeviceGetUtilizationRates(handle).gpu}% "
                         f"mem {mem.used / 2**30:.1f}/{mem.total / 2**30:.1f} GiB")
    except Exception:  # noqa: BLE001 - not installed, no driver, no device: all mean the same here
        return "GPU: no GPU"
    return "GPU: " + ("  ".join(parts) if parts else "no GPU")


# ---------------------------------------------------------------- widgets


class SeriesRow(Horizontal):
    """A label with the latest value and range, beside a sparkline of the kept history."""

    DEFAULT_CSS = """
    SeriesRow { height: 2; }
    SeriesRow > Static { width: 46; }
    SeriesRow > Sparkline { width: 1fr; height: 2; }
    """

    def __init__(self, title: str, values: list[float]) -> None:
        super().__init__()
        self.label = Static(self._label(title, values))
        self.spark = Sparkline(values, summary_function=statistics.fmean)

    def compose(self) -> ComposeResult:
        yield self.label
        yield self.spark

    def show(self, title: str, values: list[float]) -> None:
        self.label.update(self._label(title, values))
        self.spark.data = values
        self._fit(len(values))

    def on_mount(self) -> None:
        self._fit(len(self.spark.data or ()))

    def _fit(self, points: int) -> None:
        """One column per point until the history is wider than the screen, then buckets."""
        room = self.app.size.width - 50
        self.spark.styles.width = points if 0 < points < room else "1fr"

    @staticmethod
    def _label(title: str, values: list[float]) -> Text:
        if not values:
            return Text(f"{title:<28} -")
        return Text.assemble(f"{title:<28} ", (fmt(values[-1]), "bold"),
                             (f"\n{'':<28} {fmt(min(values))} .. {fmt(max(values))}", "dim"))


class SeriesPanel(VerticalScroll):
    """Rows are (title, series); rows appear as their series do (e.g. a new reward component)."""

    def __init__(self, rows: Callable[[RunState], list[tuple[str, list[float]]]], note: Callable[[RunState], str], id: str) -> None:
        super().__init__(id=id)
        self._view_rows, self._view_note = rows, note
        self._row_widgets: dict[str, SeriesRow] = {}
        self.note = Static()

    def compose(self) -> ComposeResult:
        yield self.note

    def draw(self, state: RunState) -> None:
        self.note.update(self._view_note(state))
        for title, values in self._view_rows(state):
            if title in self._row_widgets:
                self._row_widgets[title].show(title, values)
            else:
                self._row_widgets[title] = row = SeriesRow(title, values)
                self.mount(row)


class TablePanel(VerticalScroll):
    def __init__(self, render: Callable[[RunState], Any], id: str) -> None:
        super().__init__(id=id)
        self._view = render
        self.body = Static()

    def compose(self) -> ComposeResult:
        yield self.body

    def draw(self, state: RunState) -> None:
        self.body.update(self._view(state))


def time_view(s: RunState) -> Table:
    table = Table(title=f"seconds per phase, iterations seen: {s.count}", title_justify="left", box=None, padding=(0, 2))
    for col in ("phase", "last", f"mean last {ROLLING}", "mean all", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    last = s.iterations[-1]["seconds"] if s.iterations else {}
    total = s.rolling("total")
    for phase in PHASES:
        mean = s.rolling(phase)
        share = f"{100 * mean / total:.0f}%" if mean is not None and total and phase != "total" else ""
        table.add_row(phase, _num(last.get(phase)), _num(mean), _num(s.phase_sums[phase] / s.count if s.count else None), share)
    return table


def time_rows(s: RunState) -> list[tuple[str, list[float]]]:
    return [(f"{p} s/iter", s.series("seconds", p)) for p in ("total", "explore", "regenerate", "train")]


def time_note(s: RunState) -> str:
    speed = s.explore_speed()
    return "\n".join(speed) if speed else "explore speed-up: not derivable from these events (needs the sol_rl family's two generation stages)"


def reward_rows(s: RunState) -> list[tuple[str, list[float]]]:
    rows = []
    for stage, name in (("final", "Stage-2 final"), ("draft", "Stage-1 draft")):
        rows += [(f"{name} {stat}", s.series(stage, stat)) for stat in ("mean", "best", "worst")]
        rows += [(f"{name[:7]} {comp}", s.series(stage, "components", comp)) for comp in s.components(stage)]
    return [r for r in rows if r[1]]


def reward_note(s: RunState) -> str:
    weights = (s.started or {}).get("config", {}).get("reward", {}).get("weights", {})
    spec = ", ".join(f"{k}={v:g}" for k, v in weights.items()) or "?"
    return f"rewards {spec}  (mean of each bar's iterations; latest value in bold, then the range)"


def loss_rows(s: RunState) -> list[tuple[str, list[float]]]:
    return [(f"loss {k}" if k != "loss" else "loss", s.series("loss", k)) for k in ("loss", "policy", "kl")] + [
        ("grad norm", s.series("grad_norm")), ("old-policy decay", s.series("old_decay"))]


def loss_note(s: RunState) -> str:
    return f"non-finite losses zeroed: {s.nonfinite} in total"


def eval_view(s: RunState) -> Table | str:
    if not s.evals:
        return "no evaluation yet (run.eval_prompts sets the prompts, run.eval_every how often)"
    table = Table(title="evaluations (fixed prompts and seeds)", title_justify="left", box=None, padding=(0, 2))
    for col in ("iteration", "weights", "prompts", "images", "reward", "change", "extras", "seconds"):
        table.add_column(col, justify="right" if col in ("iteration", "images", "reward", "change", "seconds") else "left")
    first = s.evals[0]["mean"]
    for e in s.evals:
        extras = "  ".join(f"{k.split('.')[-1]} {v:.3f}" for k, v in e.get("extras", {}).items())
        comps = "  ".join(f"{k} {fmt(v)}" for k, v in e.get("components", {}).items()) if len(e.get("components", {})) > 1 else ""
        table.add_row(str(e["iteration"]), e["weights"], e["prompts"], str(e["samples"]), fmt(e["mean"]),
                      f"{e['mean'] - first:+.4f}" if e is not s.evals[0] else "", "  ".join(x for x in (comps, extras) if x), f"{e['seconds']:.1f}")
    return table


def log_view(s: RunState) -> Text:
    text = Text()
    if s.quantization:
        text.append(f"explore copy: {s.quantization}\n")
    text.append(f"warnings: {s.warning_count}" + (f" (last {len(s.warnings)})" if s.warning_count > len(s.warnings) else "") + "\n",
                style="yellow" if s.warning_count else "")
    for w in s.warnings:
        text.append(f"  {_clock(w)} {w['message']}\n", style="yellow")
    text.append("log:\n")
    for line in s.log:
        text.append(f"  {line}\n")
    return text


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


class StopScreen(ModalScreen[bool]):
    """q during `train --tui`: stop safely (finish the iteration, save a checkpoint) or cancel."""

    DEFAULT_CSS = """
    StopScreen { align: center middle; }
    StopScreen > Static { width: 78; height: auto; border: thick $warning; padding: 1 2; background: $surface; }
    """
    BINDINGS = [Binding("s,enter", "dismiss(True)", "stop safely"), Binding("c,escape", "dismiss(False)", "cancel")]

    def compose(self) -> ComposeResult:
        yield Static("[bold]Stop training?[/]\n\n"
                     "[bold]s[/]  stop safely: finish this iteration, save a checkpoint, then exit\n"
                     "     (continue later with `solrl train --resume RUN_DIR`)\n"
                     "[bold]c[/]  cancel: keep training and watching")


# ---------------------------------------------------------------- the app


class SolrlMonitor(App):
    """Panels over one RunState. `stop`: how to stop the run safely (train --tui); None for monitor."""

    TITLE = "solrl"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #header { height: auto; padding: 0 1; background: $boost; }
    #progress { height: 1; }
    #progress > ProgressBar { width: 50; }
    #progress > Static { width: 1fr; }
    #tabs { height: 1; padding: 0 1; }
    ContentSwitcher { height: 1fr; padding: 0 1; }
    #time-rows { height: auto; }
    """
    BINDINGS = [Binding("q", "request_quit", "quit"), Binding("ctrl+c", "request_quit", show=False, priority=True),
                Binding("p", "toggle_pause", "pause/resume"),
                *(Binding(str(i), f"show('{name}')", label) for i, (name, label) in enumerate(PANELS.items(), 1)),
                Binding("tab", "cycle(1)", "next panel", show=False, priority=True),
                Binding("shift+tab", "cycle(-1)", "previous panel", show=False, priority=True)]

    def __init__(self, source: JsonlTail | QueueSource, stop: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.source, self.stop_run = source, stop
        self.state = RunState()
        self.paused = False
        self.stopping = False
        self.exit_requested = False  # set from a signal handler; acted on by the next tick
        self._drawn = -1
        self.panels = {"time": TablePanel(time_view, "time"), "rewards": SeriesPanel(reward_rows, reward_note, "rewards"),
                       "loss": SeriesPanel(loss_rows, loss_note, "loss"), "eval": TablePanel(eval_view, "eval"),
                       "log": TablePanel(log_view, "log")}
        self.time_rows = SeriesPanel(time_rows, time_note, "time-rows")
        self.current = "time"
        # held, not queried: a query would search the active screen, which may be the stop dialog
        self.run_line, self.status, self.flags, self.gpu = Static("waiting for the first event ..."), Static(), Static(), Static(gpu_line())
        self.bar, self.tabs, self.switcher = ProgressBar(total=None, show_eta=False), Static(id="tabs"), ContentSwitcher(initial="time")

    def compose(self) -> ComposeResult:
        with Vertical(id="header"):
            yield self.run_line
            with Horizontal(id="progress"):
                yield self.bar
                yield self.status
            yield self.flags
            yield self.gpu
        yield self.tabs
        with self.switcher:
            yield from self.panels.values()
        yield Footer()

    def on_mount(self) -> None:
        self.panels["time"].mount(self.time_rows)
        self._tick()
        self.set_interval(self.source.poll_interval, self._tick)
        self.set_interval(2.0, lambda: self.gpu.update(gpu_line()))

    def _tick(self) -> None:
        if not self.paused:  # paused: new events wait in the source (the queue, or the file)
            for event in self.source.poll():
                try:
                    self.state.apply(event)
                except (KeyError, TypeError, AttributeError):  # a log from another solrl version: show the rest
                    self.state.apply({"event": "warning", "message": f"monitor: could not read a {event.get('event')} event"})
        failed = getattr(self.source, "error", None) is not None
        if self.exit_requested or failed or (self.stopping and self.source.finished):
            self.exit()
            return
        if self.state.version != self._drawn:
            self._drawn = self.state.version
            self.draw()
        self._draw_status()

    def draw(self) -> None:
        s = self.state
        if s.started:
            e = s.started
            resumed = f"  resumed at iteration {e['start_iteration']}" if e["resumed"] else ""
            self.run_line.update(Text.assemble((e["preset"], "bold"), f"  device {e['device']}  full precision {e['dtype']}  "
                                               f"explore precision {e['explore_precision']}{resumed}\n{e['plan']}\nrun dir {e['run_dir']}"))
        if s.total:
            self.bar.update(total=s.total, progress=s.iteration)
        self.panels[self.current].draw(s)
        if self.current == "time":
            self.time_rows.draw(s)
        self.tabs.update("  ".join(
            f"[reverse] {i} {label} [/]" if name == self.current else f" {i} {label} " for i, (name, label) in enumerate(PANELS.items(), 1)))

    def _draw_status(self) -> None:
        s = self.state
        parts = [f"iteration {s.iteration}/{s.total}"]
        if s.iterations:
            it = s.iterations[-1]
            parts.append(f"reward {fmt(it['final']['mean'])}" + (f" (draft {fmt(it['draft']['mean'])})" if it.get("draft") else ""))
        eta = s.eta()
        if eta is not None:
            parts.append(f"eta ~{_duration(eta)} (recent s/iteration x iterations left, excl. eval)")
        self.status.update("  ".join(parts))
        flags = []
        if self.paused:
            flags.append("[reverse] PAUSED [/] new events are buffered (p resumes)")
        if s.finished:
            flags.append(f"[bold]run {s.finished['reason']}[/]" + (" (q exits)" if self.stop_run else ""))
        elif self.stopping:
            flags.append(f"[bold yellow]stopping: finishing iteration {s.iteration + 1}, then saving a checkpoint[/]")
        if s.last_time is not None:
            flags.append(f"last event {_clock({'time': s.last_time})} ({_duration(max(time.time() - s.last_time, 0))} ago)")
        if s.warning_count:
            flags.append(f"[yellow]{s.warning_count} warning{'s' if s.warning_count > 1 else ''} (key 5)[/]")
        self.flags.update("  ".join(flags) or "waiting for events ...")

    def action_show(self, name: str) -> None:
        self.current = name
        self.switcher.current = name
        self.draw()

    def action_cycle(self, step: int) -> None:
        names = list(PANELS)
        self.action_show(names[(names.index(self.current) + step) % len(names)])

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self._tick()

    def action_quit(self) -> None:  # ctrl+q, Textual's own quit key, asks too
        self.action_request_quit()

    def action_request_quit(self) -> None:
        if self.stop_run is None or self.stopping or self.source.finished:
            self.exit()
        elif not isinstance(self.screen, StopScreen):
            self.push_screen(StopScreen(), self._stop_answer)

    def _stop_answer(self, stop: bool | None) -> None:
        if stop and self.stop_run is not None:
            self.stop_run()
            self.stopping, self.paused = True, False
            self._draw_status()


# ---------------------------------------------------------------- entry points for the CLI


def run_monitor(run_dir: Path) -> None:
    """`solrl monitor RUN_DIR`: replay events.jsonl, then follow it. q exits; the run is not touched."""
    SolrlMonitor(JsonlTail(Path(run_dir) / EVENTS_FILE)).run()


def run_tui_training(config: Any, resume: bool = False) -> Any:
    """`solrl train --tui`: train in a worker thread and watch it. Every way out of the app (q then s,
    a crash of the UI, SIGTERM/SIGHUP/SIGINT) sets the stop flag and waits for the iteration to finish
    and its checkpoint to be saved. Returns the trainer's session; re-raises its error."""
    from solrl_core.events import EventBus
    from solrl_core.trainer import StopFlag, train

    stop, source, bus = StopFlag(), QueueSource(), EventBus()
    bus.subscribe(source)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["session"] = train(config, bus, resume=resume, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            source.error = exc
        finally:
            source.done.set()

    def stop_run() -> None:
        stop.requested = True

    app = SolrlMonitor(source, stop=stop_run)
    worker = threading.Thread(target=work, name="solrl-train", daemon=True)
    with _signals_stop(stop, app, worker):
        worker.start()
        try:
            app.run()
        finally:
            stop.requested = True
            if worker.is_alive():
                with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                    print(f"solrl: finishing iteration {app.state.iteration + 1} and saving a checkpoint ...", flush=True)
            worker.join()
    if source.error is not None:
        raise source.error
    for event in source.poll():  # what arrived after the app closed
        app.state.apply(event)
    with contextlib.suppress(OSError):
        print(outcome(app.state), flush=True)
    return result["session"]


def outcome(state: RunState) -> str:
    """The one line left on the terminal once the app has closed."""
    run_dir = state.started["run_dir"] if state.started else "RUN_DIR"
    end = state.finished or {"reason": "stopped", "iteration": state.iteration, "seconds": 0.0}
    line = f"solrl: run {end['reason']} at iteration {end['iteration']}/{state.total} after {end['seconds']:.1f}s; replay: solrl monitor {run_dir}"
    return line + (f"; continue: solrl train --resume {run_dir}" if end["iteration"] < state.total else "")


@contextlib.contextmanager
def _signals_stop(stop: Any, app: SolrlMonitor, worker: threading.Thread) -> Iterator[None]:
    """SIGTERM, SIGHUP (terminal closed) and SIGINT stop the run safely, like q then s; a second one
    while waiting raises KeyboardInterrupt (the checkpoint on disk is atomic, so nothing is torn)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hangup = getattr(signal, "SIGHUP", None)

    def handler(signum: int, frame: object) -> None:
        if stop.requested and not app.is_running:
            raise KeyboardInterrupt
        stop.requested = True
        app.exit_requested = True  # plain flags only: the app's next tick exits
        if signum == hangup:
            _after_hangup(worker)

    wanted = [signal.SIGINT, signal.SIGTERM] + ([hangup] if hangup is not None else [])
    previous = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _after_hangup(worker: threading.Thread) -> None:
    """The terminal is gone. Textual's output thread dies on its first write to it (EIO), and the app
    then blocks on its full output queue (Textual issue #6692): send output to /dev/null instead, and
    once the trainer has saved its checkpoint, end the process even if the app never returns."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(null, fd)

    def finish() -> None:
        worker.join()
        time.sleep(10)
        os._exit(128 + signal.SIGHUP)

    threading.Thread(target=finish, name="solrl-hangup", daemon=True).start()
