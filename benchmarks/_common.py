"""The command-line options the benchmarks share. The machine a figure was measured on is named by
solrl_core.telemetry.peaks.device_label, as `solrl bench` names it."""

from __future__ import annotations

import argparse
from pathlib import Path


DEVICE_HELP = "auto, cpu, cuda or cuda:N (default: auto: cuda when torch sees a GPU, else cpu)"


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """--device, as every benchmark that picks a device takes it (auto included: lease.py passes it on)."""
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def resolved_device(name: str) -> str:
    """`name` with auto resolved as solrl resolves run.device (cuda when torch sees a GPU, else cpu)."""
    from solrl_core.runtime.device import resolve_device

    return str(resolve_device(name))


def add_common_args(p: argparse.ArgumentParser, json_help: str) -> None:
    """The options every benchmark shares: model preset, device, threads, overrides, JSON output."""
    p.add_argument("--model", default="tiny", help="model preset (default: tiny, the pre-trained tiny world)")
    add_device_arg(p)
    p.add_argument("--threads", type=int, default=0, help="run.threads, CPU threads for torch (0 = auto: one per "
                                                          "usable core)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra config override, as solrl train --set (repeatable)")
    p.add_argument("--json", type=Path, metavar="PATH", help=json_help)


def add_families_arg(p: argparse.ArgumentParser, default: tuple[str, ...]) -> None:
    from solrl_core.config.families import FAMILIES

    p.add_argument("--families", nargs="+", default=list(default), choices=FAMILIES, metavar="FAMILY",
                   help=f"families to run, in order (default: {' '.join(default)}; choices: {', '.join(FAMILIES)})")
