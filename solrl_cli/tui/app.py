"""The live view of a run (Textual): one app that only consumes typed events.

Two sources feed it the same events, so a live run and a replay share one ingestion path:
`JsonlTail` follows a run's events.jsonl (`solrl monitor RUN_DIR`), and `QueueSource` is a bus
subscriber that queues events for the app (`solrl train --tui`, via `run_tui_training`). History
lives in `RunState`, apart from rendering; the app applies new events in batches on a timer and
redraws only the visible panel, so a run of thousands of iterations stays cheap, and the training
thread never waits on the screen.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import ContentSwitcher, Footer, ProgressBar, Sparkline, Static

from solrl_view.run_summary import fmt
from solrl_view.run_summary import end_summary
from solrl_view.stop_text import finished_message
from solrl_cli.tui.meter import ProcessMeter, gpu_line, run_pid
from solrl_cli.tui.panels import (
    ChartPanel,
    env_view,
    eval_charts,
    eval_note,
    eval_view,
    latest_table,
    log_view,
    loss_note,
    loss_rows,
    reward_charts,
    reward_note,
    reward_rows,
    time_charts,
    time_note,
    time_view,
)
from solrl_cli.tui.screens import HelpScreen, StopScreen
from solrl_cli.tui.state import PANELS, JsonlTail, QueueSource, RunState, _duration
from solrl_core import events as ev
from solrl_core.errors import SolrlError
from solrl_core.io.rundir import EVENTS_FILE

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

    def __init__(self, rows: Callable[[RunState], list[tuple[str, list[float]]]], note: Callable[[RunState], str],
                 id: str) -> None:
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
    """follow: keep to the newest lines at the bottom as they come (a log), until the user scrolls up."""

    def __init__(self, render: Callable[[RunState], Any], id: str, follow: bool = False) -> None:
        super().__init__(id=id)
        self._view, self._follow = render, follow
        self.body = Static()

    def compose(self) -> ComposeResult:
        yield self.body

    def on_mount(self) -> None:
        if self._follow:
            self.anchor()

    def draw(self, state: RunState) -> None:
        self.body.update(self._view(state))


# ---------------------------------------------------------------- the app


class SolrlMonitor(App):
    """Panels over one RunState. `stop`: how to stop the run safely (train --tui); None for monitor."""

    TITLE = "solrl"
    ENABLE_COMMAND_PALETTE = False
    # the header is three lines (run, progress, flags and machine use) so a 24-line terminal keeps its panel
    CSS = """
    #header { height: 3; padding: 0 1; background: $boost; }
    #header Static { height: 1; overflow: hidden hidden; text-wrap: nowrap; text-overflow: ellipsis; }
    #progress, #flagrow { height: 1; }
    #progress > ProgressBar { width: 18; }
    #progress > Static { width: 1fr; padding: 0 0 0 1; }
    #flags { width: 1fr; }
    #machine { width: auto; max-width: 60%; padding: 0 0 0 2; }
    #tabs { height: 1; padding: 0 1; }
    ContentSwitcher { height: 1fr; padding: 0 1; }
    """
    BINDINGS = [Binding("q", "request_quit", "quit"), Binding("ctrl+c", "request_quit", show=False, priority=True),
                Binding("question_mark", "help", "help"), Binding("p", "toggle_pause", "pause/resume"),
                *(Binding(key, f"scroll('{how}')", show=False) for key, how in (
                    ("up", "up"), ("down", "down"), ("pageup", "page_up"), ("pagedown", "page_down"), ("home",
                            "home"), ("end", "end"))),
                # the tab row names the panels' keys: the footer keeps the rest, whole at 80 columns
                *(Binding(str(i), f"show('{name}')", label, show=False)
                  for i, (name, label) in enumerate(PANELS.items(), 1)),
                Binding("tab", "cycle(1)", "next panel", priority=True),
                Binding("shift+tab", "cycle(-1)", "previous panel", show=False, priority=True)]

    def __init__(self, source: JsonlTail | QueueSource, stop: Callable[[], None] | None = None,
                 pid: int | None = None) -> None:
        super().__init__()
        self.source, self.stop_run = source, stop
        self.meter = ProcessMeter(pid)  # the training process, measured where it runs on this machine
        self.state = RunState()
        self.paused = False
        self.stopping = False
        self.exit_requested = False  # set from a signal handler; acted on by the next tick
        self.failure: SolrlError | None = None  # a log the monitor cannot read on: run_monitor raises it
        self._drawn = -1
        self.panels = {"time": ChartPanel(time_charts, time_note, "time", table=time_view),
                       "rewards": ChartPanel(reward_charts, reward_note, "rewards", table=latest_table(reward_rows)),
                       "loss": SeriesPanel(loss_rows, loss_note, "loss"),
                       "eval": ChartPanel(eval_charts, eval_note, "eval", table=eval_view),
                       "log": TablePanel(log_view, "log", follow=True), "env": TablePanel(env_view, "env")}
        self.current = "time"
        # held, not queried: a query would search the active screen, which may be the stop dialog
        self.run_line, self.status = Static("waiting for the first event ..."), Static()
        self.flags, self.machine = Static(id="flags"), Static(id="machine")
        self.bar, self.tabs, self.switcher = ProgressBar(total=None,
                show_eta=False), Static(id="tabs"), ContentSwitcher(initial="time")

    def compose(self) -> ComposeResult:
        with Vertical(id="header"):
            yield self.run_line
            with Horizontal(id="progress"):
                yield self.bar
                yield self.status
            with Horizontal(id="flagrow"):
                yield self.flags
                yield self.machine
        yield self.tabs
        with self.switcher:
            yield from self.panels.values()
        yield Footer()

    def on_mount(self) -> None:
        self._tick()
        self.set_interval(self.source.poll_interval, self._tick)
        self._measure()
        self.set_interval(2.0, self._measure)

    def _measure(self) -> None:
        """This machine's GPU use, and the training process's CPU% and resident memory."""
        if self.meter.pid is None and isinstance(self.source, JsonlTail):  # monitor: the run may start after it
            self.meter.pid = run_pid(self.source.path.parent)
        here = "  ".join(x for x in (gpu_line(), self.meter.line()) if x)
        self.machine.update(here or ("" if self.state.finished else "run process: not on this machine"))

    def _tick(self) -> None:
        try:
            if not self.paused:  # paused: new events wait in the source (the queue, or the file)
                for event in self.source.poll():
                    self.state.apply(event)
        except SolrlError as exc:  # a damaged line, or a config this version cannot read: stop, then say where
            self.failure = exc
            self.exit()
            return
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
            resumed = f", resumed at {e.start_iteration}" if e.resumed else ""  # 80 columns hold the line whole
            self.run_line.update(Text.assemble((e.preset, "bold"), f"  {e.device} {e.dtype}, explore "
                                                                   f"{e.explore_precision}{resumed}"
                                               "  (key 6: plan)"))
        if s.total:
            self.bar.update(total=s.total, progress=s.iteration)
        self.panels[self.current].draw(s)
        self.tabs.update("  ".join(
            f"[reverse] {i} {label} [/]" if name == self.current else f" {i} {label} "
                                   for i, (name, label) in enumerate(PANELS.items(), 1)))

    def _draw_status(self) -> None:
        s = self.state
        self.status.update(Text(s.progress_text()))
        flags = []
        if self.paused:
            flags.append("[reverse] PAUSED [/] new events are buffered (p resumes)")
        if s.finished:
            flags.append(f"[bold]{s.outcome_text()}[/]" + (" (q exits)" if self.stop_run else ""))
        elif self.stopping:
            flags.append(f"[bold yellow]stopping: finishing iteration {s.iteration + 1}, then saving a checkpoint[/]")
        if s.warning_count:
            flags.append(f"[yellow]{s.warning_count} warning{'s' if s.warning_count > 1 else ''} (key 5)[/]")
        if s.last_time is not None and not s.finished:
            flags.append(f"last event {_duration(max(time.time() - s.last_time, 0))} ago")
        self.flags.update("  ".join(flags))

    def action_show(self, name: str) -> None:
        self.current = name
        self.switcher.current = name
        self.draw()

    def action_cycle(self, step: int) -> None:
        names = list(PANELS)
        self.action_show(names[(names.index(self.current) + step) % len(names)])

    def action_scroll(self, how: str) -> None:
        getattr(self.panels[self.current], f"scroll_{how}")(animate=False)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(training=self.stop_run is not None))

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self._tick()

    def action_quit(self) -> None:  # ctrl+q, Textual's own quit key, asks too
        self.action_request_quit()

    def action_request_quit(self) -> None:
        if self.stop_run is None or self.stopping or self.source.finished:
            self.exit()
        elif not isinstance(self.screen, StopScreen):
            self.push_screen(StopScreen(_run_dir(self.state)), self._stop_answer)

    def _stop_answer(self, stop: bool | None) -> None:
        if stop and self.stop_run is not None:
            self.stop_run()
            self.stopping, self.paused = True, False
            self._draw_status()


# ---------------------------------------------------------------- entry points for the CLI


def run_monitor(run_dir: Path) -> None:
    """`solrl monitor RUN_DIR`: replay events.jsonl, then follow it. q exits; the run is not touched.
    Raises the SolrlError that stopped the view (a line whose fields do not fit its kind)."""
    app = SolrlMonitor(JsonlTail(Path(run_dir) / EVENTS_FILE))
    app.run()
    if app.failure is not None:
        raise app.failure


def run_tui_training(start: Any) -> Any:
    """`solrl train --tui`: train `start` (solrl_core/tools/start.py) in a worker thread and watch it.
    Every way out of the app (q then s, a crash of the UI, SIGTERM/SIGHUP/SIGINT, the launcher gone)
    sets the stop flag and waits for the iteration to finish and its checkpoint to be saved; the
    signals are handled as in plain mode (solrl_core/runtime/stopping.py), and each also closes the
    view. Returns the trainer's session; re-raises its error."""
    from solrl_core.events import EventBus
    from solrl_core.runtime.stopping import StopFlag, graceful_stop

    stop, source, bus = StopFlag(), QueueSource(), EventBus()
    bus.subscribe(source)
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["session"] = start.train(bus, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            source.error = exc
        finally:
            source.done.set()

    def stop_run() -> None:
        stop.request("q")

    app = SolrlMonitor(source, stop=stop_run, pid=os.getpid())
    worker = threading.Thread(target=work, name="solrl-train", daemon=True)
    closing = functools.partial(_close_on_signal, app, worker)
    with graceful_stop(stop, start.config.run.stop_on_sigterm, on_request=closing,
                       may_interrupt=lambda: not app.is_running):
        worker.start()
        try:
            app.run()
        finally:
            stop.requested = True
            if worker.is_alive():
                with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                    print(f"solrl: finishing iteration {app.state.iteration + 1} and saving a checkpoint ...",
                          flush=True)
            worker.join()
    if source.error is not None:
        raise source.error
    if app.failure is not None:  # the view stopped (the run did too, safely): say why
        raise app.failure
    for event in source.poll():  # what arrived after the app closed
        app.state.apply(event)
    with contextlib.suppress(OSError):
        print(outcome(app.state), flush=True)
    return result["session"]


def outcome(state: RunState) -> str:
    """What is left on the terminal once the app has closed: the run's last line, the end summary the
    plain display prints under it (the reward's and the evaluation's change), and the warnings panel 5
    showed (the plain display printed each as it came; the app's screen is gone)."""
    run_dir = _run_dir(state)
    end = state.finished or ev.RunFinished(reason="interrupted", iteration=state.iteration, seconds=0.0,
                                           first_reward=None,
                                           last3_reward=None, run_dir=run_dir)
    return "\n".join([f"solrl: {finished_message(end, state.total)}; replay: solrl monitor {run_dir}",
                      *end_summary(end), *state.warning_lines()])


def _run_dir(state: RunState) -> str:
    """The run's folder, as the run started it (or as its config names it before it has)."""
    if state.started:
        return state.started.run_dir
    return (state.config.run.run_dir if state.config is not None else "") or "<run folder>"


def _close_on_signal(app: SolrlMonitor, worker: threading.Thread, signum: int) -> None:
    """A signal asked the run to stop: the app's next tick exits (plain flags only, from a handler)."""
    app.exit_requested = True
    if signum == getattr(signal, "SIGHUP", None):
        _after_hangup(worker)


def _after_hangup(worker: threading.Thread) -> None:
    """The terminal is gone. Textual's output thread dies on its first write to it (EIO), and the app
    then blocks on its full output queue (Textual issue #6692): output already goes to /dev/null
    (stopping.graceful_stop); once the trainer has saved its checkpoint, end the process even if the
    app never returns."""

    def finish() -> None:
        worker.join()
        time.sleep(10)
        os._exit(128 + signal.SIGHUP)

    threading.Thread(target=finish, name="solrl-hangup", daemon=True).start()
