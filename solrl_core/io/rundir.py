"""The run directory: where a run is written, its files' names, its checkpoints, and how rank 0 claims it
(the saved config is read and written by config/convert.py).

Torch-free, so the CLI and the TUI can read a run folder without loading torch.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from solrl_core.errors import SolrlError

CONFIG_FILE = "config.toml"
EVENTS_FILE = "events.jsonl"


CHECKPOINT_NAME = re.compile(r"^iter_(\d{6})$")  # checkpoints/iter_NNNNNN (checkpoint.py writes them)


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    # real folders only: retention and --checkpoint's set-aside delete and rename what this lists
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and CHECKPOINT_NAME.match(p.name))


def pick_checkpoint(run_dir: Path, found: list[Path], name: str | None) -> Path:
    """`name` among `found` (folder name or path); the newest when `name` is None."""
    if name is None:
        return found[-1]
    for path in found:
        if name in (path.name, str(path)) or Path(name).resolve() == path.resolve():
            return path
    raise SolrlError(f"no checkpoint '{name}' in {run_dir}", "choose one of: " + ", ".join(p.name for p in found))


def restarts(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a run that never saved a checkpoint (stopped or killed before its first):
    a resume or a new run there starts it again from iteration 0, losing nothing."""
    return (Path(run_dir) / CONFIG_FILE).exists() and not list_checkpoints(Path(run_dir))


RUN_FOLDER_FIX = "pass the folder a previous `solrl train` wrote (runs/<time>-<preset>)"


def check_run_folder(run_dir: str | Path) -> Path:
    """A folder named as a run's (train --resume, eval, infer, export, monitor, compare): there, and a
    folder rather than a file. Every command checks this first, before any model or run file is read."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise SolrlError(f"{path} is a file, not a run folder", RUN_FOLDER_FIX)
    if not path.exists():
        raise SolrlError(f"run directory {path} does not exist", RUN_FOLDER_FIX)
    return path


def check_new_run_dir(run_dir: str | Path) -> None:
    """A --run-dir given for a new run is not a file and does not hold a run already, unless that run
    never saved a checkpoint (checked again under the lock)."""
    if run_dir and Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise SolrlError(f"{run_dir} is a file, not a run folder", "give --run-dir a folder that does not exist yet "
                                                                   "(or omit it: runs/<time>-<preset>)")
    if run_dir and (Path(run_dir) / CONFIG_FILE).exists() and not restarts(run_dir):
        raise SolrlError(f"{run_dir} already holds a run",
                         f"continue it with `solrl train --resume {run_dir}` or pick another --run-dir")


def check_empty_folder(out_dir: Path) -> None:
    """An output folder (export's --out) is new or empty: nothing in it is overwritten."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SolrlError(f"{out_dir} exists and is not empty", "choose a new --out folder")


def fresh_run_dir(preset: str) -> Path:
    """runs/<time>-<preset>, with a counter when that folder exists already."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path("runs") / f"{stamp}-{preset or 'run'}"
    n = 1
    while path.exists():
        n += 1
        path = Path("runs") / f"{stamp}-{preset or 'run'}-{n}"
    return path
