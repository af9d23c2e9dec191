"""Experiment trackers (TensorBoard, Weights & Biases) as subscribers to the engine's events, and
`solrl compare`'s reading of recorded runs.

A tracker is fed the same events as the JSONL log, on rank 0 only, and sends them under the metric
names of `metrics.py`. Each tracker's library is optional (`pip install -e ".[tracking]"`) and
imported only when the run names it; `require` checks that it is installed before anything starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from solrl_core import events as ev
from solrl_core.errors import SolrlError

# tracker -> the module whose presence says it can run (one capability check each)
REQUIRES = {"tensorboard": "tensorboard", "wandb": "wandb"}
INSTALL = 'pip install -e ".[tracking]"  (or pip install {package})'


def available(name: str) -> bool:
    try:
        return importlib.util.find_spec(REQUIRES[name]) is not None
    except (ImportError, ValueError):
        return False


def require(names: tuple[str, ...]) -> None:
    """Raise, naming the first tracker in `names` whose library is not installed."""
    for name in names:
        if not available(name):
            raise SolrlError(f"run.log names {name}, which is not installed", INSTALL.format(package=REQUIRES[name]))


class Trackers:
    """One subscriber that fans events out to the run's trackers and closes them with the run."""

    def __init__(self, trackers: list[Any]) -> None:
        self.trackers = trackers
        self.reason = "failed"  # until a RunFinished says otherwise

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunFinished):
            self.reason = event.reason
        for tracker in self.trackers:
            tracker(event)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close(self.reason)


def open_trackers(names: tuple[str, ...], run_dir: Path, config: dict[str, Any], resumed: bool,
                  start_iteration: int) -> Trackers:
    """The trackers `names` for the run in `run_dir`, which starts (or resumes) at `start_iteration`."""
    require(names)
    makers: dict[str, Callable[[], Any]] = {}
    if "tensorboard" in names:
        from solrl_core.tracking.tensorboard_log import TensorBoardLog

        makers["tensorboard"] = lambda: TensorBoardLog(run_dir, config, resumed, start_iteration)
    if "wandb" in names:
        from solrl_core.tracking.wandb_log import WandbLog

        makers["wandb"] = lambda: WandbLog(run_dir, config, resumed)
    before = set(Path(run_dir).iterdir())
    opened: list[Any] = []
    try:
        for name in names:
            opened.append(makers[name]())
    except BaseException:
        for tracker in opened:
            tracker.close("failed")
        undo_start(Path(run_dir), before, fresh=not resumed and start_iteration == 0)
        raise
    return Trackers(opened)




def undo_start(run_dir: Path, before: set[Path], fresh: bool) -> None:
    """A tracker could not start: remove what the trackers made, and for a fresh run what its start
    wrote, then the folder if that leaves it empty, so a failed start leaves no half-made run behind.
    A resumed run keeps everything it had."""
    for made in set(run_dir.iterdir()) - before:
        shutil.rmtree(made, ignore_errors=True) if made.is_dir() else made.unlink(missing_ok=True)
    if fresh:  # what a fresh run's start writes before its trackers open (session.py, trainer.py)
        from solrl_core.faults.lock import LOCK_FILE
        from solrl_core.io.rundir import CONFIG_FILE, EVENTS_FILE
        from solrl_core.rewards.identity import RECORD_FILE

        for name in (CONFIG_FILE, EVENTS_FILE, "quantization_report.json", RECORD_FILE, LOCK_FILE):
            (run_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            run_dir.rmdir()


def where(names: tuple[str, ...], run_dir: Path) -> list[str]:
    """Where each tracker of a started run writes, and how to look at it."""
    lines = []
    if "tensorboard" in names:
        from solrl_core.tracking.tensorboard_log import FOLDER

        folder = Path(run_dir) / FOLDER
        lines.append(f"TensorBoard: {folder}  (view: tensorboard --logdir {folder})")
    if "wandb" in names:
        from solrl_core.tracking.wandb_log import ID_FILE

        with contextlib.suppress(OSError, ValueError):
            info = json.loads((Path(run_dir) / ID_FILE).read_text(encoding="utf-8"))
            if info.get("offline_dir"):
                lines.append(f"W&B offline run: {info['offline_dir']}  (upload: wandb sync {info['offline_dir']})")
            elif info.get("url"):
                lines.append(f"W&B run: {info['url']}")
    return lines
