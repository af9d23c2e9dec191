"""`solrl doctor`: check this machine against a run before starting it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from solrl_view.safe_console import SafeConsole as Console
from rich.table import Table
from rich.text import Text

from solrl_cli import options as opt
from solrl_cli.errors import user_errors

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    model: opt.Model = None,
    family: opt.Family = None,
    reward: opt.Reward = None,
    model_path: opt.ModelPath = None,
    set_: opt.Sets = None,
    explore_precision: Annotated[Optional[str], typer.Option(
        "--explore-precision", help="Check this explore precision instead of the config's: auto, nvfp4, fp8, "
                                    "nvfp4-emulated, fp8-e5m2-tensor, fp8-e5m2-delayed, bf16 or fp32.")] = None,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", min=1, help="Processes the run would start on this "
                                                                                "machine.")] = 1,
    json_out: Annotated[bool,
                        typer.Option("--json", help="Print the checks as a JSON list instead of a table.")] = False,
    selftest: Annotated[bool, typer.Option("--selftest", help="Run every path solrl would take here, for real, on tiny "
                                           "random models (one iteration each): a table of pass / fail / skipped "
                                           "rows.")] = False,
    only: Annotated[Optional[str], typer.Option("--only", help="With --selftest: the rows whose names match these "
                                                "comma-separated patterns (globs, or substrings), e.g. "
                                                "'explore/*,reward'.")] = None,
    json_file: Annotated[Optional[Path], typer.Option("--json-out", help="With --selftest: also write the rows as JSON "
                                                      "to this file, rewritten after each row.")] = None,
    device: opt.Device = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Every check's detail and fix in full (the default: a line "
                                                            "a check, a warning or failure in full).")] = False,
    memory_modes: Annotated[bool, typer.Option("--memory-modes", help="Also show the memory mode every model preset "
                                                                      "needs on each GPU size (by the "
                                                                      "estimate).")] = False,
    gpu_capability: Annotated[Optional[str], typer.Option(
        "--gpu-capability", help="Name the explore backends for a simulated GPU of this compute capability "
                                 "(e.g. 9.0, 10.0) instead of this machine's.")] = None,
) -> None:
    """Check that this machine can run the given model, family and reward: software, GPUs, weights, disk, memory.
    Exits 1 when a check the run depends on fails. With --selftest: runs each path instead, exits 1 when a row fails."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.doctor import failed_for_run, run_checks

    with user_errors():
        _check_selftest_options(selftest, json_out, only, json_file)
        if selftest:
            from solrl_cli.selftest_view import run_and_show

            if not run_and_show(device, only, json_file, sets=tuple(set_ or ()), reward=reward,
                                precision=explore_precision):
                raise typer.Exit(1)
            return
        flags = {"model": {"path": str(model_path)}} if model_path else None
        cfg = resolve_config(model or "tiny", family or "sol_rl", reward, sets=set_ or (), flags=flags)
        checks = run_checks(cfg, nproc=nproc_per_node, explore_precision=explore_precision, memory_modes=memory_modes,
                            gpu_capability=gpu_capability)
        if json_out:
            print(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            _print_table(cfg.preset, checks, verbose)
        if failed_for_run(checks):
            raise typer.Exit(1)


def _check_selftest_options(selftest: bool, json_out: bool, only: Optional[str], json_file: Optional[Path]) -> None:
    from solrl_core.errors import SolrlError

    if selftest and json_out:
        raise SolrlError("--json prints the doctor's checks; the self-test's rows go to a file", "use --json-out PATH")
    if not selftest and (only or json_file):
        raise SolrlError(f"{'--only' if only else '--json-out'} is for the self-test", "add --selftest")


def _print_table(preset: str, checks, verbose: bool = False) -> None:  # type: ignore[no-untyped-def]
    """A line a check (its detail cut to the width: `--verbose` or `--json` for all of it); a warning or a
    failure in full with its fix, under its line. The fix column only where a check has a fix."""
    console = Console(highlight=False, markup=False)  # built here, so it follows the terminal the command runs in
    table = Table(title=f"solrl doctor: {preset}  (* = the run depends on it)", box=box.SIMPLE_HEAD,
                  title_justify="left",
                  show_edge=False, pad_edge=False)
    fixes = verbose and any(c.fix for c in checks)
    name_w = min(28, max(len(c.name) + 2 for c in checks))
    table.add_column("check", overflow="fold" if verbose else "ellipsis", no_wrap=not verbose,
                     width=None if verbose else name_w)
    table.add_column("status", no_wrap=True, width=6)
    table.add_column("detail", overflow="fold" if verbose else "ellipsis", no_wrap=not verbose,
                     width=None if verbose else max(20, console.width - name_w - 6 - 4))
    if fixes:
        table.add_column("fix", overflow="fold")
    for c in checks:
        full = verbose or c.status != "pass"
        detail = Text(c.detail + (f"\nfix: {c.fix}" if c.fix and not fixes else ""), no_wrap=not full,
                      overflow="fold" if full else "ellipsis")
        table.add_row(c.name + (" *" if c.needed_by_run else ""), Text(c.status, style=STYLE[c.status]), detail,
                      *([Text(c.fix)] if fixes else []))
    console.print(table)
    counts = {s: sum(c.status == s for c in checks) for s in STYLE}
    blocking = sum(c.status == "fail" and c.needed_by_run for c in checks)
    console.print(f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail"
                  + (f" ({blocking} the run depends on: fix them first)" if blocking else
                     " (nothing blocks this run)" if not counts["fail"] else " (none that this run depends on)")
                  + ("" if verbose else "; in full: --verbose"))
