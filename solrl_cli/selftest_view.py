"""`solrl doctor --selftest` on the terminal: a progress line per row as it runs, then the table."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from solrl_cli.safe_console import SafeConsole as Console
from rich.table import Table
from rich.text import Text

STYLE = {"pass": "green", "skipped": "yellow", "fail": "bold red"}


def run_and_show(device: Optional[str], only: Optional[str], json_file: Optional[Path], **given: Any) -> bool:
    """Run the self-test, showing each row as it ends and writing `json_file` after each; True when
    every row that could run passed."""
    from solrl_core.doctor.selftest import passed, run_selftest
    from solrl_core.tools.export import export_weights

    console = Console(highlight=False, markup=False)
    started = time.perf_counter()
    done: list[Any] = []

    def on_row(result: Any) -> None:
        done.append(result)
        line = Text(f"  {result.status:<7} ", style=STYLE[result.status])
        line.append(f"{result.seconds:6.1f} s  " + (result.detail if result.status != "pass" else ""))
        console.print(line)
        if result.fix:
            console.print(f"          fix: {result.fix}")
        if json_file is not None:
            json_file.write_text(json.dumps([r.to_dict() for r in done], indent=2))

    results = run_selftest(device or "auto", only, on_start=lambda name: console.print(f"[{len(done) + 1}] {name} ..."),
                           on_row=on_row, export=export_weights, **given)
    label = next((r.peak_of for r in results if r.peak_of), "")
    table = Table(title=f"solrl doctor --selftest  (peak GiB: {label})")
    for col in ("row", "status", "seconds", "peak GiB", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(r.name, Text(r.status, style=STYLE[r.status]), f"{r.seconds:.1f}",
                      "" if r.peak_gib is None else f"{r.peak_gib:.2f}", Text(r.detail), Text(r.fix))
    console.print(table)
    counts = {s: sum(r.status == s for r in results) for s in STYLE}
    console.print(f"{counts['pass']} pass, {counts['fail']} fail, {counts['skipped']} skipped in "
                  f"{time.perf_counter() - started:.0f} s" + ("" if passed(results) else ": fix the failing rows first"))
    return passed(results)

