"""The run directory: where a run is written, its saved config, and how rank 0 claims it.

Torch-free, so the CLI and the TUI can read a run folder without loading torch.
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path

import tomli_w

from solrl_core.config import Config
from solrl_core.config_io import from_dict, to_dict
from solrl_core.atomic import write_atomic
from solrl_core.errors import SolrlError
from solrl_core.faults.links import check_tree

CONFIG_FILE = "config.toml"
EVENTS_FILE = "events.jsonl"


def load_run_config(run_dir: str | Path) -> Config:
    """The resolved config saved in a run directory (for --resume, eval and infer), once the folder
    holds no link out of it and no special file (faults/links.py): every command that opens a run folder reads this first."""
    path = Path(run_dir)
    if not path.is_dir():
        raise SolrlError(f"run directory {path} does not exist", "pass the folder a previous `solrl train` wrote")
    check_tree(path)
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise SolrlError(f"{path} is not a solrl run directory (no {CONFIG_FILE})", "pass the folder a previous `solrl train` wrote")
    try:
        data = tomllib.loads(cfg_file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SolrlError(f"{cfg_file} is corrupt: {exc}", "restore it, or start a new run") from exc
    return from_dict(data, Config(), source=str(cfg_file)).validate()


def save_run_config(run_dir: Path, config: Config) -> None:
    """The run's resolved config, read back by --resume, eval and infer (and rewritten when an
    out-of-memory back-off changes a batch size)."""
    write_atomic(run_dir / CONFIG_FILE, tomli_w.dumps(to_dict(config)))


CHECKPOINT_NAME = re.compile(r"^iter_(\d{6})$")  # checkpoints/iter_NNNNNN (checkpoint.py writes them)


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    # real folders only: retention and --checkpoint's set-aside delete and rename what this lists
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and CHECKPOINT_NAME.match(p.name))


def restarts(run_dir: str | Path) -> bool:
    """Whether `run_dir` holds a run that never saved a checkpoint (stopped or killed before its first):
    a resume or a new run there starts it again from iteration 0, losing nothing."""
    return (Path(run_dir) / CONFIG_FILE).exists() and not list_checkpoints(Path(run_dir))


def check_new_run_dir(run_dir: str | Path) -> None:
    """A --run-dir given for a new run must not hold one already, unless that run never saved a
    checkpoint (checked again under the lock)."""
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


FIXED_BY_CHECKPOINT = ("lora_rank", "lora_alpha", "lora_targets")  # the adapters' shape and scale


def check_resume_overrides(saved: Config, resumed: Config, run_dir: str | Path) -> None:
    """A resume's `--set` may not change what the checkpoints' adapters fix: name the flag, not
    config.toml, and the value the run was saved with."""
    for key in FIXED_BY_CHECKPOINT:
        before, after = getattr(saved.model, key), getattr(resumed.model, key)
        if before != after:
            shown = ",".join(before) if isinstance(before, tuple) else before
            raise SolrlError(f"--set model.{key} cannot change a resumed run: the adapters in {run_dir}'s checkpoints "
                             f"were trained with model.{key} = {shown}",
                             f"drop --set model.{key}, or start a new run to train with another value")
