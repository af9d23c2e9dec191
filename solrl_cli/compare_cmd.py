"""`solrl compare RUN RUN...`: runs side by side, from their events.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from solrl_cli.errors import err_console, user_errors
from solrl_core.tools.sources import output_folder


def compare(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (each holds events.jsonl), e.g. a sol_rl run and a "
                                                    "naive_scaling run.")],
    out: Annotated[Optional[Path],
                   typer.Option("--out", "-o", help="Output folder. Default: runs/compare-<time>.")] = None,
) -> None:
    """Plot and tabulate several runs: Stage-2 reward and evaluation against iteration and time, time per phase."""
    import csv

    from rich.table import Table

    from solrl_view.safe_console import SafeConsole as Console

    from solrl_core.tracking.compare import figure, load_run, table

    with user_errors():
        records = [load_run(run, skip_damaged=True) for run in runs]  # one damaged line: a warning, not the whole run
        for warning in (w for r in records for w in r.warnings):
            err_console.print(Text.assemble(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
        out_dir = output_folder(out, None, "compare")
        out_dir.mkdir(parents=True, exist_ok=True)
        header, rows = table(records)
        view = Table(title="runs compared (seconds as each run measured them, on its device)")
        view.add_column("")
        for row in rows:  # one column per run, so several runs fit a terminal
            view.add_column(row[0], justify="right")
        for i, name in enumerate(header[1:], 1):
            view.add_row(name, *[row[i] for row in rows])
        console = Console(highlight=False, soft_wrap=True)
        console.print(view)
        with open(out_dir / "compare.csv", "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([header, *rows])
        png = figure(records, out_dir / "compare.png")
        console.print(f"plot: {png}   table: {out_dir / 'compare.csv'}")
