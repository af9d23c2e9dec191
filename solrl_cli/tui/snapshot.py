"""`solrl monitor RUN` without a terminal (a pipe, nohup, CI, an agent's shell): the run once, as
plain text, from the same RunState and panel views the full-screen UI draws (progress, time,
rewards, loss, evaluations, warnings and the log), then the end summary a finished run printed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from solrl_view.run_summary import end_summary
from solrl_view.stop_text import finished_message
from solrl_cli.tui.meter import run_pid
from solrl_cli.tui.panels import (eval_note, eval_view, latest_table, loss_note, loss_rows, reward_note, reward_rows,
                                  time_note, time_view)
from solrl_cli.tui.state import JsonlTail, RunState, _clock, _duration
from solrl_core.io.rundir import EVENTS_FILE

LOG_LINES = 12  # the snapshot's tail of the log (the UI's panel 5 scrolls through all it keeps)


def read_run(run_dir: Path) -> RunState:
    """Every event events.jsonl holds now, folded into a RunState (a damaged line raises SolrlError)."""
    tail, state = JsonlTail(Path(run_dir) / EVENTS_FILE), RunState()
    while batch := tail.poll():  # a huge log comes in slices of JsonlTail.max_bytes
        for event in batch:
            state.apply(event)
    return state


def process_text(s: RunState, run_dir: Path) -> str:
    """Where the run stands: how and when it ended, or the process writing it, or that none is seen here."""
    if s.finished:
        return s.outcome_text()
    pid = run_pid(run_dir)
    ago = f", last event {_duration(max(time.time() - s.last_time, 0))} ago" if s.last_time is not None else ""
    return (f"running: pid {pid} on this machine{ago}" if pid is not None
            else f"run process: not on this machine (it runs elsewhere, or ended without its last event){ago}")


def snapshot(run_dir: Path) -> list[Any]:
    """The lines and tables to print, in the panels' order."""
    s = read_run(run_dir)
    if s.started is None and not s.iterations:
        return [f"{run_dir}: no run has started in it yet (its {EVENTS_FILE} holds no start event)"]
    out: list[Any] = []
    if s.started:
        e = s.started
        resumed = f", resumed at iteration {e.start_iteration}" if e.resumed else ""
        out += [Text.assemble(("solrl run ", "bold"), e.run_dir), f"{e.preset}: {e.device} {e.dtype}, explore "
                                                                  f"{e.explore_precision}{resumed}",
                f"plan: {e.plan}"]
    out += [s.progress_text(), process_text(s, run_dir)]
    if s.warning_count:
        out.append(f"{s.warning_count} warning{'s' if s.warning_count > 1 else ''}: see below")
    out += [_heading("time"), time_note(s), time_view(s),
            _heading("rewards"), reward_note(s), latest_table(reward_rows)(s), loss_note(s), latest_table(loss_rows)(s),
            _heading("eval"), *([eval_note(s)] if s.evaluating else []), eval_view(s),
            _heading("warnings & log"), *(s.warning_lines() or ["no warnings"])]
    if s.log:
        out += [f"log (the last {min(LOG_LINES, len(s.log))} of {len(s.log)} lines kept):",
                *(f"  {line}" for line in list(s.log)[-LOG_LINES:])]
    if s.finished:
        out += [_heading("end"), finished_message(s.finished, s.total), *end_summary(s.finished)]
    return out


def print_snapshot(run_dir: Path, console: Console) -> None:
    console.print(f"solrl monitor: a snapshot at {_clock(time.time())} (no terminal here: run it in one for the live "
                  f"view)")
    for part in snapshot(run_dir):
        console.print(part)


def _heading(name: str) -> Text:
    return Text(f"\n== {name} ==", style="bold")
