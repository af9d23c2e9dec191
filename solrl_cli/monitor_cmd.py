"""`solrl monitor RUN_DIR`: the live view of a run another process is writing, or a replay of a finished one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from solrl_cli.errors import user_errors


def monitor(run_dir: Annotated[Path, typer.Argument(help="A run folder (it holds events.jsonl).")]) -> None:
    """Watch a run in a terminal UI: timings, rewards, losses, evaluations, warnings. q exits; the run goes on.
    Without a terminal (piped, nohup, CI): print a plain-text snapshot of the run and exit."""
    from solrl_cli.tui import no_terminal
    from solrl_core.errors import SolrlError
    from solrl_core.faults.links import check_path
    from solrl_core.io.rundir import EVENTS_FILE, check_run_folder

    with user_errors():
        run_dir = check_run_folder(run_dir)
        if not check_path(run_dir, EVENTS_FILE).is_file():  # a planted link or fifo: refused, not followed
            what = "does not exist" if not run_dir.exists() else f"has no {EVENTS_FILE}"
            raise SolrlError(f"{run_dir} {what}", "pass a run folder written by `solrl train` (it holds config.toml "
                                                  "and "
                                                  f"{EVENTS_FILE}; the default is runs/<time>-<preset>)")
        if no_terminal() is not None:
            from solrl_cli.common import console
            from solrl_cli.tui.snapshot import print_snapshot

            return print_snapshot(run_dir, console)
        from solrl_cli.tui.app import run_monitor

        run_monitor(run_dir)
