"""Experiment trackers (TensorBoard, Weights & Biases) as subscribers to the engine's events, and
`solrl compare`'s reading of recorded runs.

A tracker is fed the same events as the JSONL log, on rank 0 only, and sends them under the metric
names of `metrics.py`. Each tracker's library is optional (`pip install -e ".[tracking]"`) and
imported only when the run names it; `require` checks that it is installed before anything starts.
"""

from __future__ import annotations

import importlib.util
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


def open_trackers(names: tuple[str, ...], run_dir: Path, config: dict[str, Any], resumed: bool, start_iteration: int) -> Trackers:
    """The trackers `names` for the run in `run_dir`, which starts (or resumes) at `start_iteration`."""
    require(names)
    makers: dict[str, Callable[[], Any]] = {}
    if "tensorboard" in names:
        from solrl_core.tracking.tensorboard_log import TensorBoardLog

        makers["tensorboard"] = lambda: TensorBoardLog(run_dir, config, resumed, start_iteration)
    if "wandb" in names:
        from solrl_core.tracking.wandb_log import WandbLog

        makers["wandb"] = lambda: WandbLog(run_dir, config, resumed)
    return Trackers([makers[name]() for name in names])
