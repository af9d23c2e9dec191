"""`solrl doctor --selftest` on the terminal: a line a row as it ends (status, seconds, peak memory,
name, and why where it did not pass), then the counts; every field of every row with --json-out."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from solrl_view.safe_console import SafeConsole as Console
from rich.text import Text

STYLE = {"pass": "green", "skipped": "yellow", "fail": "bold red"}


def run_and_show(device: Optional[str], only: Optional[str], json_file: Optional[Path], **given: Any) -> bool:
    """Run the self-test, each row said once as it ends (on a terminal, the row running shows meanwhile)
    and `json_file` written after each; True when every row that could run passed."""
    from solrl_core.doctor.selftest import passed, run_selftest
    from solrl_core.tools.export import export_weights

    console = Console(highlight=False, markup=False)
    started = time.perf_counter()
    done: list[Any] = []
    running = console.status("", spinner="line") if console.is_terminal else None

    def on_start(name: str) -> None:
        if running is not None:
            running.update(f"[{len(done) + 1}] {name} ...")
            running.start()

    def on_row(result: Any) -> None:
        if running is not None:
            running.stop()
        done.append(result)
        peak = "" if result.peak_gib is None else f"{result.peak_gib:5.2f} GiB  "
        line = Text(f"[{len(done)}] ").append(f"{result.status:<7} ", style=STYLE[result.status])
        line.append(f"{result.seconds:5.1f} s  {peak}{result.name}"
                    + (f": {result.detail}" if result.status != "pass" else ""))
        console.print(line)
        if result.fix:
            console.print(f"          fix: {result.fix}")
        if json_file is not None:
            json_file.write_text(json.dumps([r.to_dict() for r in done], indent=2))

    results = run_selftest(device or "auto", only, on_start=on_start, on_row=on_row, export=export_weights, **given)
    label = next((r.peak_of for r in results if r.peak_of), "")
    counts = {s: sum(r.status == s for r in results) for s in STYLE}
    console.print(f"{counts['pass']} pass, {counts['fail']} fail, {counts['skipped']} skipped in "
                  f"{time.perf_counter() - started:.0f} s" + (f" (GiB: {label})" if label else "")
                  + ("" if passed(results) else ": fix the failing rows first"))
    return passed(results)
