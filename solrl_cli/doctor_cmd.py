"""`solrl doctor`: check this machine against a run before starting it."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
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
                                    "nvfp4-emulated, bf16 or fp32.")] = None,
    nproc_per_node: Annotated[int, typer.Option("--nproc-per-node", min=1, help="Processes the run would start on this machine.")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON list instead of a table.")] = False,
    gpu_capability: Annotated[Optional[str], typer.Option(
        "--gpu-capability", help="Name the explore backends for a simulated GPU of this compute capability "
                                 "(e.g. 9.0, 10.0) instead of this machine's.")] = None,
) -> None:
    """Check that this machine can run the given model, family and reward: software, GPUs, weights, disk, memory.
    Exits 1 when a check the run depends on fails."""
    from solrl_core.config.presets import resolve_config
    from solrl_core.doctor import failed_for_run, run_checks

    with user_errors():
        flags = {"model": {"path": str(model_path)}} if model_path else None
        cfg = resolve_config(model or "tiny", family or "sol_rl", reward, sets=set_ or (), flags=flags)
        checks = run_checks(cfg, nproc=nproc_per_node, explore_precision=explore_precision, gpu_capability=gpu_capability)
        if json_out:
            print(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            _print_table(cfg.preset, checks)
        if failed_for_run(checks):
            raise typer.Exit(1)


def _print_table(preset: str, checks) -> None:  # type: ignore[no-untyped-def]
    console = Console(highlight=False, markup=False)  # built here, so it follows the terminal the command runs in
    table = Table(title=f"solrl doctor: {preset}  (* = the run depends on it)")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name + (" *" if c.needed_by_run else ""), Text(c.status, style=STYLE[c.status]), Text(c.detail), Text(c.fix))
    console.print(table)
    counts = {s: sum(c.status == s for c in checks) for s in STYLE}
    blocking = sum(c.status == "fail" and c.needed_by_run for c in checks)
    console.print(f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail"
                  + (f" ({blocking} the run depends on: fix them first)" if blocking else
                     " (nothing blocks this run)" if not counts["fail"] else " (none that this run depends on)"))
