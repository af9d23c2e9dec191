"""TensorBoard event files under RUN/tensorboard/, written with torch's SummaryWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tomli_w

from solrl_core import events as ev
from solrl_core.tracking.base import Tracker

FOLDER = "tensorboard"


class TensorBoardLog(Tracker):
    def __init__(self, run_dir: Path, config: dict[str, Any], resumed: bool, start_iteration: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # On resume, steps after the checkpoint were logged by the run that stopped and will be logged
        # again: purge_step tells TensorBoard to drop the old ones, so each series stays one line.
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / FOLDER), purge_step=start_iteration + 1 if resumed else None)
        self.writer.add_text("config", "```\n" + tomli_w.dumps(config) + "```", start_iteration)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a few events per iteration: a dashboard watching the run sees each one at once

    def image(self, grid: ev.SampleGrid) -> None:
        from PIL import Image

        with Image.open(grid.path) as picture:
            pixels = np.asarray(picture.convert("RGB"))
        self.writer.add_image("samples", pixels, grid.iteration, dataformats="HWC")
        rewards = ", ".join(f"{r:.4g}" for r in grid.rewards)
        self.writer.add_text("samples/caption", f"{grid.prompt} (Stage-2 rewards, best first: {rewards})", grid.iteration)

    def close(self, reason: str) -> None:
        self.writer.close()
