"""What every benchmark prints about the machine it measured on."""

from __future__ import annotations

import argparse

import os
import platform
from pathlib import Path

import torch


def device_name(device: str | torch.device) -> str:
    """'cuda:0 (NVIDIA H100 ...)' or 'cpu (x86_64, <CPU model>, N cores)'."""
    d = torch.device(device)
    if d.type == "cuda":
        return f"{d} ({torch.cuda.get_device_name(d)})"
    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
             if ln.startswith("model name")] if info.is_file() else []
    return f"cpu ({platform.machine()}, {names[0] if names else platform.processor() or 'unknown model'}, {os.cpu_count()} cores)"


def add_common_args(p: argparse.ArgumentParser, json_help: str) -> None:
    """The options every benchmark shares: model preset, device, threads, overrides, JSON output."""
    p.add_argument("--model", default="tiny", help="model preset (default: tiny, the pre-trained tiny world)")
    p.add_argument("--device", default="auto", help="run.device: auto, cpu, cuda, cuda:N (default: auto)")
    p.add_argument("--threads", type=int, default=0, help="run.threads, CPU threads for torch (0 = torch's default)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra config override, as solrl train --set (repeatable)")
    p.add_argument("--json", type=Path, metavar="PATH", help=json_help)


def add_families_arg(p: argparse.ArgumentParser, default: tuple[str, ...]) -> None:
    from solrl_core.config import FAMILIES

    p.add_argument("--families", nargs="+", default=list(default), choices=FAMILIES, metavar="FAMILY",
                   help=f"families to run, in order (default: {' '.join(default)}; choices: {', '.join(FAMILIES)})")
